//! OpenAI Chat Completions' and Completions' stream format, as the stream
//! machinery asks it of every API ([`StreamFormat`]).

use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Value, json, value::RawValue};

use crate::{
    sse::{
        DONE_EVENT, Frame, StreamFormat, UsageFree, data_event, data_event_text, done_event,
        error_event, event_json, read_object,
    },
    usage::Usage,
};

/// OpenAI Chat Completions and Completions: `data: <json object>` events, `data: [DONE]` last,
/// an error is an object with an `error` member.
#[derive(Debug)]
pub struct ChatStream;

/// The chat stream format.
pub static STREAM: ChatStream = ChatStream;

/// The members of a chunk the relay decides on. The rest of the chunk is
/// checked to be JSON but not built.
#[derive(Deserialize)]
struct Decisive<'a> {
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
    #[serde(borrow, default)]
    usage: Option<&'a RawValue>,
}

/// An ordinary chunk written on one line, relayed as the provider wrote it:
/// every event of every stream passes here, and building its tree only to
/// write it back cost more than the rest of the relay. `None` for what the
/// tree must judge (not an object, an error, a repeated `error` or `usage`,
/// a chunk written over several lines, which one `data:` line cannot hold).
fn read_as_written(data: &str) -> Option<Frame> {
    let json = data.trim();
    if !json.starts_with('{') || json.contains(['\n', '\r']) {
        return None;
    }
    let decisive: Decisive = serde_json::from_str(json).ok()?;
    if decisive.error.is_some() {
        return None;
    }
    let usage = decisive
        .usage
        .and_then(|_| Usage::from_body(json.as_bytes()));
    Some(Frame::Event {
        event: data_event_text(json),
        usage,
    })
}

impl StreamFormat for ChatStream {
    fn read(&self, name: Option<&str>, data: &str) -> Frame {
        if data.trim() == "[DONE]" {
            return Frame::Complete {
                event: None,
                usage: None,
            };
        }
        if name != Some("error")
            && let Some(frame) = read_as_written(data)
        {
            return frame;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn event_of(frame: Frame) -> (Bytes, Option<Usage>) {
        match frame {
            Frame::Event { event, usage } => (event, usage),
            other => panic!("an event, not {other:?}"),
        }
    }

    #[test]
    fn a_chunk_on_one_line_is_relayed_as_written() {
        let data = r#"{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"a"}}],"usage":null}"#;
        let (event, usage) = event_of(STREAM.read(None, data));
        assert_eq!(
            event,
            format!("data: {data}\n\n"),
            "the provider's own bytes and order"
        );
        assert_eq!(usage, None);

        let counted = r#"{"id":"c1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}"#;
        let (event, usage) = event_of(STREAM.read(None, counted));
        assert_eq!(event, format!("data: {counted}\n\n"));
        let usage = usage.expect("the usage chunk's counts");
        assert_eq!(
            (usage.prompt_tokens, usage.completion_tokens),
            (3, 4),
            "{usage:?}"
        );
    }

    #[test]
    fn what_one_line_cannot_hold_is_written_anew_and_errors_stay_errors() {
        // Written over several lines: one `data:` line of corral's framing holds it compact.
        let (event, _) = event_of(STREAM.read(None, "{\"choices\":\n[]}"));
        assert_eq!(event, Bytes::from_static(b"data: {\"choices\":[]}\n\n"));

        for error in [
            r#"{"error":{"message":"overloaded"}}"#,
            r#"{"choices":[],"error":{"message":"overloaded"}}"#,
        ] {
            assert!(
                matches!(STREAM.read(None, error), Frame::Failed(_)),
                "{error}"
            );
        }
        assert!(matches!(
            STREAM.read(Some("error"), r#"{"message":"overloaded"}"#),
            Frame::Failed(_)
        ));
        for malformed in ["{\"choices\":[]", "[1]", "\"text\""] {
            assert!(
                matches!(STREAM.read(None, malformed), Frame::Malformed(_)),
                "{malformed}"
            );
        }
        // `"error": null` is an ordinary chunk's.
        let (event, _) = event_of(STREAM.read(None, r#"{"choices":[],"error":null}"#));
        assert_eq!(
            event,
            Bytes::from_static(b"data: {\"choices\":[],\"error\":null}\n\n")
        );
    }
}
