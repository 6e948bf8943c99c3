//! Gemini's native API: a request that speaks it (a `/v1beta/` path, a Gemini
//! model method, a Gemini key in `x-goog-api-key` or `?key=`) goes to an
//! `api: gemini` upstream only, its key only as `x-goog-api-key`; without one
//! it is answered 404 in Gemini's error shape and sent nowhere, so a Gemini
//! key never reaches another provider. Google's own SDK is the client.

use corral::config::{Api, Config, Secret};
use serde_json::{Value, json};

use crate::{harness::TestGateway, sdk::Python};

/// Adds an `api: gemini` upstream at the mock's `/v1beta` (for `gemini-*`).
fn with_gemini(config: &mut Config) {
    let mut gemini = config.upstreams[0].clone();
    gemini.name = "gemini".into();
    gemini.api = Api::Gemini;
    gemini.base_url = format!("{}beta", gemini.base_url.trim_end_matches('/'));
    gemini.models = vec!["gemini-*".into()];
    gemini.api_key = None;
    config.upstreams[0].models = vec!["gpt-*".into(), "text-embedding-*".into()];
    config.upstreams.push(gemini);
}

/// The `x-goog-api-key` the mock saw on each Gemini call (`-` for none), and
/// whether any carried `authorization` or a `key` in its query.
fn keys_seen(gateway: &TestGateway) -> (Vec<String>, bool) {
    let calls: Vec<_> = gateway
        .provider
        .requests()
        .into_iter()
        .filter(|request| request.path.starts_with("/v1beta/"))
        .collect();
    let keys = calls
        .iter()
        .map(|request| {
            request
                .headers
                .iter()
                .find(|(name, _)| name == "x-goog-api-key")
                .map_or("-".to_owned(), |(_, value)| value.clone())
        })
        .collect();
    let leaked = calls.iter().any(|request| {
        request
            .headers
            .iter()
            .any(|(name, _)| name == "authorization")
            || request.query.as_deref().is_some_and(|q| q.contains("key="))
    });
    (keys, leaked)
}

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

/// With an `api: gemini` upstream, Gemini's requests go there and nowhere
/// else: the key (from the header or the query) as `x-goog-api-key` only, the
/// version the upstream's base URL names; two different keys are a 400.
#[tokio::test]
async fn gemini_requests_go_to_the_gemini_upstream_with_the_key_in_its_header_only() {
    let gateway = TestGateway::start(with_gemini).await;
    let (status, body) = send(
        &gateway,
        "POST",
        "/v1beta/models/gemini-2.5-flash:countTokens",
        true,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body["totalTokens"].as_u64().is_some_and(|n| n > 0),
        "{body}"
    );
    let (status, body) = send(
        &gateway,
        "POST",
        &format!("/v1/models/gemini-2.5-flash:generateContent?key={KEY}"),
        false,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["candidates"][0]["finishReason"], "STOP", "{body}");
    let (status, body) = send(&gateway, "GET", "/v1/models", true).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["models"][0]["name"], "models/gemini-2.5-flash",
        "Gemini's own list: {body}"
    );
    let (status, body) = send(
        &gateway,
        "POST",
        "/v1beta/models/gemini-2.5-flash:countTokens?key=AIza-another",
        true,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["status"], "INVALID_ARGUMENT", "{body}");
    let (status, body) = send(
        &gateway,
        "POST",
        "/v1beta/models/gpt-4o-mini:countTokens",
        true,
    )
    .await;
    assert_eq!(status, 404, "a model no Gemini upstream serves: {body}");
    assert_eq!(body["error"]["code"], 404, "{body}");
    assert_eq!(
        gateway.provider.received(),
        [
            "POST /v1beta/models/gemini-2.5-flash:countTokens",
            "POST /v1beta/models/gemini-2.5-flash:generateContent",
            "GET /v1beta/models",
        ],
        "the key left the query; nothing went to the OpenAI upstream"
    );
    let (keys, leaked) = keys_seen(&gateway);
    assert_eq!(keys, [KEY, KEY]);
    assert!(!leaked);

    // With corral's own Gemini key, the caller's is not sent at all.
    let own = TestGateway::start(|config| {
        with_gemini(config);
        config.upstreams[1].api_key = Some(Secret::new("AIza-corrals-own".into()));
    })
    .await;
    let (status, body) = send(
        &own,
        "POST",
        "/v1beta/models/gemini-2.5-flash:countTokens",
        true,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        keys_seen(&own),
        (vec!["AIza-corrals-own".to_owned()], false)
    );
}

/// `google-genai` against a corral with a Gemini upstream: `count_tokens`,
/// `models.list` and `generate_content` reach it (relayed as they came, not
/// deduplicated yet), each with the caller's key in `x-goog-api-key` only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn googles_sdk_reaches_the_gemini_upstream_through_corral() {
    let python = Python::with_google_genai().await;
    let gateway = TestGateway::start(with_gemini).await;
    let (results, stderr) = python
        .run_script("gemini_passthrough.py", &gateway.url)
        .await;
    let context = format!("results: {results}\nstderr: {stderr}");
    assert!(
        results["total_tokens"].as_u64().is_some_and(|n| n > 0),
        "{context}"
    );
    assert!(
        results["models"]
            .as_array()
            .is_some_and(|models| models.iter().any(|m| m == "models/gemini-2.5-flash")),
        "{context}"
    );
    assert!(
        results["text"]
            .as_str()
            .is_some_and(|text| text.starts_with("mock gemini answer")),
        "{context}"
    );
    let (keys, leaked) = keys_seen(&gateway);
    assert_eq!(
        keys,
        [KEY, KEY],
        "count_tokens and generate_content; {context}"
    );
    assert!(!leaked, "{context}");
    assert!(
        gateway
            .provider
            .received()
            .iter()
            .all(|line| line.contains("/v1beta/")),
        "nothing went to the OpenAI upstream: {:?}",
        gateway.provider.received()
    );
}

/// Behind gateway keys, a Google SDK user's key is its gateway key, in
/// `x-goog-api-key` or `?key=` alike: one key, one caller, either place. A
/// key corral does not know is refused in Gemini's shape; the Gemini upstream
/// gets corral's own key, never the caller's.
#[tokio::test]
async fn a_gateway_key_in_googles_places_is_the_callers_key() {
    let gateway = TestGateway::start(|config| {
        with_gemini(config);
        config.upstreams[0].api_key = Some(Secret::new("sk-corral".into()));
        config.upstreams[1].api_key = Some(Secret::new("AIza-corrals-own".into()));
        config.auth.key_hashes = vec![corral::tenant::key_hash(KEY.as_bytes())];
    })
    .await;
    let path = "/v1beta/models/gemini-2.5-flash:countTokens";
    let (status, body) = send(&gateway, "POST", path, true).await;
    assert_eq!(status, 200, "the key in x-goog-api-key: {body}");
    let (status, body) = send(&gateway, "POST", &format!("{path}?key={KEY}"), false).await;
    assert_eq!(status, 200, "the key in the query: {body}");
    let (status, body) = send(&gateway, "POST", &format!("{path}?key=AIza-unknown"), false).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["error"]["status"], "UNAUTHENTICATED", "{body}");
    let (keys, leaked) = keys_seen(&gateway);
    assert_eq!(keys, ["AIza-corrals-own", "AIza-corrals-own"]);
    assert!(!leaked);
}
