//! The grant against a token endpoint that checks each assertion as Google
//! does: its RS256 signature with the account's public key, its audience,
//! issuer, scope and lifetime.

use std::{
    collections::HashMap,
    convert::Infallible,
    sync::{Arc, LazyLock, Mutex},
};

use crate::provider::oauth::MAX_ANSWER_BYTES;
use axum::{
    Form, Router,
    body::Body,
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::post,
};
use bytes::Bytes;
use jsonwebtoken::{DecodingKey, Validation};
use rsa::{RsaPrivateKey, pkcs1::EncodeRsaPublicKey, pkcs8::EncodePrivateKey};

use super::*;
use crate::provider::token::TokenCache;

pub(crate) const CLIENT_EMAIL: &str = "corral@my-proj.iam.gserviceaccount.com";
pub(crate) const KEY_ID: &str = "0123456789abcdef";
pub(crate) const ACCESS_TOKEN: &str = "ya29.test-access-token";

/// A service account's key pair, made once per test run (none is committed).
pub(crate) struct TestKey {
    /// The private key as Google's JSON key holds it: PKCS#8 PEM.
    pub(crate) pem: String,
    pub(crate) public: DecodingKey,
}

pub(crate) static TEST_KEY: LazyLock<TestKey> = LazyLock::new(|| {
    let key = RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 2048).expect("an RSA key");
    let pem = key
        .to_pkcs8_pem(rsa::pkcs8::LineEnding::LF)
        .expect("PKCS#8 PEM")
        .to_string();
    let public = key
        .to_public_key()
        .to_pkcs1_der()
        .expect("PKCS#1 public DER");
    TestKey {
        pem,
        public: DecodingKey::from_rsa_der(public.as_bytes()),
    }
});

/// The JSON key file of the test account, asking for tokens at `token_uri`.
pub(crate) fn service_account_json(token_uri: &str) -> String {
    serde_json::json!({
        "type": "service_account",
        "project_id": "my-proj",
        "private_key_id": KEY_ID,
        "private_key": TEST_KEY.pem,
        "client_email": CLIENT_EMAIL,
        "client_id": "1234567890",
        "auth_uri": "https://accounts.google.com/o/oauth2/auth",
        "token_uri": token_uri,
    })
    .to_string()
}

/// The claims the endpoint reads from an assertion.
#[derive(Debug, Deserialize)]
pub(crate) struct SeenClaims {
    pub(crate) iss: String,
    pub(crate) scope: String,
    pub(crate) aud: String,
    pub(crate) iat: u64,
    pub(crate) exp: u64,
}

/// Every assertion the endpoint accepted: its header's `kid` and its claims.
pub(crate) type Seen = Arc<Mutex<Vec<(Option<String>, SeenClaims)>>>;

/// A token endpoint at `{url}/token` that answers an access token to an
/// assertion the test key signed for that very URL, and Google's
/// `invalid_grant` to anything else.
pub(crate) async fn token_endpoint() -> (String, Seen) {
    let seen = Seen::default();
    let url = serve_with(|url| {
        Router::new()
            .route("/token", post(verify))
            .route("/other", post(verify))
            .with_state((format!("{url}/token"), Arc::clone(&seen)))
    })
    .await;
    (url, seen)
}

async fn verify(
    State((audience, seen)): State<(String, Seen)>,
    Form(form): Form<HashMap<String, String>>,
) -> Response {
    let refuse = |description: String| {
        let body = serde_json::json!({"error": "invalid_grant", "error_description": description});
        (StatusCode::BAD_REQUEST, axum::Json(body)).into_response()
    };
    if form.get("grant_type").map(String::as_str) != Some(JWT_BEARER_GRANT) || form.len() != 2 {
        return refuse(format!("not a JWT bearer grant: {:?}", form.keys()));
    }
    let mut validation = Validation::new(Algorithm::RS256);
    validation.set_audience(&[&audience]);
    validation.set_issuer(&[CLIENT_EMAIL]);
    validation.set_required_spec_claims(&["exp", "iat", "aud", "iss"]);
    match jsonwebtoken::decode::<SeenClaims>(&form["assertion"], &TEST_KEY.public, &validation) {
        Ok(data) => {
            seen.lock().unwrap().push((data.header.kid, data.claims));
            axum::Json(serde_json::json!({
                "access_token": ACCESS_TOKEN,
                "expires_in": 3599,
                "token_type": "Bearer",
            }))
            .into_response()
        }
        Err(error) => refuse(format!("Invalid JWT: {error}")),
    }
}

/// Serves the router `make` builds for the server's own URL on 127.0.0.1:0.
async fn serve_with(make: impl FnOnce(&str) -> Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let router = make(&url);
    tokio::spawn(async move { axum::serve(listener, router).await });
    url
}

/// An endpoint at `{url}/token` that answers every request with `answer`.
async fn answering(answer: impl Fn() -> Response + Clone + Send + Sync + 'static) -> String {
    serve_with(|_| Router::new().route("/token", post(move || std::future::ready(answer())))).await
}

fn grant_for(token_uri: &str) -> ServiceAccountGrant {
    ServiceAccountGrant::new(
        &Secret::new(service_account_json(token_uri)),
        reqwest::Client::new(),
    )
    .unwrap()
}

/// The grant's answer, bounded so a broken test fails instead of hanging.
async fn issue(grant: &ServiceAccountGrant) -> Result<Issued, TokenError> {
    tokio::time::timeout(Duration::from_secs(10), grant.issue())
        .await
        .expect("the grant answered in time")
}

/// Whether `text` holds any line of the private key's body.
fn shows_the_key(text: &str) -> bool {
    TEST_KEY
        .pem
        .lines()
        .filter(|line| !line.starts_with("-----"))
        .any(|line| text.contains(line))
}

#[tokio::test]
async fn a_signed_assertion_is_traded_for_an_access_token() {
    let (url, seen) = token_endpoint().await;
    let before = now();
    let issued = issue(&grant_for(&format!("{url}/token"))).await.unwrap();
    assert_eq!(issued.token.expose(), ACCESS_TOKEN);
    assert_eq!(issued.lifetime, Duration::from_secs(3599));

    let seen = seen.lock().unwrap();
    let [(kid, claims)] = seen.as_slice() else {
        panic!("one accepted assertion, not {}", seen.len());
    };
    assert_eq!(kid.as_deref(), Some(KEY_ID));
    assert_eq!(claims.iss, CLIENT_EMAIL);
    assert_eq!(claims.scope, CLOUD_PLATFORM_SCOPE);
    assert_eq!(claims.aud, format!("{url}/token"));
    assert!(
        (before..=now()).contains(&claims.iat),
        "iat {} is now",
        claims.iat
    );
    assert_eq!(claims.exp - claims.iat, 3600);
}

#[tokio::test]
async fn an_assertion_for_another_audience_is_refused_with_googles_code() {
    let (url, seen) = token_endpoint().await;
    // Signed for `/other`, which the endpoint is not.
    let error = issue(&grant_for(&format!("{url}/other")))
        .await
        .unwrap_err();
    let TokenError::Refused { status, reason } = &error else {
        panic!("refused, not {error:?}");
    };
    assert_eq!(*status, StatusCode::BAD_REQUEST);
    assert!(reason.starts_with("invalid_grant: Invalid JWT"), "{reason}");
    assert!(seen.lock().unwrap().is_empty());
    assert!(!shows_the_key(&format!("{error} {error:?}")));
}

#[tokio::test]
async fn a_long_refusal_is_clipped_to_one_line() {
    let url = answering(|| {
        let description = format!("Invalid JWT Signature. {}\r\nmore", "x".repeat(1000));
        let body = serde_json::json!({"error": "invalid_grant", "error_description": description});
        (StatusCode::BAD_REQUEST, axum::Json(body)).into_response()
    })
    .await;
    let error = issue(&grant_for(&format!("{url}/token")))
        .await
        .unwrap_err();
    let TokenError::Refused { reason, .. } = &error else {
        panic!("refused, not {error:?}");
    };
    assert!(reason.starts_with("invalid_grant: Invalid JWT Signature."));
    assert!(reason.chars().count() <= "invalid_grant: ".len() + 201);
    assert!(
        !reason.contains('\n') && !reason.contains("more"),
        "{reason}"
    );

    let url =
        answering(|| (StatusCode::SERVICE_UNAVAILABLE, "<html>down</html>").into_response()).await;
    assert_eq!(
        issue(&grant_for(&format!("{url}/token")))
            .await
            .unwrap_err(),
        TokenError::Refused {
            status: StatusCode::SERVICE_UNAVAILABLE,
            reason: "Service Unavailable".into()
        }
    );
}

#[tokio::test]
async fn an_answer_that_is_no_bearer_token_is_malformed_without_quoting_it() {
    for body in [
        r#"{"token_type":"Bearer","expires_in":"soon","access_token":"ya29.leak"}"#,
        r#"{"token_type":"Bearer","expires_in":-1,"access_token":"ya29.leak"}"#,
        r#"{"token_type":"Bearer","access_token":"ya29.leak"}"#,
        r#"{"token_type":"mac","expires_in":60,"access_token":"ya29.leak"}"#,
        r#"{"id_token":"ya29.leak","expires_in":60}"#,
        "ya29.leak",
    ] {
        let url = answering(move || {
            (
                [(http::header::CONTENT_TYPE, "application/json")],
                body.to_owned(),
            )
                .into_response()
        })
        .await;
        let error = issue(&grant_for(&format!("{url}/token")))
            .await
            .unwrap_err();
        assert!(
            matches!(error, TokenError::Malformed(_)),
            "{body}: {error:?}"
        );
        assert!(!error.to_string().contains("ya29.leak"), "{error}");
    }
}

#[tokio::test]
async fn an_oversized_answer_is_refused_without_reading_it_whole() {
    let url = answering(|| " ".repeat(MAX_ANSWER_BYTES + 1).into_response()).await;
    let too_large = TokenError::TooLarge {
        limit: MAX_ANSWER_BYTES,
    };
    assert_eq!(
        issue(&grant_for(&format!("{url}/token")))
            .await
            .unwrap_err(),
        too_large
    );

    // No length given and no end: reading stops at the bound.
    let url = answering(|| {
        Body::from_stream(futures::stream::repeat_with(|| {
            Ok::<_, Infallible>(Bytes::from_static(&[b' '; 8192]))
        }))
        .into_response()
    })
    .await;
    assert_eq!(
        issue(&grant_for(&format!("{url}/token")))
            .await
            .unwrap_err(),
        too_large
    );
}

#[tokio::test]
async fn a_silent_token_endpoint_times_out() {
    let url =
        serve_with(|_| Router::new().route("/token", post(std::future::pending::<&'static str>)))
            .await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let grant = ServiceAccountGrant::new(
        &Secret::new(service_account_json(&format!("{url}/token"))),
        client,
    )
    .unwrap();
    assert_eq!(issue(&grant).await.unwrap_err(), TokenError::Timeout);
}

#[tokio::test]
async fn the_cache_asks_once_for_many_callers() {
    let (url, seen) = token_endpoint().await;
    let cache = TokenCache::new(Box::new(grant_for(&format!("{url}/token"))));
    let bearers = futures::future::join_all((0..8).map(|_| cache.bearer())).await;
    for bearer in bearers {
        assert_eq!(bearer.unwrap(), format!("Bearer {ACCESS_TOKEN}").as_str());
    }
    assert!(cache.bearer().await.unwrap().is_sensitive());
    assert_eq!(seen.lock().unwrap().len(), 1);
    let printed = format!("{cache:?}");
    assert!(!shows_the_key(&printed) && !printed.contains(ACCESS_TOKEN));
}

/// The key file with `edit` applied to its fields.
fn edited(edit: impl FnOnce(&mut Map<String, Value>)) -> Secret<String> {
    let mut fields: Map<String, Value> =
        serde_json::from_str(&service_account_json("https://oauth2.googleapis.com/token")).unwrap();
    edit(&mut fields);
    Secret::new(Value::Object(fields).to_string())
}

#[test]
fn a_bad_key_file_is_refused_by_the_field_at_fault_and_never_quoted() {
    let invalid = |field, problem| KeyError::Invalid { field, problem };
    let pem_body: String = TEST_KEY
        .pem
        .lines()
        .filter(|line| !line.starts_with("-----"))
        .collect();
    let cases: Vec<(Secret<String>, KeyError)> = vec![
        (
            edited(|f| drop(f.remove("client_email"))),
            KeyError::Missing("client_email"),
        ),
        (
            edited(|f| drop(f.remove("private_key"))),
            KeyError::Missing("private_key"),
        ),
        (
            edited(|f| drop(f.remove("token_uri"))),
            KeyError::Missing("token_uri"),
        ),
        (
            edited(|f| drop(f.insert("client_email".into(), 7.into()))),
            invalid("client_email", "is not a string"),
        ),
        (
            edited(|f| drop(f.insert("client_email".into(), " ".into()))),
            invalid("client_email", "is empty"),
        ),
        (
            edited(|f| drop(f.insert("type".into(), "authorized_user".into()))),
            invalid(
                "type",
                "is not \"service_account\": only a service account's key is taken",
            ),
        ),
        (
            edited(|f| drop(f.insert("token_uri".into(), "oauth2.googleapis.com".into()))),
            invalid("token_uri", "is not an http(s) URL without query"),
        ),
        (
            edited(|f| drop(f.insert("token_uri".into(), "https://h/token?x=1".into()))),
            invalid("token_uri", "is not an http(s) URL without query"),
        ),
        (
            edited(|f| drop(f.insert("private_key".into(), pem_body[..200].into()))),
            invalid("private_key", "is not an RSA private key in PEM"),
        ),
        (
            edited(|f| {
                let truncated = TEST_KEY.pem.replace(&pem_body[64..128], "");
                drop(f.insert("private_key".into(), truncated.into()));
            }),
            invalid("private_key", "is not an RSA private key in PEM"),
        ),
    ];
    for (key, expected) in cases {
        let error = ServiceAccountGrant::new(&key, reqwest::Client::new()).unwrap_err();
        assert_eq!(error, expected);
        let shown = format!("{error} {error:?}");
        assert!(!shows_the_key(&shown), "{shown}");
    }
}

#[test]
fn a_key_file_that_is_no_json_object_is_refused_by_where_it_breaks() {
    for (text, line) in [
        (format!("{{\"private_key\": {:?}", TEST_KEY.pem), 1),
        ("\n\n[1, 2]".to_owned(), 3),
        (TEST_KEY.pem.clone(), 1),
    ] {
        let error =
            ServiceAccountGrant::new(&Secret::new(text), reqwest::Client::new()).unwrap_err();
        assert!(
            matches!(error, KeyError::NotJson { line: at, .. } if at == line),
            "{error:?}"
        );
        assert!(!shows_the_key(&format!("{error} {error:?}")), "{error}");
    }
}

#[test]
fn a_pkcs1_key_is_taken_as_well() {
    use rsa::pkcs1::EncodeRsaPrivateKey as _;
    let pkcs1 = RsaPrivateKey::from_pkcs8_pem(&TEST_KEY.pem)
        .unwrap()
        .to_pkcs1_pem(rsa::pkcs8::LineEnding::LF)
        .unwrap()
        .to_string();
    assert!(pkcs1.starts_with("-----BEGIN RSA PRIVATE KEY-----"));
    let grant = ServiceAccountGrant::new(
        &edited(|f| drop(f.insert("private_key".into(), pkcs1.into()))),
        reqwest::Client::new(),
    )
    .unwrap();
    let assertion = grant.assertion(now()).unwrap();
    let mut validation = Validation::new(Algorithm::RS256);
    validation.set_audience(&["https://oauth2.googleapis.com/token"]);
    jsonwebtoken::decode::<SeenClaims>(&assertion, &TEST_KEY.public, &validation).unwrap();
}

#[test]
fn a_key_without_its_id_signs_without_kid_and_debug_shows_no_key() {
    let grant = ServiceAccountGrant::new(
        &edited(|f| drop(f.remove("private_key_id"))),
        reqwest::Client::new(),
    )
    .unwrap();
    let assertion = grant.assertion(now()).unwrap();
    assert_eq!(jsonwebtoken::decode_header(&assertion).unwrap().kid, None);
    assert_eq!(grant.client_email(), CLIENT_EMAIL);
    let printed = format!("{grant:?}");
    assert!(printed.contains(CLIENT_EMAIL), "{printed}");
    assert!(!shows_the_key(&printed), "{printed}");
}
