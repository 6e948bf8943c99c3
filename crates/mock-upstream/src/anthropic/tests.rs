//! The Anthropic surface over real loopback HTTP: the shapes the official SDK's types parse
//! (`Message`, `Usage`, the `RawMessageStreamEvent`s framed as `event:`/`data:` pairs), the
//! accumulation its `get_final_message()` performs, errors in Anthropic's shape, and the same
//! knobs as the OpenAI surface.

use std::time::Duration;

use serde_json::{Value, json};

use crate::test_support::{DEADLINE, body_until_cut, named_events, post_to, start, with};
use crate::{FailureMode, MockProvider};

fn message(text: &str) -> Value {
    json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 256,
        "system": "You are terse.",
        "messages": [{"role": "user", "content": text}],
    })
}

async fn post(
    mock: &MockProvider,
    path: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut request = post_to(mock, path, body).timeout(DEADLINE);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.expect("sending the request")
}

const VERSION: (&str, &str) = ("anthropic-version", "2023-06-01");

async fn post_json(mock: &MockProvider, path: &str, body: &Value) -> (u16, Value) {
    let response = post(mock, path, body, &[VERSION, ("x-api-key", "sk-ant-test")]).await;
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON body"))
}

/// The events of an Anthropic SSE body, checking that each `event:` line names its data's type.
fn events(body: &str) -> Vec<Value> {
    named_events(body)
        .into_iter()
        .map(|(_, data)| data)
        .collect()
}

/// What the SDK's `accumulate_event` builds from a stream: the `message_start` message, blocks
/// appended on `content_block_start`, text deltas concatenated, the stop reason and output
/// usage of `message_delta`.
fn accumulate(events: &[Value]) -> Value {
    let mut message = events[0]["message"].clone();
    for event in &events[1..] {
        match event["type"].as_str() {
            Some("content_block_start") => message["content"]
                .as_array_mut()
                .unwrap()
                .push(event["content_block"].clone()),
            Some("content_block_delta") => {
                let index = event["index"].as_u64().unwrap() as usize;
                let text = message["content"][index]["text"]
                    .as_str()
                    .unwrap()
                    .to_owned();
                message["content"][index]["text"] =
                    json!(text + event["delta"]["text"].as_str().unwrap());
            }
            Some("message_delta") => {
                message["stop_reason"] = event["delta"]["stop_reason"].clone();
                message["stop_sequence"] = event["delta"]["stop_sequence"].clone();
                message["usage"]["output_tokens"] = event["usage"]["output_tokens"].clone();
            }
            _ => {}
        }
    }
    message
}

#[tokio::test]
async fn a_message_is_deterministic_and_numbered_by_its_call() {
    let mock = start().await;
    let (status, first) = post_json(&mock, "/messages", &message("Hello there, Claude")).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["type"], "message");
    assert_eq!(first["role"], "assistant");
    assert_eq!(first["model"], "claude-sonnet-4-5");
    assert_eq!(first["id"], "msg_mock_1");
    assert_eq!(first["stop_reason"], "end_turn");
    assert_eq!(first["stop_sequence"], Value::Null);
    assert_eq!(first["content"][0]["type"], "text");
    let text = first["content"][0]["text"].as_str().unwrap();
    assert!(
        text.starts_with("mock reply to ") && text.ends_with("Hello there, Claude"),
        "{text}"
    );
    for field in [
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
    ] {
        assert!(first["usage"][field].is_u64(), "{field}: {first}");
    }
    assert_eq!(
        first["usage"]["output_tokens"],
        text.split_whitespace().count()
    );

    // Delivery and attribution fields do not change the answer; the prompt does.
    let (_, again) = post_json(
        &mock,
        "/messages",
        &with(
            with(
                message("Hello there, Claude"),
                "metadata",
                json!({"user_id": "u-9"}),
            ),
            "temperature",
            json!(0),
        ),
    )
    .await;
    assert_eq!(again["id"], "msg_mock_2");
    assert_eq!(again["content"], first["content"]);
    assert_eq!(again["usage"], first["usage"]);
    let (_, other) = post_json(
        &mock,
        "/messages",
        &with(
            message("Hello there, Claude"),
            "system",
            json!("Be verbose."),
        ),
    )
    .await;
    assert_ne!(
        other["content"], first["content"],
        "the system prompt is part of the prompt"
    );
    assert_eq!(mock.calls_to("/messages"), 3);
}

#[tokio::test]
async fn a_stream_is_framed_as_the_api_does_and_accumulates_to_the_message() {
    let mock = start().await;
    let (_, plain) = post_json(&mock, "/messages", &message("stream me please")).await;
    let response = post(
        &mock,
        "/messages",
        &with(message("stream me please"), "stream", json!(true)),
        &[VERSION],
    )
    .await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let events = events(&response.text().await.unwrap());
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    let deltas = kinds
        .iter()
        .filter(|k| **k == "content_block_delta")
        .count();
    assert!(deltas >= 2, "one delta per word: {kinds:?}");
    let mut expected = vec!["message_start", "content_block_start", "ping"];
    expected.extend(std::iter::repeat_n("content_block_delta", deltas));
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(kinds, expected);
    assert_eq!(events[0]["message"]["stop_reason"], Value::Null);
    assert_eq!(events[0]["message"]["content"], json!([]));
    assert_eq!(events[3]["delta"]["type"], "text_delta");

    let mut accumulated = accumulate(&events);
    assert_eq!(accumulated["id"], "msg_mock_2");
    accumulated["id"] = plain["id"].clone();
    assert_eq!(
        accumulated, plain,
        "get_final_message() equals the non-stream answer"
    );
}

#[tokio::test]
async fn max_tokens_cuts_the_reply_and_says_so() {
    let mock = start().await;
    let (_, cut) = post_json(
        &mock,
        "/messages",
        &with(message("a long question"), "max_tokens", json!(2)),
    )
    .await;
    assert_eq!(cut["stop_reason"], "max_tokens");
    assert_eq!(cut["usage"]["output_tokens"], 2);
    assert_eq!(
        cut["content"][0]["text"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .count(),
        2
    );
}

#[tokio::test]
async fn cache_control_marks_show_as_cache_reads_and_writes() {
    let mock = start().await;
    let body = json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 64,
        "system": [{"type": "text", "text": "A long, stable system prompt.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "A document to keep.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "And a question?"},
        ]}],
    });
    let (status, answer) = post_json(&mock, "/messages", &body).await;
    assert_eq!(status, 200, "{answer}");
    let usage = &answer["usage"];
    assert_eq!(
        usage["cache_read_input_tokens"], 8,
        "29 chars of system: {usage}"
    );
    assert_eq!(
        usage["cache_creation_input_tokens"], 5,
        "19 chars marked: {usage}"
    );
    assert_eq!(usage["input_tokens"], 4, "15 chars unmarked: {usage}");
    let (_, counted) = post_json(&mock, "/messages/count_tokens", &body).await;
    assert_eq!(counted, json!({"input_tokens": 17}));
    let (_, plain) = post_json(&mock, "/messages", &message("no marks")).await;
    assert_eq!(plain["usage"]["cache_read_input_tokens"], 0);
    assert_eq!(plain["usage"]["cache_creation_input_tokens"], 0);
}

#[tokio::test]
async fn bad_requests_get_anthropic_errors() {
    let mock = start().await;
    let cases = [
        (
            json!({"model": "claude-x", "messages": [{"role": "user", "content": "hi"}]}),
            "max_tokens",
        ),
        (
            json!({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}),
            "model",
        ),
        (
            json!({"model": "claude-x", "max_tokens": 5, "messages": "hi"}),
            "messages",
        ),
        (
            json!({"model": "claude-x", "max_tokens": 5, "messages": [{"role": "tool", "content": "hi"}]}),
            "role",
        ),
        (
            json!({"model": "claude-x", "max_tokens": 5, "messages": [{"role": "system", "content": "hi"}]}),
            "top-level 'system'",
        ),
        (
            json!({"model": "claude-x", "max_tokens": 5, "messages": [
                {"role": "user", "content": "hi"},
                {"role": "system", "content": [], "output_config": {"effort": "low"}},
            ]}),
            "messages.1.output_config",
        ),
        (
            with(message("hi"), "temperature", json!(1.5)),
            "temperature",
        ),
    ];
    for (body, field) in cases {
        let (status, error) = post_json(&mock, "/messages", &body).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(error["type"], "error", "{error}");
        assert_eq!(error["error"]["type"], "invalid_request_error", "{error}");
        assert!(
            error["error"]["message"].as_str().unwrap().contains(field),
            "{error}"
        );
    }
    // The API refuses a request without its version header.
    let response = post(&mock, "/messages", &message("hi"), &[("x-api-key", "k")]).await;
    assert_eq!(response.status(), 400);
    let error: Value = response.json().await.unwrap();
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("anthropic-version")
    );
}

#[tokio::test]
async fn an_injected_overload_is_a_529_with_retry_after() {
    let mock = start().await;
    mock.set_failure(Some(
        FailureMode::always(529).with_retry_after(Duration::from_millis(1500)),
    ));
    let response = post(&mock, "/messages", &message("overload me"), &[VERSION]).await;
    assert_eq!(response.status(), 529);
    assert_eq!(response.headers()["retry-after"], "2");
    assert!(
        response.headers().get("retry-after-ms").is_none(),
        "Anthropic sends seconds only"
    );
    let error: Value = response.json().await.unwrap();
    assert_eq!(
        error,
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    );

    mock.set_failure(Some(FailureMode::always(429)));
    let (status, error) = post_json(&mock, "/messages/count_tokens", &message("x")).await;
    assert_eq!(status, 429);
    assert_eq!(error["error"]["type"], "rate_limit_error");
}

#[tokio::test]
async fn a_truncated_stream_stops_after_its_first_text_delta() {
    let mock = start().await;
    mock.set_truncate_streams(true);
    let response = post(
        &mock,
        "/messages",
        &with(message("cut me short"), "stream", json!(true)),
        &[VERSION],
    )
    .await;
    assert_eq!(response.status(), 200);
    let body = body_until_cut(response).await;
    let events = events(std::str::from_utf8(&body).unwrap());
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta"
        ]
    );
}

#[tokio::test]
async fn held_calls_wait_and_the_credential_header_is_recorded() {
    let mock = start().await;
    mock.hold();
    let base = mock.clone();
    let call = tokio::spawn(async move {
        post(
            &base,
            "/messages",
            &message("hold me"),
            &[VERSION, ("x-api-key", "sk-ant-held")],
        )
        .await
        .status()
    });
    assert!(mock.wait_for_calls(1, DEADLINE).await);
    assert!(!call.is_finished());
    mock.release();
    assert_eq!(call.await.unwrap(), 200);
    let bearer = post(
        &mock,
        "/messages",
        &message("bearer"),
        &[VERSION, ("authorization", "Bearer t")],
    )
    .await;
    assert_eq!(bearer.status(), 200);
    let requests = mock.requests();
    assert_eq!(requests[0].auth_headers(), ["x-api-key"]);
    assert_eq!(requests[0].header("x-api-key"), Some("sk-ant-held"));
    assert_eq!(requests[1].auth_headers(), ["authorization"]);
}

/// A system turn inside `messages`, as Claude Code sends one: accepted after the first message,
/// and with its own `output_config` under the `per-turn-control` beta; the reply quotes the last
/// user text as for any conversation.
#[tokio::test]
async fn a_system_turn_mid_conversation_is_accepted_as_the_api_does() {
    let mock = start().await;
    let body = json!({
        "model": "claude-opus-5-5",
        "max_tokens": 64,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Say hello"}]},
            {"role": "system", "content": [{"type": "text", "text": "Environment: a test."}],
             "output_config": {"effort": "medium"}},
        ],
    });
    let beta = (
        "anthropic-beta",
        "claude-code-20250219,per-turn-control-2026-07-01",
    );
    let response = post(&mock, "/messages", &body, &[VERSION, beta]).await;
    assert_eq!(response.status(), 200);
    let message: Value = response.json().await.unwrap();
    let text = message["content"][0]["text"].as_str().unwrap();
    assert!(text.ends_with(": Say hello"), "{message}");
    let mut plain = body.clone();
    plain["messages"][1]
        .as_object_mut()
        .unwrap()
        .remove("output_config");
    let (status, _) = post_json(&mock, "/messages", &plain).await;
    assert_eq!(status, 200, "a system turn needs no beta of its own");
    let directive = json!({
        "model": "claude-opus-5-5",
        "max_tokens": 64,
        "messages": [
            {"role": "system", "content": [], "output_config": {"effort": "low"}},
            {"role": "user", "content": "hi"},
        ],
    });
    let response = post(&mock, "/messages", &directive, &[VERSION, beta]).await;
    assert_eq!(
        response.status(),
        200,
        "the directive-only form may come first"
    );
}
