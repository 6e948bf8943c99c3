//! Gemini's native API: a request that speaks it (a `/v1beta/` path, a Gemini
//! model method, a Gemini key in `x-goog-api-key` or `?key=`) goes to an
//! `api: gemini` upstream only, its key only as `x-goog-api-key`; without one
//! it is answered 404 in Gemini's error shape and sent nowhere, so a Gemini
//! key never reaches another provider. `generateContent`, its streams and the
//! embedding methods are deduplicated like the other APIs: herds of Google's
//! own SDK (the client throughout) are one upstream call on one instance and
//! on two, the caller's key is its tenant and is kept nowhere, and the usage
//! is billed kind by kind.

use corral::config::{Api, Config, Secret};
use serde_json::{Value, json};

use crate::{harness::TestGateway, sdk::Python};

/// Adds an `api: gemini` upstream at the mock's `/v1beta` (for `gemini-*`).
pub(crate) fn with_gemini(config: &mut Config) {
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
pub(crate) fn keys_seen(gateway: &TestGateway) -> (Vec<String>, bool) {
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

/// The generate calls (`generateContent`, `streamGenerateContent`) the
/// provider received.
fn generate_calls(provider: &mock_upstream::MockProvider) -> usize {
    provider
        .received()
        .iter()
        .filter(|line| line.contains(":generateContent") || line.contains(":streamGenerateContent"))
        .count()
}

/// Every call the provider received was Gemini's (`/v1beta/`): nothing
/// went to another upstream.
pub(crate) fn assert_only_gemini_reached(provider: &mock_upstream::MockProvider) {
    let received = provider.received();
    assert!(
        received.iter().all(|line| line.contains("/v1beta/")),
        "a call went elsewhere: {received:?}"
    );
}

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
/// `models.list` (relayed) and `generate_content` (deduplicated) reach it,
/// each with the caller's key in `x-goog-api-key` only.
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
    assert_only_gemini_reached(&gateway.provider);
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
    // Under `/v1/`, where the 3.x SDKs post, a refusal is Gemini's too: a
    // deduplicated method, a relayed one, or any request with a Gemini key.
    for v1 in [
        "/v1/models/gemini-2.5-flash:generateContent?key=AIza-unknown",
        "/v1/models/gemini-2.5-flash:countTokens?key=AIza-unknown",
        "/v1/models?key=AIza-unknown",
    ] {
        let method = if v1.starts_with("/v1/models?") {
            "GET"
        } else {
            "POST"
        };
        let (status, body) = send(&gateway, method, v1, false).await;
        assert_eq!(status, 401, "{v1}: {body}");
        assert_eq!(body["error"]["status"], "UNAUTHENTICATED", "{v1}: {body}");
    }
    let (keys, leaked) = keys_seen(&gateway);
    assert_eq!(keys, ["AIza-corrals-own", "AIza-corrals-own"]);
    assert!(!leaked);
}

/// `google-genai` callers of one request share one upstream call, as the
/// other APIs' callers do: 100 concurrent `generate_content` calls at
/// temperature 0, then a `HIT`; 100 concurrent `generate_content_stream`
/// calls (one upstream stream, the same text for all), then the same prompt
/// non-streamed from the cache; stream and non-stream callers of a new
/// prompt together; and a cut stream, which reaches every caller as the
/// SDK's own error and leaves nothing cached. Each herd is held at the
/// provider until every caller waits on the flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn googles_sdk_callers_of_one_request_share_one_call() {
    let _sdk = Python::with_google_genai().await;
    let gateway = TestGateway::start(with_gemini).await;
    let url = gateway.url.clone();
    let phase = |phase: &'static str| {
        let url = url.clone();
        tokio::spawn(async move {
            Python::with_google_genai()
                .await
                .run_script_with("gemini_herd.py", &url, &[phase])
                .await
        })
    };
    let checked = |(results, stderr): (Value, String)| {
        let context = format!("results: {results}\nstderr: {stderr}");
        assert_eq!(results["failures"], json!([]), "{context}");
        (results, context)
    };
    let gemini_calls = |gateway: &TestGateway| generate_calls(&gateway.provider);

    let (results, context) = checked(gateway.held_for_waiters(100, || phase("herd")).await);
    assert_eq!(results["herd_texts"], 1, "{context}");
    assert_eq!(results["herd_misses"], 1, "{context}");
    assert_eq!(
        results["herd_statuses"],
        json!(["COALESCED", "MISS"]),
        "{context}"
    );
    assert_eq!(results["repeat_cache"], "HIT", "{context}");
    assert_eq!(gemini_calls(&gateway), 1, "{context}");
    assert_billed_and_saved(&gateway, &results["usage"], 100, &context).await;

    let (results, context) = checked(gateway.held_for_waiters(100, || phase("stream")).await);
    assert_eq!(results["stream_texts"], 1, "{context}");
    assert_eq!(results["stream_misses"], 1, "{context}");
    assert_eq!(results["stream_errors"], json!([]), "{context}");
    assert_eq!(
        results["stream_finish"],
        json!(["FinishReason.STOP"]),
        "{context}"
    );
    assert_eq!(results["after_stream_cache"], "HIT", "{context}");
    assert_eq!(gemini_calls(&gateway), 2, "{context}");
    assert!(
        gateway.provider.received().contains(
            &"POST /v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse".to_owned()
        ),
        "{:?}",
        gateway.provider.received()
    );

    let (results, context) = checked(gateway.held_for_waiters(100, || phase("mixed")).await);
    assert_eq!(results["mixed_texts"], 1, "{context}");
    assert_eq!(gemini_calls(&gateway), 3, "{context}");

    gateway.provider.set_truncate_streams(true);
    let (results, context) = checked(gateway.held_for_waiters(100, || phase("cut")).await);
    assert_eq!(
        results["cut_errors"],
        json!(["ServerError:500"]),
        "{context}"
    );
    assert_eq!(gemini_calls(&gateway), 4, "{context}");
    gateway.wait_idle().await;
    gateway.provider.set_truncate_streams(false);
    let again = gateway
        .post_with(
            "/v1beta/models/gemini-2.5-flash:generateContent",
            &json!({"contents": [{"role": "user", "parts": [{"text": "A stream that breaks."}]}],
                    "generationConfig": {"temperature": 0}}),
            &[("x-goog-api-key", KEY)],
        )
        .await;
    assert_eq!(
        again.cache(),
        "MISS",
        "nothing of the cut stream was cached"
    );
    assert_eq!(gemini_calls(&gateway), 5);
}

/// Picodollars per token of a snapshot price (USD per million tokens).
fn picos(usd_per_million: f64) -> u128 {
    (usd_per_million * 1e6).round() as u128
}

/// The model the cost tests bill.
const FLASH: &str = "gemini-2.5-flash";

/// The snapshot's price of [`FLASH`].
fn flash_price() -> corral::pricing::SnapshotModel {
    corral::pricing::snapshot()
        .models
        .iter()
        .find(|entry| entry.id == FLASH)
        .expect("the snapshot prices gemini-2.5-flash")
        .clone()
}

/// What `/metrics` says was billed and saved for [`FLASH`].
struct FlashBooks(prometheus_parse::Scrape);

impl FlashBooks {
    async fn of(gateway: &TestGateway) -> Self {
        Self(crate::metrics::scrape(gateway).await)
    }

    /// `corral_cost_usd_total` from `source` (`upstream`, `saved`).
    fn cost(&self, source: &str) -> f64 {
        crate::metrics::sum(
            &self.0,
            "corral_cost_usd_total",
            &[("model", FLASH), ("source", source)],
        )
    }

    /// `corral_tokens_total` of `kind` from `source`.
    fn tokens(&self, kind: &str, source: &str) -> f64 {
        crate::metrics::sum(
            &self.0,
            "corral_tokens_total",
            &[("model", FLASH), ("kind", kind), ("source", source)],
        )
    }
}

const GENERATE: &str = "/v1beta/models/gemini-2.5-flash:generateContent";
const STREAM: &str = "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse";

/// A deterministic generateContent body.
fn prompt(text: &str) -> Value {
    json!({"contents": [{"role": "user", "parts": [{"text": text}]}],
           "generationConfig": {"temperature": 0}})
}

/// `usageMetadata` billed kind by kind at the snapshot's prices: the cached
/// part of `promptTokenCount` at the cached-input price, thinking as
/// reasoning at the output price; nine HITs save nine times that. A
/// stream's chunks carry running totals: its last `usageMetadata` is its
/// usage, counted once.
#[tokio::test]
async fn geminis_usage_is_billed_kind_by_kind_and_a_streams_once() {
    let gateway = TestGateway::start(with_gemini).await;
    let model = FLASH;
    let price = flash_price();
    let cached_price = price.cached_input.expect("Gemini prices cached input");
    gateway.provider.push_script(mock_upstream::Scripted::json(
        200,
        json!({
            "candidates": [{"content": {"role": "model", "parts": [{"text": "42"}]},
                            "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 1000, "cachedContentTokenCount": 800,
                              "candidatesTokenCount": 40, "thoughtsTokenCount": 60,
                              "totalTokenCount": 1100},
            "modelVersion": model, "responseId": "r-cost",
        })
        .to_string(),
    ));
    let body = prompt("what does a cached Gemini prompt cost?");
    for i in 0..10 {
        let reply = gateway
            .post_with(GENERATE, &body, &[("x-goog-api-key", KEY)])
            .await;
        assert_eq!(reply.status, 200, "{:?}", reply.body);
        assert_eq!(reply.cache(), if i == 0 { "MISS" } else { "HIT" });
    }
    let one = 200 * picos(price.input) + 800 * picos(cached_price) + 100 * picos(price.output);
    let books = FlashBooks::of(&gateway).await;
    let usd = |picos: u128| picos as f64 / 1e12;
    assert_eq!(books.cost("upstream"), usd(one));
    assert_eq!(books.cost("saved"), usd(9 * one));
    let tokens = |kind, source| books.tokens(kind, source);
    assert_eq!(tokens("input", "upstream"), 200.0);
    assert_eq!(tokens("cached_input", "upstream"), 800.0);
    assert_eq!(tokens("output", "upstream"), 40.0);
    assert_eq!(tokens("reasoning", "upstream"), 60.0);
    assert_eq!(tokens("reasoning", "saved"), 9.0 * 60.0);
    assert_eq!(tokens("cached_input", "saved"), 9.0 * 800.0);

    // A stream whose chunks report running totals: the last is the call's.
    let chunk = |text: &str, finish: Option<&str>, usage: Value| {
        let mut candidate =
            json!({"content": {"role": "model", "parts": [{"text": text}]}, "index": 0});
        if let Some(finish) = finish {
            candidate["finishReason"] = json!(finish);
        }
        format!(
            "data: {}\r\n\r\n",
            json!({"candidates": [candidate], "usageMetadata": usage})
        )
    };
    let sse = [
        chunk(
            "Hel",
            None,
            json!({"promptTokenCount": 50, "totalTokenCount": 50}),
        ),
        chunk(
            "lo",
            None,
            json!({"promptTokenCount": 50, "candidatesTokenCount": 1, "totalTokenCount": 51}),
        ),
        chunk(
            "!",
            Some("STOP"),
            json!({"promptTokenCount": 50, "candidatesTokenCount": 10,
                                        "thoughtsTokenCount": 5, "totalTokenCount": 65}),
        ),
    ]
    .concat();
    gateway.provider.push_script(mock_upstream::Scripted {
        status: 200,
        headers: vec![("content-type".into(), "text/event-stream".into())],
        body: sse,
    });
    let reply = gateway
        .post_with(
            STREAM,
            &prompt("a streamed cost"),
            &[("x-goog-api-key", KEY)],
        )
        .await;
    assert_eq!(reply.status, 200);
    let text = String::from_utf8_lossy(&reply.body);
    assert!(text.contains("\"finishReason\":\"STOP\""), "{text}");
    let books = FlashBooks::of(&gateway).await;
    let streamed = |kind| books.tokens(kind, "upstream");
    assert_eq!(
        streamed("input"),
        200.0 + 50.0,
        "counted once, not per chunk"
    );
    assert_eq!(streamed("output"), 40.0 + 10.0);
    assert_eq!(streamed("reasoning"), 60.0 + 5.0);
    // The stream's answer is cached: the same prompt non-streamed is a HIT
    // assembled from its chunks.
    let hit = gateway
        .post_with(
            GENERATE,
            &prompt("a streamed cost"),
            &[("x-goog-api-key", KEY)],
        )
        .await;
    assert_eq!(hit.cache(), "HIT");
    assert_eq!(
        hit.json()["candidates"][0]["content"]["parts"],
        json!([{"text": "Hello!"}])
    );
}

/// `/metrics` holds the Gemini answer's tokens, kind by kind, under its
/// model: `usage` (the `usageMetadata` the SDK saw, thinking and cached
/// content included) once upstream and `saved` times saved, and its cost
/// at the snapshot's prices.
async fn assert_billed_and_saved(gateway: &TestGateway, usage: &Value, saved: u64, context: &str) {
    let count = |name: &str| usage[name].as_u64().unwrap_or(0);
    let (prompt, cached) = (
        count("prompt_token_count"),
        count("cached_content_token_count"),
    );
    let (output, thoughts) = (
        count("candidates_token_count"),
        count("thoughts_token_count"),
    );
    assert!(
        cached > 0 && thoughts > 0,
        "the herd's usage has every kind: {context}"
    );
    let price = flash_price();
    let one = u128::from(prompt - cached) * picos(price.input)
        + u128::from(cached) * picos(price.cached_input.expect("a cached price"))
        + u128::from(output + thoughts) * picos(price.output);
    let books = FlashBooks::of(gateway).await;
    let cost = |source| books.cost(source);
    let usd = |picos: u128| picos as f64 / 1e12;
    assert!(
        (cost("upstream") - usd(one)).abs() < 1e-12,
        "{} vs {}; {context}",
        cost("upstream"),
        usd(one)
    );
    assert!(
        (cost("saved") - usd(u128::from(saved) * one)).abs() < 1e-9,
        "{} vs {}; {context}",
        cost("saved"),
        usd(u128::from(saved) * one)
    );
    let tokens = |kind, source| books.tokens(kind, source);
    let saved = saved as f64;
    assert_eq!(
        tokens("input", "upstream"),
        (prompt - cached) as f64,
        "{context}"
    );
    assert_eq!(
        tokens("cached_input", "upstream"),
        cached as f64,
        "{context}"
    );
    assert_eq!(tokens("output", "upstream"), output as f64, "{context}");
    assert_eq!(
        tokens("reasoning", "upstream"),
        thoughts as f64,
        "{context}"
    );
    assert_eq!(
        tokens("cached_input", "saved"),
        saved * cached as f64,
        "{context}"
    );
    assert_eq!(
        tokens("reasoning", "saved"),
        saved * thoughts as f64,
        "{context}"
    );
}

/// The same herds split over two instances sharing a Redis: one upstream
/// call for the non-stream herd and one upstream stream for the streamed
/// herd, every caller on either instance with the same text. The caller's
/// key is then nowhere in Redis, `/metrics` or `/stats`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn googles_sdk_callers_on_two_instances_share_one_call() {
    let _sdk = Python::with_google_genai().await;
    let redis = crate::redis_server::RedisServer::spawn().await;
    let url = redis.url();
    let fleet = crate::harness::Fleet::start(2, |config| {
        with_gemini(config);
        config.redis = Some(crate::harness::redis_at(&url));
    })
    .await;
    let phase = |phase: &'static str| {
        let urls: Vec<String> = fleet.instances.iter().map(|i| i.url.clone()).collect();
        urls.into_iter()
            .map(|url| {
                tokio::spawn(async move {
                    Python::with_google_genai()
                        .await
                        .run_script_with("gemini_herd.py", &url, &[phase])
                        .await
                })
            })
            .collect::<Vec<_>>()
    };
    let checked = |runs: Vec<(Value, String)>| {
        let context = format!("{runs:?}");
        for (results, _) in &runs {
            assert_eq!(results["failures"], json!([]), "{context}");
        }
        let results: Vec<Value> = runs.into_iter().map(|(results, _)| results).collect();
        (results, context)
    };
    let gemini_calls = || generate_calls(&fleet.provider);
    let all = |tasks: Vec<tokio::task::JoinHandle<(Value, String)>>| async move {
        let mut runs = Vec::new();
        for task in tasks {
            runs.push(task.await.expect("the script task ends"));
        }
        runs
    };

    let tasks = fleet.held_for_one_call(200, || phase("herd")).await;
    let (results, context) = checked(all(tasks).await);
    assert_eq!(gemini_calls(), 1, "{context}");
    let misses: u64 = results
        .iter()
        .map(|r| r["herd_misses"].as_u64().unwrap())
        .sum();
    assert_eq!(misses, 1, "{context}");
    assert_eq!(
        results[0]["herd_text"], results[1]["herd_text"],
        "{context}"
    );
    for r in &results {
        assert_eq!(r["herd_texts"], 1, "{context}");
        assert_eq!(r["repeat_cache"], "HIT", "{context}");
    }

    let tasks = fleet.held_for_one_call(200, || phase("stream")).await;
    let (results, context) = checked(all(tasks).await);
    assert_eq!(
        gemini_calls(),
        2,
        "one upstream stream for both instances; {context}"
    );
    assert_eq!(
        results[0]["stream_text"], results[1]["stream_text"],
        "{context}"
    );
    for r in &results {
        assert_eq!(r["stream_texts"], 1, "{context}");
        assert_eq!(r["stream_errors"], json!([]), "{context}");
        assert_eq!(r["after_stream_cache"], "HIT", "{context}");
    }

    // The key reached the provider, and nothing of it is kept in clear.
    assert!(
        keys_seen(&fleet.instances[0])
            .0
            .iter()
            .all(|key| key == KEY)
    );
    for (name, value) in redis.dump().await {
        let value = String::from_utf8_lossy(&value);
        assert!(
            !name.contains("GEMINICANARY") && !value.contains("GEMINICANARY"),
            "the key is in Redis under {name}"
        );
    }
    for instance in &fleet.instances {
        for report in ["/metrics", "/stats"] {
            let body = instance.get(report).await.body;
            assert!(
                !String::from_utf8_lossy(&body).contains("GEMINICANARY"),
                "the key is on {report}"
            );
        }
    }
}

/// Gemini's embeddings by the item: `embed_content` of 10 contents sends
/// 10 upstream; 10 of which 9 were embedded send 1. An `embedContent` of one
/// of them is then answered from its entry, in that method's shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn googles_sdk_embeddings_send_only_the_contents_nobody_embedded() {
    let python = Python::with_google_genai().await;
    let gateway = TestGateway::start(with_gemini).await;
    let (results, stderr) = python
        .run_script_with("gemini_herd.py", &gateway.url, &["embed"])
        .await;
    let context = format!("results: {results}\nstderr: {stderr}");
    assert_eq!(results["failures"], json!([]), "{context}");
    assert_eq!(results["embed_counts"], json!([10, 10]), "{context}");
    assert_eq!(
        gateway.provider.embedded_inputs(),
        11,
        "10, then only the new one; {context}"
    );
    assert!(
        gateway
            .provider
            .received()
            .iter()
            .all(|line| line == "POST /v1beta/models/gemini-embedding-001:batchEmbedContents"),
        "{:?}",
        gateway.provider.received()
    );

    let one = gateway
        .post_with(
            // The version the SDK used: a version is keyed.
            "/v1/models/gemini-embedding-001:embedContent",
            // The content as the SDK writes it in a batch (it adds the role).
            &json!({"content": {"parts": [{"text": "document 3"}], "role": "user"}}),
            &[("x-goog-api-key", KEY)],
        )
        .await;
    assert_eq!(one.status, 200, "{:?}", one.body);
    assert_eq!(one.cache(), "HIT", "shared with the batch's item");
    assert!(
        one.json()["embedding"]["values"]
            .as_array()
            .is_some_and(|v| !v.is_empty()),
        "{:?}",
        one.body
    );
    assert_eq!(gateway.provider.embedded_inputs(), 11);
}

/// The caller's Gemini key is its tenant in either place: a key in
/// `x-goog-api-key` and another in `?key=` are two tenants and two calls;
/// the first key sent as `?key=` is the first tenant again (a `HIT`). The
/// real binary, logging at debug, never writes either key, whether the
/// request was answered, streamed, embedded, relayed or refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gemini_key_is_one_tenant_in_either_place_and_never_logged() {
    let provider = mock_upstream::MockProvider::start(mock_upstream::MockSettings::default())
        .await
        .expect("mock provider starts");
    let yaml = "listen: 127.0.0.1:0\nupstreams:\n  - name: gemini\n    api: gemini\n    \
                base_url: http://127.0.0.1:1/v1beta\n    models: [\"gemini-*\"]\ncache:\n  ttl_jitter: 0\n";
    let base = format!("{}beta", provider.base_url().trim_end_matches('/'));
    let corral = crate::logs::Corral::start_with(
        yaml,
        &provider,
        &[("CORRAL_UPSTREAM_BASE_URL", base.as_str())],
    )
    .await;
    const OTHER: &str = "AIza-OTHERCANARY-99c2";
    let client = reqwest::Client::new();
    let post = |path: String, key: Option<&str>, body: Value| {
        let mut request = client
            .post(format!("{}{path}", corral.url))
            .timeout(crate::harness::WAIT)
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(key) = key {
            request = request.header("x-goog-api-key", key);
        }
        async move {
            let response = request.send().await.expect("corral answers");
            let status = response.status().as_u16();
            let cache = response
                .headers()
                .get("x-corral-cache")
                .map(|value| value.to_str().unwrap().to_owned());
            let body = response.bytes().await.unwrap();
            (status, cache, body)
        }
    };
    let question = prompt("whose tenant am I?");
    let (status, cache, _) = post(GENERATE.to_owned(), Some(KEY), question.clone()).await;
    assert_eq!((status, cache.as_deref()), (200, Some("MISS")));
    let (status, cache, _) = post(format!("{GENERATE}?key={OTHER}"), None, question.clone()).await;
    assert_eq!(
        (status, cache.as_deref()),
        (200, Some("MISS")),
        "another key, another tenant"
    );
    let (status, cache, _) = post(format!("{GENERATE}?key={KEY}"), None, question.clone()).await;
    assert_eq!(
        (status, cache.as_deref()),
        (200, Some("HIT")),
        "the same key in the query"
    );
    assert_eq!(provider.calls(), 2);

    // Every other way a key comes through: a stream, an embedding, a relayed
    // count, a refused body, two different keys at once.
    let (status, _, body) = post(format!("{STREAM}&key={KEY}"), None, prompt("a stream")).await;
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&body).contains("finishReason"));
    let embed = json!({"content": {"parts": [{"text": "embed me"}]}});
    let (status, _, _) = post(
        format!("/v1beta/models/gemini-embedding-001:embedContent?key={KEY}"),
        None,
        embed,
    )
    .await;
    assert_eq!(status, 200);
    let (status, _, _) = post(
        format!("/v1beta/models/gemini-2.5-flash:countTokens?key={KEY}"),
        None,
        prompt("count me"),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _, body) = post(
        format!("{GENERATE}?key={KEY}"),
        Some(OTHER),
        prompt("two keys"),
    )
    .await;
    assert_eq!(status, 400, "{}", String::from_utf8_lossy(&body));
    let response = client
        .post(format!("{}{GENERATE}?key={KEY}", corral.url))
        .timeout(crate::harness::WAIT)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 400);

    let logs = corral.logs().await;
    assert!(
        logs.contains("upstream call"),
        "the debug log has the calls:\n{logs}"
    );
    for secret in [KEY, OTHER, "GEMINICANARY", "OTHERCANARY"] {
        assert!(!logs.contains(secret), "`{secret}` is in the log:\n{logs}");
    }
}

/// A `streamGenerateContent` without `alt=sse` is streamed as Google
/// streams it, one JSON array of the chunks, and shares its call with an
/// `alt=sse` caller of the same request: both hold the same chunks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_array_stream_shares_the_call_of_an_event_stream() {
    let gateway = TestGateway::start(with_gemini).await;
    let body = prompt("framed two ways");
    let array_path = "/v1beta/models/gemini-2.5-flash:streamGenerateContent";
    gateway.provider.hold();
    let array = {
        let handle = gateway.clone_handle();
        let body = body.clone();
        tokio::spawn(async move {
            handle
                .post_with(array_path, &body, &[("x-goog-api-key", KEY)])
                .await
        })
    };
    let events = {
        let handle = gateway.clone_handle();
        let body = body.clone();
        tokio::spawn(async move {
            handle
                .post_with(STREAM, &body, &[("x-goog-api-key", KEY)])
                .await
        })
    };
    gateway.wait_for_waiters(2).await;
    gateway.provider.release();
    let (array, events) = (array.await.unwrap(), events.await.unwrap());
    assert_eq!(
        gateway.provider.calls(),
        1,
        "one upstream call for both framings"
    );
    assert_eq!(
        gateway.provider.received(),
        ["POST /v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"]
    );
    assert_eq!(
        array.header("content-type"),
        Some("application/json; charset=UTF-8")
    );
    let chunks: Vec<Value> = serde_json::from_slice(&array.body).expect("one JSON array");
    let sse: Vec<Value> = String::from_utf8_lossy(&events.body)
        .split("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
        .map(|data| serde_json::from_str(data).unwrap())
        .collect();
    assert!(chunks.len() > 1, "{chunks:?}");
    assert_eq!(chunks, sse, "the same chunks, framed two ways");
    assert_eq!(
        chunks.last().unwrap()["candidates"][0]["finishReason"],
        "STOP"
    );
}

/// Gemini's overload statuses are retried as Google asks (`Retry-After`),
/// and a lasting one reaches the caller in Gemini's own shape, relayed as
/// the provider sent it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn geminis_overload_is_retried_and_a_lasting_one_relayed_in_its_shape() {
    let gateway = TestGateway::start(|config| {
        with_gemini(config);
        config.retry.max_attempts = 3;
        config.retry.base_delay = std::time::Duration::from_millis(1);
        config.retry.max_delay = std::time::Duration::from_millis(5);
    })
    .await;
    let exhausted = |retry_after: &str| {
        let mut script = mock_upstream::Scripted::json(
            429,
            json!({"error": {"code": 429, "message": "Resource has been exhausted",
                             "status": "RESOURCE_EXHAUSTED"}})
            .to_string(),
        );
        script
            .headers
            .push(("retry-after".into(), retry_after.into()));
        script
    };
    for status in [429, 503] {
        let script = match status {
            429 => exhausted("0"),
            _ => mock_upstream::Scripted::json(
                503,
                json!({"error": {"code": 503, "message": "overloaded", "status": "UNAVAILABLE"}})
                    .to_string(),
            ),
        };
        gateway.provider.push_script(script);
        let calls = gateway.provider.calls();
        let reply = gateway
            .post_with(
                GENERATE,
                &prompt(&format!("retried after {status}")),
                &[("x-goog-api-key", KEY)],
            )
            .await;
        assert_eq!(reply.status, 200, "{status}: {:?}", reply.body);
        assert_eq!(
            gateway.provider.calls(),
            calls + 2,
            "one retry after {status}"
        );
    }
    for _ in 0..3 {
        gateway.provider.push_script(exhausted("0"));
    }
    let reply = gateway
        .post_with(GENERATE, &prompt("exhausted"), &[("x-goog-api-key", KEY)])
        .await;
    assert_eq!(reply.status, 429);
    let error = &reply.json()["error"];
    assert_eq!(error["status"], "RESOURCE_EXHAUSTED", "{error}");
    assert_eq!(error["code"], 429, "{error}");
}

/// A `no-store` Gemini stream goes upstream as it came and back as the
/// provider sent it: events with `alt=sse`, one JSON array without.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_no_store_stream_is_relayed_in_the_callers_framing() {
    let gateway = TestGateway::start(with_gemini).await;
    let headers = [("x-goog-api-key", KEY), ("cache-control", "no-store")];
    let events = gateway
        .post_with(STREAM, &prompt("not stored, events"), &headers)
        .await;
    assert_eq!(events.cache(), "BYPASS");
    assert!(
        String::from_utf8_lossy(&events.body).starts_with("data: "),
        "{:?}",
        events.body
    );
    let array = gateway
        .post_with(
            "/v1beta/models/gemini-2.5-flash:streamGenerateContent",
            &prompt("not stored, an array"),
            &headers,
        )
        .await;
    assert_eq!(array.cache(), "BYPASS");
    let chunks: Vec<Value> = serde_json::from_slice(&array.body).expect("one JSON array");
    assert_eq!(
        chunks.last().unwrap()["candidates"][0]["finishReason"],
        "STOP"
    );
    // Both streamed as events, so corral reads their usage (the array
    // caller's framed as the array, as a coalesced stream's is).
    assert_eq!(
        gateway.provider.received(),
        [
            "POST /v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
            "POST /v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
        ]
    );
}

/// A Gemini caller over its budget is refused a new call in Gemini's shape
/// (`RESOURCE_EXHAUSTED`, which the SDK raises as its own `ClientError`),
/// and its cached answers are still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gemini_caller_over_its_budget_is_refused_in_geminis_shape() {
    let gateway = TestGateway::start(|config| {
        with_gemini(config);
        config.budgets = vec![corral::budget::BudgetRule {
            tenant: Some("*".to_owned()),
            upstream: None,
            // Less than one call at the snapshot's prices.
            usd: 0.000_000_1,
            per: "day".parse().unwrap(),
        }];
    })
    .await;
    let headers = [("x-goog-api-key", KEY)];
    let first = gateway
        .post_with(GENERATE, &prompt("the budget's one call"), &headers)
        .await;
    assert_eq!((first.status.as_u16(), first.cache()), (200, "MISS"));
    let refused = gateway
        .post_with(GENERATE, &prompt("one call too many"), &headers)
        .await;
    assert_eq!(refused.status, 429, "{:?}", refused.body);
    let error = &refused.json()["error"];
    assert_eq!(error["status"], "RESOURCE_EXHAUSTED", "{error}");
    assert_eq!(error["code"], 429, "{error}");
    assert!(
        error["message"].as_str().unwrap().contains("budget"),
        "{error}"
    );
    let hit = gateway
        .post_with(GENERATE, &prompt("the budget's one call"), &headers)
        .await;
    assert_eq!(
        (hit.status.as_u16(), hit.cache()),
        (200, "HIT"),
        "a hit spends nothing"
    );
    assert_eq!(gateway.provider.calls(), 1);
}

/// A repeated Gemini request is answered from the request memo without a
/// parse, and the memo keeps the path: one body sent to two models, or to
/// the non-stream and the stream method, is never answered for the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memo_keeps_geminis_model_and_method_apart() {
    let gateway = TestGateway::start(with_gemini).await;
    let headers = [("x-goog-api-key", KEY)];
    let body = prompt("one body, two models");
    let pro = "/v1beta/models/gemini-2.5-pro:generateContent";
    let mut answers = Vec::new();
    for (path, cache) in [
        (GENERATE, "MISS"),
        (pro, "MISS"),
        // Parsed again and kept (the memo keeps a request seen twice)...
        (GENERATE, "HIT"),
        (pro, "HIT"),
        // ...then answered from it.
        (GENERATE, "HIT"),
        (pro, "HIT"),
    ] {
        let reply = gateway.post_with(path, &body, &headers).await;
        assert_eq!(reply.cache(), cache, "{path}");
        answers.push(reply.json()["modelVersion"].as_str().unwrap().to_owned());
    }
    assert_eq!(
        answers,
        [
            "gemini-2.5-flash",
            "gemini-2.5-pro",
            "gemini-2.5-flash",
            "gemini-2.5-pro",
            "gemini-2.5-flash",
            "gemini-2.5-pro"
        ]
    );
    assert!(
        gateway.state.dedup().memo().bytes() > 0,
        "the Gemini requests were remembered"
    );
    let streamed = gateway.post_with(STREAM, &body, &headers).await;
    assert_eq!(streamed.cache(), "HIT");
    assert_eq!(streamed.header("content-type"), Some("text/event-stream"));
    assert!(String::from_utf8_lossy(&streamed.body).starts_with("data: "));
    assert_eq!(gateway.provider.calls(), 2);
}
