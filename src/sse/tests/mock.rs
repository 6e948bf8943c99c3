//! Against the shipped mock provider over real loopback HTTP: the relayed, assembled stream
//! equals the provider's own non-stream answer, and a caller who did not ask for usage gets
//! the stream the provider sends without it.

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt as _;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Map, Value, json};

use super::DEADLINE;
use crate::{
    sse::{BrokenStream, CallerUsage, RelayOutcome, RelaySummary, StreamLog, relay_response},
    wire::chat::{assemble, force_include_usage},
};
use mock_upstream::{MockProvider, MockSettings};

const STALL: Duration = Duration::from_secs(5);

fn client() -> reqwest::Client {
    // A proxy from the environment must not intercept loopback calls.
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("building the HTTP client")
}

async fn post(mock: &MockProvider, path: &str, body: Bytes) -> reqwest::Response {
    let response = client()
        .post(format!("{}{path}", mock.base_url()))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("sending the request");
    assert!(response.status().is_success(), "{}", response.status());
    response
}

/// The request body for `path`: a chat conversation or a legacy prompt.
fn request(path: &str, text: &str, n: u64) -> Map<String, Value> {
    let body = if path == "/chat/completions" {
        json!({"model": "gpt-4o-mini", "n": n,
               "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]})
    } else {
        json!({"model": "gpt-3.5-turbo-instruct", "n": n, "prompt": text})
    };
    match body {
        Value::Object(body) => body,
        _ => unreachable!(),
    }
}

/// Relays one streamed call of `body` (usage forced) into a fresh log.
async fn relay_stream(
    mock: &MockProvider,
    path: &str,
    body: &Map<String, Value>,
) -> (RelaySummary, StreamLog) {
    let upstream = force_include_usage(body);
    let response = post(mock, path, upstream.body).await;
    let (log, writer) = super::chat_log(1 << 20);
    let summary = tokio::time::timeout(DEADLINE, relay_response(response, writer, STALL, DEADLINE))
        .await
        .expect("the relay should finish");
    (summary, log)
}

/// `value` without the members that differ between two identical calls to the mock.
fn without_call_identity(mut value: Value) -> Value {
    if let Value::Object(object) = &mut value {
        object.remove("id");
        object.remove("created");
    }
    value
}

async fn check_against_mock(mock: &MockProvider, path: &str, text: &str, n: u64) {
    let body = request(path, text, n);
    let (summary, log) = relay_stream(mock, path, &body).await;
    assert!(summary.completed(), "{summary:?}");
    assert!(summary.usage.is_some(), "usage was forced upstream");

    // The assembled stream is the provider's own non-stream answer.
    let answer: Value = post(
        mock,
        path,
        Bytes::from(Value::Object(body.clone()).to_string()),
    )
    .await
    .json()
    .await
    .expect("a JSON answer");
    let assembled = assemble(&summary.events).expect("a complete stream assembles");
    assert_eq!(
        without_call_identity(assembled),
        without_call_identity(answer.clone())
    );
    let usage = crate::usage::Usage::from_body(answer.to_string().as_bytes());
    assert_eq!(summary.usage, usage);

    // A caller who did not ask for usage gets what the provider streams without it.
    let mut plain = body.clone();
    plain.insert("stream".to_owned(), json!(true));
    let direct = post(mock, path, Bytes::from(Value::Object(plain).to_string())).await;
    let direct: Vec<Value> = sse_json(direct.bytes().await.expect("the direct stream"));
    let mut served = Vec::new();
    let mut reader = log.reader(CallerUsage::NotAsked);
    while let Some(event) = reader.next_event().await {
        served.extend_from_slice(&event);
    }
    let served = sse_json(Bytes::from(served));
    assert_eq!(
        served
            .into_iter()
            .map(without_call_identity)
            .collect::<Vec<_>>(),
        direct
            .into_iter()
            .map(without_call_identity)
            .collect::<Vec<_>>()
    );
}

/// The data of every event of an SSE body, `[DONE]` as the string "[DONE]".
fn sse_json(body: Bytes) -> Vec<Value> {
    String::from_utf8(body.to_vec())
        .expect("UTF-8")
        .split("\n\n")
        .filter(|frame| !frame.is_empty())
        .map(|frame| {
            let data = frame.strip_prefix("data: ").expect("a data frame");
            serde_json::from_str(data).unwrap_or_else(|_| json!(data))
        })
        .collect()
}

#[test]
fn assembled_mock_streams_equal_the_mocks_answers() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let mock = runtime
        .block_on(MockProvider::start(MockSettings::default()))
        .expect("starting the mock provider");
    let cases = (
        prop_oneof![Just("/chat/completions"), Just("/completions")],
        prop_oneof!["\\PC{0,80}", "[a-z ]{0,40}"],
        1_u64..4,
    );
    TestRunner::new(Config::with_cases(24))
        .run(&cases, |(path, text, n)| {
            runtime.block_on(check_against_mock(&mock, path, &text, n));
            Ok(())
        })
        .expect("every case agrees with the mock");
}

#[tokio::test]
async fn a_truncated_mock_stream_is_broken_for_every_reader() {
    let mock = MockProvider::start(MockSettings::default())
        .await
        .expect("starting the mock provider");
    mock.set_truncate_streams(true);
    let body = request("/chat/completions", "hello there", 1);
    let (summary, log) = relay_stream(&mock, "/chat/completions", &body).await;
    let RelayOutcome::Broken(broken) = &summary.outcome else {
        panic!("a truncated stream must not complete: {summary:?}");
    };
    assert!(
        matches!(
            broken,
            BrokenStream::Transport { .. } | BrokenStream::EndedWithoutDone
        ),
        "{broken:?}"
    );
    assert!(assemble(&summary.events).is_err(), "nothing to cache");
    for usage in [CallerUsage::Asked, CallerUsage::NotAsked] {
        let events: Vec<Bytes> = log
            .reader(usage)
            .into_stream()
            .map(Result::unwrap)
            .collect()
            .await;
        let last = super::json_of(events.last().unwrap()).unwrap();
        assert_eq!(last["error"]["code"], crate::sse::BROKEN_STREAM_CODE);
    }
}
