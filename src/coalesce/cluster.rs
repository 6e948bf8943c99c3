//! The cluster half of a flight: after the local singleflight picked this
//! instance's owner, it contends for the Redis lock. The winner double-checks
//! the cache, calls upstream under a kept-alive lease, stores, records the
//! outcome, announces it and releases the lock. A loser follows the winner's
//! flight remotely, and contends again if the winner vanishes.
//!
//! Returning `None` means Redis could not be used: the caller falls back to
//! this instance's own upstream call (fail open).

use std::sync::Arc;

use axum::http::{HeaderName, header};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{
    Fetched, FlightContext, Loader, MAX_ELECTIONS, Outcome, Source, StreamPublisher, fresh_entry,
    load_and_store,
};
use crate::{
    cache::{StoredResponse, codec::FlightRecord},
    cluster::{Cluster, Follow, Lease, LockAttempt, Unavailable},
    config::OnWaitTimeout,
    error::{GatewayError, refuses_the_bytes_sent},
    fingerprint::CacheKey,
    request::CachePolicy,
    sse::StreamLog,
};

pub(super) async fn cluster_flight(
    context: &FlightContext,
    cluster: &Arc<Cluster>,
    key: &CacheKey,
    policy: CachePolicy,
    loader: &Loader,
    publisher: &StreamPublisher,
) -> Option<Outcome> {
    let deadline = Instant::now() + context.wait_timeout;
    // Negative caching: a flight for this key failed moments ago somewhere in
    // the cluster; its error answers at once instead of another attempt.
    if !context.error_ttl.is_zero() {
        match cluster.get_record(key).await {
            Err(Unavailable) => return None,
            Ok(Some(record))
                if record.failed
                    && negatively_cacheable(&record)
                    && record.sends == Some(loader.sends) =>
            {
                return Some(outcome_of(record));
            }
            Ok(_) => {}
        }
    }
    for _ in 0..MAX_ELECTIONS {
        match cluster.try_lock(key).await {
            Err(Unavailable) => return None,
            Ok(LockAttempt::Acquired(lease)) => {
                return Some(own(context, cluster, lease, key, policy, loader, publisher).await);
            }
            Ok(LockAttempt::Held(token)) => {
                // A streaming caller here: relay the owner's mirrored events live.
                // `settled` tells the relay the owner's flight is over (recorded, or
                // its lock gone): from then on it reads what the mirror holds and
                // ends, instead of waiting out the stall timeout for events that
                // will never come.
                let settled = CancellationToken::new();
                let relay = publisher.live_format().map(|format| {
                    let (cluster, key, token, publisher, settled) = (
                        cluster.clone(),
                        key.clone(),
                        token.clone(),
                        publisher.clone(),
                        settled.clone(),
                    );
                    let (limits, stall) = (context.stream_limits.clone(), context.stream_silence);
                    tokio::spawn(async move {
                        cluster
                            .relay_events(
                                &key,
                                &token,
                                |log| publisher.publish_remote(log),
                                // The follower's log speaks the flight's format.
                                || StreamLog::with_limits(format, limits.clone()),
                                // Callers here still wait for the stream's answer.
                                || publisher.waiters() > 0,
                                stall,
                                settled,
                            )
                            .await;
                    })
                });
                let followed = cluster.follow(key, token, deadline).await;
                settled.cancel();
                // A relay that never saw an event (the owner did not stream)
                // is not needed; one under way ends at the end marker, or at the
                // end of what the mirror holds, by itself.
                if let Some(relay) = relay
                    && !publisher.published()
                {
                    relay.abort();
                }
                match followed {
                    // The provider refused the other owner's bytes, not this
                    // flight's: its own call (no lock: the owner is done).
                    Follow::Done(record)
                        if record.failed
                            && refuses_the_bytes_sent(record.response.status)
                            && record.sends != Some(loader.sends) =>
                    {
                        return None;
                    }
                    Follow::Done(record) => return Some(outcome_of(record)),
                    // The owner died (its lease expired) or Redis lost the lock: contend again.
                    Follow::Vacant => continue,
                    Follow::Unavailable => return None,
                    // `own_call` holds for a remote owner too: this flight's own call.
                    Follow::TimedOut if context.on_wait_timeout == OnWaitTimeout::OwnCall => {
                        tracing::warn!(fingerprint = ?key.fingerprint, "wait for another instance's flight timed out; calling upstream directly");
                        return None;
                    }
                    Follow::TimedOut => return Some(Err(Arc::new(GatewayError::WaitTimedOut))),
                }
            }
        }
    }
    None
}

/// The cluster owner's part: double-check, call, store, record, announce, release.
async fn own(
    context: &FlightContext,
    cluster: &Arc<Cluster>,
    lease: Lease,
    key: &CacheKey,
    policy: CachePolicy,
    loader: &Loader,
    publisher: &StreamPublisher,
) -> Outcome {
    // Double-check after the lock: the previous owner may have just stored.
    let cached = match policy.read {
        true => fresh_entry(context, key, policy).await,
        false => None,
    };
    let outcome = match cached {
        Some(entry) => Ok(Fetched {
            response: entry.response.clone(),
            stored: false,
            source: Source::Cache {
                stored_at_ms: entry.stored_at_ms,
            },
        }),
        None => {
            // Followers on other instances relay the stream live from Redis.
            let publisher = publisher.mirrored(
                cluster.mirror(key, &lease.token),
                cluster.remote_readers(key, &lease.token),
            );
            cluster
                .holding(
                    &lease,
                    load_and_store(context, key, policy, loader, &publisher),
                )
                .await
        }
    };
    let record = FlightRecord {
        token: lease.token.clone(),
        failed: outcome.is_err(),
        response: match &outcome {
            Ok(fetched) => fetched.response.clone(),
            Err(error) => Arc::new(error_response(error)),
        },
        recorded_at_ms: context.clock.now_ms(),
        sends: Some(loader.sends),
    };
    // Each step is best effort: followers that miss the record or the
    // announcement see the lock go and contend again. A failure local to this
    // instance (its shutdown, its open circuit, its rate or waiter cap) records
    // nothing, so followers elsewhere contend again at once instead of sharing
    // (and negatively caching) an error that is not theirs.
    let local = matches!(&outcome, Err(error) if error.is_local_to_instance());
    if !local {
        let _ = cluster.put_record(key, &record, context.error_ttl).await;
    }
    let _ = cluster.announce(key).await;
    let _ = cluster.release(&lease).await;
    outcome
}

/// Whether a failed flight's record may answer later requests at once. A
/// provider's 401 or 403 is about a credential, which can become valid at any
/// moment (a key just created, a permission just granted): the record still
/// ends the waits of the flight's own followers, but the next request asks
/// the provider again.
fn negatively_cacheable(record: &FlightRecord) -> bool {
    !matches!(record.response.status.as_u16(), 401 | 403)
}

fn error_response(error: &GatewayError) -> StoredResponse {
    let (status, headers, body) = error.parts();
    let keep: [HeaderName; 2] = [header::CONTENT_TYPE, header::RETRY_AFTER];
    StoredResponse {
        status,
        headers: keep
            .into_iter()
            .filter_map(|name| {
                headers
                    .get(&name)
                    .map(|value| (name.clone(), value.clone()))
            })
            .collect(),
        body,
        usage: None,
    }
}

/// What a follower makes of another instance's record.
fn outcome_of(record: FlightRecord) -> Outcome {
    if !record.failed {
        return Ok(Fetched {
            response: record.response,
            stored: false,
            source: Source::OtherInstance,
        });
    }
    let header = |name: HeaderName| {
        record
            .response
            .headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, value)| value.clone())
    };
    Err(Arc::new(GatewayError::Upstream {
        status: record.response.status,
        content_type: header(header::CONTENT_TYPE),
        retry_after: header(header::RETRY_AFTER),
        body: record.response.body.clone(),
    }))
}
