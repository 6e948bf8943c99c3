//! OpenAI Chat Completions' and Completions' stream format, as the stream
//! machinery asks it of every API ([`StreamFormat`]).

use bytes::Bytes;
use serde_json::{Value, json};

use crate::{
    sse::{
        DONE_EVENT, Frame, StreamFormat, UsageFree, data_event, done_event, error_event,
        event_json, read_object,
    },
    usage::Usage,
};

/// OpenAI Chat Completions and Completions: `data: <json object>` events, `data: [DONE]` last,
/// an error is an object with an `error` member.
#[derive(Debug)]
pub struct ChatStream;

/// The chat stream format.
pub static STREAM: ChatStream = ChatStream;

impl StreamFormat for ChatStream {
    fn read(&self, name: Option<&str>, data: &str) -> Frame {
        if data.trim() == "[DONE]" {
            return Frame::Complete {
                event: None,
                usage: None,
            };
        }
        let chunk = match read_object(data) {
            Ok(chunk) => chunk,
            Err(malformed) => return malformed,
        };
        if chunk.get("error").is_some_and(|error| !error.is_null()) {
            return Frame::Failed(data_event(&Value::Object(chunk)));
        }
        if name == Some("error") {
            // Event names are not relayed and clients recognise an error event by its
            // `error` member, so a named error event without one is wrapped in one.
            return Frame::Failed(data_event(&json!({ "error": chunk })));
        }
        let usage = chunk
            .get("usage")
            .is_some_and(|usage| !usage.is_null())
            .then(|| Usage::from_body(data.as_bytes()))
            .flatten();
        Frame::Event {
            event: data_event(&Value::Object(chunk)),
            usage,
        }
    }

    fn done_event(&self) -> Option<Bytes> {
        Some(done_event())
    }

    fn error_event(&self, message: &str, _position: usize) -> Bytes {
        error_event(message)
    }

    fn usage_free(&self, event: &Bytes) -> UsageFree {
        UsageFree::of(event)
    }

    fn event_usage(&self, event: &[u8]) -> Option<Usage> {
        if event == DONE_EVENT {
            return None;
        }
        Usage::from_body(event_json(event)?)
    }
}
