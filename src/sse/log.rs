//! [`StreamLog`]: the append-only log of one upstream stream, shared by every caller of a
//! flight.
//!
//! The log keeps every event of the stream, so a reader is only a cursor into it: a caller
//! that joins late replays everything so far at once and then follows the live tail, a slow
//! caller falls behind without holding anyone up (the writer never waits for a reader, and
//! readers never wait for each other), and memory grows with the stream, not with the number
//! of callers. What was traded away: a stream's events stay in memory until its last handle
//! is dropped, which is why the log is bounded ([`StreamLog::new`]'s `max_bytes`).
//!
//! The events live in a `tokio::sync::watch` channel: an append is one short write lock plus
//! a wake-up of the readers that are waiting; a reader takes the read lock only to clone the
//! `Bytes` handle under its cursor.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use futures::Stream;
use tokio::sync::watch;

use super::format::Format;
use super::packed::{PackedEvent, PackedEvents, Piece};
use super::relay::BrokenStream;
use super::usage::CallerUsage;

/// How a stream ended; the terminal event is also the last event of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogEnd {
    /// Complete: the last event is the format's done event (chat: `data: [DONE]`), or, for a
    /// format without one, the completing event itself.
    Done,
    /// Broken: the last event is this error event (in the API's shape).
    Failed(Bytes),
}

/// Why an event was not appended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AppendError {
    /// The log already ended (`Done` or `Failed`); nothing more is accepted.
    #[error("the stream log has already ended")]
    Ended,
    /// The event would take the log past its bound; the log is now `Failed`.
    #[error("the stream log would exceed {max_bytes} bytes")]
    Full { max_bytes: usize },
}

/// The shared log of one stream. Cheap to clone: clones share the log.
///
/// Made by [`StreamLog::new`] together with its one [`StreamWriter`]; the flight keeps a
/// clone so that every caller that joins can take a [`reader`](Self::reader).
#[derive(Debug, Clone)]
pub struct StreamLog {
    shared: Arc<LogCore>,
}

#[derive(Debug)]
struct LogCore {
    state: watch::Sender<LogState>,
    readers: watch::Sender<ReaderCount>,
    max_bytes: usize,
    /// A reader further behind the live tail than this is cut (`usize::MAX`: never).
    max_reader_lag: usize,
    /// Where the log's bytes are counted while it lives.
    tally: Option<LogBytes>,
    /// The API whose events these are: its done and error events.
    format: Format,
}

impl Drop for LogCore {
    fn drop(&mut self) {
        if let Some(tally) = &self.tally {
            tally.sub(self.state.borrow().bytes);
        }
    }
}

/// The bytes held by every stream log of one gateway, live and finished, until
/// the last handle (writer, flight, reader) of each is gone: what `/stats`
/// reports as `stream_log_bytes`. Cheap to clone; clones share the count.
#[derive(Debug, Clone, Default)]
pub struct LogBytes(Arc<AtomicUsize>);

impl LogBytes {
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }

    fn add(&self, bytes: usize) {
        self.0.fetch_add(bytes, Ordering::Relaxed);
    }

    fn sub(&self, bytes: usize) {
        self.0.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// How a log is bounded and counted.
#[derive(Debug, Clone)]
pub struct LogLimits {
    /// The whole log's bound (see [`StreamLog::new`]).
    pub max_bytes: usize,
    /// A reader that falls further behind the live tail than this gets an
    /// error event and ends, instead of pinning the log for as long as it dawdles.
    pub max_reader_lag: usize,
    pub tally: Option<LogBytes>,
}

#[derive(Debug)]
struct LogState {
    entries: PackedEvents,
    /// Bytes held by `entries` (a usage-free view that is a cut of its event holds none).
    bytes: usize,
    end: Option<LogEnd>,
}

impl LogState {
    /// `pack`: a live log copies its events into shared blocks (see `packed.rs`).
    fn new(pack: bool) -> Self {
        Self {
            entries: PackedEvents::new(pack),
            bytes: 0,
            end: None,
        }
    }
}

/// Readers alive now, and whether any ever joined (so that a log nobody has read yet does not
/// count as abandoned).
#[derive(Debug, Clone, Copy, Default)]
struct ReaderCount {
    live: usize,
    joined: bool,
}

impl StreamLog {
    /// An empty log of `format`'s events, bounded by `limits`, and its one writer.
    pub fn with_limits(format: Format, limits: LogLimits) -> (StreamLog, StreamWriter) {
        StreamLog::build(format, limits, true)
    }

    fn build(format: Format, limits: LogLimits, pack: bool) -> (StreamLog, StreamWriter) {
        let shared = Arc::new(LogCore {
            state: watch::Sender::new(LogState::new(pack)),
            readers: watch::Sender::new(ReaderCount::default()),
            max_bytes: limits.max_bytes,
            max_reader_lag: limits.max_reader_lag,
            tally: limits.tally,
            format,
        });
        let log = StreamLog {
            shared: Arc::clone(&shared),
        };
        (log, StreamWriter { shared })
    }

    /// A finished log of a complete stream of `format`'s events, for serving a cached stream
    /// through the same readers as a live one. A trailing done event (chat: `[DONE]`) in
    /// `events` is optional.
    /// Its events are kept as given (shared handles already), not packed.
    pub fn replay(format: Format, events: impl IntoIterator<Item = Bytes>) -> StreamLog {
        let (log, mut writer) = StreamLog::build(
            format,
            LogLimits {
                max_bytes: usize::MAX,
                max_reader_lag: usize::MAX,
                tally: None,
            },
            false,
        );
        let done = format.done_event();
        for event in events {
            if done.as_ref() == Some(&event) {
                break;
            }
            // Cannot fail: the log is unbounded and has not ended.
            let _ = writer.append(event);
        }
        writer.finish();
        log
    }

    /// A new cursor at the first event, for a caller whose own request asked (or not) for usage.
    pub fn reader(&self, usage: CallerUsage) -> StreamReader {
        self.shared.readers.send_modify(|count| {
            count.live += 1;
            count.joined = true;
        });
        self.cursor(usage, true)
    }

    /// A cursor for the stream's mirror into Redis: it reads every event, and
    /// is cut behind like any reader, but is not a caller, so it keeps no
    /// stream alive (`abandoned`): the callers it relays to elsewhere say
    /// whether they are still there themselves.
    pub fn mirror_reader(&self) -> StreamReader {
        self.cursor(CallerUsage::Asked, false)
    }

    fn cursor(&self, usage: CallerUsage, counted: bool) -> StreamReader {
        let state = self.shared.state.subscribe();
        let joined_at = state.borrow().bytes;
        StreamReader {
            state,
            cursor: 0,
            read: 0,
            joined_at,
            cut: false,
            usage,
            counted,
            shared: Arc::clone(&self.shared),
        }
    }

    /// Readers alive now.
    pub fn reader_count(&self) -> usize {
        self.shared.readers.borrow().live
    }

    /// Resolves once the last reader is gone (at once if readers came and all went); never
    /// while no reader has joined yet. For `coalesce.cancel_when_abandoned`: the flight races
    /// its relay against this and drops the relay, which fails the log, when it resolves. A
    /// caller that joins after that still gets the events so far and then the error event.
    pub async fn abandoned(&self) {
        let mut readers = self.shared.readers.subscribe();
        // The sender lives in `shared`, which `self` keeps alive: this cannot fail.
        let _ = readers
            .wait_for(|count| count.joined && count.live == 0)
            .await;
    }

    /// Ends a live stream from outside its writer (shutdown cuts it): every reader gets
    /// `error_event` last. A no-op on a log that has ended; the writer's later appends fail.
    pub fn interrupt(&self, error_event: Bytes) {
        let tally = self.shared.tally.as_ref();
        self.shared.state.send_if_modified(|state| {
            if state.end.is_some() {
                return false;
            }
            terminate(
                state,
                LogEnd::Failed(error_event),
                self.shared.format,
                tally,
            );
            true
        });
    }

    /// The API whose events the log holds.
    pub fn format(&self) -> Format {
        self.shared.format
    }

    /// An error event in the log's format, numbered after the events so far.
    pub fn error_event(&self, message: &str) -> Bytes {
        self.shared.format.error_event(message, self.len())
    }

    /// How the stream ended, if it has.
    pub fn end(&self) -> Option<LogEnd> {
        self.shared.state.borrow().end.clone()
    }

    /// Waits until the stream ends, and tells how.
    pub async fn ended(&self) -> LogEnd {
        let mut state = self.shared.state.subscribe();
        loop {
            if let Some(end) = state.borrow_and_update().end.clone() {
                return end;
            }
            if state.changed().await.is_err() {
                // Unreachable: `self` keeps the sender alive.
                return LogEnd::Failed(self.error_event(&BrokenStream::Abandoned.to_string()));
            }
        }
    }

    /// Every event so far (terminal event included), as a caller who asked for usage sees them:
    /// handles, not copies. For the cache once the stream is `Done`.
    pub fn events(&self) -> Vec<Bytes> {
        let state = self.shared.state.borrow();
        state
            .entries
            .iter()
            .map(|entry| entry.event().clone())
            .collect()
    }

    /// Events in the log, terminal event included.
    pub fn len(&self) -> usize {
        self.shared.state.borrow().entries.len()
    }

    /// Whether no event has been appended yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the log holds: its events (and a usage-free view only where it is not a cut of
    /// its event).
    pub fn bytes(&self) -> usize {
        self.shared.state.borrow().bytes
    }

    /// The bound given to [`StreamLog::new`].
    pub fn max_bytes(&self) -> usize {
        self.shared.max_bytes
    }
}

/// The one writer of a [`StreamLog`].
///
/// Dropping it before [`finish`](Self::finish) or [`fail`](Self::fail) (the relay was
/// cancelled, or its task panicked) fails the log, so readers get an error event instead of
/// waiting for ever; the same idea as a cache lock whose dropped write permit lets waiters go.
#[derive(Debug)]
pub struct StreamWriter {
    shared: Arc<LogCore>,
}

impl StreamWriter {
    /// A handle to the log this writer appends to.
    pub fn log(&self) -> StreamLog {
        StreamLog {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Appends one event (a complete frame in corral's framing) and wakes the readers.
    ///
    /// Past the log's bound the event is not appended and the log fails with an error event.
    pub fn append(&mut self, event: Bytes) -> Result<(), AppendError> {
        let format = self.shared.format;
        let usage_free = format.usage_free(&event);
        let entry = PackedEvent::new(event, usage_free);
        let max_bytes = self.shared.max_bytes;
        let mut result = Ok(());
        self.shared.state.send_if_modified(|state| {
            if state.end.is_some() {
                result = Err(AppendError::Ended);
                return false;
            }
            let bytes = state.bytes.saturating_add(entry.bytes());
            if bytes > max_bytes {
                result = Err(AppendError::Full { max_bytes });
                let broken = BrokenStream::TooLarge { max_bytes };
                let event = format.error_event(&broken.to_string(), state.entries.len());
                terminate(
                    state,
                    LogEnd::Failed(event),
                    format,
                    self.shared.tally.as_ref(),
                );
                return true;
            }
            if let Some(tally) = &self.shared.tally {
                tally.add(entry.bytes());
            }
            state.bytes = bytes;
            state.entries.push(entry);
            true
        });
        result
    }

    /// Ends the stream as complete: appends the format's done event (chat: `data: [DONE]`),
    /// if it has one.
    pub fn finish(self) {
        self.end(LogEnd::Done);
    }

    /// Ends the stream as broken: appends `error_event` (in the log's format: see
    /// [`StreamLog::error_event`]), which every reader receives last.
    pub fn fail(self, error_event: Bytes) {
        self.end(LogEnd::Failed(error_event));
    }

    /// Ends the stream as broken with the log's own error event carrying `message`.
    pub fn fail_with(self, message: &str) {
        let event = self.log().error_event(message);
        self.fail(event);
    }

    /// A no-op when the log has already ended (for instance because it filled up).
    fn end(&self, end: LogEnd) {
        self.shared.state.send_if_modified(|state| {
            if state.end.is_some() {
                return false;
            }
            terminate(state, end, self.shared.format, self.shared.tally.as_ref());
            true
        });
    }
}

impl Drop for StreamWriter {
    fn drop(&mut self) {
        if self.shared.state.borrow().end.is_some() {
            return;
        }
        let abandoned = self.log().error_event(&BrokenStream::Abandoned.to_string());
        self.end(LogEnd::Failed(abandoned));
    }
}

/// Appends the terminal event (none for a complete stream of a format without a done event)
/// and records the end. The terminal event is accepted past the bound: it is small, and
/// without it readers would not learn why their stream stopped.
fn terminate(state: &mut LogState, end: LogEnd, format: Format, tally: Option<&LogBytes>) {
    let event = match &end {
        LogEnd::Done => format.done_event(),
        LogEnd::Failed(event) => Some(event.clone()),
    };
    let Some(event) = event else {
        state.end = Some(end);
        return;
    };
    let entry = PackedEvent::terminal(event);
    if let Some(tally) = tally {
        tally.add(entry.bytes());
    }
    state.bytes = state.bytes.saturating_add(entry.bytes());
    state.entries.push(entry);
    state.end = Some(end);
}

/// A caller's cursor into a [`StreamLog`]: every event from the first, then the live tail,
/// then nothing after the terminal event. Holds a position, never a copy of the events.
#[derive(Debug)]
pub struct StreamReader {
    state: watch::Receiver<LogState>,
    cursor: usize,
    /// Bytes of the entries this reader passed (its position in the log's byte count).
    read: usize,
    /// The log's size when this reader joined: what was there already is replayed from
    /// memory and does not count as lag (a late joiner is not a slow one).
    joined_at: usize,
    /// Cut for lagging: its error event was its last.
    cut: bool,
    usage: CallerUsage,
    /// A caller's reader (counted in `readers`), not the mirror's.
    counted: bool,
    shared: Arc<LogCore>,
}

impl StreamReader {
    /// The next event for this caller, waiting for the writer if the reader is caught up;
    /// `None` after the terminal event.
    ///
    /// A reader more than the log's `max_reader_lag` bytes behind a live stream gets an
    /// error event instead, and then `None`: a client that reads slower than the provider
    /// writes is told so, rather than keeping the log alive for as long as it dawdles.
    ///
    /// A usage-free view the log keeps as a cut of its event is joined into a copy here;
    /// [`into_stream`](Self::into_stream), what callers' bodies read, sends its two slices
    /// instead.
    pub async fn next_event(&mut self) -> Option<Bytes> {
        self.next_piece().await.map(Piece::joined)
    }

    async fn next_piece(&mut self) -> Option<Piece> {
        if self.cut {
            return None;
        }
        loop {
            {
                // Marking the version seen before looking means an append that lands after
                // this look wakes the `changed` below: no event can slip between the two.
                let state = self.state.borrow_and_update();
                if state.end.is_none() {
                    let lag = state.bytes - self.read.max(self.joined_at);
                    if lag > self.shared.max_reader_lag {
                        self.cut = true;
                        let message = format!(
                            "this client fell more than {} bytes behind the stream",
                            self.shared.max_reader_lag
                        );
                        let event = self.shared.format.error_event(&message, self.cursor);
                        return Some(Piece::Whole(event));
                    }
                }
                while let Some(entry) = state.entries.get(self.cursor) {
                    self.cursor += 1;
                    self.read += entry.bytes();
                    if let Some(piece) = entry.view(self.usage) {
                        return Some(piece);
                    }
                }
                if state.end.is_some() {
                    return None;
                }
            }
            if self.state.changed().await.is_err() {
                // Unreachable: `self.shared` keeps the sender alive.
                return None;
            }
        }
    }

    /// Entries of the log this reader has passed (skipped ones included).
    pub fn position(&self) -> usize {
        self.cursor
    }

    /// The reader as a body stream, for `axum::body::Body::from_stream`. The reader (and so
    /// the reader count) lives as long as the stream: a client that disconnects drops it.
    ///
    /// An event whose usage-free view is a cut comes as its two slices, one right after the
    /// other (the second is ready at once, so nothing, a keep-alive included, goes between).
    pub fn into_stream(self) -> impl Stream<Item = Result<Bytes, Infallible>> + Send + 'static {
        futures::stream::unfold((self, None), |(mut reader, pending)| async move {
            if let Some(tail) = pending {
                return Some((Ok(tail), (reader, None)));
            }
            match reader.next_piece().await? {
                Piece::Whole(event) => Some((Ok(event), (reader, None))),
                Piece::Cut(head, tail) => Some((Ok(head), (reader, Some(tail)))),
            }
        })
    }
}

impl Drop for StreamReader {
    fn drop(&mut self) {
        if self.counted {
            self.shared
                .readers
                .send_modify(|count| count.live = count.live.saturating_sub(1));
        }
    }
}
