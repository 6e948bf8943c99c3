//! [`relay`]: the provider's SSE body into a [`StreamLog`], one canonical event at a time.
//!
//! Each event is read by the log's [`StreamFormat`](super::StreamFormat) (the API's adapter),
//! which checks it and frames it in corral's one framing (whatever line endings, spacing,
//! comments or multi-line data the provider used), so that every reader and every cached replay
//! gets the same bytes. The format says which event completes the stream (chat: `data: [DONE]`;
//! Responses: `response.completed`), or whether a stream that ended is complete (Gemini: every
//! candidate finished before the body ended). Anything else that ends it is a broken stream: the body
//! ends first, an event is malformed, no event arrives within the stall timeout, reading fails,
//! the body grows past the log's bound, or the provider sends its own error (or failure) event.
//! Every reader then receives an error event in the API's shape (the provider's own, in the last
//! case) as its last event, and the summary says the stream must not be cached.

use std::error::Error as StdError;
use std::pin::pin;
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use futures::{Stream, StreamExt as _};
use sse_stream::SseByteStream;

use super::format::Frame;
use super::log::{AppendError, StreamWriter};
use crate::usage::Usage;

/// Why a stream did not complete. `Display` is the message clients receive in the error
/// event; `detail` fields are for logs only.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BrokenStream {
    #[error("the upstream stream ended before its completing event")]
    EndedWithoutDone,
    #[error("the upstream stream sent no event for {0:?}")]
    Stalled(Duration),
    /// The stream as a whole ran past its total deadline (`request_timeout`).
    #[error("the upstream stream did not complete within {0:?}")]
    DeadlineExceeded(Duration),
    #[error("the upstream stream sent a malformed event")]
    Malformed { detail: String },
    #[error("reading the upstream stream failed")]
    Transport { detail: String },
    #[error("the upstream stream exceeded the gateway's limit of {max_bytes} bytes")]
    TooLarge { max_bytes: usize },
    /// The provider sent an error event; it is relayed as it came.
    #[error("the upstream stream sent an error event")]
    UpstreamError,
    /// The writer was dropped before the stream ended (the flight was cancelled).
    #[error("the upstream stream was cancelled before it ended")]
    Abandoned,
}

/// How long a stream may be silent: before its first event (a reasoning model
/// thinks first, for minutes), and between two events after that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Silence {
    pub first_event: Duration,
    pub between_events: Duration,
}

impl From<Duration> for Silence {
    /// One bound for every wait.
    fn from(bound: Duration) -> Self {
        Self {
            first_event: bound,
            between_events: bound,
        }
    }
}

/// How a relayed stream ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RelayOutcome {
    /// The completing event arrived (chat: `[DONE]`): the stream may be cached.
    Completed,
    /// Readers received an error event; nothing may be cached.
    Broken(BrokenStream),
}

/// What a finished relay leaves behind for the flight.
#[derive(Debug, Clone)]
pub struct RelaySummary {
    pub outcome: RelayOutcome,
    /// Every event of the log, terminal event included, as a caller who asked for usage
    /// received them (handles to the log's bytes). What the cache stores when `Completed`.
    pub events: Vec<Bytes>,
    /// The token counts of the last chunk that carried non-null `usage`, if any did.
    pub usage: Option<Usage>,
}

impl RelaySummary {
    /// Whether the stream completed.
    pub fn completed(&self) -> bool {
        self.outcome == RelayOutcome::Completed
    }
}

/// Relays the body of a successful streamed upstream response. Checking the status (and
/// retrying) is the caller's business and happens before: nothing is retried once an event
/// may have reached a reader.
///
/// `total` bounds the whole stream from now: past it, the stream is broken however
/// steadily events arrive (a provider that drips an event every few seconds would
/// otherwise hold the flight, and its Redis lock, for as long as it drips).
pub async fn relay_response(
    response: reqwest::Response,
    writer: StreamWriter,
    silence: impl Into<Silence>,
    total: Duration,
) -> RelaySummary {
    // Errors without their URL: a query may carry a credential.
    let body = response
        .bytes_stream()
        .map(|chunk| chunk.map_err(reqwest::Error::without_url));
    relay_until(body, writer, silence, Some(total)).await
}

/// Reads `body` as SSE into the writer's log until its completing event or a broken stream, then ends the
/// log (complete or failed) and returns the summary.
///
/// `silence` bounds the wait for the first event and for each one after. Comments (such as
/// keep-alives) are not events: they do not count as progress. The raw body is bounded by the
/// log's `max_bytes` too, because the parser buffers an incomplete line in memory until it
/// ends. Once the completing event arrives the rest of the body is not read. Dropping the returned future
/// drops the writer, which fails the log for its readers.
pub async fn relay<S, E>(body: S, writer: StreamWriter, silence: impl Into<Silence>) -> RelaySummary
where
    S: Stream<Item = Result<Bytes, E>>,
    E: Into<Box<dyn StdError + Send + Sync>>,
{
    relay_until(body, writer, silence, None).await
}

/// As [`relay`], and the whole stream must end within `total` from now.
pub async fn relay_until<S, E>(
    body: S,
    writer: StreamWriter,
    silence: impl Into<Silence>,
    total: Option<Duration>,
) -> RelaySummary
where
    S: Stream<Item = Result<Bytes, E>>,
    E: Into<Box<dyn StdError + Send + Sync>>,
{
    let deadline = total.map(|total| (Instant::now() + total, total));
    let log = writer.log();
    let max_bytes = log.max_bytes();
    let mut read = 0_usize;
    let input = body.map(move |chunk| {
        let chunk = chunk.map_err(|error| ReadError::Transport(error.into()))?;
        read = read.saturating_add(chunk.len());
        if read > max_bytes {
            return Err(ReadError::TooLarge);
        }
        Ok(chunk)
    });
    let mut usage = None;
    let (outcome, terminal) =
        read_events(input, writer, silence.into(), deadline, &mut usage).await;
    if let Some((writer, event)) = terminal {
        writer.fail(event);
    }
    RelaySummary {
        outcome,
        events: log.events(),
        usage,
    }
}

/// The relay's loop. Returns the outcome and, for a broken stream whose log has not ended yet,
/// the writer with the error event to end it with; a completed log is finished here.
async fn read_events<S>(
    input: S,
    mut writer: StreamWriter,
    silence: Silence,
    deadline: Option<(Instant, Duration)>,
    usage_out: &mut Option<Usage>,
) -> (RelayOutcome, Option<(StreamWriter, Bytes)>)
where
    S: Stream<Item = Result<Bytes, ReadError>>,
{
    let max_bytes = writer.log().max_bytes();
    let format = writer.log().format();
    let mut events = pin!(SseByteStream::new(input));
    let mut spoke = false;
    let broken = loop {
        let stall_timeout = if spoke {
            silence.between_events
        } else {
            silence.first_event
        };
        let stall_at = Instant::now() + stall_timeout;
        let wait_until = deadline.map_or(stall_at, |(at, _)| at.min(stall_at));
        let next = match tokio::time::timeout_at(wait_until, events.next()).await {
            Ok(next) => next,
            Err(_) => match deadline {
                Some((at, total)) if at <= stall_at => break BrokenStream::DeadlineExceeded(total),
                _ => break BrokenStream::Stalled(stall_timeout),
            },
        };
        let sse = match next {
            None if format.complete_at_end(&writer.log().events()) => {
                writer.finish();
                return (RelayOutcome::Completed, None);
            }
            None => break BrokenStream::EndedWithoutDone,
            Some(Err(error)) => break classify(error, max_bytes),
            Some(Ok(sse)) => sse,
        };
        let Some(data) = sse.data else {
            // A block with only `id:`/`retry:`/`event:` fields carries nothing to relay.
            continue;
        };
        // A completing frame's event (if any) is appended like any other, then the log is
        // finished.
        let (event, counts, completes) = match format.read(sse.event.as_deref(), &data) {
            Frame::Event { event, usage } => (Some(event), usage, false),
            Frame::Skip => continue,
            Frame::Complete { event, usage } => (event, usage, true),
            Frame::Failed(event) => {
                return (
                    RelayOutcome::Broken(BrokenStream::UpstreamError),
                    Some((writer, event)),
                );
            }
            Frame::Malformed(detail) => break BrokenStream::Malformed { detail },
        };
        if counts.is_some() {
            *usage_out = counts;
        }
        spoke = true;
        if let Some(event) = event {
            match writer.append(event) {
                Ok(()) => {}
                // The log failed itself with its own error event; nothing more to append.
                Err(AppendError::Full { max_bytes }) => {
                    return (
                        RelayOutcome::Broken(BrokenStream::TooLarge { max_bytes }),
                        None,
                    );
                }
                // Only this relay ends the log, so it cannot have ended under it.
                Err(AppendError::Ended) => break BrokenStream::Abandoned,
            }
        }
        if completes {
            writer.finish();
            return (RelayOutcome::Completed, None);
        }
    };
    let event = writer.log().error_event(&broken.to_string());
    (RelayOutcome::Broken(broken), Some((writer, event)))
}

/// An error of the byte stream under the SSE parser.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error("reading the upstream body failed: {0}")]
    Transport(#[source] Box<dyn StdError + Send + Sync>),
    #[error("the upstream body exceeded the log's bound")]
    TooLarge,
}

fn classify(error: sse_stream::Error, max_bytes: usize) -> BrokenStream {
    match error {
        sse_stream::Error::Body(source) => match source.downcast::<ReadError>() {
            Ok(read) => match *read {
                ReadError::TooLarge => BrokenStream::TooLarge { max_bytes },
                ReadError::Transport(source) => BrokenStream::Transport {
                    detail: error_chain(&*source),
                },
            },
            Err(other) => BrokenStream::Transport {
                detail: error_chain(&*other),
            },
        },
        sse_stream::Error::Utf8Parse(error) => BrokenStream::Malformed {
            detail: format!("invalid UTF-8: {error}"),
        },
        // `UnknownField` (the crate's `strict-fields` feature) and future variants.
        other => BrokenStream::Malformed {
            detail: other.to_string(),
        },
    }
}

/// `error` and its sources, as one line for logs.
fn error_chain(error: &(dyn StdError + 'static)) -> String {
    let mut line = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        line.push_str(": ");
        line.push_str(&cause.to_string());
        source = cause.source();
    }
    line
}
