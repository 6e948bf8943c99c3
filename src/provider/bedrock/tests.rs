use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, SystemTime},
};

use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use bytes::Bytes;
use hmac::{Hmac, Mac as _};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use super::*;
use crate::config::ProviderKind;
use crate::{
    config::{Api, AwsCredentials, Member, Secret},
    provider::{Account, Adapter, Call, eventstream::tests as frames},
};

const KEY_ID: &str = "AKIDEXAMPLE";
const SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
const SESSION: &str = "FwoGZXIvYXdzEXAMPLETOKEN";

fn member(base_url: &str, aws: Option<AwsCredentials>, key: Option<&str>) -> Member {
    Member {
        name: "bedrock".to_owned(),
        api: Api::Anthropic,
        provider: ProviderKind::Bedrock,
        base_url: base_url.to_owned(),
        api_key: key.map(|key| Secret::new(key.to_owned())),
        api_version: None,
        deployments: Arc::new(BTreeMap::from([(
            "claude-sonnet".to_owned(),
            "us.anthropic.claude-3-5-sonnet-20240620-v1:0".to_owned(),
        )])),
        entra: None,
        region: Some("us-east-1".to_owned()),
        aws,
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

fn keys(session: Option<&str>) -> AwsCredentials {
    AwsCredentials {
        access_key_id: Secret::new(KEY_ID.to_owned()),
        secret_access_key: Secret::new(SECRET.to_owned()),
        session_token: session.map(|token| Secret::new(token.to_owned())),
    }
}

fn bedrock(member: &Member) -> Bedrock {
    Bedrock::new(Account::new(member).unwrap(), member).unwrap()
}

fn signing(base_url: &str) -> Bedrock {
    bedrock(&member(base_url, Some(keys(Some(SESSION))), None))
}

const BASE: &str = "https://bedrock-runtime.us-east-1.amazonaws.com";

fn call<'a>(
    path: &'a str,
    model: &'a str,
    headers: &'a [(HeaderName, HeaderValue)],
    body: &'a Bytes,
) -> Call<'a> {
    static POST: Method = Method::POST;
    Call {
        method: &POST,
        path,
        query: Some("beta=true"),
        model: Some(model),
        headers,
        authorization: None,
        body,
    }
}

fn messages_body(stream: bool) -> Bytes {
    Bytes::from(
        json!({"model": "claude-sonnet", "max_tokens": 16, "stream": stream,
               "messages": [{"role": "user", "content": "Hi"}]})
        .to_string(),
    )
}

fn header_value<'p>(prepared: &'p Prepared, name: &str) -> Option<&'p HeaderValue> {
    prepared
        .headers
        .iter()
        .find(|(key, _)| key == name)
        .map(|(_, value)| value)
}

#[test]
fn a_messages_call_invokes_the_percent_encoded_model_id() {
    let adapter = signing(BASE);
    let cases = [
        (
            "claude-sonnet",
            false,
            "/model/us.anthropic.claude-3-5-sonnet-20240620-v1%3A0/invoke",
        ),
        (
            "claude-sonnet",
            true,
            "/model/us.anthropic.claude-3-5-sonnet-20240620-v1%3A0/invoke-with-response-stream",
        ),
        // A model no deployment names goes by its own name, an ARN's `:`
        // and `/` encoded.
        (
            "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-v2",
            false,
            "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus.anthropic.claude-v2/invoke",
        ),
    ];
    for (model, stream, path) in cases {
        let body = messages_body(stream);
        let prepared = adapter
            .prepare(&call("/messages", model, &[], &body), None)
            .unwrap();
        assert_eq!(prepared.url.as_str(), format!("{BASE}{path}"), "{model}");
        assert_eq!(prepared.url.query(), None, "Bedrock takes no query");
    }
}

#[test]
fn the_body_loses_model_and_stream_and_gains_bedrock_fields() {
    let adapter = signing(BASE);
    let headers = [
        (
            HeaderName::from_static("anthropic-beta"),
            HeaderValue::from_static(
                "prompt-caching-2024-07-31, ,token-efficient-tools-2025-02-19",
            ),
        ),
        (
            HeaderName::from_static("anthropic-beta"),
            HeaderValue::from_static("output-128k-2025-02-19"),
        ),
        (
            HeaderName::from_static("anthropic-version"),
            HeaderValue::from_static("2023-06-01"),
        ),
    ];
    let body = messages_body(true);
    let prepared = adapter
        .prepare(&call("/messages", "claude-sonnet", &headers, &body), None)
        .unwrap();
    let sent: Value = serde_json::from_slice(&prepared.body).unwrap();
    assert_eq!(
        sent,
        json!({
            "anthropic_version": "bedrock-2023-05-31",
            "anthropic_beta": ["prompt-caching-2024-07-31", "token-efficient-tools-2025-02-19",
                               "output-128k-2025-02-19"],
            "max_tokens": 16,
            "messages": [{"role": "user", "content": "Hi"}],
        })
    );
    for (name, _) in &headers {
        assert!(
            !adapter.forwards(name),
            "{name} goes in the body or nowhere"
        );
    }
    assert_eq!(
        header_value(&prepared, "content-type").unwrap(),
        "application/json"
    );
    // A beta the body lists already is not listed twice.
    let body = Bytes::from(r#"{"anthropic_beta":["output-128k-2025-02-19"],"messages":[]}"#);
    let prepared = adapter
        .prepare(
            &call("/messages", "claude-sonnet", &headers[1..2], &body),
            None,
        )
        .unwrap();
    let sent: Value = serde_json::from_slice(&prepared.body).unwrap();
    assert_eq!(sent["anthropic_beta"], json!(["output-128k-2025-02-19"]));
}

#[test]
fn other_paths_are_refused() {
    let adapter = signing(BASE);
    let body = messages_body(false);
    for path in ["/messages/count_tokens", "/models", "/messages/batches"] {
        let err = adapter
            .prepare(&call(path, "claude-sonnet", &[], &body), None)
            .unwrap_err();
        assert!(
            matches!(&err, GatewayError::InvalidRequest { message, .. }
                if message.contains(path) && message.contains("POST /messages only")),
            "{err}"
        );
    }
    let not_json = Bytes::from_static(b"--boundary");
    assert!(
        adapter
            .prepare(&call("/messages", "claude-sonnet", &[], &not_json), None)
            .is_err()
    );
}

#[test]
fn an_api_key_is_a_bearer_token() {
    let adapter = bedrock(&member(BASE, None, Some("ABSKbedrock-key")));
    assert!(adapter.has_own_credential());
    let body = messages_body(false);
    let prepared = adapter
        .prepare(&call("/messages", "claude-sonnet", &[], &body), None)
        .unwrap();
    let authorization = header_value(&prepared, "authorization").unwrap();
    assert_eq!(authorization, "Bearer ABSKbedrock-key");
    assert!(authorization.is_sensitive());
    assert!(
        prepared
            .headers
            .iter()
            .all(|(name, _)| !name.as_str().starts_with("x-amz-")),
        "nothing is signed"
    );
    let neither = member(BASE, None, None);
    assert!(Bedrock::new(Account::new(&neither).unwrap(), &neither).is_err());
}

#[test]
fn the_signature_dates_from_the_moment_of_signing() {
    let adapter = bedrock(&member(BASE, Some(keys(None)), None));
    assert!(adapter.has_own_credential());
    let body = messages_body(false);
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_164_645); // 2024-01-02T03:04:05Z
    let prepared = adapter
        .prepare_at(&call("/messages", "claude-sonnet", &[], &body), at)
        .unwrap();
    assert_eq!(
        header_value(&prepared, "x-amz-date").unwrap(),
        "20240102T030405Z"
    );
    let authorization = header_value(&prepared, "authorization").unwrap();
    assert!(authorization.is_sensitive());
    let text = authorization.to_str().unwrap();
    assert!(
        text.starts_with(
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20240102/us-east-1/bedrock/aws4_request, \
             SignedHeaders=content-type;host;x-amz-date, Signature="
        ),
        "{text}"
    );
    assert!(
        header_value(&prepared, "x-amz-security-token").is_none(),
        "no session token without one"
    );
}

/// What the test server received.
struct Received {
    path: String,
    headers: HeaderMap,
    body: Bytes,
}

/// What the test server answers: status, headers, body.
type Answer = (u16, &'static [(&'static str, &'static str)], &'static str);

const OK_JSON: Answer = (200, &[("content-type", "application/json")], "{}");

/// A server on 127.0.0.1:0 that hands over each request it gets, and
/// answers `answer`.
async fn capturing_server(answer: Answer) -> (String, tokio::sync::mpsc::Receiver<Received>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (sender, receiver) = tokio::sync::mpsc::channel(4);
    let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
        let sender = sender.clone();
        async move {
            let (parts, body) = request.into_parts();
            let body = axum::body::to_bytes(body, 1 << 20).await.unwrap();
            let received = Received {
                path: parts.uri.path().to_owned(),
                headers: parts.headers,
                body,
            };
            sender.send(received).await.unwrap();
            let (status, headers, body) = answer;
            let mut response = http::Response::builder().status(status);
            for (name, value) in headers {
                response = response.header(*name, *value);
            }
            response.body(axum::body::Body::from(body)).unwrap()
        }
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, receiver)
}

/// SigV4 as AWS documents it (the canonical request, the string to sign,
/// the derived key), recomputed from what the server received: the
/// signature the request carries, if it verifies.
fn verify_sigv4(received: &Received, secret: &str, region: &str, service: &str) -> bool {
    const CANONICAL_PATH: &AsciiSet = &NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~')
        .remove(b'/');
    let hmac = |key: &[u8], data: &[u8]| {
        let mut mac = Hmac::<Sha256>::new_from_slice(key).unwrap();
        mac.update(data);
        mac.finalize().into_bytes().to_vec()
    };
    let sha256 = |data: &[u8]| hex::encode(Sha256::digest(data));
    let authorization = received.headers["authorization"].to_str().unwrap();
    let rest = authorization.strip_prefix("AWS4-HMAC-SHA256 ").unwrap();
    let field = |name: &str| {
        rest.split(", ")
            .find_map(|part| part.strip_prefix(name)?.strip_prefix('='))
            .unwrap()
    };
    let signed_headers = field("SignedHeaders");
    let scope = field("Credential").split_once('/').unwrap().1;
    let amz_date = received.headers["x-amz-date"].to_str().unwrap();
    let date = &amz_date[..8];
    assert_eq!(scope, format!("{date}/{region}/{service}/aws4_request"));
    let canonical_headers: String = signed_headers
        .split(';')
        .map(|name| {
            let value = received.headers[name].to_str().unwrap().trim();
            format!("{name}:{value}\n")
        })
        .collect();
    // Every service but S3 signs its path encoded once more.
    let canonical_request = format!(
        "POST\n{}\n\n{canonical_headers}\n{signed_headers}\n{}",
        utf8_percent_encode(&received.path, CANONICAL_PATH),
        sha256(&received.body)
    );
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        sha256(canonical_request.as_bytes())
    );
    let mut key = hmac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    for part in [region, service, "aws4_request"] {
        key = hmac(&key, part.as_bytes());
    }
    hex::encode(hmac(&key, string_to_sign.as_bytes())) == field("Signature")
}

/// The request as reqwest sends it (the Host with its port, the exact
/// body) carries a signature that AWS's algorithm verifies, over the host,
/// the content type and the session token.
#[tokio::test]
async fn sigv4_signs_the_request_as_sent() {
    let (url, mut requests) = capturing_server(OK_JSON).await;
    let adapter = signing(&url);
    let body = messages_body(true);
    let prepared = adapter
        .prepare(&call("/messages", "claude-sonnet", &[], &body), None)
        .unwrap();
    for name in ["authorization", "x-amz-security-token"] {
        assert!(
            header_value(&prepared, name).unwrap().is_sensitive(),
            "{name}"
        );
    }
    let mut request = reqwest::Client::new().post(prepared.url.clone());
    for (name, value) in &prepared.headers {
        request = request.header(name, value);
    }
    let response = request.body(prepared.body.clone()).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut received = tokio::time::timeout(Duration::from_secs(10), requests.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        received.path,
        "/model/us.anthropic.claude-3-5-sonnet-20240620-v1%3A0/invoke-with-response-stream"
    );
    assert_eq!(received.headers["host"], url.trim_start_matches("http://"));
    assert_eq!(received.headers["x-amz-security-token"], SESSION);
    let authorization = received.headers["authorization"].to_str().unwrap();
    assert!(
        authorization.contains("SignedHeaders=content-type;host;x-amz-date;x-amz-security-token,"),
        "{authorization}"
    );
    assert!(verify_sigv4(&received, SECRET, "us-east-1", "bedrock"));
    // The check is no formality: other bytes, or another key, fail it.
    assert!(!verify_sigv4(
        &received,
        "another secret",
        "us-east-1",
        "bedrock"
    ));
    received.body = Bytes::from_static(b"{}");
    assert!(!verify_sigv4(&received, SECRET, "us-east-1", "bedrock"));
}

fn response(status: u16, headers: &[(&str, &str)], body: reqwest::Body) -> reqwest::Response {
    let mut builder = http::Response::builder().status(status);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    reqwest::Response::from(builder.body(body).unwrap())
}

#[tokio::test]
async fn bedrock_errors_become_anthropics() {
    let adapter = signing(BASE);
    let cases = [
        (
            429,
            Some("ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/"),
            "rate_limit_error",
        ),
        (429, Some("ModelNotReadyException"), "overloaded_error"),
        (503, Some("ServiceUnavailableException"), "overloaded_error"),
        (400, Some("ValidationException"), "invalid_request_error"),
        (403, Some("AccessDeniedException"), "permission_error"),
        (
            403,
            Some("UnrecognizedClientException"),
            "authentication_error",
        ),
        (404, Some("ResourceNotFoundException"), "not_found_error"),
        (424, Some("ModelErrorException"), "api_error"),
        (500, Some("InternalServerException"), "api_error"),
        (529, None, "overloaded_error"),
        (401, None, "authentication_error"),
    ];
    for (status, error_type, kind) in cases {
        let mut headers = vec![
            ("content-type", "application/json"),
            ("content-length", "31"),
            ("retry-after", "3"),
        ];
        headers.extend(error_type.map(|name| ("x-amzn-ErrorType", name)));
        let body = reqwest::Body::from(r#"{"message":"Too many requests"}"#);
        let answer = adapter.answer(response(status, &headers, body));
        assert_eq!(answer.status().as_u16(), status);
        let head = answer.headers().clone();
        assert_eq!(head["content-type"], "application/json");
        assert_eq!(head["retry-after"], "3", "AWS's wait is kept");
        assert!(head.get("content-length").is_none(), "the body changed");
        if let Some(name) = error_type {
            assert_eq!(head["x-amzn-errortype"], name);
        }
        let body: Value = serde_json::from_slice(&answer.bytes().await.unwrap()).unwrap();
        assert_eq!(
            body,
            json!({"type": "error", "error": {"type": kind, "message": "Too many requests"}}),
            "{error_type:?}"
        );
    }
}

#[test]
fn an_error_without_the_header_is_named_by_its_body() {
    let status = StatusCode::BAD_REQUEST;
    let typed = br#"{"__type":"com.amazon.coral.service#ThrottlingException","Message":"slow"}"#;
    let body: Value = serde_json::from_slice(&anthropic_error_body(status, None, typed)).unwrap();
    assert_eq!(body["error"]["type"], "rate_limit_error");
    assert_eq!(body["error"]["message"], "slow");
    let body: Value =
        serde_json::from_slice(&anthropic_error_body(status, None, b"Bad Gateway\n")).unwrap();
    assert_eq!(body["error"]["message"], "Bad Gateway");
    let body: Value = serde_json::from_slice(&anthropic_error_body(status, None, b"")).unwrap();
    assert_eq!(body["error"]["message"], "Bedrock answered 400 Bad Request");
    assert_eq!(body["error"]["type"], "invalid_request_error");
}

/// After the rewrite, corral's Anthropic rules read Bedrock's throttle as
/// they read Anthropic's: retried, after AWS's own wait.
#[tokio::test]
async fn a_rewritten_throttle_is_retried_after_its_wait() {
    let adapter = signing(BASE);
    let headers = [
        ("x-amzn-ErrorType", "ThrottlingException"),
        ("retry-after", "7"),
    ];
    let answer = adapter.answer(response(
        429,
        &headers,
        reqwest::Body::from(r#"{"message":"Too many"}"#),
    ));
    let head = answer.headers().clone();
    let body = answer.bytes().await.unwrap();
    let attempt =
        crate::upstream::status_error(Api::Anthropic, StatusCode::TOO_MANY_REQUESTS, &head, body);
    assert!(attempt.retryable);
    assert_eq!(attempt.retry_after, Some(Duration::from_secs(7)));
    assert_eq!(attempt.cooldown, Some(Duration::from_secs(7)));
}

#[tokio::test]
async fn an_event_stream_answer_becomes_sse() {
    let adapter = signing(BASE);
    let stream: Vec<u8> = frames::EVENTS
        .iter()
        .flat_map(|event| frames::chunk_frame(event))
        .collect();
    let chunks: Vec<Result<Bytes, std::io::Error>> = stream
        .chunks(17)
        .map(|piece| Ok(Bytes::copy_from_slice(piece)))
        .collect();
    let body = reqwest::Body::wrap_stream(futures::stream::iter(chunks));
    let headers = [
        ("content-type", "application/vnd.amazon.eventstream"),
        ("x-amzn-requestid", "req-1"),
    ];
    let answer = adapter.answer(response(200, &headers, body));
    assert_eq!(answer.status(), StatusCode::OK);
    assert_eq!(answer.headers()[header::CONTENT_TYPE], "text/event-stream");
    assert_eq!(answer.headers()["x-amzn-requestid"], "req-1");
    let text = answer.text().await.unwrap();
    assert_eq!(text, frames::events_sse());
}

#[tokio::test]
async fn a_json_answer_is_unchanged() {
    let adapter = signing(BASE);
    let json = r#"{"id":"msg_1","type":"message","content":[]}"#;
    let answer = adapter.answer(response(
        200,
        &[("content-type", "application/json")],
        reqwest::Body::from(json),
    ));
    assert_eq!(answer.headers()[header::CONTENT_TYPE], "application/json");
    assert_eq!(answer.text().await.unwrap(), json);
}

/// Through the client: no caller header reaches Bedrock (its beta is in the
/// body), one `Content-Type`, the account's key and never the caller's;
/// Bedrock's refusal comes back in Anthropic's shape.
#[tokio::test]
async fn the_client_sends_bedrock_no_caller_header_and_relays_its_error_as_anthropics() {
    const REFUSED: Answer = (
        400,
        &[
            ("content-type", "application/json"),
            ("x-amzn-ErrorType", "ValidationException"),
        ],
        r#"{"message":"max_tokens: field required"}"#,
    );
    let (url, mut requests) = capturing_server(REFUSED).await;
    // Below a path: the configuration refuses an Anthropic-API member's bare
    // host (Anthropic's needs its `/v1`), Bedrock's real endpoint too.
    let url = format!("{url}/runtime");
    let yaml = format!(
        "listen: 127.0.0.1:0\nupstreams:\n  - name: claude\n    api: anthropic\n    \
         provider: bedrock\n    base_url: {url}\n    region: us-east-1\n    \
         api_key_env: BEDROCK_KEY\n    deployments: {{claude-sonnet: anthropic.claude-v2:1}}\n"
    );
    let config = crate::config::Config::load(&yaml, [("BEDROCK_KEY", "ABSK-key")]).unwrap();
    let upstream =
        crate::upstream::Upstream::new(&config, crate::metrics::Metrics::new(&config)).unwrap();
    let caller_headers = [
        ("anthropic-beta", "interleaved-thinking-2025-05-14"),
        ("anthropic-version", "2023-06-01"),
        ("accept", "text/event-stream"),
        ("content-type", "application/json; charset=utf-8"),
    ];
    let outbound = crate::upstream::Outbound {
        upstream: 0,
        method: Method::POST,
        path: "/messages".into(),
        query: None,
        headers: caller_headers
            .iter()
            .map(|(name, value)| {
                (
                    HeaderName::from_static(name),
                    HeaderValue::from_static(value),
                )
            })
            .collect(),
        authorization: Some(HeaderValue::from_static("Bearer sk-ant-api03-caller")),
        affinity: None,
        pin: None,
        model: Some("claude-sonnet".into()),
        body: messages_body(false),
    };
    let label = crate::metrics::ModelLabel::for_tests("claude-sonnet");
    let err = upstream.call_buffered(&outbound, &label).await.unwrap_err();
    let GatewayError::Upstream { status, body, .. } = err else {
        panic!("{err}");
    };
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        body,
        json!({"type": "error", "error": {"type": "invalid_request_error",
               "message": "max_tokens: field required"}})
    );
    let received = tokio::time::timeout(Duration::from_secs(10), requests.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        received.path,
        "/runtime/model/anthropic.claude-v2%3A1/invoke"
    );
    for name in ["anthropic-beta", "anthropic-version", "x-api-key"] {
        assert!(received.headers.get(name).is_none(), "{name} was sent");
    }
    // reqwest's own default, not the caller's.
    assert_eq!(received.headers["accept"], "*/*");
    let content_types: Vec<_> = received.headers.get_all("content-type").iter().collect();
    assert_eq!(content_types, ["application/json"]);
    assert_eq!(received.headers["authorization"], "Bearer ABSK-key");
    let sent: Value = serde_json::from_slice(&received.body).unwrap();
    assert_eq!(
        sent["anthropic_beta"],
        json!(["interleaved-thinking-2025-05-14"])
    );
    assert!(requests.try_recv().is_err(), "a 400 is not retried");
}
