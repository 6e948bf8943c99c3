//! Anthropic's API through corral: an `api: anthropic` upstream gets the
//! caller's key (or corral's own) as `x-api-key` and an `anthropic-version`,
//! callers authenticate with either header, refusals on `/v1/messages*` come
//! in Anthropic's error shape, and `count_tokens` is passed through to the
//! upstream its model routes to, retried on 529 as the provider asks.

use std::time::Duration;

use corral::{
    Config,
    auth::key_hash,
    config::{Api, Secret},
};
use mock_upstream::{MockProvider, MockSettings, Scripted};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{TestGateway, chat};

pub const MODEL: &str = "claude-sonnet-4-5";

/// A second mock standing for Anthropic (the mock speaks both APIs; a
/// separate one shows which upstream a request went to).
pub async fn anthropic_mock(models: &[&str]) -> MockProvider {
    MockProvider::start(MockSettings {
        models: Some(models.iter().map(|m| (*m).to_owned()).collect()),
        ..MockSettings::default()
    })
    .await
    .expect("mock starts")
}

/// Adds `provider` as an `api: anthropic` upstream serving `claude-*`, after
/// the catch-all OpenAI one (which must not shadow it).
pub fn add_anthropic(config: &mut Config, provider: &MockProvider) {
    let mut anthropic = config.upstreams[0].clone();
    anthropic.name = "anthropic".into();
    anthropic.api = Api::Anthropic;
    anthropic.base_url = provider.base_url();
    anthropic.models = vec!["claude-*".into()];
    config.upstreams.push(anthropic);
}

pub fn count_body() -> Value {
    json!({"model": MODEL, "messages": [{"role": "user", "content": "How many tokens is this?"}]})
}

/// The Anthropic error shape, and its `error.type`.
fn anthropic_error_type(body: &Value) -> &str {
    assert_eq!(body["type"], "error", "{body}");
    assert!(body["error"]["message"].is_string(), "{body}");
    body["error"]["type"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn count_tokens_reaches_the_anthropic_upstream_with_the_callers_key_as_x_api_key() {
    let anthropic = anthropic_mock(&[MODEL]).await;
    let gateway = TestGateway::start(|config| add_anthropic(config, &anthropic)).await;

    let reply = gateway
        .post_with(
            "/v1/messages/count_tokens",
            &count_body(),
            &[
                ("x-api-key", "sk-ant-caller-a"),
                ("anthropic-beta", "token-counting-2024-11-01"),
            ],
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    assert!(reply.json()["input_tokens"].as_u64().is_some_and(|n| n > 0));
    // The current Python SDK's way (auth_token=): a bearer token, with a version of its own.
    let reply = gateway
        .post_with(
            "/v1/messages/count_tokens",
            &count_body(),
            &[
                ("authorization", "Bearer sk-ant-caller-b"),
                ("anthropic-version", "2023-01-01"),
            ],
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);

    let requests = anthropic.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].path, "/v1/messages/count_tokens");
    assert_eq!(requests[0].auth_headers(), ["x-api-key"]);
    assert_eq!(requests[0].header("x-api-key"), Some("sk-ant-caller-a"));
    assert_eq!(
        requests[0].header("anthropic-version"),
        Some("2023-06-01"),
        "the default"
    );
    assert_eq!(
        requests[0].header("anthropic-beta"),
        Some("token-counting-2024-11-01")
    );
    assert_eq!(
        requests[1].auth_headers(),
        ["x-api-key"],
        "never Authorization to Anthropic"
    );
    assert_eq!(requests[1].header("x-api-key"), Some("sk-ant-caller-b"));
    assert_eq!(requests[1].header("anthropic-version"), Some("2023-01-01"));
    assert_eq!(
        gateway.provider.received(),
        Vec::<String>::new(),
        "OpenAI's upstream saw nothing"
    );

    // A model no Anthropic upstream serves is refused in Anthropic's shape,
    // though the catch-all OpenAI upstream would take it for chat.
    let reply = gateway
        .post_with(
            "/v1/messages/count_tokens",
            &json!({"model": "gpt-4o", "messages": []}),
            &[("x-api-key", "sk-ant-caller-a")],
        )
        .await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert_eq!(anthropic_error_type(&reply.json()), "not_found_error");
    assert_eq!(anthropic.requests().len(), 2);

    // The provider's own refusal is relayed as it came.
    let reply = gateway
        .post_with(
            "/v1/messages/count_tokens",
            &json!({"model": MODEL}),
            &[("x-api-key", "sk-ant-caller-a")],
        )
        .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(anthropic_error_type(&reply.json()), "invalid_request_error");
    assert!(
        reply.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("messages")
    );
}

#[tokio::test]
async fn a_gateway_key_passes_in_either_header_and_corrals_own_key_goes_upstream() {
    let anthropic = anthropic_mock(&[MODEL]).await;
    let gateway = TestGateway::start(|config| {
        add_anthropic(config, &anthropic);
        config.auth.key_hashes = vec![key_hash(b"gw-team-key")];
        config.upstreams[0].api_key = Some(Secret::new("sk-openai-corral".into()));
        config.upstreams[1].api_key = Some(Secret::new("sk-ant-corral".into()));
    })
    .await;

    for header in ["x-api-key", "authorization"] {
        let value = if header == "x-api-key" {
            "gw-team-key"
        } else {
            "Bearer gw-team-key"
        };
        let reply = gateway
            .post_with(
                "/v1/messages/count_tokens",
                &count_body(),
                &[(header, value)],
            )
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{header}: {:?}", reply.body);
    }
    for request in anthropic.requests() {
        assert_eq!(request.auth_headers(), ["x-api-key"]);
        assert_eq!(request.header("x-api-key"), Some("sk-ant-corral"));
    }
    // An OpenAI client with the same gateway key, in the x-api-key header.
    let reply = gateway
        .post_with(
            "/v1/chat/completions",
            &chat("hi"),
            &[("x-api-key", "gw-team-key")],
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    let openai = gateway.provider.requests();
    assert_eq!(openai[0].auth_headers(), ["authorization"]);
    assert_eq!(
        openai[0].header("authorization"),
        Some("Bearer sk-openai-corral")
    );
    // The gateway key went nowhere.
    for request in anthropic.requests().iter().chain(&openai) {
        assert!(
            request
                .headers
                .iter()
                .all(|(_, value)| !value.contains("gw-team-key")),
            "{:?}",
            request.headers
        );
    }

    // Refused: no key, an unknown key; each in its route's shape.
    for headers in [vec![], vec![("x-api-key", "gw-wrong")]] {
        let reply = gateway
            .post_with("/v1/messages/count_tokens", &count_body(), &headers)
            .await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
        assert_eq!(anthropic_error_type(&reply.json()), "authentication_error");
        let reply = gateway
            .post_with("/v1/chat/completions", &chat("hi"), &headers)
            .await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
        assert_eq!(reply.json()["error"]["code"], "invalid_api_key");
    }
    assert_eq!(anthropic.calls(), 2);
}

#[tokio::test]
async fn an_overloaded_anthropic_upstream_is_retried_after_its_retry_after() {
    let anthropic = anthropic_mock(&[MODEL]).await;
    let gateway = TestGateway::start(|config| add_anthropic(config, &anthropic)).await;
    anthropic.push_script(Scripted {
        status: 529,
        headers: vec![("retry-after".into(), "0.3".into())],
        body:
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
                .to_string(),
    });
    let reply = gateway
        .post_with(
            "/v1/messages/count_tokens",
            &count_body(),
            &[("x-api-key", "sk-ant-a")],
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    assert!(reply.json()["input_tokens"].is_u64());
    let requests = anthropic.requests();
    assert_eq!(requests.len(), 2, "one 529, one retry");
    // A lower bound only: corral waited at least what the provider asked
    // (its own backoff in tests is at most 100 ms).
    assert!(
        requests[1].at - requests[0].at >= Duration::from_millis(300),
        "{:?}",
        requests[1].at - requests[0].at
    );
}

#[tokio::test]
async fn the_model_list_includes_the_anthropic_upstreams_models() {
    let anthropic = anthropic_mock(&[MODEL, "claude-haiku-4-5"]).await;
    let gateway = TestGateway::start(|config| add_anthropic(config, &anthropic)).await;
    let reply = gateway.get("/v1/models").await;
    assert_eq!(reply.status, StatusCode::OK);
    let mut ids: Vec<String> = reply.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|model| model["id"].as_str().unwrap().to_owned())
        .collect();
    ids.sort_unstable();
    assert!(
        ids.contains(&MODEL.to_owned()) && ids.contains(&"claude-haiku-4-5".to_owned()),
        "{ids:?}"
    );
    assert!(ids.contains(&"gpt-4o".to_owned()), "{ids:?}");
    let asked: Vec<_> = anthropic
        .received()
        .into_iter()
        .filter(|line| line == "GET /v1/models")
        .collect();
    assert_eq!(asked.len(), 1);
}
