//! Tests of the streaming building blocks. Waits are on events (the log's own wake-ups,
//! `now_or_never` for "not yet"); time only ever moves on a paused clock.

mod convert;
mod keepalive;
mod log;
mod mock;
mod relay;
mod usage;

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt as _;
use serde_json::Value;

use super::data_event;

/// Deadline for anything that should happen promptly; reached only when a test is failing.
const DEADLINE: Duration = Duration::from_secs(10);

/// An event in corral's framing from JSON text.
fn event(json: &str) -> Bytes {
    data_event(&serde_json::from_str::<Value>(json).expect("test JSON"))
}

/// The JSON of an event in corral's framing (`None` for `[DONE]`).
fn json_of(event: &[u8]) -> Option<Value> {
    super::event_json(event).map(|json| serde_json::from_slice(json).expect("event JSON"))
}

/// A byte stream that yields `chunks` and then ends.
fn body(
    chunks: Vec<Bytes>,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    futures::stream::iter(chunks.into_iter().map(Ok))
}

/// A byte stream that yields `chunks` and then never yields again (a stalled provider).
fn stalled_body(
    chunks: Vec<Bytes>,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    body(chunks).chain(futures::stream::pending())
}

/// An empty log of chat events (`data:` events, `[DONE]` last) holding at
/// most `max_bytes`, and its one writer.
fn chat_log(max_bytes: usize) -> (super::StreamLog, super::StreamWriter) {
    super::StreamLog::with_limits(
        &crate::wire::chat::STREAM,
        super::LogLimits {
            max_bytes,
            max_reader_lag: usize::MAX,
            tally: None,
        },
    )
}
