//! Tests of the mock provider over real loopback HTTP, the way the gateway talks to it.
//!
//! Synchronisation is event-driven throughout (`wait_for_calls`, the long-poll route, joins);
//! the only timeouts are deadlines that turn a hang into a failure.

use std::time::Duration;

use proptest::prelude::*;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use super::openai::{canonical_json, embedding_vector, word_pieces};
use super::test_support::{
    DEADLINE, body_until_cut, client, post_to, start, streamed_content, with,
};
use super::{FailureMode, MockProvider, MockSettings, Scripted};

async fn post(mock: &MockProvider, path: &str, body: &Value) -> reqwest::Response {
    post_to(mock, path, body)
        .send()
        .await
        .expect("sending the request")
}

async fn post_json(mock: &MockProvider, path: &str, body: &Value) -> (u16, Value) {
    let response = post(mock, path, body).await;
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON body"))
}

fn chat(text: &str) -> Value {
    json!({
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": text},
        ],
    })
}

/// The JSON payloads of an SSE body, `[DONE]` kept as a string, checking the framing on the way.
fn sse_events(body: &str) -> Vec<Value> {
    assert!(
        body.ends_with("\n\n"),
        "SSE body must end an event: {body:?}"
    );
    body.split_terminator("\n\n")
        .map(|event| {
            let data = event
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not a data event: {event:?}"));
            if data == "[DONE]" {
                Value::String(data.to_owned())
            } else {
                serde_json::from_str(data).expect("a JSON chunk")
            }
        })
        .collect()
}

#[tokio::test]
async fn chat_answers_deterministically_and_numbers_each_call() {
    let mock = start().await;

    let (status, first) = post_json(&mock, "/chat/completions", &chat("Hello there, mock")).await;
    assert_eq!(status, 200);
    assert_eq!(first["id"], "chatcmpl-mock-1");
    assert_eq!(first["object"], "chat.completion");
    assert_eq!(first["model"], "gpt-4o-mini");
    assert_eq!(first["system_fingerprint"], "fp_mock");
    assert!(first["created"].as_u64().is_some_and(|t| t > 1_600_000_000));
    let choice = &first["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(choice["logprobs"], Value::Null);
    let content = choice["message"]["content"].as_str().expect("content");
    assert!(content.starts_with("mock reply to "), "{content}");
    assert!(content.ends_with(": Hello there, mock"), "{content}");

    // 14 + 17 characters of message text, four per token rounded up; seven words of reply.
    assert_eq!(
        first["usage"],
        json!({"prompt_tokens": 8, "completion_tokens": 7, "total_tokens": 15})
    );

    let (_, again) = post_json(&mock, "/chat/completions", &chat("Hello there, mock")).await;
    assert_eq!(again["id"], "chatcmpl-mock-2");
    assert_eq!(again["choices"][0]["message"]["content"], content);

    let (_, other) = post_json(&mock, "/chat/completions", &chat("Something else")).await;
    assert_ne!(other["choices"][0]["message"]["content"], content);

    assert_eq!(mock.calls(), 3);
    assert_eq!(mock.calls_to("/chat/completions"), 3);
    assert_eq!(mock.calls_to("/embeddings"), 0);
}

#[tokio::test]
async fn chat_content_ignores_key_order_but_not_earlier_messages() {
    let mock = start().await;
    let reordered = json!({
        "messages": [
            {"content": "You are terse.", "role": "system"},
            {"content": "Hi", "role": "user"},
        ],
        "model": "gpt-4o-mini",
    });
    let (_, a) = post_json(&mock, "/chat/completions", &chat("Hi")).await;
    let (_, b) = post_json(&mock, "/chat/completions", &reordered).await;
    assert_eq!(
        a["choices"][0]["message"]["content"],
        b["choices"][0]["message"]["content"]
    );

    let other_system = json!({
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "You are verbose."},
            {"role": "user", "content": "Hi"},
        ],
    });
    let (_, c) = post_json(&mock, "/chat/completions", &other_system).await;
    assert_ne!(
        a["choices"][0]["message"]["content"],
        c["choices"][0]["message"]["content"]
    );
}

#[tokio::test]
async fn n_gives_that_many_distinct_choices() {
    let mock = start().await;
    let (_, answer) = post_json(
        &mock,
        "/chat/completions",
        &with(chat("pick one"), "n", json!(3)),
    )
    .await;
    let choices = answer["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 3);
    for (i, choice) in choices.iter().enumerate() {
        assert_eq!(choice["index"], i);
    }
    assert_ne!(choices[0]["message"], choices[1]["message"]);
}

#[tokio::test]
async fn stream_assembles_to_the_plain_content_and_ends_with_done() {
    let mock = start().await;
    let (_, plain) = post_json(&mock, "/chat/completions", &chat("stream me please")).await;

    let response = post(
        &mock,
        "/chat/completions",
        &with(chat("stream me please"), "stream", json!(true)),
    )
    .await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "text/event-stream",
        "SSE content type"
    );
    let events = sse_events(&response.text().await.expect("body"));

    assert_eq!(events.last(), Some(&json!("[DONE]")));
    let chunks = &events[..events.len() - 1];
    for chunk in chunks {
        assert_eq!(chunk["id"], "chatcmpl-mock-2");
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["model"], "gpt-4o-mini");
        assert!(chunk.get("usage").is_none(), "usage was not asked for");
    }
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    let last = &chunks[chunks.len() - 1]["choices"][0];
    assert_eq!(last["delta"], json!({}));
    assert_eq!(last["finish_reason"], "stop");
    assert_eq!(
        streamed_content(chunks),
        plain["choices"][0]["message"]["content"]
            .as_str()
            .expect("content")
    );
    // One chunk per word, between the role chunk and the finish chunk.
    assert_eq!(
        chunks.len() - 2,
        u64_of(&plain["usage"]["completion_tokens"])
    );
}

fn u64_of(value: &Value) -> usize {
    usize::try_from(value.as_u64().expect("an integer")).expect("fits usize")
}

#[tokio::test]
async fn usage_chunk_comes_only_when_asked() {
    let mock = start().await;
    let (_, plain) = post_json(&mock, "/chat/completions", &chat("count me")).await;

    let request = with(
        with(chat("count me"), "stream", json!(true)),
        "stream_options",
        json!({"include_usage": true}),
    );
    let response = post(&mock, "/chat/completions", &request).await;
    let events = sse_events(&response.text().await.expect("body"));
    assert_eq!(events.last(), Some(&json!("[DONE]")));
    let usage_chunk = &events[events.len() - 2];
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"], plain["usage"]);
    for chunk in &events[..events.len() - 2] {
        assert_eq!(chunk["usage"], Value::Null);
        assert_eq!(chunk["choices"].as_array().map(Vec::len), Some(1));
    }

    let no_usage = with(
        with(chat("count me"), "stream", json!(true)),
        "stream_options",
        json!({"include_usage": false}),
    );
    let response = post(&mock, "/chat/completions", &no_usage).await;
    let events = sse_events(&response.text().await.expect("body"));
    assert!(events.iter().all(|e| e.get("usage").is_none()));
}

#[tokio::test]
async fn truncated_stream_stops_after_the_first_content_chunk() {
    let mock = start().await;
    mock.set_truncate_streams(true);
    for _ in 0..20 {
        let response = post(
            &mock,
            "/chat/completions",
            &with(chat("cut me short"), "stream", json!(true)),
        )
        .await;
        assert_eq!(response.status(), 200);
        let body = body_until_cut(response).await;
        let events = sse_events(std::str::from_utf8(&body).expect("UTF-8"));
        assert_eq!(events.len(), 2, "role chunk and first content chunk");
        assert_eq!(events[1]["choices"][0]["delta"]["content"], "mock ");
        assert!(
            events
                .iter()
                .all(|e| e != "[DONE]" && e["choices"][0]["finish_reason"].is_null())
        );
    }

    mock.set_truncate_streams(false);
    let response = post(
        &mock,
        "/chat/completions",
        &with(chat("cut me short"), "stream", json!(true)),
    )
    .await;
    let events = sse_events(&response.text().await.expect("a complete body"));
    assert_eq!(events.last(), Some(&json!("[DONE]")));
}

#[tokio::test]
async fn failure_injection_sets_status_code_and_retry_after() {
    let mock = start().await;
    mock.set_failure(Some(
        FailureMode::always(429)
            .with_retry_after(Duration::from_millis(1500))
            .with_code("insufficient_quota"),
    ));
    let response = post(&mock, "/chat/completions", &chat("fail me")).await;
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["retry-after"], "2");
    assert_eq!(response.headers()["retry-after-ms"], "1500");
    let body: Value = response.json().await.expect("JSON error");
    assert_eq!(body["error"]["code"], "insufficient_quota");
    assert_eq!(body["error"]["type"], "insufficient_quota");
    assert_eq!(body["error"]["param"], Value::Null);
    assert!(body["error"]["message"].is_string());

    mock.set_failure(Some(FailureMode::always(503)));
    let response = post(&mock, "/embeddings", &json!({"model": "m", "input": "x"})).await;
    assert_eq!(response.status(), 503);
    assert!(response.headers().get("retry-after").is_none());
    let body: Value = response.json().await.expect("JSON error");
    assert_eq!(body["error"]["type"], "server_error");
    assert_eq!(body["error"]["code"], Value::Null);

    mock.set_failure(Some(FailureMode {
        fraction: 0.0,
        ..FailureMode::always(500)
    }));
    let (status, _) = post_json(&mock, "/chat/completions", &chat("fine")).await;
    assert_eq!(status, 200);

    mock.set_failure(None);
    let (status, _) = post_json(&mock, "/chat/completions", &chat("fine")).await;
    assert_eq!(status, 200);
    // Failed calls were still received, so they count.
    assert_eq!(mock.calls(), 4);
}

#[tokio::test]
async fn held_calls_are_counted_then_released_together() {
    let mock = start().await;
    mock.hold();
    let requests = 50;
    let handles: Vec<_> = (0..requests)
        .map(|i| {
            let mock = mock.clone();
            tokio::spawn(async move {
                post(&mock, "/chat/completions", &chat(&format!("held {i}")))
                    .await
                    .status()
                    .as_u16()
            })
        })
        .collect();

    assert!(mock.wait_for_calls(requests, DEADLINE).await);
    assert_eq!(mock.calls(), requests);
    // Other routes are not held.
    let (status, _) = {
        let response = client()
            .get(format!("{}/models", mock.base_url()))
            .send()
            .await
            .expect("models");
        (response.status().as_u16(), ())
    };
    assert_eq!(status, 200);
    assert!(
        handles.iter().all(|h| !h.is_finished()),
        "held calls must not answer before release"
    );

    mock.release();
    for handle in handles {
        let status = tokio::time::timeout(DEADLINE, handle)
            .await
            .expect("released in time")
            .expect("request task");
        assert_eq!(status, 200);
    }
    assert_eq!(mock.requests().len(), 50);
}

#[tokio::test]
async fn a_release_frees_calls_even_if_a_new_hold_follows_at_once() {
    let mock = start().await;
    mock.hold();
    let first = {
        let mock = mock.clone();
        tokio::spawn(async move { post(&mock, "/chat/completions", &chat("first")).await })
    };
    assert!(mock.wait_for_calls(1, DEADLINE).await);
    mock.release();
    mock.hold();
    let response = tokio::time::timeout(DEADLINE, first)
        .await
        .expect("the first call was released")
        .expect("request task");
    assert_eq!(response.status(), 200);

    let second = {
        let mock = mock.clone();
        tokio::spawn(async move { post(&mock, "/chat/completions", &chat("second")).await })
    };
    assert!(mock.wait_for_calls(2, DEADLINE).await);
    assert!(!second.is_finished());
    mock.release();
    let response = tokio::time::timeout(DEADLINE, second)
        .await
        .expect("the second call was released")
        .expect("request task");
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn wait_for_calls_gives_up_at_its_timeout() {
    let mock = start().await;
    assert!(mock.wait_for_calls(0, Duration::ZERO).await);
    assert!(!mock.wait_for_calls(1, Duration::from_millis(20)).await);
}

#[tokio::test]
async fn scripts_answer_in_fifo_order_then_normal_answers_resume() {
    let mock = start().await;
    mock.push_script(Scripted {
        status: 418,
        headers: vec![("x-script".into(), "first".into())],
        body: r#"{"first":true}"#.into(),
    });
    mock.push_script(Scripted::json(503, r#"{"second":true}"#));
    // Scripts win over failure injection.
    mock.set_failure(Some(FailureMode::always(500)));

    let response = post(&mock, "/chat/completions", &chat("a")).await;
    assert_eq!(response.status(), 418);
    assert_eq!(response.headers()["x-script"], "first");
    assert_eq!(response.headers()["content-type"], "application/json");
    assert_eq!(response.text().await.expect("body"), r#"{"first":true}"#);

    // A script answers the next billable call whatever its endpoint or body.
    let response = post(&mock, "/embeddings", &json!("not even an object")).await;
    assert_eq!(response.status(), 503);
    assert_eq!(response.text().await.expect("body"), r#"{"second":true}"#);

    let (status, _) = post_json(&mock, "/chat/completions", &chat("c")).await;
    assert_eq!(status, 500);
    mock.set_failure(None);
    let (status, body) = post_json(&mock, "/chat/completions", &chat("d")).await;
    assert_eq!(status, 200);
    assert_eq!(body["id"], "chatcmpl-mock-4");
}

#[tokio::test]
async fn embeddings_are_deterministic_per_input() {
    let mock = start().await;
    let request = json!({"model": "text-embedding-3-small", "input": "the same text"});
    let (status, a) = post_json(&mock, "/embeddings", &request).await;
    assert_eq!(status, 200);
    let (_, b) = post_json(&mock, "/embeddings", &request).await;
    assert_eq!(a, b, "embeddings carry no per-call id");
    assert_eq!(a["object"], "list");
    assert_eq!(a["model"], "text-embedding-3-small");
    assert_eq!(a["data"][0]["object"], "embedding");
    assert_eq!(a["data"][0]["index"], 0);
    let vector = a["data"][0]["embedding"].as_array().expect("vector");
    assert_eq!(vector.len(), 8);
    assert!(
        vector
            .iter()
            .all(|v| v.as_f64().is_some_and(|v| (-1.0..=1.0).contains(&v)))
    );
    assert_eq!(a["usage"], json!({"prompt_tokens": 4, "total_tokens": 4}));

    let (_, many) = post_json(
        &mock,
        "/embeddings",
        &json!({"model": "text-embedding-3-small", "input": ["the same text", "other text"], "dimensions": 40}),
    )
    .await;
    let data = many["data"].as_array().expect("data");
    assert_eq!(data.len(), 2);
    assert_eq!(data[1]["index"], 1);
    let long = data[0]["embedding"].as_array().expect("vector");
    assert_eq!(long.len(), 40);
    assert_eq!(
        &long[..8],
        vector.as_slice(),
        "a longer vector extends the short one"
    );
    assert_ne!(data[0]["embedding"], data[1]["embedding"]);
    assert_eq!(
        many["usage"]["prompt_tokens"], 7,
        "billed per input: 4 + 3 tokens"
    );
    assert_eq!(mock.embedded_inputs(), 4, "one, one, then two inputs");
    assert_eq!(mock.embedded_counts()["the same text"], 3);
    let calls: Value = client()
        .get(format!("http://{}/__mock/calls", mock.addr()))
        .send()
        .await
        .expect("admin answers")
        .json()
        .await
        .expect("JSON");
    assert_eq!(calls["embedded_inputs"], 4, "{calls}");

    let (_, other_model) = post_json(
        &mock,
        "/embeddings",
        &json!({"model": "text-embedding-3-large", "input": "the same text"}),
    )
    .await;
    assert_ne!(
        other_model["data"][0]["embedding"], a["data"][0]["embedding"],
        "the vector is a function of the model too"
    );

    let (_, encoded) = post_json(
        &mock,
        "/embeddings",
        &json!({"model": "m", "input": "the same text", "encoding_format": "base64"}),
    )
    .await;
    // Eight little-endian f32 values: 32 bytes, 44 base64 characters with padding.
    let text = encoded["data"][0]["embedding"].as_str().expect("base64");
    assert_eq!(text.len(), 44);
    assert!(text.ends_with('='));
}

#[test]
fn embedding_values_come_from_the_model_and_input_hash() {
    let vector = embedding_vector("m", "abc", 3);
    let digest = Sha256::digest(b"m\0\0\0\0\0abc");
    let expected: Vec<f32> = digest
        .chunks_exact(4)
        .take(3)
        .map(|four| (u32::from_be_bytes(four.try_into().unwrap()) >> 8) as f32 / 8_388_608.0 - 1.0)
        .collect();
    assert_eq!(vector, expected);
    assert!(vector.iter().all(|v| (-1.0..1.0).contains(v)));
    // Not short decimals: the f32's shortest form is not the f64 a client parses.
    assert!(
        vector
            .iter()
            .any(|v| v.to_string().parse::<f64>().unwrap() != f64::from(*v))
    );
    assert_ne!(vector, embedding_vector("n", "abc", 3));
}

#[tokio::test]
async fn legacy_completions_answer_plain_and_streamed() {
    let mock = start().await;
    let request = json!({"model": "gpt-3.5-turbo-instruct", "prompt": "Once upon a time"});
    let (status, plain) = post_json(&mock, "/completions", &request).await;
    assert_eq!(status, 200);
    assert_eq!(plain["id"], "cmpl-mock-1");
    assert_eq!(plain["object"], "text_completion");
    let choice = &plain["choices"][0];
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(choice["logprobs"], Value::Null);
    let text = choice["text"].as_str().expect("text");
    assert!(text.ends_with("Once upon a time"), "{text}");

    let response = post(&mock, "/completions", &with(request, "stream", json!(true))).await;
    let events = sse_events(&response.text().await.expect("body"));
    assert_eq!(events.last(), Some(&json!("[DONE]")));
    let chunks = &events[..events.len() - 1];
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"));
    let assembled: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(assembled, text);
    assert_eq!(
        chunks[chunks.len() - 1]["choices"][0]["finish_reason"],
        "stop"
    );
    assert_eq!(mock.calls_to("/v1/completions"), 2);
    assert_eq!(mock.calls_to("/chat/completions"), 0);
}

#[tokio::test]
async fn bad_requests_get_openai_errors_and_still_count() {
    let mock = start().await;
    let response = client()
        .post(format!("{}/chat/completions", mock.base_url()))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.expect("JSON error");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(body["error"]["param"], Value::Null);
    assert_eq!(body["error"]["code"], Value::Null);
    assert!(body["error"]["message"].is_string());

    let (status, body) = post_json(
        &mock,
        "/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["type"], "invalid_request_error");

    let (status, _) = post_json(&mock, "/embeddings", &json!({"input": "x"})).await;
    assert_eq!(status, 400);
    let (status, _) = post_json(&mock, "/chat/completions", &with(chat("x"), "n", json!(0))).await;
    assert_eq!(status, 400);
    assert_eq!(mock.calls(), 4);

    let response = client()
        .get(format!("{}/nope", mock.base_url()))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 404);
    assert_eq!(mock.calls(), 4, "unknown routes are not billable");
}

#[tokio::test]
async fn models_are_listed() {
    let mock = start().await;
    let response = client()
        .get(format!("{}/models", mock.base_url()))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.expect("JSON");
    assert_eq!(body["object"], "list");
    let ids: Vec<&str> = body["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|m| {
            assert_eq!(m["object"], "model");
            assert_eq!(m["owned_by"], "mock");
            m["id"].as_str().expect("id")
        })
        .collect();
    assert_eq!(ids, ["gpt-4o-mini", "gpt-4o", "text-embedding-3-small"]);
    assert_eq!(mock.calls(), 0, "listing models is not billable");
}

#[tokio::test]
async fn every_response_carries_provider_headers() {
    let mock = start().await;
    let response = post(&mock, "/chat/completions", &chat("headers")).await;
    let headers = response.headers();
    assert_eq!(headers["x-request-id"], "req_mock_1");
    assert_eq!(headers["set-cookie"], "mock_session=1");
    assert_eq!(headers["x-ratelimit-remaining-requests"], "999");
    assert!(
        headers["openai-processing-ms"]
            .to_str()
            .is_ok_and(|ms| ms.parse::<u64>().is_ok())
    );

    mock.set_failure(Some(FailureMode::always(500)));
    let response = post(&mock, "/chat/completions", &chat("headers")).await;
    assert_eq!(response.headers()["x-request-id"], "req_mock_2");
    assert_eq!(response.headers()["set-cookie"], "mock_session=2");

    let response = client()
        .get(format!("{}/models", mock.base_url()))
        .send()
        .await
        .expect("request");
    assert_eq!(response.headers()["x-request-id"], "req_mock_0");
    assert_eq!(response.headers()["x-ratelimit-remaining-requests"], "999");
}

#[tokio::test]
async fn requests_are_recorded_in_order_with_headers_and_body() {
    let mock = start().await;
    client()
        .post(format!(
            "{}/chat/completions?api-version=1",
            mock.base_url()
        ))
        .header("authorization", "Bearer sk-test")
        .json(&chat("record me"))
        .send()
        .await
        .expect("request");
    post(&mock, "/embeddings", &json!({"model": "m", "input": "x"})).await;

    let requests = mock.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].path, "/v1/chat/completions");
    assert_eq!(requests[0].query.as_deref(), Some("api-version=1"));
    assert_eq!(requests[0].header("Authorization"), Some("Bearer sk-test"));
    assert_eq!(requests[0].json(), Some(chat("record me")));
    assert_eq!(requests[1].path, "/v1/embeddings");
    assert!(requests[0].at <= requests[1].at);
}

#[tokio::test]
async fn reset_returns_to_the_startup_settings() {
    let mock = MockProvider::start(MockSettings {
        latency: Duration::ZERO,
        ..MockSettings::default()
    })
    .await
    .expect("start");
    post(&mock, "/chat/completions", &chat("before")).await;
    mock.push_script(Scripted::json(500, "{}"));
    mock.set_failure(Some(FailureMode::always(502)));
    mock.set_truncate_streams(true);
    mock.set_latency(Duration::from_secs(3600));
    mock.hold();
    let held = {
        let mock = mock.clone();
        tokio::spawn(async move { post(&mock, "/chat/completions", &chat("held")).await })
    };
    assert!(mock.wait_for_calls(2, DEADLINE).await);

    mock.reset();
    assert_eq!(mock.calls(), 0);
    assert_eq!(mock.calls_to("/chat/completions"), 0);
    assert!(mock.requests().is_empty());

    // The held call was let go, yet still pays the latency set before the reset; it is the
    // next one that must come back normally.
    held.abort();
    let (status, body) = post_json(&mock, "/chat/completions", &chat("after")).await;
    assert_eq!(status, 200, "no script, no failure, no hold, no latency");
    assert_eq!(body["id"], "chatcmpl-mock-1");
    let response = post(
        &mock,
        "/chat/completions",
        &with(chat("after"), "stream", json!(true)),
    )
    .await;
    let events = sse_events(&response.text().await.expect("untruncated body"));
    assert_eq!(events.last(), Some(&json!("[DONE]")));
}

#[tokio::test]
async fn admin_routes_steer_the_mock_over_http() {
    let mock = start().await;
    let http = client();
    let admin = |path: &str| format!("http://{}/__mock/{path}", mock.addr());

    let status = |r: reqwest::Response| r.status().as_u16();
    assert_eq!(
        status(http.post(admin("hold")).send().await.expect("hold")),
        204
    );
    let held = {
        let mock = mock.clone();
        tokio::spawn(async move { post(&mock, "/chat/completions", &chat("via admin")).await })
    };
    let calls: Value = http
        .get(admin("calls?wait_for=1&timeout_ms=10000"))
        .send()
        .await
        .expect("long poll")
        .json()
        .await
        .expect("JSON");
    assert_eq!(calls["calls"], 1);
    assert_eq!(calls["reached"], true);
    assert_eq!(calls["by_path"], json!({"/v1/chat/completions": 1}));
    assert!(!held.is_finished());
    assert_eq!(
        status(http.post(admin("release")).send().await.expect("release")),
        204
    );
    let response = tokio::time::timeout(DEADLINE, held)
        .await
        .expect("released")
        .expect("task");
    assert_eq!(response.status(), 200);

    let calls: Value = http
        .get(admin("calls?wait_for=5&timeout_ms=10"))
        .send()
        .await
        .expect("short poll")
        .json()
        .await
        .expect("JSON");
    assert_eq!(calls["reached"], false);

    let set_failure = http
        .post(admin("failure"))
        .json(&json!({"status": 429, "fraction": 1.0, "retry_after_ms": 250, "code": "slow_down"}))
        .send()
        .await
        .expect("failure");
    assert_eq!(status(set_failure), 204);
    let response = post(&mock, "/chat/completions", &chat("x")).await;
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["retry-after"], "1");
    assert_eq!(response.headers()["retry-after-ms"], "250");
    let rejected = http
        .post(admin("failure"))
        .json(&json!({"status": 429, "fraction": 2.0}))
        .send()
        .await
        .expect("failure");
    assert_eq!(status(rejected), 400);
    let cleared = http
        .post(admin("failure"))
        .json(&Value::Null)
        .send()
        .await
        .expect("failure");
    assert_eq!(status(cleared), 204);
    assert_eq!(
        post(&mock, "/chat/completions", &chat("x")).await.status(),
        200
    );

    let latency = http
        .post(admin("latency"))
        .json(&json!({"ms": 0}))
        .send()
        .await
        .expect("latency");
    assert_eq!(status(latency), 204);
    let typo = http
        .post(admin("latency"))
        .json(&json!({"millis": 5}))
        .send()
        .await
        .expect("latency");
    assert_eq!(status(typo), 400);

    let script = http
        .post(admin("script"))
        .json(&json!({"status": 401, "body": {"error": {"message": "no"}}}))
        .send()
        .await
        .expect("script");
    assert_eq!(status(script), 204);
    let (code, body) = post_json(&mock, "/chat/completions", &chat("x")).await;
    assert_eq!((code, body), (401, json!({"error": {"message": "no"}})));

    assert_eq!(
        status(http.post(admin("reset")).send().await.expect("reset")),
        204
    );
    assert_eq!(mock.calls(), 0);
}

#[tokio::test]
async fn serve_stops_on_its_signal_and_lets_held_calls_go() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(MockProvider::serve(
        listener,
        MockSettings::default(),
        async move {
            let _ = stopped.await;
        },
    ));
    let http = client();
    let hold = http
        .post(format!("http://{addr}/__mock/hold"))
        .send()
        .await
        .expect("hold");
    assert_eq!(hold.status(), 204);
    let held = {
        let http = http.clone();
        tokio::spawn(async move {
            http.post(format!("http://{addr}/v1/chat/completions"))
                .json(&chat("held at shutdown"))
                .send()
                .await
                .expect("request")
                .status()
        })
    };
    let calls: Value = http
        .get(format!(
            "http://{addr}/__mock/calls?wait_for=1&timeout_ms=10000"
        ))
        .send()
        .await
        .expect("long poll")
        .json()
        .await
        .expect("JSON");
    assert_eq!(calls["reached"], true);

    stop.send(()).expect("server is listening for its signal");
    let served = tokio::time::timeout(DEADLINE, server)
        .await
        .expect("server stopped in time")
        .expect("server task");
    assert!(served.is_ok(), "{served:?}");
    let status = tokio::time::timeout(DEADLINE, held)
        .await
        .expect("held call answered")
        .expect("task");
    assert_eq!(status, 200);
}

proptest! {
    #[test]
    fn word_pieces_concatenate_back_and_count_words(text in "[ a-z\n\t]{0,40}") {
        let pieces = word_pieces(&text);
        prop_assert_eq!(pieces.concat(), text.clone());
        if text.trim().is_empty() {
            prop_assert!(pieces.len() <= 1);
        } else {
            prop_assert_eq!(pieces.len(), text.split_whitespace().count());
        }
    }

    #[test]
    fn canonical_json_ignores_key_order(keys in prop::collection::btree_set("[a-z]{1,6}", 1..8)) {
        let forward: serde_json::Map<String, Value> =
            keys.iter().map(|k| (k.clone(), json!({"z": 1, "a": [k]}))).collect();
        let backward: serde_json::Map<String, Value> =
            keys.iter().rev().map(|k| (k.clone(), json!({"a": [k], "z": 1}))).collect();
        prop_assert_eq!(
            canonical_json(&Value::Object(forward)),
            canonical_json(&Value::Object(backward))
        );
    }
}

#[tokio::test]
async fn every_request_line_is_noted_and_the_model_list_can_be_chosen() {
    let mock = MockProvider::start(MockSettings {
        models: Some(vec!["claude-3-haiku".into()]),
        ..MockSettings::default()
    })
    .await
    .expect("start");
    let listed: Value = client()
        .get(format!("{}/models", mock.base_url()))
        .send()
        .await
        .expect("models")
        .json()
        .await
        .expect("JSON");
    assert_eq!(listed["data"][0]["id"], "claude-3-haiku");
    assert_eq!(listed["data"].as_array().map(Vec::len), Some(1));
    let unknown = client()
        .delete(format!("{}/files/f-1?x=1", mock.base_url()))
        .send()
        .await
        .expect("unknown path");
    assert_eq!(unknown.status().as_u16(), 404);
    let upload = client()
        .post(format!("{}/audio/transcriptions", mock.base_url()))
        .header("content-type", "multipart/form-data; boundary=b")
        .body("--b--\r\n")
        .send()
        .await
        .expect("transcription");
    assert_eq!(upload.status().as_u16(), 200);
    client()
        .post(format!("http://{}/__mock/reset", mock.addr()))
        .send()
        .await
        .expect("admin");
    // The reset cleared the notes; admin calls are never noted.
    assert!(mock.received().is_empty());
    post(&mock, "/embeddings", &json!({"model": "m", "input": "x"})).await;
    assert_eq!(mock.received(), ["POST /v1/embeddings"]);
}

#[tokio::test]
async fn request_lines_are_noted_in_order_until_a_reset() {
    let mock = start().await;
    client()
        .get(format!("{}/models", mock.base_url()))
        .send()
        .await
        .expect("models");
    client()
        .delete(format!("{}/files/f-1?x=1", mock.base_url()))
        .send()
        .await
        .expect("unknown path");
    assert_eq!(
        mock.received(),
        ["GET /v1/models", "DELETE /v1/files/f-1?x=1"]
    );
    assert_eq!(mock.calls(), 0, "neither is billable");
}

/// `POST /v1/images/generations` answers OpenAI's `ImagesResponse` (`created`, `data[]` with
/// `b64_json` and `revised_prompt`), `n` images, is billable and scriptable.
#[tokio::test]
async fn image_generations_answer_openais_images_response_and_count_as_calls() {
    let mock = MockProvider::start(MockSettings::default()).await.unwrap();
    let (status, body) = post_json(
        &mock,
        "/images/generations",
        &json!({"model": "gpt-image-1", "prompt": "a corral at dawn", "n": 2}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body["created"].as_u64().is_some());
    let data = body["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    for image in data {
        assert!(!image["b64_json"].as_str().unwrap().is_empty());
        assert_eq!(image["revised_prompt"], "a corral at dawn");
    }
    let (status, body) = post_json(
        &mock,
        "/images/generations",
        &json!({"model": "gpt-image-1"}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(mock.calls_to("/images/generations"), 2);
    mock.push_script(Scripted::json(
        500,
        r#"{"error":{"message":"boom","type":"server_error","param":null,"code":null}}"#,
    ));
    let (status, _) = post_json(&mock, "/images/generations", &json!({"prompt": "x"})).await;
    assert_eq!(status, 500);
}
