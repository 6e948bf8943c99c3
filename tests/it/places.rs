//! Caps on requests served at once hold for as long as a request is served:
//! a stream whose head has left keeps its place until its body ends, so
//! `limits.max_concurrent_requests` and a tenant's `max_concurrent` count
//! the long streams reasoning models make, and one tenant's streams cannot
//! take every place.

use std::time::Duration;

use corral::config::TenantLimitsConfig;
use mock_upstream::{MockProvider, MockSettings};
use reqwest::StatusCode;
use serde_json::Value;

use crate::harness::{Reply, TestGateway, WAIT, chat, streamed};

const PATH: &str = "/v1/chat/completions";

/// A gateway in front of a provider that sends a stream's head at once and
/// then thinks for an hour: every stream opened here stays open until its
/// reader leaves. Readers get a keep-alive comment every 100 ms, so a reader
/// that leaves is noticed at the next one.
async fn gateway_of_slow_streams(adjust: impl FnOnce(&mut corral::Config)) -> TestGateway {
    let provider = MockProvider::start(MockSettings {
        stream_first_event_delay: Duration::from_secs(3600),
        ..MockSettings::default()
    })
    .await
    .expect("mock provider starts");
    TestGateway::start_with(provider, |config| {
        config.upstreams[0].request_timeout = Duration::from_secs(3600);
        config.coalesce.first_event_timeout = Duration::from_secs(3600);
        config.coalesce.wait_timeout = Duration::from_secs(3600);
        config.coalesce.keepalive_interval = Duration::from_millis(100);
        adjust(config);
    })
    .await
}

/// Opens a stream as `key`'s caller and returns it once its head is here.
async fn open_stream(gateway: &TestGateway, key: &str, content: &str) -> reqwest::Response {
    let response = gateway
        .client
        .post(format!("{}{PATH}", gateway.url))
        .bearer_auth(key)
        .json(&streamed(chat(content)))
        .send()
        .await
        .expect("request reaches corral");
    assert_eq!(response.status(), StatusCode::OK, "{content}");
    response
}

async fn post_as(gateway: &TestGateway, key: &str, body: &Value) -> Reply {
    let auth = format!("Bearer {key}");
    gateway
        .post_with(PATH, body, &[("authorization", auth.as_str())])
        .await
}

/// Posts `body` as `key`'s caller until it is not refused with `refused`,
/// within [`WAIT`]: a place given back is seen by the next request.
async fn served_once_a_place_is_back(
    gateway: &TestGateway,
    key: &str,
    body: &Value,
    refused: StatusCode,
) -> Reply {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let reply = post_as(gateway, key, body).await;
        if reply.status != refused || tokio::time::Instant::now() > deadline {
            return reply;
        }
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_cap_of_two_a_third_request_waits_for_a_stream_to_end() {
    let gateway = gateway_of_slow_streams(|config| {
        config.limits.max_concurrent_requests = Some(2);
    })
    .await;
    let first = open_stream(&gateway, "sk-a", "slow stream 1").await;
    let mut second = open_stream(&gateway, "sk-a", "slow stream 2").await;

    // Both heads have left; both bodies are still being served.
    for body in [streamed(chat("slow stream 3")), chat("a quick question")] {
        let refused = post_as(&gateway, "sk-b", &body).await;
        assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(refused.json()["error"]["code"], "server_overloaded");
        assert_eq!(refused.header("retry-after"), Some("1"));
    }
    assert_eq!(gateway.provider.calls(), 2, "refused requests went nowhere");

    // One stream ends (its reader leaves): its place is free again.
    drop(first);
    let served = served_once_a_place_is_back(
        &gateway,
        "sk-b",
        &chat("a quick question"),
        StatusCode::SERVICE_UNAVAILABLE,
    )
    .await;
    assert_eq!(served.status, StatusCode::OK, "{:?}", served.body);

    // The other stream is still served, and still holds its place: a quick
    // answer gave its own back when its body ended.
    let again = post_as(&gateway, "sk-b", &chat("another quick question")).await;
    assert_eq!(again.status, StatusCode::OK);
    let comment = tokio::time::timeout(WAIT, second.chunk())
        .await
        .expect("keep-alive within the wait")
        .expect("the stream is readable")
        .expect("the stream has not ended");
    assert!(comment.starts_with(b":"), "{comment:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_at_its_max_concurrent_gets_429_and_another_tenant_is_served() {
    let gateway = gateway_of_slow_streams(|config| {
        config.limits.per_tenant = Some(TenantLimitsConfig {
            max_concurrent: Some(1),
            ..TenantLimitsConfig::default()
        });
    })
    .await;
    let stream = open_stream(&gateway, "sk-a", "a's long stream").await;

    let refused = post_as(&gateway, "sk-a", &chat("a's quick question")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let error = &refused.json()["error"];
    assert_eq!(error["code"], "rate_limit_exceeded");
    assert!(
        error["message"].as_str().unwrap().contains("at once"),
        "{error}"
    );
    assert_eq!(refused.header("retry-after"), Some("1"));

    let other = post_as(&gateway, "sk-b", &chat("b's quick question")).await;
    assert_eq!(other.status, StatusCode::OK, "another tenant is served");
    let mut b_stream = open_stream(&gateway, "sk-b", "b's long stream").await;

    drop(stream);
    let served = served_once_a_place_is_back(
        &gateway,
        "sk-a",
        &chat("a's quick question"),
        StatusCode::TOO_MANY_REQUESTS,
    )
    .await;
    assert_eq!(served.status, StatusCode::OK, "{:?}", served.body);
    assert!(
        tokio::time::timeout(WAIT, b_stream.chunk())
            .await
            .expect("b's stream is alive")
            .expect("readable")
            .is_some()
    );
}
