//! How a caller receives a stream's events: as server-sent events (every
//! API, and Gemini's `alt=sse`), as the elements of one JSON array (a
//! Gemini `streamGenerateContent` without `alt=sse`, which Google streams as
//! `[{...},\r\n{...}]`), or as AWS event-stream frames (a Bedrock
//! InvokeModelWithResponseStream caller's: each event's JSON a `chunk`). The
//! log, the cache and the upstream call always hold events; only what a
//! caller is sent is framed.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use bytes::Bytes;
use futures::{Stream, StreamExt};

use super::{BLANK_LINE, event_json};

/// A caller's framing of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Framing {
    /// `text/event-stream`, one event per frame.
    #[default]
    Events,
    /// One JSON array, an element per event, streamed as it grows.
    JsonArray,
    /// AWS's binary event stream, as Bedrock's InvokeModelWithResponseStream
    /// answers: a `chunk` frame per event, its payload `{"bytes": base64(json)}`.
    AwsEventStream,
}

impl Framing {
    /// The response's content type.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Events => "text/event-stream",
            Self::JsonArray => "application/json; charset=UTF-8",
            Self::AwsEventStream => "application/vnd.amazon.eventstream",
        }
    }
}

/// `events` (in corral's framing, keep-alives among them) as the pieces of
/// one JSON array: `[` before the first element, `,\r\n` between elements,
/// `]` last; a keep-alive (any frame that is not a data event) becomes white
/// space, which JSON allows between elements.
pub fn as_json_array<S>(
    events: S,
) -> impl Stream<Item = Result<Bytes, std::convert::Infallible>> + Send
where
    S: Stream<Item = Result<Bytes, std::convert::Infallible>> + Send + 'static,
{
    // Whether no element has been sent yet: shared with the closing piece.
    let empty = Arc::new(AtomicBool::new(true));
    let closing = empty.clone();
    events
        .filter_map(move |event| {
            let Ok(event) = event;
            // Only data events are elements (nothing else is logged); the
            // rest are keep-alives.
            let piece = match event_json(&event) {
                Some(json) => {
                    let separator: &[u8] = if empty.swap(false, Ordering::Relaxed) {
                        b"["
                    } else {
                        b",\r\n"
                    };
                    Bytes::from([separator, json].concat())
                }
                None => BLANK_LINE,
            };
            futures::future::ready(Some(Ok(piece)))
        })
        .chain(futures::stream::once(async move {
            Ok(if closing.load(Ordering::Relaxed) {
                Bytes::from_static(b"[]")
            } else {
                Bytes::from_static(b"]")
            })
        }))
}

/// `events` (in corral's framing) as AWS event-stream frames, as Bedrock
/// streams them and the AWS SDKs parse them: each data event a `chunk`
/// event whose payload is `{"bytes": "<base64 of the event's JSON>"}`; a
/// keep-alive is nothing (the framing has none).
pub fn as_aws_event_stream<S>(
    events: S,
) -> impl Stream<Item = Result<Bytes, std::convert::Infallible>> + Send
where
    S: Stream<Item = Result<Bytes, std::convert::Infallible>> + Send + 'static,
{
    events.filter_map(|event| {
        let Ok(event) = event;
        futures::future::ready(data_of(&event).map(|json| Ok(aws_chunk(json))))
    })
}

/// The JSON an event carries, named (`event: x\ndata: {..}`, Messages') or
/// not; `None` for a keep-alive or `[DONE]`.
fn data_of(event: &[u8]) -> Option<&[u8]> {
    event_json(event).or_else(|| {
        let at = event.windows(7).position(|w| w == b"\ndata: ")?;
        event[at + 7..].strip_suffix(b"\n\n")
    })
}

/// One `chunk` frame carrying `json`.
fn aws_chunk(json: &[u8]) -> Bytes {
    use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
    use base64::Engine as _;
    let payload = serde_json::json!({
        "bytes": base64::engine::general_purpose::STANDARD.encode(json),
    })
    .to_string();
    let message = Message::new(payload)
        .add_header(Header::new(
            ":event-type",
            HeaderValue::String("chunk".into()),
        ))
        .add_header(Header::new(
            ":content-type",
            HeaderValue::String("application/json".into()),
        ))
        .add_header(Header::new(
            ":message-type",
            HeaderValue::String("event".into()),
        ));
    let mut frame = Vec::with_capacity(json.len() * 4 / 3 + 128);
    // Writing to a Vec fails only for a frame over the format's size limit
    // (16 MiB), which no event bounded by `max_response_bytes` reaches.
    match aws_smithy_eventstream::frame::write_message_to(&message, &mut frame) {
        Ok(()) => Bytes::from(frame),
        Err(_) => Bytes::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::{KEEPALIVE, data_event};

    async fn framed(events: Vec<Bytes>) -> String {
        let pieces: Vec<_> = as_json_array(futures::stream::iter(events.into_iter().map(Ok)))
            .collect()
            .await;
        pieces
            .into_iter()
            .map(|piece| String::from_utf8(piece.unwrap().to_vec()).unwrap())
            .collect()
    }

    #[tokio::test]
    async fn events_become_one_json_array_and_keepalives_white_space() {
        let text = framed(vec![
            KEEPALIVE,
            data_event(&serde_json::json!({"a": 1})),
            KEEPALIVE,
            data_event(&serde_json::json!({"b": 2})),
        ])
        .await;
        assert_eq!(text, "\n[{\"a\":1}\n,\r\n{\"b\":2}]");
        let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(parsed, serde_json::json!([{"a": 1}, {"b": 2}]));
        assert_eq!(framed(Vec::new()).await, "[]");
    }
}
