//! A streamed flight's mirror in Redis: the cluster owner appends every
//! event of its live log to a Redis Stream (numbered, bounded, expiring,
//! sealed when encryption is on), and a follower elsewhere relays it live
//! into a log of its own, with a blocking read on a connection of its own
//! while `redis.max_relay_connections` allows, else polling the shared one.
//! A relay keeps a readers heartbeat while its instance has callers for the
//! stream, which the owner reads before it cancels an abandoned stream.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use futures::future::BoxFuture;
use redis::streams::StreamReadReply;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Cluster, Unavailable, connection};
use crate::{
    fingerprint::CacheKey,
    sse::{LogEnd, Silence, StreamLog, StreamWriter},
};

/// How long a relay's heartbeat says its instance still reads a mirrored
/// stream; renewed after each blocking read (`EVENTS_BLOCK`).
const READERS_TTL: Duration = Duration::from_secs(2);

/// Bound on a mirrored event stream's length: `XADD MAXLEN ~`.
const EVENTS_MAX_LEN: usize = 100_000;
/// How long a mirrored event stream outlives its last write.
const EVENTS_TTL: Duration = Duration::from_secs(60);
/// One blocking read's wait; the relay checks for a stall between reads.
const EVENTS_BLOCK: Duration = Duration::from_millis(500);
/// A relay without a connection of its own reads this often while the
/// stream holds nothing new.
const EVENTS_POLL: Duration = Duration::from_millis(50);
/// Once the owner's flight is over, how long its mirror may stay quiet before
/// a follower's relay gives up on the end marker.
const SETTLED_GRACE: Duration = Duration::from_secs(1);

impl Cluster {
    /// A mirror for the cluster owner's flight: every event of the published
    /// log is appended to a Redis Stream (bounded, expiring), then an end
    /// marker, so followers elsewhere relay the stream live.
    pub fn mirror(
        self: &Arc<Self>,
        key: &CacheKey,
        token: &str,
    ) -> Arc<dyn Fn(StreamLog) + Send + Sync> {
        let cluster = self.clone();
        let name = self.keys.events(key, token);
        Arc::new(move |log: StreamLog| {
            let cluster = cluster.clone();
            let name = name.clone();
            tokio::spawn(async move {
                let mut reader = log.mirror_reader();
                let done = log.format().done_event();
                let mut seq = 0u64;
                let mut ended = false;
                while let Some(event) = reader.next_event().await {
                    // The terminal event carries the end marker: the format's done
                    // event (the follower's log appends its own), or the error event.
                    // A format without a done event ends with its completing event,
                    // an ordinary event: the end marker follows it, empty.
                    let (field, value) = match log.end() {
                        Some(LogEnd::Done)
                            if reader_at_end(&reader, &log) && done.as_ref() == Some(&event) =>
                        {
                            ("done", event)
                        }
                        Some(LogEnd::Failed(_)) if reader_at_end(&reader, &log) => {
                            ("failed", event)
                        }
                        _ => ("e", event),
                    };
                    ended = field != "e";
                    if cluster
                        .append_event(&name, seq, field, &value)
                        .await
                        .is_err()
                    {
                        // Redis is unwell: followers fall back to the flight record.
                        return;
                    }
                    seq += 1;
                }
                if !ended && !reader_at_end(&reader, &log) {
                    // The mirror's reader was cut behind the live stream (it
                    // fell `max_reader_lag_bytes` behind): followers elsewhere
                    // did not get every event, so they get an error, never an end.
                    let error = log
                        .format()
                        .error_event("the shared stream's mirror fell behind", seq as usize);
                    let _ = cluster.append_event(&name, seq, "failed", &error).await;
                } else if !ended && log.end() == Some(LogEnd::Done) {
                    let _ = cluster
                        .append_event(&name, seq, "done", &Bytes::new())
                        .await;
                }
            });
        })
    }

    /// Whether callers on other instances still read the owner's mirrored
    /// stream of `key` (their relays' heartbeat); `true` when Redis cannot
    /// say, so a stream is never cut for want of an answer.
    pub fn remote_readers(
        self: &Arc<Self>,
        key: &CacheKey,
        token: &str,
    ) -> Arc<dyn Fn() -> BoxFuture<'static, bool> + Send + Sync> {
        let cluster = self.clone();
        let name = self.keys.readers(key, token);
        Arc::new(move || {
            let (cluster, name) = (cluster.clone(), name.clone());
            Box::pin(async move {
                cluster
                    .run("read stream readers", |mut conn| async move {
                        redis::cmd("EXISTS")
                            .arg(name)
                            .query_async::<bool>(&mut conn)
                            .await
                    })
                    .await
                    .unwrap_or(true)
            })
        })
    }

    /// A relay's read without a connection of its own: what the stream holds
    /// after `last_id`, on the shared connection; when it holds nothing new,
    /// after a pause of `EVENTS_POLL`, as a blocking read would have waited.
    async fn poll_events(
        &self,
        name: &str,
        last_id: &str,
    ) -> redis::RedisResult<Option<StreamReadReply>> {
        let (query, after) = (name.to_owned(), last_id.to_owned());
        let reply = self
            .run("poll mirrored events", |mut conn| async move {
                redis::cmd("XREAD")
                    .arg("COUNT")
                    .arg(256)
                    .arg("STREAMS")
                    .arg(query)
                    .arg(after)
                    .query_async::<Option<StreamReadReply>>(&mut conn)
                    .await
            })
            .await
            .map_err(|Unavailable| {
                redis::RedisError::from((redis::ErrorKind::IoError, "Redis is unavailable"))
            })?;
        if reply.as_ref().is_none_or(|reply| reply.keys.is_empty()) {
            tokio::time::sleep(EVENTS_POLL).await;
        }
        Ok(reply)
    }

    /// Says that this instance still reads the mirrored stream `name`
    /// belongs to (best effort).
    async fn touch_readers(&self, name: &str) {
        let name = name.to_owned();
        let ttl_ms = READERS_TTL.as_millis() as u64;
        let _ = self
            .run("mark stream readers", |mut conn| async move {
                redis::cmd("SET")
                    .arg(name)
                    .arg(1)
                    .arg("PX")
                    .arg(ttl_ms)
                    .query_async::<()>(&mut conn)
                    .await
            })
            .await;
    }

    /// Appends event number `seq` under the entry id `{seq + 1}-0` (sealed,
    /// when encryption is on, to its stream, position and kind, so events
    /// cannot be moved, reordered or relabelled). The id numbers the events:
    /// a follower that finds one missing (`MAXLEN` trimmed the head of a
    /// long stream before it joined) fails its stream instead of relaying a
    /// clean end to a stream it did not see whole.
    async fn append_event(
        &self,
        name: &str,
        seq: u64,
        field: &str,
        value: &Bytes,
    ) -> Result<(), Unavailable> {
        let value = self.seal(&event_aad(name, seq, field), value.to_vec());
        let (name, field) = (name.to_owned(), field.to_owned());
        self.run("mirror event", |mut conn| async move {
            redis::pipe()
                .cmd("XADD")
                .arg(&name)
                .arg("MAXLEN")
                .arg("~")
                .arg(EVENTS_MAX_LEN)
                .arg(event_id(seq))
                .arg(field)
                .arg(value)
                .ignore()
                .cmd("PEXPIRE")
                .arg(&name)
                .arg(EVENTS_TTL.as_millis() as u64)
                .ignore()
                .query_async::<()>(&mut conn)
                .await
        })
        .await
    }

    /// A follower's live relay of the owner's mirrored stream into a local
    /// log (made by `new_log`, in the flight's stream format, which the mirror
    /// does not know), published to this instance's flight at the first
    /// event. The events are relayed as they are; the end marker finishes the
    /// log (which adds the format's done event, if it has one) or fails it
    /// with the owner's error event. Returns
    /// when the end marker arrives, the stream stalls, or Redis fails; and,
    /// once `settled` fires (the owner's flight is over: recorded, or its lock
    /// gone), as soon as it has read everything the mirror holds: a mirror
    /// without its end marker then fails the log at once instead of after
    /// `stall_timeout`. While this instance still has callers for the stream
    /// (`interested`: callers waiting on its flight, or readers of the relayed
    /// log), it keeps a heartbeat the owner reads before it cancels an
    /// abandoned stream (`coalesce.cancel_when_abandoned`).
    #[allow(clippy::too_many_arguments)]
    pub async fn relay_events(
        &self,
        key: &CacheKey,
        token: &str,
        publish: impl Fn(StreamLog),
        new_log: impl Fn() -> (StreamLog, StreamWriter),
        interested: impl Fn() -> bool,
        silence: Silence,
        settled: CancellationToken,
    ) {
        let name = self.keys.events(key, token);
        let readers = self.keys.readers(key, token);
        let mut relayed: Option<StreamLog> = None;
        // A connection of its own for blocking reads while places last; past
        // them, non-blocking reads on the shared connection, polled.
        let mut own = match self.relay_connections.clone().try_acquire_owned() {
            Ok(place) => {
                let Ok(Ok(conn)) = tokio::time::timeout(
                    self.config.op_timeout.max(Duration::from_secs(1)),
                    connection::dedicated(&self.config, EVENTS_BLOCK),
                )
                .await
                else {
                    return;
                };
                Some((conn, place))
            }
            Err(_) => None,
        };
        let mut writer: Option<StreamWriter> = None;
        let mut last_id = "0".to_owned();
        let mut last_event = Instant::now();
        let mut seq = 0u64;
        let mut settled_at = None;
        loop {
            if settled_at.is_none() && settled.is_cancelled() {
                settled_at = Some(Instant::now());
            }
            if interested() || relayed.as_ref().is_some_and(|log| log.reader_count() > 0) {
                self.touch_readers(&readers).await;
            }
            let reply: redis::RedisResult<Option<StreamReadReply>> = match &mut own {
                Some((conn, _place)) => {
                    redis::cmd("XREAD")
                        .arg("COUNT")
                        .arg(256)
                        .arg("BLOCK")
                        .arg(EVENTS_BLOCK.as_millis() as u64)
                        .arg("STREAMS")
                        .arg(&name)
                        .arg(&last_id)
                        .query_async(conn)
                        .await
                }
                None => self.poll_events(&name, &last_id).await,
            };
            let Ok(reply) = reply else {
                if let Some(writer) = writer {
                    writer.fail_with("the shared stream was interrupted");
                }
                return;
            };
            for entry in reply.into_iter().flat_map(|r| r.keys).flat_map(|k| k.ids) {
                if entry.id != event_id(seq) {
                    // An event is missing: the stream's head was trimmed before
                    // this relay read it. Never a clean end to a partial stream.
                    let (log, writer) = match writer.take() {
                        Some(writer) => (None, writer),
                        None => {
                            let (log, writer) = new_log();
                            (Some(log), writer)
                        }
                    };
                    if let Some(log) = log {
                        publish(log);
                    }
                    writer.fail_with("the shared stream was trimmed before this reader joined");
                    return;
                }
                last_id = entry.id.clone();
                last_event = Instant::now();
                let opened = entry.map.into_iter().next().and_then(|(field, value)| {
                    let sealed = redis::from_redis_value::<Vec<u8>>(&value).ok()?;
                    let plain = self.open(&event_aad(&name, seq, &field), sealed)?;
                    Some((field, plain))
                });
                seq += 1;
                let Some((field, bytes)) = opened else {
                    // Not an event we wrote (or it does not decrypt): never relay it.
                    if let Some(writer) = writer {
                        writer.fail_with("the shared stream was unreadable");
                    }
                    return;
                };
                let writer_ref = writer.get_or_insert_with(|| {
                    let (log, writer) = new_log();
                    relayed = Some(log.clone());
                    publish(log);
                    writer
                });
                match field.as_str() {
                    "done" => {
                        if let Some(writer) = writer.take() {
                            writer.finish();
                        }
                        return;
                    }
                    "failed" => {
                        if let Some(writer) = writer.take() {
                            writer.fail(Bytes::from(bytes));
                        }
                        return;
                    }
                    _ => {
                        if writer_ref.append(Bytes::from(bytes)).is_err() {
                            return;
                        }
                    }
                }
            }
            // The owner's flight is over, yet its mirror went quiet without an end
            // marker (the owner died mid-stream, or Redis dropped a write): end
            // after a short grace (the owner's mirror task may still be writing
            // its last events), not after the stall timeout.
            if settled_at.is_some_and(|at| last_event.max(at).elapsed() > SETTLED_GRACE) {
                if let Some(writer) = writer {
                    writer.fail_with("the shared stream ended without completing");
                }
                return;
            }
            // Before the first event a model may think for minutes.
            let stall_timeout = match writer {
                Some(_) => silence.between_events,
                None => silence.first_event,
            };
            if last_event.elapsed() > stall_timeout {
                if let Some(writer) = writer {
                    writer.fail_with("the shared stream stalled");
                }
                return;
            }
        }
    }
}

/// The entry id of event number `seq` of a mirrored stream.
fn event_id(seq: u64) -> String {
    format!("{}-0", seq + 1)
}

/// What an event of a mirrored stream is sealed to.
fn event_aad(name: &str, seq: u64, field: &str) -> String {
    format!("{name}#{seq}:{field}")
}

fn reader_at_end(reader: &crate::sse::StreamReader, log: &StreamLog) -> bool {
    reader.position() >= log.len()
}
