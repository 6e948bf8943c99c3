//! Codex dials `GET /v1/responses` with `Upgrade: websocket` before it falls
//! back to HTTP (issue 38 item 9): corral answers `426 Upgrade Required` at
//! once (any other status costs Codex five reconnects per session) and never
//! forwards an upgrade to a provider.

use reqwest::StatusCode;

use crate::harness::{TestGateway, chat};

/// The headers of a WebSocket handshake (RFC 6455), as Codex sends them.
const DIAL: &[(&str, &str)] = &[
    ("connection", "Upgrade"),
    ("upgrade", "websocket"),
    ("sec-websocket-version", "13"),
    ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
    ("openai-beta", "responses_websockets=2026-02-04"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_dial_gets_426_and_never_reaches_the_provider() {
    let gateway = TestGateway::start(|_| {}).await;
    let reply = gateway.get_with("/v1/responses", DIAL).await;
    assert_eq!(
        reply.status,
        StatusCode::UPGRADE_REQUIRED,
        "{:?}",
        reply.body
    );
    let error = &reply.json()["error"];
    assert_eq!(
        error["type"], "invalid_request_error",
        "OpenAI's shape: {error}"
    );
    assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()));
    // Any other `/v1/*` upgrade too, a deduplicated endpoint's included.
    let other = gateway.get_with("/v1/models", DIAL).await;
    assert_eq!(other.status, StatusCode::UPGRADE_REQUIRED);
    let posted = gateway
        .post_with(
            "/v1/chat/completions",
            &chat("over a socket"),
            &[("connection", "upgrade"), ("upgrade", "websocket")],
        )
        .await;
    assert_eq!(posted.status, StatusCode::UPGRADE_REQUIRED);
    assert!(
        gateway.provider.requests().is_empty(),
        "no upgrade was forwarded: {:?}",
        gateway.provider.requests().len()
    );
    // The fallback Codex makes next, over HTTP, is served as ever.
    let fallback = gateway
        .post("/v1/chat/completions", &chat("over HTTP"))
        .await;
    assert_eq!(fallback.status, StatusCode::OK, "{:?}", fallback.body);
}
