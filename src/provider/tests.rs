use std::{collections::BTreeMap, sync::Arc, time::Duration};

use axum::http::{HeaderValue, Method};
use bytes::Bytes;

use super::*;
use crate::config::{Api, Member, ProviderKind, Secret};

fn member(provider: ProviderKind, base_url: &str, key: Option<&str>) -> Member {
    Member {
        name: "m".to_owned(),
        api: match provider {
            ProviderKind::OpenAi | ProviderKind::Azure => Api::OpenAi,
            ProviderKind::Gemini => Api::Gemini,
            _ => Api::Anthropic,
        },
        provider,
        base_url: base_url.to_owned(),
        api_key: key.map(|key| Secret::new(key.to_owned())),
        api_version: None,
        deployments: Arc::new(BTreeMap::new()),
        entra: None,
        region: None,
        aws: None,
        service_account: None,
        weight: 1,
        priority: 0,
        quota: None,
        connect_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(1),
        first_byte_timeout: Duration::from_secs(1),
        rate: None,
        max_concurrency: None,
        breaker_failures: 1,
        breaker_cool_down: Duration::from_secs(1),
    }
}

fn deployed(mut member: Member, pairs: &[(&str, &str)]) -> Member {
    member.deployments = Arc::new(
        pairs
            .iter()
            .map(|(model, name)| ((*model).to_owned(), (*name).to_owned()))
            .collect(),
    );
    member
}

struct Sent {
    url: String,
    headers: Vec<String>,
    body: serde_json::Value,
}

fn send(
    member: &Member,
    path: &str,
    query: Option<&str>,
    model: Option<&str>,
    caller: Option<&str>,
) -> Sent {
    let adapter = adapter(member, &reqwest::Client::new()).unwrap();
    let authorization = caller.map(|value| HeaderValue::from_str(value).unwrap());
    let body =
        Bytes::from(serde_json::json!({"model": model.unwrap_or("none"), "n": 1}).to_string());
    let call = Call {
        method: &Method::POST,
        path,
        query,
        model,
        headers: &[],
        authorization: authorization.as_ref(),
        body: &body,
    };
    let prepared = adapter.prepare(&call, None).unwrap();
    let mut headers: Vec<String> = prepared
        .headers
        .iter()
        .map(|(name, value)| format!("{name}: {}", value.to_str().unwrap()))
        .collect();
    headers.sort();
    Sent {
        url: prepared.url.to_string(),
        headers,
        body: serde_json::from_slice(&prepared.body).unwrap(),
    }
}

fn credentials(provider: ProviderKind, own_key: Option<&str>, caller: Option<&str>) -> Vec<String> {
    let member = member(provider, "http://127.0.0.1:9/v1", own_key);
    send(&member, "/messages", None, None, caller)
        .headers
        .into_iter()
        .filter(|header| !header.starts_with("anthropic-version"))
        .collect()
}

#[test]
fn urls_stay_below_the_base_path_on_its_origin() {
    let base = reqwest::Url::parse("https://api.example.com/v1/").unwrap();
    let url = confined_url(&base, "/files/f-1", Some("limit=2")).unwrap();
    assert_eq!(url.as_str(), "https://api.example.com/v1/files/f-1?limit=2");
    for path in [
        "/../admin",
        "/%2e%2e/admin",
        "/a/../../admin",
        "/",
        "",
        "@evil.com/x",
    ] {
        assert!(confined_url(&base, path, None).is_err(), "{path}");
    }
    let root = reqwest::Url::parse("http://127.0.0.1:9").unwrap();
    assert!(confined_url(&root, "/models", None).is_ok());
    assert!(
        confined_url(&root, "/../models", None).is_ok(),
        "the root is the root"
    );
}

#[test]
fn each_provider_gets_the_credential_in_its_own_form() {
    use ProviderKind::*;
    assert_eq!(
        credentials(OpenAi, None, Some("Bearer sk-caller")),
        ["authorization: Bearer sk-caller"]
    );
    assert_eq!(
        credentials(OpenAi, Some("sk-own"), Some("Bearer sk-caller")),
        ["authorization: Bearer sk-own"]
    );
    assert_eq!(
        credentials(Anthropic, None, Some("Bearer sk-ant-api03-caller")),
        ["x-api-key: sk-ant-api03-caller"]
    );
    assert_eq!(
        credentials(Anthropic, Some("sk-ant-own"), Some("Bearer sk-ant-x")),
        ["x-api-key: sk-ant-own"]
    );
    // An OAuth access token is refused by Anthropic as an x-api-key.
    assert_eq!(
        credentials(Anthropic, None, Some("Bearer sk-ant-oat01-caller")),
        ["authorization: Bearer sk-ant-oat01-caller"]
    );
    assert!(credentials(Anthropic, None, None).is_empty());
    assert_eq!(
        credentials(Gemini, Some("AIza-own"), None),
        ["x-goog-api-key: AIza-own"]
    );
    // Azure takes a key as `api-key`, never as a bearer token.
    assert_eq!(
        credentials(Azure, Some("az-own"), Some("Bearer az-caller")),
        ["api-key: az-own"]
    );
    assert_eq!(
        credentials(Azure, None, Some("Bearer az-caller")),
        ["api-key: az-caller"]
    );
}

#[test]
fn anthropic_gets_a_version_unless_the_caller_named_one() {
    let member = member(ProviderKind::Anthropic, "http://127.0.0.1:9/v1", Some("k"));
    let sent = send(&member, "/messages", None, None, None);
    assert!(
        sent.headers
            .contains(&format!("anthropic-version: {DEFAULT_ANTHROPIC_VERSION}"))
    );
}

#[test]
fn azure_v1_sends_the_deployment_as_the_model() {
    let member = deployed(
        member(
            ProviderKind::Azure,
            "https://east.openai.azure.com/openai/v1",
            Some("k"),
        ),
        &[("gpt-4o", "prod-gpt4o")],
    );
    let sent = send(&member, "/chat/completions", None, Some("gpt-4o"), None);
    assert_eq!(
        sent.url,
        "https://east.openai.azure.com/openai/v1/chat/completions"
    );
    assert_eq!(sent.body["model"], "prod-gpt4o");
    assert_eq!(sent.body["n"], 1, "the rest of the body is kept");
    // A model without a deployment goes by its own name.
    let sent = send(
        &member,
        "/chat/completions",
        None,
        Some("gpt-4o-mini"),
        None,
    );
    assert_eq!(sent.body["model"], "gpt-4o-mini");
}

#[test]
fn azure_versioned_routes_by_deployment_path_with_its_api_version() {
    let mut member = deployed(
        member(
            ProviderKind::Azure,
            "https://west.openai.azure.com/openai",
            Some("k"),
        ),
        &[("gpt-4o", "prod-gpt4o")],
    );
    member.api_version = Some("2024-10-21".to_owned());
    let sent = send(&member, "/chat/completions", None, Some("gpt-4o"), None);
    assert_eq!(
        sent.url,
        "https://west.openai.azure.com/openai/deployments/prod-gpt4o/chat/completions?api-version=2024-10-21"
    );
    let sent = send(
        &member,
        "/embeddings",
        Some("api-version=2023-05-15&x=1"),
        Some("text-embedding-3-small"),
        None,
    );
    assert_eq!(
        sent.url,
        "https://west.openai.azure.com/openai/deployments/text-embedding-3-small/embeddings?x=1&api-version=2024-10-21",
        "the account's version replaces the caller's"
    );
    // Responses is below the resource, the deployment in the body.
    let sent = send(&member, "/responses", None, Some("gpt-4o"), None);
    assert_eq!(
        sent.url,
        "https://west.openai.azure.com/openai/responses?api-version=2024-10-21"
    );
    assert_eq!(sent.body["model"], "prod-gpt4o");
}

#[test]
fn gemini_calls_the_accounts_name_for_the_model_in_its_path() {
    let member = deployed(
        member(ProviderKind::Gemini, "http://127.0.0.1:9/v1beta", Some("k")),
        &[("gemini-flash", "gemini-2.5-flash")],
    );
    let sent = send(
        &member,
        "/models/gemini-flash:generateContent",
        None,
        Some("gemini-flash"),
        None,
    );
    assert_eq!(
        sent.url,
        "http://127.0.0.1:9/v1beta/models/gemini-2.5-flash:generateContent"
    );
}
