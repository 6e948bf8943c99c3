//! Vertex AI's surface over real loopback HTTP: the door (Google's 401, then 404), Claude's
//! `rawPredict` / `streamRawPredict` with Vertex's body rules, Gemini's methods under both API
//! versions, and the knobs every billable call obeys, its failures in Google's shape.

use std::time::Duration;

use serde_json::{Value, json};

use axum::http::header::AUTHORIZATION;
use axum::http::{HeaderMap, HeaderValue};

use super::{Publisher, Refusal, Target};
use crate::test_support::{DEADLINE, client, named_events, start};
use crate::{FailureMode, MockProvider, MockSettings, Scripted, Shared};

const CLAUDE: &str = "claude-sonnet-4@20250514";
const PREFIX: &str = "/v1/projects/my-project/locations/us-east5/publishers";

fn claude_path(method: &str) -> String {
    format!("{PREFIX}/anthropic/models/{CLAUDE}:{method}")
}

/// A Messages body as AnthropicVertex sends it: no `model`, the version in the body.
fn claude_body(text: &str) -> Value {
    json!({
        "anthropic_version": "vertex-2023-10-16",
        "max_tokens": 256,
        "system": "You are terse.",
        "messages": [{"role": "user", "content": text}],
    })
}

fn gemini_body(text: &str) -> Value {
    json!({"contents": [{"role": "user", "parts": [{"text": text}]}]})
}

/// A token from the mock's own Google endpoint.
fn token(mock: &MockProvider) -> String {
    mock.inner.shared.google.issue().0
}

/// A POST of `body` to `path` below the mock's root, bearing `token` if any.
async fn post(
    mock: &MockProvider,
    path: &str,
    token: Option<&str>,
    body: &Value,
) -> reqwest::Response {
    let mut request = client()
        .post(format!("http://{}{path}", mock.addr()))
        .json(body)
        .timeout(DEADLINE);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request.send().await.expect("sending the request")
}

async fn post_json(mock: &MockProvider, path: &str, body: &Value) -> (u16, Value) {
    let response = post(mock, path, Some(&token(mock)), body).await;
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON body"))
}

#[test]
fn targets_are_read_off_vertex_paths() {
    let claude = claude_path("rawPredict");
    assert_eq!(
        Target::of(&claude),
        Some(Target {
            publisher: Publisher::Anthropic,
            model: CLAUDE,
            method: "rawPredict"
        })
    );
    let gemini = "/v1beta1/projects/p/locations/global/publishers/google/models/gemini-2.5-pro:streamGenerateContent";
    assert_eq!(
        Target::of(gemini).map(|target| (target.publisher, target.model)),
        Some((Publisher::Google, "gemini-2.5-pro"))
    );
    for path in [
        format!("{PREFIX}/anthropic/models/{CLAUDE}:generateContent"),
        format!("{PREFIX}/google/models/gemini-2.5-pro:rawPredict"),
        format!("{PREFIX}/meta/models/llama:rawPredict"),
        format!("{PREFIX}/anthropic/models/:rawPredict"),
        format!("{PREFIX}/anthropic/models/{CLAUDE}"),
        "/v1/projects//locations/l/publishers/google/models/g:generateContent".to_owned(),
        "/v2/projects/p/locations/l/publishers/google/models/g:generateContent".to_owned(),
        "/v1/projects/p/locations/l/publishers/google/models/g:generateContent/extra".to_owned(),
    ] {
        assert_eq!(Target::of(&path), None, "{path}");
    }
}

#[tokio::test]
async fn the_door_wants_a_token_the_mock_issued_and_bills_nothing_it_refuses() {
    let mock = start().await;
    let path = claude_path("rawPredict");
    let body = claude_body("hi");
    let entra: Value = client()
        .post(mock.entra_token_url("tenant"))
        .form(&[
            ("grant_type", "client_credentials"),
            ("client_id", "app"),
            ("client_secret", "secret"),
            ("scope", "https://cognitiveservices.azure.com/.default"),
        ])
        .send()
        .await
        .expect("asking Entra")
        .json()
        .await
        .expect("Entra's token");
    let entra = entra["access_token"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    for (case, token) in [
        ("no credential", None),
        ("a token never issued", Some("ya29.never-issued")),
        ("an Entra token", Some(entra.as_str())),
    ] {
        let response = post(&mock, &path, token, &body).await;
        assert_eq!(response.status(), 401, "{case}");
        let body: Value = response.json().await.expect("a JSON body");
        assert_eq!(body["error"]["code"], 401, "{case}");
        assert_eq!(body["error"]["status"], "UNAUTHENTICATED", "{case}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with("Request had invalid authentication credentials."),
            "{message}"
        );
    }
    let unknown = format!("{PREFIX}/anthropic/models/{CLAUDE}:predict");
    let (status, body) = post_json(&mock, &unknown, &claude_body("hi")).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["status"], "NOT_FOUND");
    assert_eq!(mock.calls(), 0, "refused at the door: no call");
    assert_eq!(
        mock.received().len(),
        5,
        "yet every request was seen (Entra's included)"
    );
}

#[tokio::test(start_paused = true)]
async fn a_token_opens_the_door_until_the_instant_it_expires() {
    let shared = Shared::new(MockSettings::default());
    shared.google.push_lifetime(Duration::from_secs(1));
    let (token, _) = shared.google.issue();
    let mut headers = HeaderMap::new();
    let bearer = HeaderValue::try_from(format!("Bearer {token}")).expect("a header value");
    headers.insert(AUTHORIZATION, bearer);
    let path = claude_path("rawPredict");
    assert_eq!(
        shared.admit_vertex(&path, &headers).ok(),
        Some(Publisher::Anthropic)
    );
    tokio::time::advance(Duration::from_millis(999)).await;
    assert!(shared.admit_vertex(&path, &headers).is_ok());
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(
        shared.admit_vertex(&path, &headers),
        Err(Refusal::Unauthenticated)
    );
}

#[tokio::test]
async fn raw_predict_is_the_messages_answer_for_the_paths_model() {
    let mock = start().await;
    let path = format!("{}?trace=1", claude_path("rawPredict"));
    let (status, vertex) = post_json(&mock, &path, &claude_body("Hello Vertex")).await;
    assert_eq!(status, 200, "{vertex}");
    assert_eq!(vertex["type"], "message");
    assert_eq!(vertex["model"], CLAUDE);
    assert_eq!(vertex["stop_reason"], "end_turn");

    // The same body on Anthropic's own surface answers the same content.
    let mut direct = claude_body("Hello Vertex");
    direct
        .as_object_mut()
        .map(|body| body.remove("anthropic_version"));
    direct["model"] = json!(CLAUDE);
    let anthropic: Value = client()
        .post(format!("{}/messages", mock.base_url()))
        .header("anthropic-version", "2023-06-01")
        .json(&direct)
        .send()
        .await
        .expect("sending the request")
        .json()
        .await
        .expect("a JSON body");
    assert_eq!(vertex["content"], anthropic["content"]);
    assert_eq!(vertex["usage"], anthropic["usage"]);

    assert_eq!(mock.calls_to(":rawPredict"), 1);
    let recorded = &mock.requests()[0];
    assert_eq!(recorded.path, claude_path("rawPredict"));
    assert_eq!(recorded.query.as_deref(), Some("trace=1"));
    assert!(
        recorded
            .header("authorization")
            .is_some_and(|v| v.starts_with("Bearer ya29.mock-"))
    );
}

#[tokio::test]
async fn stream_raw_predict_streams_as_anthropic_does() {
    let mock = start().await;
    let mut body = claude_body("Hello Vertex");
    body["stream"] = json!(true);
    let (_, whole) = post_json(
        &mock,
        &claude_path("rawPredict"),
        &claude_body("Hello Vertex"),
    )
    .await;
    let response = post(
        &mock,
        &claude_path("streamRawPredict"),
        Some(&token(&mock)),
        &body,
    )
    .await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"].to_str().ok(),
        Some("text/event-stream")
    );
    let events = named_events(&response.text().await.expect("the stream"));
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names.first(), Some(&"message_start"));
    assert_eq!(names.last(), Some(&"message_stop"));
    assert_eq!(events[0].1["message"]["model"], CLAUDE);
    let text: String = events
        .iter()
        .filter_map(|(_, event)| event["delta"]["text"].as_str())
        .collect();
    assert_eq!(
        text,
        whole["content"][0]["text"].as_str().unwrap_or_default()
    );
}

#[tokio::test]
async fn vertex_refuses_a_body_that_breaks_its_rules_in_googles_shape() {
    let mock = start().await;
    let body = claude_body("hi");
    let with = |key: &str, value: Value| {
        let mut body = body.clone();
        body[key] = value;
        body
    };
    let mut unversioned = body.clone();
    unversioned
        .as_object_mut()
        .map(|body| body.remove("anthropic_version"));
    for (case, method, body, says) in [
        (
            "a model in the body",
            "rawPredict",
            with("model", json!(CLAUDE)),
            "model",
        ),
        (
            "no version",
            "rawPredict",
            unversioned,
            "anthropic_version: Field required",
        ),
        (
            "the Messages version",
            "rawPredict",
            with("anthropic_version", json!("2023-06-01")),
            "vertex-2023-10-16",
        ),
        (
            "a stream without stream",
            "streamRawPredict",
            body.clone(),
            "\"stream\": true",
        ),
        (
            "stream false",
            "streamRawPredict",
            with("stream", json!(false)),
            "\"stream\": true",
        ),
    ] {
        let (status, answer) = post_json(&mock, &claude_path(method), &body).await;
        assert_eq!(status, 400, "{case}: {answer}");
        assert_eq!(answer["error"]["code"], 400, "{case}");
        assert_eq!(answer["error"]["status"], "INVALID_ARGUMENT", "{case}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{case}: {message}");
    }
    // What Vertex passes through, Anthropic's own validation, keeps Anthropic's shape.
    let (status, answer) = post_json(
        &mock,
        &claude_path("rawPredict"),
        &with("messages", json!([])),
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["type"], "error");
    assert_eq!(answer["error"]["type"], "invalid_request_error");
    assert_eq!(mock.calls(), 6, "each was a billed call");
}

#[tokio::test]
async fn claude_takes_the_version_the_anthropic_sdks_vertex_client_sends() {
    let mock = start().await;
    for version in crate::VERTEX_ANTHROPIC_VERSIONS {
        let mut body = claude_body("hi");
        body["anthropic_version"] = json!(version);
        let (status, answer) = post_json(&mock, &claude_path("rawPredict"), &body).await;
        assert_eq!(status, 200, "{version}: {answer}");
        assert_eq!(answer["model"], CLAUDE, "{version}");
    }
    assert!(crate::VERTEX_ANTHROPIC_VERSIONS.contains(&"2026-10-21"));
}

#[tokio::test]
async fn gemini_on_vertex_answers_as_gemini_under_both_versions() {
    let mock = start().await;
    for version in ["v1", "v1beta1"] {
        let base = format!(
            "/{version}/projects/p/locations/us-central1/publishers/google/models/gemini-2.5-flash"
        );
        let (status, answer) = post_json(
            &mock,
            &format!("{base}:generateContent"),
            &gemini_body("Hi"),
        )
        .await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["modelVersion"], "gemini-2.5-flash");
        assert_eq!(answer["candidates"][0]["finishReason"], "STOP");

        let sse = post(
            &mock,
            &format!("{base}:streamGenerateContent?alt=sse"),
            Some(&token(&mock)),
            &gemini_body("Hi"),
        )
        .await;
        assert_eq!(
            sse.headers()["content-type"].to_str().ok(),
            Some("text/event-stream")
        );
        let sse = sse.text().await.expect("the stream");
        assert!(
            sse.starts_with("data: {") && sse.ends_with("\r\n\r\n"),
            "{sse}"
        );

        let array = post(
            &mock,
            &format!("{base}:streamGenerateContent"),
            Some(&token(&mock)),
            &gemini_body("Hi"),
        )
        .await;
        let chunks: Vec<Value> = array.json().await.expect("a JSON array of chunks");
        assert!(chunks.len() > 1, "{chunks:?}");
        assert!(
            chunks
                .iter()
                .all(|chunk| chunk["modelVersion"] == "gemini-2.5-flash")
        );

        let (status, count) =
            post_json(&mock, &format!("{base}:countTokens"), &gemini_body("Hi")).await;
        assert_eq!(status, 200, "{count}");
        assert!(count["totalTokens"].as_u64().is_some_and(|n| n > 0));
    }
    assert_eq!(mock.calls_to(":generateContent"), 2);
    assert_eq!(mock.calls_to("streamGenerateContent"), 4);
}

#[tokio::test]
async fn injected_failures_take_googles_shape_on_both_publishers() {
    let mock = start().await;
    mock.set_failure(Some(
        FailureMode::always(429).with_retry_after(Duration::from_secs(2)),
    ));
    let gemini = format!("{PREFIX}/google/models/gemini-2.5-flash:generateContent");
    for (path, body) in [
        (claude_path("rawPredict"), claude_body("hi")),
        (gemini, gemini_body("hi")),
    ] {
        let response = post(&mock, &path, Some(&token(&mock)), &body).await;
        assert_eq!(response.status(), 429);
        assert_eq!(response.headers()["retry-after"], "2");
        let body: Value = response.json().await.expect("a JSON body");
        assert_eq!(body["error"]["code"], 429, "{body}");
        assert_eq!(body["error"]["status"], "RESOURCE_EXHAUSTED", "{body}");
    }
    assert_eq!(mock.calls(), 2);
}

#[tokio::test]
async fn held_and_scripted_vertex_calls_obey_the_knobs() {
    let mock = start().await;
    mock.push_script(Scripted::json(200, r#"{"scripted":true}"#));
    let (_, scripted) = post_json(&mock, &claude_path("rawPredict"), &claude_body("hi")).await;
    assert_eq!(scripted, json!({"scripted": true}));

    mock.hold();
    let call = {
        let mock = mock.clone();
        let token = token(&mock);
        tokio::spawn(async move {
            post(
                &mock,
                &claude_path("rawPredict"),
                Some(&token),
                &claude_body("hi"),
            )
            .await
            .status()
        })
    };
    assert!(mock.wait_for_calls(2, DEADLINE).await, "counted while held");
    assert!(!call.is_finished());
    mock.release();
    assert_eq!(call.await.expect("the call ran"), 200);
}
