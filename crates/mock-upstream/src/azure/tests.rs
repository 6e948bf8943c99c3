//! Tests of the Azure surface over real loopback HTTP: the paths, the door, the annotations and
//! the content-filter verdicts, and that hold, scripts and failures apply as on OpenAI's paths.

use std::time::Duration;

use serde_json::{Value, json};

use super::reset_duration;
use crate::openai::embedding_vector;
use crate::test_support::{DEADLINE, client, start, streamed_content};
use crate::{
    AZURE_CHAT_MODEL, AZURE_EMBEDDING_MODEL, FailureMode, MockProvider, MockSettings, Scripted,
};

const VERSION: &str = "api-version=2024-10-21";

fn chat_path(deployment: &str) -> String {
    format!("/openai/deployments/{deployment}/chat/completions?{VERSION}")
}

fn chat(text: &str) -> Value {
    json!({"messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": text},
    ]})
}

fn with_model(mut body: Value, model: &str) -> Value {
    body["model"] = json!(model);
    body
}

/// A POST of `body` to `path` on the mock, with `api-key: key` if given.
async fn post(
    mock: &MockProvider,
    path: &str,
    key: Option<&str>,
    body: &Value,
) -> reqwest::Response {
    let mut request = client()
        .post(format!("{}{path}", mock.azure_endpoint()))
        .json(body);
    if let Some(key) = key {
        request = request.header("api-key", key);
    }
    request.send().await.expect("sending the request")
}

async fn post_json(mock: &MockProvider, path: &str, body: &Value) -> (u16, Value) {
    let response = post(mock, path, Some("key"), body).await;
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON body"))
}

/// The JSON payloads of an SSE body, `[DONE]` kept as a string.
async fn sse_events(response: reqwest::Response) -> Vec<Value> {
    let body = response.text().await.expect("a body");
    assert!(body.ends_with("\n\n"), "{body:?}");
    body.split_terminator("\n\n")
        .map(|event| {
            let data = event.strip_prefix("data: ").expect("a data event");
            serde_json::from_str(data).unwrap_or_else(|_| json!(data))
        })
        .collect()
}

fn safe() -> Value {
    json!({"filtered": false, "severity": "safe"})
}

#[tokio::test]
async fn both_path_shapes_answer_the_openai_content_for_the_snapshot_with_annotations() {
    let mock = start().await;
    let (_, openai) = {
        let response = client()
            .post(format!("{}/chat/completions", mock.base_url()))
            .json(&with_model(chat("Hello Azure"), "gpt-4o"))
            .send()
            .await
            .expect("sending");
        (200, response.json::<Value>().await.expect("JSON"))
    };
    // The versioned path routes by the deployment and ignores the body's model, even none.
    let (status, versioned) = post_json(&mock, &chat_path("my-gpt"), &chat("Hello Azure")).await;
    assert_eq!(status, 200, "{versioned}");
    let (status, v1) = post_json(
        &mock,
        "/openai/v1/chat/completions",
        &with_model(chat("Hello Azure"), "my-gpt"),
    )
    .await;
    assert_eq!(status, 200, "{v1}");

    for answer in [&versioned, &v1] {
        assert_eq!(answer["model"], AZURE_CHAT_MODEL);
        assert_eq!(answer["object"], "chat.completion");
        assert_eq!(
            answer["choices"][0]["message"]["content"],
            openai["choices"][0]["message"]["content"]
        );
        assert_eq!(answer["choices"][0]["finish_reason"], "stop");
        let prompt = &answer["prompt_filter_results"][0];
        assert_eq!(prompt["prompt_index"], 0);
        assert_eq!(prompt["content_filter_results"]["hate"], safe());
        assert_eq!(
            prompt["content_filter_results"]["jailbreak"],
            json!({"filtered": false, "detected": false})
        );
        let completion = &answer["choices"][0]["content_filter_results"];
        assert_eq!(completion["violence"], safe());
        assert_eq!(
            completion["protected_material_text"],
            json!({"filtered": false, "detected": false})
        );
    }
    assert!(openai.get("prompt_filter_results").is_none());
    assert_eq!(mock.calls(), 3);
    assert_eq!(mock.calls_to("/chat/completions"), 3);
    let recorded = mock.requests();
    assert_eq!(
        recorded[1].path,
        "/openai/deployments/my-gpt/chat/completions"
    );
    assert_eq!(recorded[1].query.as_deref(), Some(VERSION));
    assert_eq!(recorded[1].auth_headers(), ["api-key"]);
    assert_eq!(recorded[2].path, "/openai/v1/chat/completions");
}

#[tokio::test]
async fn the_v1_shape_needs_the_deployment_in_the_body() {
    let mock = start().await;
    let (status, body) = post_json(&mock, "/openai/v1/chat/completions", &chat("hi")).await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(mock.calls(), 1, "a bad request is still a call");
}

#[tokio::test]
async fn a_versioned_path_without_api_version_is_azures_404_and_no_call() {
    let mock = start().await;
    for path in [
        "/openai/deployments/d/chat/completions",
        "/openai/deployments/d/embeddings?api-version=",
        "/openai/responses",
    ] {
        let response = post(&mock, path, Some("key"), &chat("hi")).await;
        assert_eq!(response.status(), 404, "{path}");
        let body: Value = response.json().await.expect("JSON");
        assert_eq!(
            body,
            json!({"error": {"code": "404", "message": "Resource not found"}})
        );
    }
    let (status, body) = post_json(&mock, "/openai/deployments/d/images", &json!({})).await;
    assert_eq!((status, &body["error"]["code"]), (404, &json!("404")));
    assert_eq!(mock.calls(), 0);
    let refused = mock.azure_refused();
    assert_eq!(refused.len(), 3, "the unknown path is no door's business");
    assert_eq!(refused[0].path, "/openai/deployments/d/chat/completions");
    assert_eq!(refused[0].json().expect("the body is kept"), chat("hi"));
}

#[tokio::test]
async fn keys_are_checked_when_set_and_any_non_empty_key_opens_otherwise() {
    let mock = start().await;
    let path = chat_path("d");
    assert_eq!(
        post(&mock, &path, Some("anything"), &chat("a"))
            .await
            .status(),
        200
    );
    let invalid_key = json!({"error": {"code": "401", "message": super::INVALID_KEY}});
    for key in [Some(""), None] {
        let response = post(&mock, &path, key, &chat("a")).await;
        assert_eq!(response.status(), 401, "{key:?}");
        assert_eq!(response.json::<Value>().await.expect("JSON"), invalid_key);
    }

    mock.set_azure_keys(vec!["key-1".into(), "key-2".into()]);
    assert_eq!(
        post(&mock, &path, Some("key-2"), &chat("a")).await.status(),
        200
    );
    let response = post(&mock, &path, Some("anything"), &chat("a")).await;
    assert_eq!(response.status(), 401);
    assert_eq!(response.json::<Value>().await.expect("JSON"), invalid_key);

    assert_eq!(mock.calls(), 2, "refused requests are not calls");
    assert_eq!(mock.azure_refused().len(), 3);
    mock.reset();
    assert_eq!(
        post(&mock, &path, Some("anything"), &chat("a"))
            .await
            .status(),
        200
    );
    assert!(mock.azure_refused().is_empty());
}

#[tokio::test]
async fn an_api_key_sent_as_a_bearer_is_refused() {
    let mock = MockProvider::start(MockSettings {
        azure_keys: vec!["key-1".into()],
        ..MockSettings::default()
    })
    .await
    .expect("starting");
    let response = client()
        .post(format!(
            "{}/openai/v1/chat/completions",
            mock.azure_endpoint()
        ))
        .bearer_auth("key-1")
        .json(&with_model(chat("a"), "d"))
        .send()
        .await
        .expect("sending");
    assert_eq!(response.status(), 401);
    let body: Value = response.json().await.expect("JSON");
    assert_eq!(body["error"]["code"], "401");
    assert_eq!(body["error"]["message"], super::INVALID_TOKEN);
    assert_eq!(mock.calls(), 0);
    assert_eq!(mock.azure_refused()[0].auth_headers(), ["authorization"]);
}

#[tokio::test]
async fn a_streamed_chat_is_azures_chunk_sequence() {
    let mock = start().await;
    let mut body = chat("Stream to me");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let events = sse_events(post(&mock, &chat_path("d"), Some("key"), &body).await).await;
    let (status, plain) = post_json(&mock, &chat_path("d"), &chat("Stream to me")).await;
    assert_eq!(status, 200);

    let opening = &events[0];
    assert_eq!(
        *opening,
        json!({
            "id": "", "object": "", "created": 0, "model": "", "choices": [], "usage": null,
            "prompt_filter_results": plain["prompt_filter_results"],
        })
    );
    let (done, rest) = events.split_last().expect("events");
    assert_eq!(*done, json!("[DONE]"));
    let (usage, rest) = rest.split_last().expect("a usage chunk");
    assert_eq!(usage["choices"], json!([]));
    assert!(
        usage["usage"]["total_tokens"]
            .as_u64()
            .is_some_and(|t| t > 0)
    );
    let (annotation, content) = rest[1..].split_last().expect("an annotation chunk");
    let choice = &annotation["choices"][0];
    assert_eq!(annotation["id"], "");
    assert_eq!(choice["finish_reason"], Value::Null);
    assert!(choice.get("delta").is_none(), "{annotation}");
    assert_eq!(choice["content_filter_results"]["violence"], safe());
    let offsets = &choice["content_filter_offsets"];
    assert!(offsets["end_offset"].as_u64() > offsets["start_offset"].as_u64());

    let (finish, words) = content.split_last().expect("a finish chunk");
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    assert_eq!(finish["choices"][0]["delta"], json!({}));
    for chunk in content {
        assert_eq!(chunk["model"], AZURE_CHAT_MODEL);
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["choices"][0]["content_filter_results"], json!({}));
    }
    assert_eq!(
        streamed_content(words),
        plain["choices"][0]["message"]["content"]
            .as_str()
            .expect("content")
    );
}

#[tokio::test]
async fn a_padded_azure_stream_pads_with_annotated_chunks() {
    let mock = start().await;
    mock.set_stream_padding(64 * 1024);
    let mut body = chat("pad me");
    body["stream"] = json!(true);
    let events = sse_events(post(&mock, &chat_path("d"), Some("key"), &body).await).await;
    assert!(events.len() > 100, "padded: {}", events.len());
    assert_eq!(events[0]["choices"], json!([]));
    for chunk in &events[1..events.len() - 2] {
        assert!(
            chunk["choices"][0].get("content_filter_results").is_some(),
            "{chunk}"
        );
    }
}

#[tokio::test]
async fn the_400_trigger_is_a_billed_call_answered_with_azures_content_filter_error() {
    let mock = start().await;
    for path in [chat_path("d"), "/openai/v1/chat/completions".to_owned()] {
        let body = with_model(
            chat(&format!("say {}", crate::CONTENT_FILTER_400_TRIGGER)),
            "d",
        );
        let (status, answer) = post_json(&mock, &path, &body).await;
        assert_eq!(status, 400);
        let error = &answer["error"];
        assert_eq!(error["code"], "content_filter");
        assert_eq!(error["param"], "prompt");
        assert_eq!(error["type"], Value::Null);
        assert_eq!(error["status"], 400);
        assert!(
            error["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("The response was filtered due to the prompt"))
        );
        assert_eq!(error["innererror"]["code"], "ResponsibleAIPolicyViolation");
        assert_eq!(
            error["innererror"]["content_filter_result"]["violence"],
            json!({"filtered": true, "severity": "medium"})
        );
    }
    // Only a user's words trigger it.
    let body = json!({"messages": [
        {"role": "system", "content": crate::CONTENT_FILTER_400_TRIGGER},
        {"role": "user", "content": "hi"},
    ]});
    assert_eq!(post_json(&mock, &chat_path("d"), &body).await.0, 200);
    assert_eq!(mock.calls(), 3);
}

#[tokio::test]
async fn the_finish_trigger_ends_plain_and_streamed_choices_with_content_filter() {
    let mock = start().await;
    let body = chat(&format!("tell {}", crate::CONTENT_FILTER_FINISH_TRIGGER));
    let (status, plain) = post_json(&mock, &chat_path("d"), &body).await;
    assert_eq!(status, 200);
    let choice = &plain["choices"][0];
    assert_eq!(choice["finish_reason"], "content_filter");
    assert_eq!(
        choice["content_filter_results"]["violence"],
        json!({"filtered": true, "severity": "high"})
    );

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let events = sse_events(post(&mock, &chat_path("d"), Some("key"), &streamed).await).await;
    let finishes: Vec<&Value> = events
        .iter()
        .filter_map(|event| event["choices"].get(0))
        .map(|choice| &choice["finish_reason"])
        .filter(|reason| !reason.is_null())
        .collect();
    assert_eq!(finishes, [&json!("content_filter")]);
    let annotation = &events[events.len() - 2]["choices"][0];
    assert_eq!(
        annotation["content_filter_results"]["violence"]["filtered"],
        true
    );

    let completion = json!({"prompt": crate::CONTENT_FILTER_FINISH_TRIGGER});
    let path = format!("/openai/deployments/d/completions?{VERSION}");
    let (status, answer) = post_json(&mock, &path, &completion).await;
    assert_eq!(status, 200);
    assert_eq!(answer["choices"][0]["finish_reason"], "content_filter");
    assert_eq!(answer["model"], AZURE_CHAT_MODEL);
}

#[tokio::test]
async fn embeddings_name_the_snapshot_and_embed_as_the_deployment() {
    let mock = start().await;
    let body = json!({"model": "ignored", "input": ["one", "two"]});
    let path = format!("/openai/deployments/text-embedding-3-large/embeddings?{VERSION}");
    let (status, answer) = post_json(&mock, &path, &body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["model"], AZURE_EMBEDDING_MODEL);
    let expected: Vec<f64> = embedding_vector("text-embedding-3-large", "two", 8)
        .into_iter()
        .map(crate::openai::shortest)
        .collect();
    assert_eq!(answer["data"][1]["embedding"], json!(expected));
    assert!(answer.get("prompt_filter_results").is_none());
    assert_eq!(mock.embedded_inputs(), 2);

    let v1 = json!({"model": "text-embedding-3-large", "input": ["two"]});
    let (_, answer_v1) = post_json(&mock, "/openai/v1/embeddings", &v1).await;
    assert_eq!(answer_v1["data"][0]["embedding"], json!(expected));
}

#[tokio::test]
async fn responses_answer_on_both_shapes_for_the_snapshot() {
    let mock = start().await;
    let body = json!({"model": "my-deployment", "input": "Hello Responses"});
    for path in [
        format!("/openai/responses?{VERSION}"),
        "/openai/v1/responses".to_owned(),
    ] {
        let (status, answer) = post_json(&mock, &path, &body).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["object"], "response");
        assert_eq!(answer["model"], AZURE_CHAT_MODEL);
    }
    let blocked = json!({"model": "d", "input": crate::CONTENT_FILTER_400_TRIGGER});
    let (status, answer) = post_json(&mock, "/openai/v1/responses", &blocked).await;
    assert_eq!(
        (status, &answer["error"]["code"]),
        (400, &json!("content_filter"))
    );
    assert_eq!(mock.calls_to("/responses"), 3);
}

#[tokio::test]
async fn azure_calls_are_held_and_scripted_like_openai_calls() {
    let mock = start().await;
    mock.hold();
    let held = tokio::spawn({
        let mock = mock.clone();
        async move { post_json(&mock, &chat_path("d"), &chat("held")).await }
    });
    assert!(mock.wait_for_calls(1, DEADLINE).await);
    assert!(!held.is_finished());
    mock.release();
    let (status, _) = tokio::time::timeout(DEADLINE, held)
        .await
        .expect("released in time")
        .expect("joined");
    assert_eq!(status, 200);

    mock.push_script(Scripted::json(200, r#"{"scripted":true}"#));
    let (status, answer) = post_json(&mock, &chat_path("d"), &chat("s")).await;
    assert_eq!((status, answer), (200, json!({"scripted": true})));
}

#[tokio::test]
async fn an_injected_429_takes_azures_shape_with_its_rate_limit_headers() {
    let mock = start().await;
    mock.set_failure(Some(
        FailureMode::always(429).with_retry_after(Duration::from_millis(1500)),
    ));
    let response = post(&mock, &chat_path("d"), Some("key"), &chat("a")).await;
    assert_eq!(response.status(), 429);
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    assert_eq!(header("retry-after").as_deref(), Some("2"));
    assert_eq!(header("retry-after-ms").as_deref(), Some("1500"));
    assert_eq!(
        header("x-ratelimit-remaining-requests").as_deref(),
        Some("0")
    );
    assert_eq!(
        header("x-ratelimit-reset-requests").as_deref(),
        Some("1.5s")
    );
    let body: Value = response.json().await.expect("JSON");
    assert_eq!(body["error"]["code"], "429");
    let message = body["error"]["message"].as_str().expect("a message");
    assert!(
        message.starts_with(
            "Requests to the ChatCompletions_Create Operation under Azure OpenAI API version \
             2024-10-21 have exceeded"
        ),
        "{message}"
    );
    assert!(
        message.contains("Please retry after 2 seconds."),
        "{message}"
    );

    mock.set_failure(Some(FailureMode::always(429)));
    let body = with_model(json!({"input": "x"}), "d");
    let response = post(&mock, "/openai/v1/embeddings", Some("key"), &body).await;
    assert!(response.headers().get("retry-after").is_none());
    assert_eq!(response.headers()["x-ratelimit-reset-requests"], "1s");
    let body: Value = response.json().await.expect("JSON");
    let message = body["error"]["message"].as_str().expect("a message");
    assert!(message.contains("Embeddings_Create Operation under Azure OpenAI API version v1"));

    mock.set_failure(Some(
        FailureMode::always(503).with_code("ServiceUnavailable"),
    ));
    let (status, body) = post_json(&mock, &chat_path("d"), &chat("a")).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (503, &json!("ServiceUnavailable"))
    );
    assert_eq!(mock.calls(), 3, "failures are calls");
}

#[test]
fn reset_durations_read_like_azures_headers() {
    assert_eq!(reset_duration(Duration::from_millis(250)), "250ms");
    assert_eq!(reset_duration(Duration::from_secs(2)), "2s");
    assert_eq!(reset_duration(Duration::from_millis(1500)), "1.5s");
    assert_eq!(reset_duration(Duration::from_millis(61_250)), "61.25s");
    assert_eq!(reset_duration(Duration::ZERO), "1ms");
}
