//! Tests of Google's token endpoint and the test service account: the key file a client reads,
//! what an assertion must be to get a token and the words of each refusal, how long a token
//! lives, and the token-request counter.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

use super::{
    CLOUD_PLATFORM_SCOPE, DEFAULT_TOKEN_LIFETIME, GOOGLE_TOKEN_URI, GoogleTokens,
    SERVICE_ACCOUNT_EMAIL, verify,
};
use crate::test_support::{DEADLINE, client, start};
use crate::{MockProvider, MockSettings};

const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_secs()
}

/// The key file's fields, parsed.
fn key_file(mock: &MockProvider) -> Value {
    serde_json::from_str(&mock.service_account_json()).expect("the key file is JSON")
}

/// The claims google-auth puts in a service account's assertion.
fn claims(mock: &MockProvider) -> Value {
    let iat = now();
    json!({
        "iss": SERVICE_ACCOUNT_EMAIL,
        "aud": mock.google_token_url(),
        "scope": format!("openid {CLOUD_PLATFORM_SCOPE}"),
        "iat": iat,
        "exp": iat + 3600,
    })
}

/// `claims` signed RS256 with the key file's own private key, its `kid` in the header.
fn sign(mock: &MockProvider, claims: &Value) -> String {
    let file = key_file(mock);
    let key =
        EncodingKey::from_rsa_pem(file["private_key"].as_str().unwrap_or_default().as_bytes())
            .expect("the key file's private key is RSA PEM");
    let mut header = Header::new(Algorithm::RS256);
    header.kid = file["private_key_id"].as_str().map(str::to_owned);
    jsonwebtoken::encode(&header, claims, &key).expect("signing the assertion")
}

async fn ask(mock: &MockProvider, form: &[(&str, &str)]) -> (u16, Value) {
    let response = client()
        .post(mock.google_token_url())
        .form(form)
        .send()
        .await
        .expect("sending the token request");
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON body"))
}

async fn grant(mock: &MockProvider, assertion: &str) -> (u16, Value) {
    ask(
        mock,
        &[("grant_type", JWT_BEARER), ("assertion", assertion)],
    )
    .await
}

/// The status of a Vertex Gemini call bearing `token`.
async fn vertex_status(mock: &MockProvider, token: &str) -> u16 {
    client()
        .post(format!(
            "{}/projects/p/locations/us-central1/publishers/google/models/gemini-2.5-flash:generateContent",
            mock.base_url()
        ))
        .bearer_auth(token)
        .json(&json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}))
        .send()
        .await
        .expect("sending the call")
        .status()
        .as_u16()
}

#[tokio::test]
async fn the_key_file_is_googles_and_its_key_signs_assertions_the_endpoint_accepts() {
    let mock = start().await;
    let file = key_file(&mock);
    assert_eq!(file["type"], "service_account");
    assert_eq!(file["project_id"], "mock-project");
    assert_eq!(file["client_email"], SERVICE_ACCOUNT_EMAIL);
    assert_eq!(file["token_uri"], format!("http://{}/token", mock.addr()));
    assert!(file["client_id"].as_str().is_some_and(|id| !id.is_empty()));
    assert!(
        file["auth_uri"]
            .as_str()
            .is_some_and(|uri| uri.starts_with("https://"))
    );
    let private_key = file["private_key"].as_str().unwrap_or_default();
    assert!(
        private_key.starts_with("-----BEGIN PRIVATE KEY-----\n")
            && private_key.ends_with("-----END PRIVATE KEY-----\n"),
        "PKCS#8 PEM, as Google's key files carry it: {private_key:.40}"
    );
    let kid = file["private_key_id"].as_str().unwrap_or_default();
    assert!(
        kid.len() == 40 && kid.bytes().all(|b| b.is_ascii_hexdigit()),
        "{kid}"
    );
    assert_eq!(
        mock.service_account_json(),
        mock.service_account_json(),
        "one account per process"
    );

    let (status, body) = grant(&mock, &sign(&mock, &claims(&mock))).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["token_type"], "Bearer");
    assert_eq!(body["expires_in"], DEFAULT_TOKEN_LIFETIME.as_secs());
    let token = body["access_token"].as_str().unwrap_or_default();
    assert!(token.starts_with("ya29.mock-"), "{token}");
    assert_eq!(vertex_status(&mock, token).await, 200);
    assert_eq!(mock.google_token_requests(), 1);
    assert_eq!(
        mock.calls(),
        1,
        "the token request is no call; the Vertex call is"
    );
}

#[tokio::test]
async fn googles_own_token_uri_is_an_accepted_audience_as_google_auth_sends_it() {
    let mock = start().await;
    let mut claims = claims(&mock);
    claims["aud"] = json!(GOOGLE_TOKEN_URI);
    let (status, body) = grant(&mock, &sign(&mock, &claims)).await;
    assert_eq!(status, 200, "{body}");
}

/// A refused token request: what it is, its form, Google's `error` and `error_description`.
type Case<'a> = (&'a str, Vec<(&'a str, String)>, &'a str, &'a str);

#[tokio::test]
async fn the_endpoint_refuses_in_googles_words() {
    let mock = start().await;
    let good = claims(&mock);
    let with = |field: &str, value: Value| {
        let mut claims = good.clone();
        claims[field] = value;
        claims
    };
    let without = |field: &str| {
        let mut claims = good.clone();
        claims.as_object_mut().map(|claims| claims.remove(field));
        claims
    };
    let signed = sign(&mock, &good);
    let (head_and_claims, _) = signed.rsplit_once('.').unwrap_or_default();
    let other = sign(&mock, &with("scope", json!("x")));
    let foreign_signature = other.rsplit_once('.').unwrap_or_default().1;
    let forged = format!("{head_and_claims}.{foreign_signature}");
    let t = now();

    let cases: Vec<Case<'_>> = vec![
        (
            "wrong grant",
            vec![
                ("grant_type", "client_credentials".into()),
                ("assertion", signed.clone()),
            ],
            "unsupported_grant_type",
            "Invalid grant_type: client_credentials",
        ),
        (
            "no assertion",
            vec![("grant_type", JWT_BEARER.into())],
            "invalid_request",
            "Missing required parameter: assertion",
        ),
        (
            "not a JWT",
            vec![
                ("grant_type", JWT_BEARER.into()),
                ("assertion", "not.a.jwt".into()),
            ],
            "invalid_grant",
            "Invalid JWT.",
        ),
        (
            "another key's signature",
            vec![("grant_type", JWT_BEARER.into()), ("assertion", forged)],
            "invalid_grant",
            "Invalid JWT Signature.",
        ),
        (
            "another issuer",
            vec![
                ("grant_type", JWT_BEARER.into()),
                (
                    "assertion",
                    sign(
                        &mock,
                        &with("iss", json!("other@p.iam.gserviceaccount.com")),
                    ),
                ),
            ],
            "invalid_grant",
            "Invalid grant: account not found",
        ),
        (
            "another audience",
            vec![
                ("grant_type", JWT_BEARER.into()),
                (
                    "assertion",
                    sign(&mock, &with("aud", json!("https://example.com/token"))),
                ),
            ],
            "invalid_grant",
            "Invalid JWT: Failed audience check.",
        ),
        (
            "longer than an hour",
            vec![
                ("grant_type", JWT_BEARER.into()),
                ("assertion", sign(&mock, &with("exp", json!(t + 3601)))),
            ],
            "invalid_grant",
            super::BAD_TIMEFRAME.description,
        ),
        (
            "without exp",
            vec![
                ("grant_type", JWT_BEARER.into()),
                ("assertion", sign(&mock, &without("exp"))),
            ],
            "invalid_grant",
            super::BAD_TIMEFRAME.description,
        ),
        (
            "without the cloud-platform scope",
            vec![
                ("grant_type", JWT_BEARER.into()),
                (
                    "assertion",
                    sign(
                        &mock,
                        &with(
                            "scope",
                            json!("https://www.googleapis.com/auth/userinfo.email"),
                        ),
                    ),
                ),
            ],
            "invalid_scope",
            "Invalid OAuth scope or ID token audience provided.",
        ),
        (
            "without a scope",
            vec![
                ("grant_type", JWT_BEARER.into()),
                ("assertion", sign(&mock, &without("scope"))),
            ],
            "invalid_scope",
            "Invalid OAuth scope or ID token audience provided.",
        ),
    ];
    let n = cases.len();
    for (case, form, error, description) in cases {
        let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (status, body) = ask(&mock, &form).await;
        assert_eq!(status, 400, "{case}: {body}");
        assert_eq!(
            body,
            json!({"error": error, "error_description": description}),
            "{case}"
        );
    }
    assert_eq!(
        mock.google_token_requests(),
        u64::try_from(n).unwrap_or(u64::MAX)
    );
}

#[test]
fn the_timeframe_must_be_short_lived_current_and_ordered() {
    let mock_uri = "http://127.0.0.1:1/token";
    let assertion = |iat: u64, exp: u64| {
        let claims = json!({
            "iss": SERVICE_ACCOUNT_EMAIL, "aud": mock_uri, "scope": CLOUD_PLATFORM_SCOPE,
            "iat": iat, "exp": exp,
        });
        let key = EncodingKey::from_rsa_pem(super::service_account().private_key_pem.as_bytes())
            .expect("the account's key is RSA PEM");
        jsonwebtoken::encode(&Header::new(Algorithm::RS256), &claims, &key)
            .expect("signing the assertion")
    };
    let now = 2_000_000_000;
    assert_eq!(verify(&assertion(now, now + 3600), mock_uri, now), Ok(()));
    assert_eq!(
        verify(&assertion(now + 30, now + 3600), mock_uri, now),
        Ok(()),
        "within skew"
    );
    for (case, iat, exp) in [
        ("expired", now - 3600, now - 61),
        ("from the future", now + 61, now + 3600),
        ("exp before iat", now, now - 1),
        ("longer than an hour", now, now + 3601),
    ] {
        assert_eq!(
            verify(&assertion(iat, exp), mock_uri, now),
            Err(super::BAD_TIMEFRAME),
            "{case}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn queued_lifetimes_go_to_the_next_tokens_and_expire_at_their_instant() {
    let tokens = GoogleTokens::default();
    tokens.push_lifetime(Duration::from_secs(1));
    let (short, lifetime) = tokens.issue();
    assert_eq!(lifetime, Duration::from_secs(1));
    let (long, lifetime) = tokens.issue();
    assert_eq!(lifetime, DEFAULT_TOKEN_LIFETIME);
    assert!(tokens.accepts(&short) && tokens.accepts(&long));
    tokio::time::advance(Duration::from_millis(999)).await;
    assert!(tokens.accepts(&short));
    tokio::time::advance(Duration::from_millis(1)).await;
    assert!(!tokens.accepts(&short), "expired at its instant");
    assert!(tokens.accepts(&long));
    assert!(!tokens.accepts("ya29.never-issued") && !tokens.accepts(""));
}

#[tokio::test]
async fn a_queued_lifetime_is_reported_in_whole_seconds_then_the_default() {
    let mock = start().await;
    mock.push_google_token_lifetime(Duration::from_millis(1500));
    let (status, body) = grant(&mock, &sign(&mock, &claims(&mock))).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["expires_in"], 1, "whole seconds, rounded down");
    let (_, next) = grant(&mock, &sign(&mock, &claims(&mock))).await;
    assert_eq!(next["expires_in"], DEFAULT_TOKEN_LIFETIME.as_secs());
}

#[tokio::test]
async fn token_requests_are_waited_for_and_reset_but_tokens_outlive_a_reset() {
    let mock = MockProvider::start(MockSettings::default())
        .await
        .expect("starting the mock");
    let waiter = {
        let mock = mock.clone();
        tokio::spawn(async move { mock.wait_for_google_token_requests(2, DEADLINE).await })
    };
    let (_, first) = grant(&mock, &sign(&mock, &claims(&mock))).await;
    ask(&mock, &[("grant_type", "nonsense")]).await;
    assert!(
        waiter.await.expect("the waiter ran"),
        "woken by the second request"
    );
    assert!(
        !mock
            .wait_for_google_token_requests(3, Duration::from_millis(10))
            .await
    );

    mock.push_google_token_lifetime(Duration::from_secs(7));
    mock.reset();
    assert_eq!(mock.google_token_requests(), 0);
    let (_, after) = grant(&mock, &sign(&mock, &claims(&mock))).await;
    assert_eq!(
        after["expires_in"],
        DEFAULT_TOKEN_LIFETIME.as_secs(),
        "queue cleared"
    );
    let token = first["access_token"].as_str().unwrap_or_default();
    assert_eq!(
        vertex_status(&mock, token).await,
        200,
        "issued before the reset"
    );
}
