//! Gemini's native API before corral has a Gemini adapter: a request that
//! speaks it (a `/v1beta/` path, a Gemini model method, a Gemini key in
//! `x-goog-api-key` or `?key=`) is answered 404 in Gemini's error shape and
//! sent nowhere, so a Gemini key never reaches another provider. Google's own
//! SDK raises its own error type for it.

use serde_json::{Value, json};

use crate::{harness::TestGateway, sdk::Python};

const KEY: &str = "AIza-GEMINICANARY-7d1e";

async fn send(gateway: &TestGateway, method: &str, path: &str, key_header: bool) -> (u16, Value) {
    let mut request = gateway
        .client
        .request(method.parse().unwrap(), format!("{}{path}", gateway.url))
        .header("content-type", "application/json");
    if key_header {
        request = request.header("x-goog-api-key", KEY);
    }
    if method == "POST" {
        request = request.body(json!({"contents": [{"parts": [{"text": "hello"}]}]}).to_string());
    }
    let response = request.send().await.expect("corral answers");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn gemini_requests_get_a_404_in_geminis_shape_and_reach_no_provider() {
    let gateway = TestGateway::start(|_| {}).await;
    for (method, path, key_header) in [
        (
            "POST",
            "/v1beta/models/gemini-2.5-flash:generateContent",
            true,
        ),
        (
            "POST",
            "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
            true,
        ),
        // The 3.x SDKs' default version, the key in the query.
        (
            "POST",
            &format!("/v1/models/gemini-2.5-flash:generateContent?key={KEY}"),
            false,
        ),
        ("POST", "/v1/models/gemini-2.5-flash:countTokens", true),
        // A Gemini credential makes the model list Gemini's, not the merged one.
        ("GET", "/v1/models", true),
        ("GET", "/v1beta/models", false),
        // A deduplicated endpoint too: the key would have gone along.
        ("POST", "/v1/chat/completions", true),
        ("POST", &format!("/v1/embeddings?key={KEY}"), false),
        ("GET", &format!("/v1/files?key={KEY}"), false),
    ] {
        let (status, body) = send(&gateway, method, path, key_header).await;
        assert_eq!(status, 404, "{method} {path}: {body}");
        let error = &body["error"];
        assert_eq!(error["code"], 404, "an integer code: {body}");
        assert_eq!(error["status"], "NOT_FOUND", "{body}");
        let message = error["message"].as_str().unwrap_or_default();
        assert!(message.contains("api: gemini"), "{message}");
        assert!(!message.contains(KEY), "the key is not echoed: {message}");
    }
    assert_eq!(
        gateway.provider.received(),
        Vec::<String>::new(),
        "nothing was sent to the OpenAI upstream"
    );
    // An OpenAI fine-tuned model id has colons too; it is still OpenAI's.
    let (_, body) = send(
        &gateway,
        "GET",
        "/v1/models/ft:gpt-4o-mini:acme::abc123",
        false,
    )
    .await;
    assert!(
        body["error"]["status"].is_null(),
        "the mock's answer: {body}"
    );
    assert_eq!(
        gateway.provider.received(),
        ["GET /v1/models/ft:gpt-4o-mini:acme::abc123"]
    );
}

/// `google-genai` pointed at corral (`http_options.base_url`): each call
/// raises the SDK's own `ClientError` (code 404, `NOT_FOUND`), as it would
/// for Google's own 404, and none reaches the provider.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn googles_sdk_raises_its_own_error_and_nothing_is_sent() {
    let python = Python::with_google_genai().await;
    let gateway = TestGateway::start(|_| {}).await;
    let (results, stderr) = python.run_script("gemini_check.py", &gateway.url).await;
    let context = format!("results: {results}\nstderr: {stderr}");
    for call in ["generate", "stream", "count_tokens", "list", "embed"] {
        let outcome = &results[call];
        assert_eq!(outcome["type"], "ClientError", "{call}: {context}");
        assert_eq!(outcome["code"], 404, "{call}: {context}");
        assert_eq!(outcome["status"], "NOT_FOUND", "{call}: {context}");
        assert!(
            outcome["message"]
                .as_str()
                .unwrap_or_default()
                .contains("api: gemini"),
            "{call}: {context}"
        );
    }
    assert_eq!(
        gateway.provider.received(),
        Vec::<String>::new(),
        "{context}"
    );
    assert!(
        !format!("{results}{stderr}").contains("GEMINICANARY"),
        "{context}"
    );
}

/// Refusals at admission (no gateway key) take Gemini's shape under `/v1beta/`.
#[tokio::test]
async fn a_refused_gemini_request_is_refused_in_geminis_shape() {
    let gateway = TestGateway::start(|config| {
        config.upstreams[0].api_key = Some(corral::config::Secret::new("sk-corral".into()));
        config.auth.key_hashes = vec![corral::tenant::key_hash(b"gw-1")];
    })
    .await;
    let (status, body) = send(
        &gateway,
        "POST",
        "/v1beta/models/gemini-2.5-flash:generateContent",
        true,
    )
    .await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["error"]["code"], 401, "{body}");
    assert_eq!(body["error"]["status"], "UNAUTHENTICATED", "{body}");
    assert_eq!(gateway.provider.received(), Vec::<String>::new());
}
