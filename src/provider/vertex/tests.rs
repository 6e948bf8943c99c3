use std::{collections::BTreeMap, sync::Arc, time::Duration};

use axum::http::Method;
use serde_json::json;

use super::*;
use crate::config::ProviderKind;
use crate::{
    config::Secret,
    provider::{
        adapter,
        google::tests::{ACCESS_TOKEN, service_account_json, token_endpoint},
    },
};

const BASE: &str =
    "https://us-east5-aiplatform.googleapis.com/v1/projects/my-proj/locations/us-east5";

fn member(api: Api, token_uri: &str, deployments: &[(&str, &str)]) -> Member {
    Member {
        name: "vertex-1".to_owned(),
        api,
        provider: ProviderKind::Vertex,
        base_url: BASE.to_owned(),
        api_key: None,
        api_version: None,
        deployments: Arc::new(
            deployments
                .iter()
                .map(|(model, name)| ((*model).to_owned(), (*name).to_owned()))
                .collect::<BTreeMap<_, _>>(),
        ),
        entra: None,
        region: None,
        aws: None,
        service_account: Some(Secret::new(service_account_json(token_uri))),
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

fn vertex(api: Api, deployments: &[(&str, &str)]) -> Box<dyn Adapter> {
    let member = member(api, "https://oauth2.googleapis.com/token", deployments);
    adapter(&member, &reqwest::Client::new()).unwrap()
}

/// What `adapter` prepares for a POST of `body` to `path`.
fn prepare(
    adapter: &dyn Adapter,
    path: &str,
    query: Option<&str>,
    model: Option<&str>,
    body: &Value,
) -> Result<Prepared, GatewayError> {
    let body = Bytes::from(body.to_string());
    let token = HeaderValue::from_static("Bearer ya29.t");
    adapter.prepare(
        &Call {
            method: &Method::POST,
            path,
            query,
            model,
            headers: &[],
            authorization: None,
            body: &body,
        },
        Some(&token),
    )
}

fn body_of(prepared: &Prepared) -> Value {
    serde_json::from_slice(&prepared.body).unwrap()
}

#[test]
fn messages_go_to_raw_predict_without_model_and_with_vertexs_version() {
    let vertex = vertex(Api::Anthropic, &[]);
    let model = "claude-sonnet-4-5@20250929";
    let sent =
        json!({"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
    let prepared = prepare(&*vertex, "/messages", Some("beta=true"), Some(model), &sent).unwrap();
    assert_eq!(
        prepared.url.as_str(),
        format!("{BASE}/publishers/anthropic/models/{model}:rawPredict"),
        "the query of Anthropic's SDKs is dropped"
    );
    assert_eq!(
        body_of(&prepared),
        json!({
            "anthropic_version": "vertex-2023-10-16",
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "hi"}],
        })
    );
    let headers: Vec<_> = prepared.headers.iter().map(|(name, _)| name).collect();
    assert_eq!(
        headers,
        [&header::AUTHORIZATION],
        "no anthropic-version header"
    );
    assert_eq!(prepared.headers[0].1, "Bearer ya29.t");
}

#[test]
fn a_streamed_message_goes_to_stream_raw_predict_and_keeps_stream() {
    let vertex = vertex(Api::Anthropic, &[]);
    let sent = json!({"model": "claude-haiku-4-5@20251001", "stream": true, "max_tokens": 8});
    let prepared = prepare(
        &*vertex,
        "/messages",
        None,
        Some("claude-haiku-4-5@20251001"),
        &sent,
    )
    .unwrap();
    assert!(
        prepared
            .url
            .as_str()
            .ends_with("/publishers/anthropic/models/claude-haiku-4-5@20251001:streamRawPredict"),
        "{}",
        prepared.url
    );
    assert_eq!(body_of(&prepared)["stream"], true);

    // `"stream": false` is a whole answer.
    let sent = json!({"model": "m", "stream": false});
    let prepared = prepare(&*vertex, "/messages", None, Some("m"), &sent).unwrap();
    assert!(prepared.url.as_str().ends_with("/models/m:rawPredict"));
}

#[test]
fn a_deployment_names_the_model_and_a_callers_version_is_kept() {
    let vertex = vertex(
        Api::Anthropic,
        &[("claude-sonnet-4-5", "claude-sonnet-4-5@20250929")],
    );
    let sent = json!({"model": "claude-sonnet-4-5", "anthropic_version": "vertex-2099-01-01"});
    let prepared = prepare(
        &*vertex,
        "/messages",
        None,
        Some("claude-sonnet-4-5"),
        &sent,
    )
    .unwrap();
    assert!(
        prepared
            .url
            .path()
            .ends_with("/models/claude-sonnet-4-5@20250929:rawPredict"),
        "{}",
        prepared.url
    );
    assert_eq!(
        body_of(&prepared),
        json!({"anthropic_version": "vertex-2099-01-01"})
    );

    // A pass-through call names no routing model: the body's is used.
    let sent = json!({"model": "claude-opus-4-1@20250805"});
    let prepared = prepare(&*vertex, "/messages", None, None, &sent).unwrap();
    assert!(
        prepared
            .url
            .path()
            .ends_with("/models/claude-opus-4-1@20250805:rawPredict")
    );
    let error = prepare(&*vertex, "/messages", None, None, &json!({"max_tokens": 1})).unwrap_err();
    assert!(error.to_string().contains("names its model"), "{error}");
}

#[test]
fn count_tokens_goes_to_vertexs_count_tokens_model_keeping_the_model() {
    let vertex = vertex(
        Api::Anthropic,
        &[("claude-sonnet-4-5", "claude-sonnet-4-5@20250929")],
    );
    let sent = json!({"model": "claude-sonnet-4-5", "messages": []});
    let prepared = prepare(
        &*vertex,
        "/messages/count_tokens",
        Some("beta=true"),
        Some("claude-sonnet-4-5"),
        &sent,
    )
    .unwrap();
    assert_eq!(
        prepared.url.as_str(),
        format!("{BASE}/publishers/anthropic/models/count-tokens:rawPredict")
    );
    assert_eq!(
        body_of(&prepared),
        json!({
            "anthropic_version": "vertex-2023-10-16",
            "model": "claude-sonnet-4-5@20250929",
            "messages": [],
        })
    );
}

#[test]
fn what_vertex_does_not_serve_is_refused_before_it_is_sent() {
    let claude = vertex(Api::Anthropic, &[]);
    for path in ["/messages/batches", "/models", "/complete"] {
        let error = prepare(&*claude, path, None, Some("m"), &json!({"model": "m"})).unwrap_err();
        assert!(
            matches!(error, GatewayError::InvalidRequest { .. })
                && error.to_string().contains(path),
            "{path}: {error}"
        );
    }
    let not_json = claude.prepare(
        &Call {
            method: &Method::POST,
            path: "/messages",
            query: None,
            model: Some("m"),
            headers: &[],
            authorization: None,
            body: &Bytes::from_static(b"[1]"),
        },
        None,
    );
    assert!(not_json.is_err());

    // A model that would change the path rather than name a model.
    for model in ["../../x", "a/b", "a?b", "a:b", ".hidden", ""] {
        let error = prepare(&*claude, "/messages", None, Some(model), &json!({})).unwrap_err();
        assert!(
            matches!(
                error,
                GatewayError::InvalidRequest {
                    param: Some("model"),
                    ..
                }
            ),
            "{model:?}: {error}"
        );
    }

    let gemini = vertex(Api::Gemini, &[]);
    for path in [
        "/models",
        "/models/gemini-2.5-pro",
        "/models/gemini-2.5-pro:",
        "/models/gemini-2.5-pro:generate/../x",
        "/models/../../x:generateContent",
        "/cachedContents",
    ] {
        assert!(
            prepare(&*gemini, path, None, Some("gemini-2.5-pro"), &json!({})).is_err(),
            "{path}"
        );
    }
}

#[test]
fn gemini_methods_go_below_googles_publisher_with_their_query_and_body() {
    let gemini = vertex(Api::Gemini, &[("gemini-pro", "gemini-2.5-pro")]);
    let sent = json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]});
    let prepared = prepare(
        &*gemini,
        "/models/gemini-2.0-flash-001:streamGenerateContent",
        Some("alt=sse"),
        Some("gemini-2.0-flash-001"),
        &sent,
    )
    .unwrap();
    assert_eq!(
        prepared.url.as_str(),
        format!(
            "{BASE}/publishers/google/models/gemini-2.0-flash-001:streamGenerateContent?alt=sse"
        )
    );
    assert_eq!(body_of(&prepared), sent);
    assert_eq!(prepared.headers[0].1, "Bearer ya29.t");

    let prepared = prepare(
        &*gemini,
        "/models/gemini-pro:generateContent",
        None,
        Some("gemini-pro"),
        &sent,
    )
    .unwrap();
    assert_eq!(
        prepared.url.as_str(),
        format!("{BASE}/publishers/google/models/gemini-2.5-pro:generateContent"),
        "the account's name for the model"
    );
}

#[test]
fn an_account_is_googles_own_credential_and_refuses_a_bad_key_by_its_field() {
    let vertex = vertex(Api::Gemini, &[]);
    assert_eq!(vertex.kind(), ProviderKind::Vertex);
    assert!(vertex.has_own_credential());
    assert!(vertex.token().is_some());
    assert_eq!(vertex.owner(), auth::Provider::Google);

    let client = reqwest::Client::new();
    let mut keyless = member(Api::Anthropic, "https://oauth2.googleapis.com/token", &[]);
    keyless.service_account = None;
    let error = adapter(&keyless, &client).unwrap_err();
    assert!(error.to_string().contains("vertex-1"), "{error:#}");

    let mut bad = member(Api::Anthropic, "https://oauth2.googleapis.com/token", &[]);
    let mut fields: Map<String, Value> =
        serde_json::from_str(bad.service_account.as_ref().unwrap().expose()).unwrap();
    fields.remove("client_email");
    bad.service_account = Some(Secret::new(Value::Object(fields).to_string()));
    let error = format!("{:#}", adapter(&bad, &client).unwrap_err());
    assert!(
        error.contains("vertex-1") && error.contains("`client_email`"),
        "{error}"
    );

    let mut openai = member(Api::OpenAi, "https://oauth2.googleapis.com/token", &[]);
    openai.api = Api::OpenAi;
    assert!(adapter(&openai, &client).is_err());
}

#[tokio::test]
async fn one_token_request_serves_every_call_as_a_bearer() {
    let (url, seen) = token_endpoint().await;
    let member = member(Api::Anthropic, &format!("{url}/token"), &[]);
    let vertex = adapter(&member, &reqwest::Client::new()).unwrap();
    let tokens = vertex.token().unwrap();
    let bearers = tokio::time::timeout(
        Duration::from_secs(10),
        futures::future::join_all((0..5).map(|_| tokens.bearer())),
    )
    .await
    .expect("the tokens came in time");
    for bearer in bearers {
        let bearer = bearer.unwrap();
        let prepared = vertex
            .prepare(
                &Call {
                    method: &Method::POST,
                    path: "/messages",
                    query: None,
                    model: Some("claude-sonnet-4-5@20250929"),
                    headers: &[],
                    authorization: None,
                    body: &Bytes::from_static(b"{}"),
                },
                Some(&bearer),
            )
            .unwrap();
        let [(name, value)] = prepared.headers.as_slice() else {
            panic!("one header, not {:?}", prepared.headers);
        };
        assert_eq!(*name, header::AUTHORIZATION);
        assert_eq!(value, format!("Bearer {ACCESS_TOKEN}").as_str());
        assert!(value.is_sensitive());
    }
    assert_eq!(seen.lock().unwrap().len(), 1, "one token request");
}
