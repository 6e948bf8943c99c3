//! How a streamed answer reaches the client: the silence before its first event and the pause
//! between two events, the deliberate cut after the first content chunk, padding to a size, and
//! the hold before the final event.
//!
//! Padding and the end hold are for memory benchmarks of a gateway. A gateway keeps what a live
//! stream relayed until the stream ends, so a benchmark needs streams of a known size that stay
//! live, all of them at once, while it measures: it sets the padding, holds stream ends, waits
//! until [`MockProvider::streams_at_end`](super::MockProvider::streams_at_end) counts every
//! stream (an event to wait for, not a guess at how long sending takes), measures, and releases
//! them. A padded stream is still the provider's wire format: the padding is more content chunks
//! of the same choice (chat) or candidate (Gemini), one word each, as a model sends its tokens.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::HeaderValue;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::Response;
use bytes::Bytes;
use futures::{Stream, StreamExt as _};

use super::Shared;
use super::openai::{PadChunk, SseEvents};

/// Padding goes out in frames of about this many bytes, several chunks each: the same SSE
/// events on the wire in fewer writes, so a mock can send hundreds of megabytes quickly.
const PAD_FRAME_BYTES: usize = 64 * 1024;

/// The words padding text is made of, one per chunk.
const PAD_WORDS: [&str; 8] = [
    " the", " quick", " brown", " fox", " jumps", " over", " a", " lazy",
];

/// How one streamed answer is delivered.
#[derive(Debug, Clone, Copy)]
pub(super) struct Delivery {
    /// Silence before the first event.
    pub(super) first: Duration,
    /// Pause between two of the answer's own events (padding is not paced).
    pub(super) delay: Duration,
    /// Stop after the first content event by failing the body.
    pub(super) truncate: bool,
    /// Pad a stream that can be padded until its body is at least this many bytes; 0 leaves it.
    pub(super) pad_to: usize,
}

/// Whether stream ends are held, who waits at one now, and a generation bumped on every
/// release (a stream that arrived in a hold waits for that hold to end, so a release followed
/// at once by a new hold still lets it go).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct StreamEnds {
    pub(super) held: bool,
    pub(super) generation: u64,
    /// Streams that sent everything but their final event and wait to send it.
    pub(super) waiting: usize,
    /// The bytes those streams sent before their final event.
    pub(super) waiting_bytes: u64,
}

/// What [`MockProvider::streams_at_end`](super::MockProvider::streams_at_end) reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamsAtEnd {
    /// Streams that sent everything but their final event and wait for a release.
    pub streams: usize,
    /// Body bytes those streams sent so far, together.
    pub bytes: u64,
}

impl Shared {
    pub(super) fn set_stream_ends_held(&self, held: bool) {
        self.stream_ends.send_modify(|state| {
            if state.held && !held {
                state.generation += 1;
            }
            state.held = held;
        });
    }

    pub(super) fn streams_at_end(&self) -> StreamsAtEnd {
        let state = *self.stream_ends.borrow();
        StreamsAtEnd {
            streams: state.waiting,
            bytes: state.waiting_bytes,
        }
    }

    /// Wait until at least `n` streams wait at their end, the timeout passes or the server
    /// stops; true if reached.
    pub(super) async fn wait_for_streams_at_end(&self, n: usize, timeout: Duration) -> bool {
        let mut ends = self.stream_ends.subscribe();
        tokio::select! {
            reached = tokio::time::timeout(timeout, ends.wait_for(|s| s.waiting >= n)) => {
                matches!(reached, Ok(Ok(_)))
            }
            () = self.stopping.cancelled() => self.streams_at_end().streams >= n,
        }
    }

    /// Called by a stream that sent `bytes`, all but its final event: returns at once unless
    /// stream ends are held, else when that hold is released (or the server stops).
    async fn wait_at_stream_end(&self, bytes: u64) {
        let mut generation = None;
        self.stream_ends.send_if_modified(|state| {
            if !state.held {
                return false;
            }
            generation = Some(state.generation);
            state.waiting += 1;
            state.waiting_bytes += bytes;
            true
        });
        let Some(generation) = generation else {
            return;
        };
        // Counted out however the wait ends, the client's disconnect (a dropped body) included.
        let _waiting = Waiting {
            shared: self,
            bytes,
        };
        let mut ends = self.stream_ends.subscribe();
        tokio::select! {
            _ = ends.wait_for(|state| !state.held || state.generation != generation) => {}
            () = self.stopping.cancelled() => {}
        }
    }
}

/// One stream counted in [`StreamEnds::waiting`] until dropped.
struct Waiting<'a> {
    shared: &'a Shared,
    bytes: u64,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.shared.stream_ends.send_modify(|state| {
            state.waiting = state.waiting.saturating_sub(1);
            state.waiting_bytes = state.waiting_bytes.saturating_sub(self.bytes);
        });
    }
}

/// The streamed response of `events` (SSE, or Gemini's streamed JSON array: the same knobs
/// apply to both), delivered as `delivery` says; its final event waits while stream ends are
/// held.
pub(super) fn sse_response(shared: Arc<Shared>, events: SseEvents, delivery: Delivery) -> Response {
    let SseEvents {
        mut events,
        content_type,
        first_content,
        padding,
    } = events;
    let Delivery {
        first,
        delay,
        truncate,
        pad_to,
    } = delivery;
    let starts = Arc::clone(&shared);
    let paced = move |(index, event): (usize, Bytes)| {
        let starts = Arc::clone(&starts);
        async move {
            if index == 0 {
                starts.wait_at_stream_start().await;
            }
            paced_event(index, event, first, delay).await
        }
    };
    let body = if truncate {
        events.truncate(first_content + 1);
        let frames = futures::stream::iter(events.into_iter().enumerate()).then(paced);
        let cut = futures::stream::once(async {
            // Returning Pending once lets hyper flush what was written before the connection is
            // dropped; without it, the last content event could be lost with the socket.
            tokio::task::yield_now().await;
            Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "mock provider truncated the stream",
            ))
        });
        Body::from_stream(frames.chain(cut))
    } else {
        let mut head: Vec<(usize, Bytes)> = events.into_iter().enumerate().collect();
        let last = head.pop();
        let tail = head.split_off((first_content + 1).min(head.len()));
        let before_last: usize = head.iter().chain(&tail).map(|(_, e)| e.len()).sum();
        let natural = before_last + last.as_ref().map_or(0, |(_, e)| e.len());
        let pad = padding
            .filter(|_| pad_to > natural)
            .map(|chunk| Pad::new(chunk, pad_to - natural));
        let before_end = before_last + pad.as_ref().map_or(0, |pad| pad.total);
        let end = futures::stream::once(async move {
            shared.wait_at_stream_end(before_end as u64).await;
        })
        .filter_map(|()| async { None });
        let frames = futures::stream::iter(head)
            .then(paced.clone())
            .chain(futures::stream::iter(pad.map(Pad::frames)).flatten())
            .chain(futures::stream::iter(tail).then(paced.clone()))
            .chain(end)
            .chain(futures::stream::iter(last).then(paced));
        Body::from_stream(frames)
    };
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// One of a stream's own events, after the silence before it: `first` before the first,
/// `delay` before each other.
async fn paced_event(
    index: usize,
    event: Bytes,
    first: Duration,
    delay: Duration,
) -> Result<Bytes, io::Error> {
    if index == 0 && !first.is_zero() {
        tokio::time::sleep(first).await;
    }
    if index > 0 && !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    Ok(event)
}

/// The padding of one stream: chunks of one word each until they add up to at least the
/// bytes asked for.
struct Pad {
    chunk: PadChunk,
    /// Chunks to send.
    chunks: usize,
    /// Bytes those chunks make together.
    total: usize,
}

impl Pad {
    fn new(chunk: PadChunk, at_least: usize) -> Self {
        let frame = chunk.before.len() + chunk.after.len();
        let (mut chunks, mut total) = (0, 0);
        while total < at_least {
            total += frame + PAD_WORDS[chunks % PAD_WORDS.len()].len();
            chunks += 1;
        }
        Self {
            chunk,
            chunks,
            total,
        }
    }

    /// The chunks, several to a frame, made as they are sent.
    fn frames(self) -> impl Stream<Item = Result<Bytes, io::Error>> + Send {
        futures::stream::unfold((self, 0), |(pad, mut next)| async move {
            if next == pad.chunks {
                return None;
            }
            let mut frame = Vec::with_capacity(PAD_FRAME_BYTES + 64);
            while next < pad.chunks && frame.len() < PAD_FRAME_BYTES {
                pad.chunk
                    .with(PAD_WORDS[next % PAD_WORDS.len()], &mut frame);
                next += 1;
            }
            Some((Ok(Bytes::from(frame)), (pad, next)))
        })
    }
}

#[cfg(test)]
#[path = "delivery_tests.rs"]
mod tests;
