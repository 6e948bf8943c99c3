//! How a caller receives a stream's events: as server-sent events (every
//! API, and Gemini's `alt=sse`), or as the elements of one JSON array (a
//! Gemini `streamGenerateContent` without `alt=sse`, which Google streams as
//! `[{...},\r\n{...}]`). The log, the cache and the upstream call always
//! hold events; only what a caller is sent is framed.

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
}

impl Framing {
    /// The response's content type.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Events => "text/event-stream",
            Self::JsonArray => "application/json; charset=UTF-8",
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
