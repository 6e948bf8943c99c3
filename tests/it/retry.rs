//! The upstream retry policy, observed at the mock provider.

use std::time::Duration;

use mock_upstream::{FailureMode, Scripted};
use reqwest::StatusCode;

use crate::harness::{TestGateway, chat};

const PATH: &str = "/v1/chat/completions";

fn error_body(code: &str) -> String {
    format!(r#"{{"error":{{"message":"scripted","type":"{code}","param":null,"code":"{code}"}}}}"#)
}

#[tokio::test]
async fn transient_failures_are_retried_until_success() {
    let gateway = TestGateway::start(|config| config.retry.max_attempts = 3).await;
    gateway
        .provider
        .push_script(Scripted::json(503, error_body("overloaded")));
    gateway
        .provider
        .push_script(Scripted::json(503, error_body("overloaded")));
    let reply = gateway.post(PATH, &chat("eventually")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(gateway.provider.calls(), 3);
    assert_eq!(reply.cache(), "MISS");
}

#[tokio::test]
async fn retry_after_is_honoured() {
    let gateway = TestGateway::start(|config| {
        config.retry.base_delay = Duration::from_millis(1);
        config.retry.max_delay = Duration::from_millis(5);
    })
    .await;
    let mut limited = Scripted::json(429, error_body("rate_limit_exceeded"));
    limited.headers.push(("retry-after".into(), "1".into()));
    gateway.provider.push_script(limited);
    let reply = gateway.post(PATH, &chat("patience")).await;
    assert_eq!(reply.status, StatusCode::OK);
    let requests = gateway.provider.requests();
    assert_eq!(requests.len(), 2);
    let gap = requests[1].at.duration_since(requests[0].at);
    // The backoff alone would wait at most 5 ms; the provider asked for 1 s.
    assert!(gap >= Duration::from_millis(950), "waited only {gap:?}");
    assert!(gap < Duration::from_secs(10), "waited {gap:?}");
}

#[tokio::test]
async fn client_errors_and_exhausted_quota_are_not_retried() {
    let gateway = TestGateway::start(|config| config.retry.max_attempts = 5).await;
    gateway
        .provider
        .push_script(Scripted::json(400, error_body("invalid_request_error")));
    let reply = gateway.post(PATH, &chat("bad")).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        reply.json()["error"]["code"],
        "invalid_request_error",
        "the provider's body is relayed"
    );
    assert_eq!(gateway.provider.calls(), 1);

    gateway
        .provider
        .push_script(Scripted::json(429, error_body("insufficient_quota")));
    let reply = gateway.post(PATH, &chat("broke")).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(gateway.provider.calls(), 2);

    let mut told_not_to = Scripted::json(503, error_body("overloaded"));
    told_not_to
        .headers
        .push(("x-should-retry".into(), "false".into()));
    gateway.provider.push_script(told_not_to);
    let reply = gateway.post(PATH, &chat("do not retry")).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(gateway.provider.calls(), 3);
}

#[tokio::test]
async fn attempts_stop_at_max_attempts() {
    let gateway = TestGateway::start(|config| config.retry.max_attempts = 3).await;
    gateway.provider.set_failure(Some(FailureMode::always(503)));
    let reply = gateway.post(PATH, &chat("never")).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(gateway.provider.calls(), 3);
}
