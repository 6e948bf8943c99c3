//! Tests of Entra's token endpoint: what it issues, what it refuses and in which words, how long
//! a token opens Azure's door, and the token-request counter.

use std::time::Duration;

use serde_json::{Value, json};

use super::{DEFAULT_TOKEN_LIFETIME, Entra};
use crate::test_support::{DEADLINE, client, start};
use crate::{EntraClient, MockProvider, MockSettings};

const SCOPE: &str = "https://cognitiveservices.azure.com/.default";

/// A token request's form fields.
type Fields<'a> = Vec<(&'a str, &'a str)>;

fn grant<'a>(client_id: &'a str, secret: &'a str, scope: &'a str) -> Fields<'a> {
    vec![
        ("grant_type", "client_credentials"),
        ("client_id", client_id),
        ("client_secret", secret),
        ("scope", scope),
    ]
}

async fn ask(mock: &MockProvider, form: &[(&str, &str)]) -> (u16, Value) {
    let response = client()
        .post(mock.entra_token_url("my-tenant"))
        .form(form)
        .send()
        .await
        .expect("sending the token request");
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON body"))
}

async fn token(mock: &MockProvider) -> String {
    let (status, body) = ask(mock, &grant("app", "secret", SCOPE)).await;
    assert_eq!(status, 200, "{body}");
    body["access_token"].as_str().expect("a token").to_owned()
}

/// The status of an Azure chat call bearing `token`.
async fn azure_status(mock: &MockProvider, token: &str) -> (u16, Value) {
    let response = client()
        .post(format!(
            "{}/openai/deployments/d/chat/completions?api-version=2024-10-21",
            mock.azure_endpoint()
        ))
        .bearer_auth(token)
        .json(&json!({"messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("sending the call");
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON body"))
}

async fn configured() -> MockProvider {
    MockProvider::start(MockSettings {
        entra_client: Some(EntraClient::new("app", "secret")),
        ..MockSettings::default()
    })
    .await
    .expect("starting the mock provider")
}

#[tokio::test]
async fn a_token_opens_azure_and_is_no_call() {
    let mock = configured().await;
    let (status, body) = ask(&mock, &grant("app", "secret", SCOPE)).await;
    assert_eq!(status, 200);
    assert_eq!(body["token_type"], "Bearer");
    assert_eq!(body["expires_in"], 3600);
    assert_eq!(body["ext_expires_in"], 3600);
    let token = body["access_token"].as_str().expect("a token");
    assert!(token.len() > 40, "{token}");
    assert_ne!(token, self::token(&mock).await, "every token is new");

    assert_eq!(azure_status(&mock, token).await.0, 200);
    assert_eq!(mock.calls(), 1);
    assert_eq!(mock.token_requests(), 2);
    assert_eq!(
        mock.requests()[0].header("authorization"),
        Some(&*format!("Bearer {token}"))
    );
}

#[tokio::test]
async fn entra_refuses_in_its_own_words_in_its_own_order() {
    let mock = configured().await;
    let cases: [(Fields, u16, &str, &str); 7] = [
        (vec![], 400, "invalid_request", "AADSTS900144: "),
        (
            vec![("grant_type", "password")],
            400,
            "unsupported_grant_type",
            "AADSTS70003: ",
        ),
        (
            grant("other-app", "secret", SCOPE),
            400,
            "unauthorized_client",
            "AADSTS700016: ",
        ),
        (
            grant("app", "", SCOPE),
            401,
            "invalid_client",
            "AADSTS7000216: ",
        ),
        (
            grant("app", "wrong", SCOPE),
            401,
            "invalid_client",
            "AADSTS7000215: Invalid client secret provided.",
        ),
        (
            grant("app", "secret", ""),
            400,
            "invalid_request",
            "AADSTS900144: ",
        ),
        (
            grant(
                "app",
                "secret",
                "https://cognitiveservices.azure.com/user_impersonation",
            ),
            400,
            "invalid_scope",
            "AADSTS1002012: ",
        ),
    ];
    for (form, status, error, description) in &cases {
        let (got, body) = ask(&mock, form).await;
        assert_eq!(got, *status, "{form:?}: {body}");
        assert_eq!(body["error"], *error, "{form:?}");
        let text = body["error_description"].as_str().expect("a description");
        assert!(text.starts_with(description), "{text}");
        assert!(text.contains(" Trace ID: "), "{text}");
        let code: u64 = description[6..]
            .split(':')
            .next()
            .and_then(|code| code.parse().ok())
            .expect("an AADSTS code");
        assert_eq!(body["error_codes"], json!([code]));
        assert!(body.get("access_token").is_none());
    }
    assert_eq!(
        mock.token_requests(),
        cases.len() as u64,
        "refusals count too"
    );
    assert_eq!(mock.calls(), 0);
}

#[tokio::test]
async fn without_a_configured_client_any_client_with_a_secret_gets_a_token() {
    let mock = start().await;
    assert_eq!(ask(&mock, &grant("anyone", "anything", SCOPE)).await.0, 200);
    assert_eq!(ask(&mock, &grant("anyone", "", SCOPE)).await.0, 401);
    mock.set_entra_client("app", "secret");
    assert_eq!(ask(&mock, &grant("anyone", "anything", SCOPE)).await.0, 400);
    assert_eq!(ask(&mock, &grant("app", "secret", SCOPE)).await.0, 200);
}

#[tokio::test]
async fn a_token_for_another_resource_does_not_open_azure() {
    let mock = start().await;
    let (status, body) = ask(
        &mock,
        &grant("app", "secret", "https://management.azure.com/.default"),
    )
    .await;
    assert_eq!(status, 200, "Entra issues it");
    let token = body["access_token"].as_str().expect("a token");
    let (status, body) = azure_status(&mock, token).await;
    assert_eq!(status, 401);
    assert_eq!(body["error"]["message"], crate::azure::INVALID_TOKEN);
}

#[tokio::test]
async fn queued_lifetimes_go_to_the_next_tokens_then_the_default() {
    let mock = start().await;
    mock.set_token_lifetimes(vec![Duration::from_millis(1500)]);
    mock.push_token_lifetime(Duration::ZERO);
    let mut expires = Vec::new();
    for _ in 0..3 {
        let (_, body) = ask(&mock, &grant("app", "secret", SCOPE)).await;
        expires.push((
            body["expires_in"].clone(),
            body["access_token"].as_str().map(str::to_owned),
        ));
    }
    assert_eq!(expires[0].0, 1, "whole seconds, rounded down");
    assert_eq!(expires[1].0, 0);
    assert_eq!(expires[2].0, 3600);
    // A zero lifetime is expired on arrival: Azure's expired-token 401.
    let expired = expires[1].1.as_deref().expect("a token");
    let (status, body) = azure_status(&mock, expired).await;
    assert_eq!((status, &body["error"]["code"]), (401, &json!("401")));
    assert_eq!(mock.calls(), 0);
    assert_eq!(mock.azure_refused().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_token_is_accepted_until_the_instant_it_expires() {
    let entra = Entra::new(None);
    entra.push_lifetime(Duration::from_secs(1));
    let (short, lifetime) = entra.issue(SCOPE);
    assert_eq!(lifetime, Duration::from_secs(1));
    let (long, lifetime) = entra.issue(SCOPE);
    assert_eq!(lifetime, DEFAULT_TOKEN_LIFETIME);
    assert!(entra.accepts(&short) && entra.accepts(&long));
    tokio::time::advance(Duration::from_millis(999)).await;
    assert!(entra.accepts(&short));
    tokio::time::advance(Duration::from_millis(1)).await;
    assert!(!entra.accepts(&short), "expired at its instant");
    assert!(entra.accepts(&long));
    assert!(!entra.accepts("mock-entra-never-issued"));
    assert!(!entra.accepts(""));
}

#[tokio::test]
async fn token_requests_are_waited_for_and_reset_but_tokens_outlive_a_reset() {
    let mock = start().await;
    let waiter = tokio::spawn({
        let mock = mock.clone();
        async move { mock.wait_for_token_requests(2, DEADLINE).await }
    });
    let token = token(&mock).await;
    assert_eq!(ask(&mock, &[]).await.0, 400);
    assert!(
        tokio::time::timeout(DEADLINE, waiter)
            .await
            .expect("in time")
            .expect("joined")
    );
    assert!(
        !mock
            .wait_for_token_requests(3, Duration::from_millis(10))
            .await
    );

    mock.set_token_lifetimes(vec![Duration::ZERO]);
    mock.set_entra_client("app", "other");
    mock.reset();
    assert_eq!(mock.token_requests(), 0);
    assert_eq!(
        azure_status(&mock, &token).await.0,
        200,
        "issued tokens stay valid"
    );
    let (status, body) = ask(&mock, &grant("app", "secret", SCOPE)).await;
    assert_eq!(status, 200, "the client is back to the settings' (any)");
    assert_eq!(
        body["expires_in"], 3600,
        "no queued lifetimes after a reset"
    );
}

#[tokio::test]
async fn admin_routes_steer_keys_the_client_and_lifetimes_and_report_token_requests() {
    let mock = start().await;
    let admin = |path: &str, body: Value| {
        client()
            .post(format!("{}/__mock/{path}", mock.azure_endpoint()))
            .json(&body)
            .send()
    };
    let status = |response: reqwest::Response| response.status().as_u16();
    assert_eq!(
        status(
            admin("azure_keys", json!({"keys": ["k1"]}))
                .await
                .expect("sent")
        ),
        204
    );
    assert_eq!(
        status(
            admin(
                "entra_client",
                json!({"client_id": "app", "client_secret": "s"})
            )
            .await
            .expect("sent")
        ),
        204
    );
    assert_eq!(
        status(
            admin("token_lifetimes", json!({"ms": [2000]}))
                .await
                .expect("sent")
        ),
        204
    );
    assert_eq!(
        status(
            admin("token_lifetimes", json!({"seconds": [2]}))
                .await
                .expect("sent")
        ),
        400
    );

    let (code, body) = ask(&mock, &grant("app", "s", SCOPE)).await;
    assert_eq!((code, &body["expires_in"]), (200, &json!(2)));
    assert_eq!(ask(&mock, &grant("app", "secret", SCOPE)).await.0, 401);
    let key_call = client()
        .post(format!("{}/openai/v1/embeddings", mock.azure_endpoint()))
        .header("api-key", "k2")
        .json(&json!({"model": "d", "input": "x"}))
        .send()
        .await
        .expect("sent");
    assert_eq!(key_call.status(), 401);

    let tokens: Value = client()
        .get(format!(
            "{}/__mock/tokens?wait_for=2&timeout_ms=5000",
            mock.azure_endpoint()
        ))
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("JSON");
    assert_eq!(tokens, json!({"token_requests": 2, "reached": true}));
}
