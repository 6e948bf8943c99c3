//! What the mock's tests of each surface (OpenAI chat and embeddings, Responses, Anthropic
//! Messages) share: starting a mock, a loopback client, reading the named-event framing and a
//! stream the truncation knob cuts.

use std::time::Duration;

use futures::StreamExt as _;
use serde_json::Value;

use crate::{MockProvider, MockSettings};

/// Deadline for anything that should happen promptly; only reached when a test is failing.
pub const DEADLINE: Duration = Duration::from_secs(10);

pub fn client() -> reqwest::Client {
    // A proxy from the environment must not intercept loopback calls.
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("building the HTTP client")
}

pub async fn start() -> MockProvider {
    MockProvider::start(MockSettings::default())
        .await
        .expect("starting the mock provider")
}

/// A POST of `body` as JSON to the mock's `path`.
pub fn post_to(mock: &MockProvider, path: &str, body: &Value) -> reqwest::RequestBuilder {
    client()
        .post(format!("{}{path}", mock.base_url()))
        .json(body)
}

pub fn with(mut body: Value, key: &str, value: Value) -> Value {
    body[key] = value;
    body
}

/// `(event name, data)` of every event of a named-event SSE body (Responses, Anthropic), checking
/// the framing: whole `event: <name>\ndata: <json>` frames, each name equal to its data's `type`.
/// The text of a chat stream's content deltas (choice 0), joined.
pub fn streamed_content(chunks: &[Value]) -> String {
    chunks
        .iter()
        .filter_map(|c| c["choices"].get(0)?["delta"]["content"].as_str())
        .collect()
}

pub fn named_events(body: &str) -> Vec<(String, Value)> {
    assert!(
        body.ends_with("\n\n"),
        "SSE body must end an event: {body:?}"
    );
    body.split_terminator("\n\n")
        .map(|frame| {
            let (name, data) = frame
                .strip_prefix("event: ")
                .and_then(|rest| rest.split_once("\ndata: "))
                .unwrap_or_else(|| panic!("not an event/data pair: {frame:?}"));
            let data: Value = serde_json::from_str(data).expect("JSON data");
            assert_eq!(data["type"], name, "{frame}");
            (name.to_owned(), data)
        })
        .collect()
}

/// The body of a stream the truncation knob cuts, read until the connection breaks; fails the
/// test if the stream ends cleanly instead.
pub async fn body_until_cut(response: reqwest::Response) -> Vec<u8> {
    let mut body = Vec::new();
    let mut aborted = false;
    let mut frames = response.bytes_stream();
    while let Some(frame) = frames.next().await {
        match frame {
            Ok(bytes) => body.extend_from_slice(&bytes),
            Err(_) => {
                aborted = true;
                break;
            }
        }
    }
    assert!(aborted, "the connection must be cut, not the stream ended");
    body
}
