//! Bedrock's response stream on the wire: AWS event-stream frames (`application/vnd.amazon.eventstream`),
//! written by `aws-smithy-eventstream`, the codec the AWS SDKs read them with (prelude, headers,
//! payload and both CRCs are its work, not ours).
//!
//! `InvokeModelWithResponseStream` wraps each event of the model's own stream (for Claude, one
//! Messages SSE event) in a `chunk` event whose payload is `{"bytes": <base64 of the event's
//! JSON>}`, plus a `p` field of padding that Bedrock adds so that frame sizes do not reveal the
//! text; a failure after the stream began is an exception frame, after which the stream ends.

use aws_smithy_eventstream::frame::write_message_to;
use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
use bytes::Bytes;
use serde_json::json;

pub(super) use aws_smithy_eventstream::error::Error as FrameError;

/// The content type of an event-stream response.
pub(super) const CONTENT_TYPE: &str = "application/vnd.amazon.eventstream";

/// The padding every chunk carries (Bedrock's varies in length; a fixed one keeps answers
/// deterministic).
const PADDING: &str = "abcd";

/// A `chunk` event carrying one event of the model's stream, `event_json` byte for byte.
pub(super) fn chunk(event_json: &[u8]) -> Result<Bytes, FrameError> {
    let payload = json!({
        "bytes": aws_smithy_types::base64::encode(event_json),
        "p": PADDING,
    });
    frame(
        vec![
            string_header(":event-type", "chunk"),
            string_header(":content-type", "application/json"),
            string_header(":message-type", "event"),
        ],
        payload.to_string(),
    )
}

/// An exception frame: the stream failed after it began, e.g. `throttlingException`.
pub(super) fn exception(exception_type: &'static str, message: &str) -> Result<Bytes, FrameError> {
    frame(
        vec![
            string_header(":exception-type", exception_type),
            string_header(":content-type", "application/json"),
            string_header(":message-type", "exception"),
        ],
        json!({"message": message}).to_string(),
    )
}

fn string_header(name: &'static str, value: &'static str) -> Header {
    Header::new(name, HeaderValue::String(value.into()))
}

fn frame(headers: Vec<Header>, payload: String) -> Result<Bytes, FrameError> {
    let message = Message::new_from_parts(headers, payload.into_bytes());
    let mut buffer = Vec::new();
    write_message_to(&message, &mut buffer)?;
    Ok(Bytes::from(buffer))
}
