//! [`StreamFormat`]: what the stream machinery (log, relay, cluster mirror) must know about one
//! API's server-sent events, and nothing more.
//!
//! The log, the relay and the cluster relay handle bytes: every event is one whole SSE frame,
//! kept byte for byte. Which frames complete a stream, which fail it, what ends a complete
//! stream, and what a broken stream's last event looks like differ per API; each API's adapter
//! (`wire/`) answers those questions through this trait (chat's is `wire::chat::ChatStream`).

use std::fmt;

use bytes::Bytes;
use serde_json::Value;

use super::usage::UsageFree;
use super::{KEEPALIVE, named_event};
use crate::usage::Usage;

/// One API's stream format, as a `&'static` adapter: flights, logs and the cluster relay hold
/// it without knowing which API it is.
pub type Format = &'static dyn StreamFormat;

/// What the stream machinery asks of an API's event format.
pub trait StreamFormat: Send + Sync + fmt::Debug + 'static {
    /// Reads one upstream SSE event: its `event:` name (if any) and its `data:`.
    fn read(&self, name: Option<&str>, data: &str) -> Frame;

    /// The event appended after the last one when a stream completes (chat: `data: [DONE]`);
    /// `None` for formats whose completing event is itself part of the stream.
    fn done_event(&self) -> Option<Bytes>;

    /// The event that ends a broken stream for every reader, in the API's own error shape.
    /// `position` is the number of events before it (for formats that number their events).
    /// The message is for clients: detail belongs in logs.
    fn error_event(&self, message: &str, position: usize) -> Bytes;

    /// How a caller who did not ask for usage sees `event` (chat's `include_usage`); formats
    /// that always report usage show every event as it is.
    fn usage_free(&self, _event: &Bytes) -> UsageFree {
        UsageFree::Same
    }

    /// What a silent stream's readers receive every
    /// `coalesce.keepalive_interval`: something the API's SDKs skip. By
    /// default an SSE comment ([`KEEPALIVE`]).
    fn keepalive(&self) -> Bytes {
        KEEPALIVE
    }

    /// Whether a stream whose body ended after `events`, without a
    /// [`Frame::Complete`], is complete: for a format whose stream completes
    /// by ending rather than on an event (Gemini's, once every candidate has
    /// finished). By default a body that ends first is a broken stream.
    fn complete_at_end(&self, _events: &[Bytes]) -> bool {
        false
    }

    /// Whether [`complete_at_end`](Self::complete_at_end) can ever say yes:
    /// then a reader that keeps no log of its own (a `no-store` stream's
    /// tap) keeps the events to ask it.
    fn may_complete_at_end(&self) -> bool {
        false
    }

    /// The token counts a logged event carries, if it carries any.
    fn event_usage(&self, event: &[u8]) -> Option<Usage>;

    /// The token counts of a complete stream, from its events (a live
    /// follower's saving). By default the last event among the final three
    /// that carries usage (chat: the usage chunk before `[DONE]`; Responses:
    /// the completing event); a format that splits usage over several events
    /// (Anthropic: input in `message_start`, output in `message_delta`) merges them.
    fn stream_usage(&self, events: &[Bytes]) -> Option<Usage> {
        events
            .iter()
            .rev()
            .take(3)
            .find_map(|event| self.event_usage(event))
    }
}

/// What the relay does with one upstream event.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// An ordinary event, in corral's framing, with the usage it reports (if any).
    Event { event: Bytes, usage: Option<Usage> },
    /// The stream is complete: `event` (if any) is appended, then the log is finished (and the
    /// format's [`done_event`](StreamFormat::done_event) appended). Nothing after it is read.
    Complete {
        event: Option<Bytes>,
        usage: Option<Usage>,
    },
    /// The provider failed the stream: this event ends every reader's stream and nothing is
    /// cached.
    Failed(Bytes),
    /// Nothing to relay (a frame without data the format cares about).
    Skip,
    /// Not an event of this format: the stream is broken.
    Malformed(String),
}

/// The JSON object an event's data holds; `Err` is the [`Frame::Malformed`]
/// of data that is not one (the one reading every format's events share).
pub fn read_object(data: &str) -> Result<serde_json::Map<String, Value>, Frame> {
    match serde_json::from_str::<Value>(data) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(_) => Err(Frame::Malformed(
            "event data is JSON but not an object".to_owned(),
        )),
        Err(error) => Err(Frame::Malformed(format!("event data is not JSON: {error}"))),
    }
}

/// One event of a named-event format (`event: <name>\ndata: <json object>`, Responses and
/// Anthropic Messages): its type and the event in corral's framing ([`named_event`]). The data's
/// own `type` names the event (the SDKs read it); the SSE name only stands in for it. `Err` is
/// the [`Frame::Malformed`] of what is not such an event.
pub fn read_named(name: Option<&str>, data: &str) -> Result<(String, Bytes), Frame> {
    let object = read_object(data)?;
    let kind = match object.get("type").and_then(Value::as_str).or(name) {
        Some(kind) => kind.to_owned(),
        None => return Err(Frame::Malformed("an event without a type".to_owned())),
    };
    let event = named_event(&kind, &Value::Object(object));
    Ok((kind, event))
}
