//! Streamed completions (`stream: true`): the building blocks of streaming coalescing.
//!
//! - `log.rs`: [`StreamLog`], the shared, append-only log of one upstream stream's events.
//!   One [`StreamWriter`] appends; every identical caller reads it through its own
//!   [`StreamReader`] cursor, from the first event on, at its own pace. `packed.rs` holds
//!   its events: packed into shared blocks, a usage-free view kept as a cut of its event, so a
//!   live stream costs about the bytes it relayed.
//! - `relay.rs`: [`relay`] parses the provider's SSE body, appends each event to the log in one
//!   canonical framing, and turns a broken stream (cut short, stalled, malformed, too large)
//!   into an error event in the API's shape that ends every reader's stream.
//! - `usage.rs`: a caller that did not ask for usage sees the stream it would have received
//!   without it ([`CallerUsage`], [`without_usage`]) although the upstream call asked for it.
//! - `tap.rs`: [`StreamTap`] reads a stream relayed unlogged (`no-store`) as it passes, for
//!   its usage, by the same [`StreamFormat`], and rewrites it only for a caller who did not ask
//!   for the usage chunk.
//! - `format.rs`: [`StreamFormat`], what all of the above ask of one API's events (which event
//!   completes a stream, which fails it, the done and error events), so that none of them
//!   parses a provider's JSON. Every API's format, and the conversions between its stream and
//!   its answer, live in its adapter in `wire/` (chat's in `wire/chat/`).
//!
//! Every event handled here is one complete SSE frame (chat: `data: <json>\n\n` or
//! `data: [DONE]\n\n`; named-event formats: `event: <name>\ndata: <json>\n\n`), held as
//! reference-counted [`Bytes`]: a follower receives a clone of the handle, never a copy of the
//! bytes. The SSE grammar itself is parsed by the `sse-stream`
//! crate; `eventsource-stream` was passed over because it panics on a stream that begins with
//! a UTF-8 byte-order mark and buffers without bound past invalid UTF-8.

mod format;
mod framing;
mod log;
mod packed;
mod relay;
mod tap;
mod usage;

use bytes::Bytes;
use serde_json::{Value, json};

pub use format::{Format, Frame, StreamFormat, read_named, read_object};
pub use framing::{Framing, as_aws_event_stream, as_json_array};
pub use log::{AppendError, LogBytes, LogEnd, LogLimits, StreamLog, StreamReader, StreamWriter};
pub use relay::{
    BrokenStream, RelayOutcome, RelaySummary, Silence, relay, relay_response, relay_until,
};
pub use tap::{StreamTap, TapEnd};
pub use usage::{CallerUsage, UpstreamStreamRequest, UsageFree, force_stream, without_usage};

/// The event that ends every complete stream.
pub const DONE_EVENT: &[u8] = b"data: [DONE]\n\n";

/// `error.code` of the error event a reader of a broken stream receives last.
pub const BROKEN_STREAM_CODE: &str = "upstream_stream_broken";

/// The `[DONE]` event, without allocating.
pub fn done_event() -> Bytes {
    Bytes::from_static(DONE_EVENT)
}

/// `value` framed as one SSE event, `data: <compact json>\n\n`.
///
/// This is the one framing corral sends: whatever line endings, `data:` spacing or multi-line
/// data the provider used, every reader (and every cached replay) gets the same bytes.
pub fn data_event(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

/// JSON text on one line, framed as [`data_event`] frames a value: an upstream event relayed
/// as the provider wrote it, once its reader checked it.
pub fn data_event_text(json: &str) -> Bytes {
    let mut event = Vec::with_capacity(json.len() + 8);
    event.extend_from_slice(b"data: ");
    event.extend_from_slice(json.as_bytes());
    event.extend_from_slice(b"\n\n");
    Bytes::from(event)
}

/// Chat's error event that ends a broken stream, in the shape of the gateway's own
/// error bodies. The message is for clients: detail belongs in logs.
pub fn error_event(message: &str) -> Bytes {
    data_event(&json!({
        "error": {
            "message": message,
            "type": "server_error",
            "param": null,
            "code": BROKEN_STREAM_CODE,
        }
    }))
}

/// What a silent stream's readers receive every `coalesce.keepalive_interval`
/// by default ([`StreamFormat::keepalive`]): an SSE comment, which every SSE
/// parser (the OpenAI and Anthropic SDKs' included) skips.
pub const KEEPALIVE: Bytes = Bytes::from_static(b": keep-alive\n\n");

/// A blank line: the keep-alive of a format whose SDKs read the stream line by
/// line rather than as SSE (Gemini's: `google-genai` skips an empty line but
/// fails on a comment, `@google/genai` skips white space before `data:`).
/// Between two events it is an empty SSE block, which SSE parsers skip too.
pub const BLANK_LINE: Bytes = Bytes::from_static(b"\n");

/// `events`, with `keepalive` (the format's [`StreamFormat::keepalive`])
/// whenever `every` passes without an event (none when `every` is zero). Only
/// what a reader receives: the log, the cache and replays never see one.
pub fn with_keepalive<S>(
    events: S,
    every: std::time::Duration,
    keepalive: Bytes,
) -> impl futures::Stream<Item = Result<Bytes, std::convert::Infallible>> + Send
where
    S: futures::Stream<Item = Result<Bytes, std::convert::Infallible>> + Send + 'static,
{
    use futures::StreamExt;
    let events = Box::pin(events);
    futures::stream::unfold(events, move |mut events| {
        let keepalive = keepalive.clone();
        async move {
            if every.is_zero() {
                return events.next().await.map(|event| (event, events));
            }
            // The stream keeps its pending read across a timeout (`next` only
            // borrows it), so no event is lost to a keep-alive.
            match tokio::time::timeout(every, events.next()).await {
                Ok(Some(event)) => Some((event, events)),
                Ok(None) => None,
                Err(_) => Some((Ok(keepalive), events)),
            }
        }
    })
}

/// The JSON text of an event in corral's framing (`None` for `[DONE]` or any other frame).
pub fn event_json(event: &[u8]) -> Option<&[u8]> {
    let json = event.strip_prefix(b"data: ")?.strip_suffix(b"\n\n")?;
    (json != b"[DONE]").then_some(json)
}

/// `value` framed as one named SSE event, `event: <name>\ndata: <compact json>\n\n`: the
/// framing of the formats whose events are named (Responses, Anthropic Messages).
pub fn named_event(name: &str, value: &Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {value}\n\n"))
}

/// The JSON value a named event in corral's framing ([`named_event`]) carries.
pub fn named_event_value(event: &[u8]) -> Option<Value> {
    let at = event.windows(7).position(|w| w == b"\ndata: ")?;
    serde_json::from_slice(event[at + 7..].strip_suffix(b"\n\n")?).ok()
}

/// The JSON object an event in corral's framing carries, if it carries one.
fn event_object(event: &[u8]) -> Option<serde_json::Map<String, Value>> {
    match serde_json::from_slice(event_json(event)?) {
        Ok(Value::Object(object)) => Some(object),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
