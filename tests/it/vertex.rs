//! corral in front of Google Vertex AI: a pool's member with `provider:
//! vertex` serves Claude by `rawPredict` / `streamRawPredict` and Gemini below
//! `publishers/google`, authenticated by its service account's token, while
//! the callers keep their own SDKs (`anthropic.Anthropic`, `google-genai`) and
//! their own keys. The mock speaks Vertex's paths, rules and token endpoint;
//! its SDK check proves that surface is what Google's and Anthropic's clients
//! parse.

use std::time::Duration;

use corral::config::{Api, Config, ProviderKind, Secret};
use mock_upstream::{MockProvider, MockSettings, RecordedRequest, VERTEX_ANTHROPIC_VERSION};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{
    harness::{TestGateway, WAIT, collect},
    metrics::{model_tokens, scrape},
    pools::member,
    sdk::Python,
};

const MESSAGES: &str = "/v1/messages";
const CALLER_KEY: &str = "sk-ant-vertex-caller";
const GEMINI_KEY: &str = "AIza-vertex-caller";
const CLAUDE: &str = "claude-sonnet-4-5";
const CLAUDE_ON_VERTEX: &str = "claude-sonnet-4-5@20250929";
const GEMINI: &str = "gemini-2.5-flash";
/// Where the member's project and location are, below the mock's root.
const LOCATION: &str = "/v1/projects/mock-project/locations/us-east5";

/// The first upstream, speaking `api`, made a pool of one Vertex AI account
/// at the mock: its service account's key, Claude's public name deployed as
/// Vertex's versioned id.
fn vertex_pool(config: &mut Config, mock: &MockProvider, api: Api) {
    let mut account = member("vertex-east", format!("{}{LOCATION}", mock.origin()));
    account.provider = Some(ProviderKind::Vertex);
    account.api_key = None;
    account.service_account = Some(Secret::new(mock.service_account_json()));
    account.deployments = [(CLAUDE.to_owned(), CLAUDE_ON_VERTEX.to_owned())].into();
    let upstream = &mut config.upstreams[0];
    upstream.name = "vertex".into();
    upstream.api = api;
    upstream.base_url = match api {
        Api::Gemini => format!("{}/v1beta", mock.origin()),
        _ => mock.origin() + "/v1",
    };
    upstream.api_key = None;
    upstream.members = vec![account];
}

fn claude(content: &str) -> Value {
    json!({
        "model": CLAUDE,
        "max_tokens": 64,
        "messages": [{"role": "user", "content": content}],
    })
}

/// The path of Claude's `method` on the member's project and location.
fn claude_path(method: &str) -> String {
    format!("{LOCATION}/publishers/anthropic/models/{CLAUDE_ON_VERTEX}:{method}")
}

/// What Vertex's rules want of every Claude call corral sent: the body's
/// version Vertex's, no model in it (the path names it), the member's own
/// token and none of the caller's credentials.
fn assert_vertex_claude_call(request: &RecordedRequest) {
    let body = request.json().expect("a JSON body");
    assert_eq!(
        body["anthropic_version"], VERTEX_ANTHROPIC_VERSION,
        "{body}"
    );
    assert!(
        body.get("model").is_none(),
        "the path names the model: {body}"
    );
    assert!(
        request
            .header("authorization")
            .is_some_and(|value| value.starts_with("Bearer ya29.mock-")),
        "{:?}",
        request.headers
    );
    assert_eq!(request.header("x-api-key"), None, "never the caller's key");
}

/// A gateway whose first upstream is a Vertex AI member speaking `api`, and
/// what `tests/sdk/vertex_members.py <args>` reported through it (an answer
/// with text), with the context to print on a failed assertion.
async fn through_a_vertex_member(
    python: Python,
    api: Api,
    args: &[&str],
) -> (MockProvider, TestGateway, Value, String) {
    let mock = MockProvider::start(MockSettings::default()).await.unwrap();
    let gateway = TestGateway::start_with(mock.clone(), |config| {
        vertex_pool(config, &mock, api);
    })
    .await;
    let (results, stderr) = python
        .run_script_with("vertex_members.py", &gateway.url, args)
        .await;
    let context = format!("results: {results}\nstderr: {stderr}");
    assert!(
        !results["text"].as_str().unwrap_or_default().is_empty(),
        "{context}"
    );
    (mock, gateway, results, context)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anthropic_client_reaches_claude_on_a_vertex_member_and_fifty_make_one_call() {
    let (mock, gateway, results, context) = through_a_vertex_member(
        Python::with_anthropic().await,
        Api::Anthropic,
        &["claude", CALLER_KEY],
    )
    .await;
    assert_eq!(results["stop_reason"], "end_turn", "{context}");
    assert!(results["input_tokens"].as_u64() > Some(0), "{context}");
    let types = results["stream_types"].as_array().expect("stream events");
    assert_eq!(types.first(), Some(&json!("message_start")), "{context}");
    assert_eq!(types.last(), Some(&json!("message_stop")), "{context}");
    assert!(
        !results["stream_text"]
            .as_str()
            .unwrap_or_default()
            .is_empty(),
        "{context}"
    );
    assert_eq!(results["stream_stop_reason"], "end_turn", "{context}");

    let requests = mock.requests();
    let paths: Vec<&str> = requests.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(
        paths,
        [claude_path("rawPredict"), claude_path("streamRawPredict")],
        "{context}"
    );
    for request in &requests {
        assert_vertex_claude_call(request);
    }
    assert_eq!(requests[1].json().unwrap()["stream"], true);
    assert_eq!(mock.google_token_requests(), 1, "one token for both calls");

    // 50 identical callers, held at the mock until all wait: one call.
    let url = gateway.url.clone();
    let (results, stderr) = gateway
        .held_for_waiters(50, || {
            tokio::spawn(async move {
                Python::with_anthropic()
                    .await
                    .run_script_with(
                        "vertex_members.py",
                        &url,
                        &["claude_herd", CALLER_KEY, "50"],
                    )
                    .await
            })
        })
        .await;
    let answers = results["herd"]
        .as_array()
        .unwrap_or_else(|| panic!("no herd: {results}\n{stderr}"));
    assert_eq!(answers.len(), 50, "{stderr}");
    assert!(
        answers.iter().all(|a| a["text"] == answers[0]["text"]),
        "{results}"
    );
    let misses = answers.iter().filter(|a| a["cache"] == "MISS").count();
    assert_eq!(misses, 1, "{results}");
    assert_eq!(mock.calls(), 3);
    assert_eq!(mock.requests()[2].path, claude_path("rawPredict"));
    assert_vertex_claude_call(&mock.requests()[2]);

    // The calls' tokens are counted under the public name, not Vertex's id.
    let metrics = scrape(&gateway).await;
    assert!(model_tokens(&metrics, CLAUDE, "input", "upstream") > 0.0);
    assert_eq!(
        model_tokens(&metrics, CLAUDE_ON_VERTEX, "input", "upstream"),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_google_genai_client_reaches_gemini_on_a_vertex_member() {
    let (mock, gateway, results, context) = through_a_vertex_member(
        Python::with_google_genai().await,
        Api::Gemini,
        &["gemini", GEMINI_KEY],
    )
    .await;
    assert_eq!(results["model_version"], GEMINI, "{context}");
    assert!(results["prompt_tokens"].as_u64() > Some(0), "{context}");
    assert!(results["stream_chunks"].as_u64() > Some(1), "{context}");
    assert!(
        results["stream_text"]
            .as_str()
            .unwrap_or_default()
            .contains("Stream from Gemini on Vertex."),
        "{context}"
    );
    assert!(
        results["stream_finish_reason"]
            .as_str()
            .unwrap_or_default()
            .contains("STOP"),
        "{context}"
    );

    let requests = mock.requests();
    let calls: Vec<(&str, Option<&str>)> = requests
        .iter()
        .map(|r| (r.path.as_str(), r.query.as_deref()))
        .collect();
    let gemini_path =
        |method: &str| format!("{LOCATION}/publishers/google/models/{GEMINI}:{method}");
    assert_eq!(
        calls,
        [
            (gemini_path("generateContent").as_str(), None),
            (
                gemini_path("streamGenerateContent").as_str(),
                Some("alt=sse")
            ),
        ],
        "{context}"
    );
    for request in &requests {
        assert!(
            request
                .header("authorization")
                .is_some_and(|value| value.starts_with("Bearer ya29.mock-")),
            "{:?}",
            request.headers
        );
        assert_eq!(
            request.header("x-goog-api-key"),
            None,
            "never the caller's key"
        );
    }
    assert_eq!(mock.google_token_requests(), 1);

    // 20 identical Gemini callers: one call.
    let path = format!("/v1beta/models/{GEMINI}:generateContent");
    let body = json!({"contents": [{"role": "user", "parts": [{"text": "a Gemini herd"}]}]});
    let replies = gateway
        .herd(&path, &body, 20, &[("x-goog-api-key", GEMINI_KEY)])
        .await;
    assert!(
        replies.iter().all(|reply| reply.status == StatusCode::OK),
        "{:?}",
        replies[0].body
    );
    assert!(replies.iter().all(|reply| reply.body == replies[0].body));
    assert_eq!(mock.calls(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vertex_member_fetches_one_token_for_many_calls_and_refreshes_once_after_expiry() {
    let mock = MockProvider::start(MockSettings::default()).await.unwrap();
    // The first token lives one second (corral refreshes it a quarter of that
    // early); the next ones an hour.
    mock.push_google_token_lifetime(Duration::from_secs(1));
    let gateway = TestGateway::start_with(mock.clone(), |config| {
        vertex_pool(config, &mock, Api::Anthropic);
    })
    .await;
    let key = [("x-api-key", CALLER_KEY)];
    let first = gateway.post_with(MESSAGES, &claude("vertex 0"), &key).await;
    assert_eq!(first.status, StatusCode::OK, "{:?}", first.body);
    assert_eq!(mock.google_token_requests(), 1);

    // Waiting out the token's lifetime is the point: this wait is the expiry
    // under test, not a stand-in for an event.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let calls = |round: &str| {
        let tasks: Vec<_> = (0..100)
            .map(|i| {
                let handle = gateway.clone_handle();
                let body = claude(&format!("vertex {round} {i}"));
                tokio::spawn(async move { handle.post_with(MESSAGES, &body, &key).await })
            })
            .collect();
        collect(tasks)
    };
    for reply in calls("at expiry").await {
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    }
    assert_eq!(
        mock.google_token_requests(),
        2,
        "a hundred callers at expiry: one refresh"
    );
    for reply in calls("after the refresh").await {
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    }
    assert_eq!(mock.calls(), 201);
    assert_eq!(
        mock.google_token_requests(),
        2,
        "one token for the next hundred calls"
    );
    let tokens: std::collections::BTreeSet<String> = mock
        .requests()
        .iter()
        .map(|request| {
            assert_eq!(request.path, claude_path("rawPredict"));
            request.header("authorization").unwrap().to_owned()
        })
        .collect();
    assert_eq!(tokens.len(), 2, "the first token, then its replacement");
}

/// The mock's Vertex surface is what the official SDKs parse:
/// `AnthropicVertex` and `google-genai`'s Vertex mode, each with a token from
/// the mock's service account key
/// (`crates/mock-upstream/tests/vertex_sdk_check.py`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mocks_vertex_surface_is_what_the_official_sdks_parse() {
    let python = Python::with_anthropic_clouds().await;
    let mock = MockProvider::start(MockSettings::default()).await.unwrap();
    let key_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(key_file.path(), mock.service_account_json()).unwrap();
    let root = mock.origin();
    python
        .run_mock_check(
            "vertex_sdk_check.py",
            &[root.as_ref(), key_file.path().as_os_str()],
            WAIT * 4,
        )
        .await;
    assert!(mock.google_token_requests() >= 1, "the check took tokens");
    let paths: Vec<String> = mock.requests().into_iter().map(|r| r.path).collect();
    for method in ["rawPredict", "streamRawPredict"] {
        assert!(
            paths
                .iter()
                .any(|path| path.contains("/publishers/anthropic/") && path.ends_with(method)),
            "{method}: {paths:?}"
        );
    }
    assert!(
        paths
            .iter()
            .any(|path| path.starts_with("/v1beta1/") && path.ends_with(":generateContent")),
        "{paths:?}"
    );
}
