//! Bad input gets an OpenAI-style error with the right status, nothing goes
//! upstream, and the gateway keeps serving.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{TestGateway, chat};

#[tokio::test]
async fn malformed_requests_get_openai_errors_and_the_gateway_keeps_serving() {
    let gateway = TestGateway::start(|_| {}).await;
    let path = "/v1/chat/completions";

    let not_json = gateway.post_raw(path, "{not json", &[]).await;
    assert_eq!(not_json.status, StatusCode::BAD_REQUEST);
    assert_eq!(not_json.json()["error"]["type"], "invalid_request_error");

    let not_object = gateway.post_raw(path, "[1, 2, 3]", &[]).await;
    assert_eq!(not_object.status, StatusCode::BAD_REQUEST);
    assert!(
        not_object.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("object")
    );

    let no_model = gateway.post(path, &json!({"messages": []})).await;
    assert_eq!(no_model.status, StatusCode::BAD_REQUEST);
    assert_eq!(no_model.json()["error"]["param"], "model");

    let wrong_type = gateway
        .post(path, &json!({"model": 4, "messages": []}))
        .await;
    assert_eq!(wrong_type.status, StatusCode::BAD_REQUEST);

    // Refused on its announced length, before a byte of it is read.
    let (status, body) = crate::harness::head_only(&gateway.url, path, &[], 40 << 20).await;
    assert_eq!(status, 413);
    let error: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["error"]["code"], "request_too_large");

    let unknown = gateway
        .post(
            path.replace("chat/completions", "nope").as_str(),
            &json!({}),
        )
        .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    let outside = gateway.get("/not-an-api").await;
    assert_eq!(outside.status, StatusCode::NOT_FOUND);
    assert_eq!(outside.json()["error"]["code"], "unknown_url");

    assert_eq!(gateway.provider.calls(), 0, "nothing bad went upstream");
    let fine = gateway.post(path, &chat("still serving")).await;
    assert_eq!(fine.status, StatusCode::OK);
    assert_eq!(gateway.provider.calls(), 1);
}

#[tokio::test]
async fn a_model_without_a_route_is_404() {
    let gateway =
        TestGateway::start(|config| config.upstreams[0].models = vec!["gpt-*".into()]).await;
    let mut body = chat("hello");
    body["model"] = json!("llama-3-70b");
    let reply = gateway.post("/v1/chat/completions", &body).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert_eq!(reply.json()["error"]["code"], "model_not_found");
    assert_eq!(gateway.provider.calls(), 0);
}

#[tokio::test]
async fn unreachable_and_slow_upstreams_map_to_502_and_504() {
    let unreachable = TestGateway::start(|config| {
        // Port 1 on loopback: nothing listens, the connection is refused.
        config.upstreams[0].base_url = "http://127.0.0.1:1/v1".into();
        config.retry.max_attempts = 1;
    })
    .await;
    let reply = unreachable
        .post("/v1/chat/completions", &chat("anyone?"))
        .await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY);
    assert_eq!(reply.json()["error"]["code"], "upstream_unreachable");

    let slow = TestGateway::start(|config| {
        config.upstreams[0].request_timeout = std::time::Duration::from_millis(200);
        config.retry.max_attempts = 1;
    })
    .await;
    slow.provider.hold();
    let reply = slow.post("/v1/chat/completions", &chat("too slow")).await;
    slow.provider.release();
    assert_eq!(reply.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(reply.json()["error"]["code"], "upstream_timeout");
}
