//! Azure OpenAI both ways: corral in front of Azure deployments (an `azure`
//! member: v1 or `api_version` shape, `api-key` or an Entra ID token, its
//! quirks), and apps written for Azure (`AzureOpenAI`) pointed at corral.
//! The mock speaks Azure's paths, auth, token endpoint and quirks.

use std::time::Duration;

use corral::config::{Config, EntraConfig, ProviderKind, Secret};
use mock_upstream::{MockProvider, MockSettings, Scripted};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{
    harness::{TestGateway, chat, streamed},
    metrics::{model_tokens, scrape, sum},
    pools::{first_and_spare, member},
    sdk::Python,
};

const CHAT: &str = "/v1/chat/completions";
const AZURE_KEY: &str = "az-east-KEYCANARY-0123456789abcdef";
const ENTRA_SECRET: &str = "entra-SECRETCANARY-fedcba9876543210";
const API_VERSION: &str = "2024-10-21";

/// The first upstream an Azure v1 account: `api-key`, `gpt-4o` deployed as `prod-gpt4o`.
fn azure_v1(config: &mut Config, mock: &MockProvider) {
    let upstream = &mut config.upstreams[0];
    upstream.provider = Some(ProviderKind::Azure);
    upstream.base_url = format!("{}/openai/v1", mock.origin());
    upstream.api_key = Some(Secret::new(AZURE_KEY.to_owned()));
    upstream.deployments = [("gpt-4o".to_owned(), "prod-gpt4o".to_owned())].into();
}

/// The first upstream an Azure account of the versioned API, authenticated
/// by an Entra ID application whose token endpoint is the mock's.
fn azure_entra(config: &mut Config, mock: &MockProvider) {
    let upstream = &mut config.upstreams[0];
    upstream.provider = Some(ProviderKind::Azure);
    upstream.base_url = format!("{}/openai", mock.origin());
    upstream.api_version = Some(API_VERSION.to_owned());
    upstream.entra = Some(EntraConfig {
        tenant_id: "tenant-1".to_owned(),
        client_id: "client-1".to_owned(),
        client_secret_env: "AZ_SECRET".to_owned(),
        authority: mock.origin(),
        client_secret: Some(Secret::new(ENTRA_SECRET.to_owned())),
    });
    upstream.deployments = [("gpt-4o".to_owned(), "prod-gpt4o".to_owned())].into();
}

async fn azure_mock() -> MockProvider {
    let mock = MockProvider::start(MockSettings::default()).await.unwrap();
    mock.set_azure_keys(vec![AZURE_KEY.to_owned()]);
    mock.set_entra_client("client-1", ENTRA_SECRET);
    mock
}

fn gpt4o(content: &str) -> Value {
    let mut body = chat(content);
    body["model"] = json!("gpt-4o");
    body
}

/// The SSE events of a body, as JSON (without `[DONE]`).
fn events(body: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(body)
        .split("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str(data).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_client_reaches_an_azure_v1_member_by_its_deployment_with_its_api_key() {
    let python = Python::with_openai().await;
    let mock = azure_mock().await;
    let gateway = TestGateway::start_with(mock.clone(), |config| azure_v1(config, &mock)).await;
    let (results, stderr) = python
        .run_script_with(
            "azure_clients.py",
            &gateway.url,
            &["openai", "sk-app-caller"],
        )
        .await;
    let context = format!("results: {results}\nstderr: {stderr}");
    assert!(
        !results["plain"]["content"]
            .as_str()
            .unwrap_or_default()
            .is_empty(),
        "{context}"
    );
    let chunks = results["streamed"].as_array().expect("chunks");
    assert_eq!(
        chunks[0]["choices"], 0,
        "Azure's empty first chunk reached the SDK; {context}"
    );
    assert_eq!(chunks[0]["prompt_filter_results"], true, "{context}");
    let text: String = chunks.iter().filter_map(|c| c["text"].as_str()).collect();
    assert!(!text.is_empty(), "{context}");
    for request in mock.requests() {
        assert_eq!(request.path, "/openai/v1/chat/completions");
        assert_eq!(request.header("api-key"), Some(AZURE_KEY));
        assert_eq!(
            request.header("authorization"),
            None,
            "never a bearer to Azure"
        );
        assert_eq!(request.json().unwrap()["model"], "prod-gpt4o");
    }
    assert_eq!(mock.calls(), 2);

    // 50 identical callers, one call; a repeat is a HIT.
    let replies = gateway.herd(CHAT, &gpt4o("a herd at Azure"), 50, &[]).await;
    assert!(replies.iter().all(|reply| reply.status == StatusCode::OK));
    assert_eq!(mock.calls(), 3);
    let repeat = gateway.post(CHAT, &gpt4o("a herd at Azure")).await;
    assert_eq!(repeat.cache(), "HIT");
    assert_eq!(mock.calls(), 3);

    // A stream caller gets Azure's first chunk as Azure sent it.
    let live = gateway
        .post(CHAT, &streamed(gpt4o("a live Azure stream")))
        .await;
    let first = &events(&live.body)[0];
    assert_eq!(first["choices"], json!([]), "{first}");
    assert!(first["prompt_filter_results"].is_array(), "{first}");

    // The call's tokens and cost are counted under the public name.
    let m = scrape(&gateway).await;
    assert!(model_tokens(&m, "gpt-4o", "input", "upstream") > 0.0);
    assert!(model_tokens(&m, "gpt-4o", "output", "upstream") > 0.0);
    assert!(
        sum(
            &m,
            "corral_cost_usd_total",
            &[("model", "gpt-4o"), ("source", "upstream")]
        ) > 0.0
    );
    for other in ["prod-gpt4o", "gpt-4o-2024-11-20"] {
        assert_eq!(
            sum(&m, "corral_cost_usd_total", &[("model", other)]),
            0.0,
            "{other}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entra_member_fetches_one_token_for_many_calls_and_refreshes_once_after_expiry() {
    let mock = azure_mock().await;
    // The first token lives one second; the next ones an hour.
    mock.push_token_lifetime(Duration::from_secs(1));
    let gateway = TestGateway::start_with(mock.clone(), |config| azure_entra(config, &mock)).await;
    let first = gateway.post(CHAT, &gpt4o("entra 0")).await;
    assert_eq!(first.status, StatusCode::OK, "{:?}", first.body);
    assert_eq!(mock.token_requests(), 1);
    // Waiting out the token's lifetime is the point: this wait is the
    // expiry under test, not a stand-in for an event.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let tasks: Vec<_> = (0..30)
        .map(|i| gateway.spawn_post(CHAT, &gpt4o(&format!("entra at expiry {i}"))))
        .collect();
    for reply in crate::harness::collect(tasks).await {
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    }
    assert_eq!(
        mock.token_requests(),
        2,
        "concurrent callers at expiry: one refresh"
    );
    for round in 0..4 {
        let tasks: Vec<_> = (0..25)
            .map(|i| gateway.spawn_post(CHAT, &gpt4o(&format!("entra {round} {i}"))))
            .collect();
        for reply in crate::harness::collect(tasks).await {
            assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
        }
    }
    assert_eq!(mock.calls(), 131);
    assert_eq!(
        mock.token_requests(),
        2,
        "one token for the next hundred calls"
    );
    for request in mock.requests() {
        assert_eq!(
            request.path,
            "/openai/deployments/prod-gpt4o/chat/completions"
        );
        assert_eq!(request.query.as_deref(), Some("api-version=2024-10-21"));
        assert!(
            request
                .header("authorization")
                .unwrap()
                .starts_with("Bearer ")
        );
        assert_eq!(request.header("api-key"), None);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_content_filter_is_the_callers_answer_and_a_filtered_answer_is_not_kept() {
    let (first, spare) = (azure_mock().await, azure_mock().await);
    let gateway = TestGateway::start_with(first.clone(), |config| {
        azure_v1(config, &first);
        let at = |mock: &MockProvider, name: &str| {
            let mut account = member(name, format!("{}/openai/v1", mock.origin()));
            account.api_key = Some(Secret::new(AZURE_KEY.to_owned()));
            account.breaker_failures = Some(1);
            account
        };
        first_and_spare(config, at(&first, "first"), at(&spare, "spare"));
    })
    .await;
    let filtered = gateway
        .post(CHAT, &gpt4o("[[content_filter_400]] something"))
        .await;
    assert_eq!(filtered.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        filtered.json()["error"]["code"],
        "content_filter",
        "{:?}",
        filtered.body
    );
    assert_eq!(
        (first.calls(), spare.calls()),
        (1, 0),
        "one call, no retry, no failover"
    );
    // No breaker opened (one failure would open it) and no member cooled:
    // the next call goes to the first member again.
    let next = gateway.post(CHAT, &gpt4o("after the filter")).await;
    assert_eq!(next.status, StatusCode::OK);
    assert_eq!((first.calls(), spare.calls()), (2, 0));
    // A `finish_reason: content_filter` answer is relayed, never kept.
    for body in [
        gpt4o("[[content_filter_finish]] twice"),
        streamed(gpt4o("[[content_filter_finish]] streamed twice")),
    ] {
        let before = first.calls();
        for _ in 0..2 {
            let reply = gateway.post(CHAT, &body).await;
            assert_eq!(reply.status, StatusCode::OK);
            assert!(
                String::from_utf8_lossy(&reply.body).contains("content_filter"),
                "{:?}",
                reply.body
            );
        }
        assert_eq!(first.calls(), before + 2, "not cached");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azures_retry_after_ms_is_honoured() {
    let mock = azure_mock().await;
    let gateway = TestGateway::start_with(mock.clone(), |config| azure_v1(config, &mock)).await;
    mock.push_script(Scripted {
        status: 429,
        headers: vec![
            ("retry-after-ms".to_owned(), "400".to_owned()),
            ("x-ratelimit-remaining-requests".to_owned(), "0".to_owned()),
        ],
        body: r#"{"error":{"code":"429","message":"Requests to the ChatCompletions_Create Operation have exceeded the rate limit. Please retry after 1 second."}}"#.to_owned(),
    });
    let reply = gateway.post(CHAT, &gpt4o("rate limited once")).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    let requests = mock.requests();
    assert_eq!(requests.len(), 2, "retried once");
    let waited = requests[1].at.duration_since(requests[0].at);
    assert!(waited >= Duration::from_millis(400), "waited {waited:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_clients_are_served_by_deployment_name_and_each_key_is_a_tenant() {
    let python = Python::with_openai().await;
    // An OpenAI member: the Azure caller's app does not know what serves it.
    let gateway = TestGateway::start(|_| {}).await;
    let mock = gateway.provider.clone();
    let run = |key: &'static str| {
        let python = &python;
        let url = gateway.url.clone();
        async move {
            let (results, stderr) = python
                .run_script_with("azure_clients.py", &url, &["azure", key])
                .await;
            (results, stderr)
        }
    };
    let (results, stderr) = run("az-caller-one").await;
    let context = format!("results: {results}\nstderr: {stderr}");
    assert!(
        !results["plain"]["content"]
            .as_str()
            .unwrap_or_default()
            .is_empty(),
        "{context}"
    );
    assert!(
        results["streamed"]
            .as_array()
            .is_some_and(|c| !c.is_empty()),
        "{context}"
    );
    assert_eq!(
        results["embeddings"].as_array().map(Vec::len),
        Some(2),
        "{context}"
    );
    let after_one = mock.calls();
    assert!(after_one >= 3, "{context}");
    for request in mock.requests() {
        assert!(request.path.starts_with("/v1/"), "{}", request.path);
        assert_eq!(
            request.header("authorization"),
            Some("Bearer az-caller-one")
        );
        assert_eq!(request.query, None, "api-version stays with corral");
    }
    // Another key is another tenant: nothing of the first is served to it.
    run("az-caller-two").await;
    assert_eq!(mock.calls(), 2 * after_one);
    // The first key again: all from the cache.
    run("az-caller-one").await;
    assert_eq!(mock.calls(), 2 * after_one);

    // 50 identical AzureOpenAI callers at once: one call.
    mock.hold();
    let url = gateway.url.clone();
    let herd = tokio::spawn(async move {
        Python::with_openai()
            .await
            .run_script_with(
                "azure_clients.py",
                &url,
                &["azure_herd", "az-caller-one", "50"],
            )
            .await
    });
    gateway.wait_for_waiters(50).await;
    mock.release();
    let (results, stderr) = herd.await.unwrap();
    let answers = results["herd"].as_array().expect("the herd's answers");
    assert_eq!(answers.len(), 50, "{stderr}");
    assert!(answers.iter().all(|answer| *answer == answers[0]));
    assert_eq!(mock.calls(), 2 * after_one + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrals_own_errors_on_azure_paths_take_azures_shape() {
    let gateway = TestGateway::start(|_| {}).await;
    let path = "/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21";
    let invalid = gateway
        .post_with(
            path,
            &json!(["not", "an", "object"]),
            &[("api-key", "az-caller")],
        )
        .await;
    assert_eq!(
        invalid.status,
        StatusCode::BAD_REQUEST,
        "{:?}",
        invalid.body
    );
    let error = &invalid.json()["error"];
    assert!(
        error["code"].is_string() && error["message"].is_string(),
        "{error}"
    );
    assert!(
        error.get("type").is_none(),
        "Azure's shape, not OpenAI's: {error}"
    );
    assert_eq!(gateway.provider.calls(), 0);
    // The same mistake on OpenAI's path: OpenAI's shape.
    let openai = gateway.post(CHAT, &json!(["not", "an", "object"])).await;
    assert!(
        openai.json()["error"]["type"].is_string(),
        "{:?}",
        openai.body
    );
    // Azure paths corral does not serve: 404 in Azure's shape, sent nowhere.
    let unknown = gateway
        .post_with(
            "/openai/deployments/x/images/generations",
            &json!({}),
            &[("api-key", "k")],
        )
        .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert!(
        unknown.json()["error"]["code"].is_string(),
        "{:?}",
        unknown.body
    );
    assert_eq!(gateway.provider.calls(), 0);
}

/// The corral binary at debug level, with an Entra account and an `api-key`
/// account, Redis and both kinds of calls: no key, client secret or token it
/// used reaches its logs, `/metrics`, `/stats` or Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_azure_key_entra_secret_or_token_reaches_logs_metrics_stats_or_redis() {
    let redis = crate::redis_server::RedisServer::spawn().await;
    let mock = azure_mock().await;
    let yaml = format!(
        "listen: 127.0.0.1:0
upstreams:
  - name: azure-entra
    provider: azure
    models: [gpt-4o]
    base_url: {root}/openai
    api_version: '{API_VERSION}'
    entra: {{tenant_id: tenant-1, client_id: client-1, client_secret_env: AZ_SECRET, authority: '{root}'}}
    deployments: {{gpt-4o: prod-gpt4o}}
  - name: azure-key
    provider: azure
    base_url: {root}/openai/v1
    api_key_env: AZ_KEY
redis:
  url: '{redis}'
",
        root = mock.origin(),
        redis = redis.url(),
    );
    let base = format!("{}/openai", mock.origin());
    let corral = crate::logs::Corral::start_with(
        &yaml,
        &mock,
        &[
            ("AZ_SECRET", ENTRA_SECRET),
            ("AZ_KEY", AZURE_KEY),
            ("CORRAL_UPSTREAM_BASE_URL", &base),
        ],
    )
    .await;
    let client = reqwest::Client::new();
    for (model, stream) in [
        ("gpt-4o", false),
        ("gpt-4o", true),
        ("gpt-4o-mini", false),
        ("gpt-4o-mini", true),
    ] {
        let mut body = chat(&format!("secrets {model} {stream}"));
        body["model"] = json!(model);
        if stream {
            body = streamed(body);
        }
        let reply = client
            .post(format!("{}{CHAT}", corral.url))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(reply.status(), StatusCode::OK);
        reply.bytes().await.unwrap();
    }
    let tokens: Vec<String> = mock
        .requests()
        .iter()
        .filter_map(|request| request.header("authorization"))
        .map(|value| value.trim_start_matches("Bearer ").to_owned())
        .collect();
    assert_eq!(
        tokens.len(),
        2,
        "the Entra account's calls carried its token"
    );
    assert!(
        mock.requests()
            .iter()
            .any(|request| request.header("api-key") == Some(AZURE_KEY))
    );
    let exposed = corral.exposed(&redis).await;
    assert!(
        exposed.metrics.contains("gpt-4o"),
        "the scrape has the calls"
    );
    let mut secrets = vec![AZURE_KEY.to_owned(), ENTRA_SECRET.to_owned()];
    secrets.extend(tokens);
    exposed.assert_holds_none(&secrets);
}

/// The mock's Azure surface is what the official SDK parses: its
/// `AzureOpenAI` and `OpenAI` clients read every answer into their own types
/// (`crates/mock-upstream/tests/azure_sdk_check.py`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mocks_azure_surface_is_what_the_official_sdk_parses() {
    let python = Python::with_openai().await;
    let mock = MockProvider::start(MockSettings::default()).await.unwrap();
    let root = mock.origin();
    python
        .run_mock_check(
            "azure_sdk_check.py",
            &[root.as_ref()],
            Duration::from_secs(120),
        )
        .await;
    assert!(mock.token_requests() >= 1, "the check took an Entra token");
}
