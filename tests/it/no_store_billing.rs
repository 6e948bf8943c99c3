//! Budgets hold on every path: a `Cache-Control: no-store` stream is relayed
//! as it comes but read as it passes, so its usage is billed (metrics and
//! budgets) once, when it ends, breaks or its caller leaves; where usage stays
//! unknown, an estimate is charged and `/metrics` says so.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{
    budgets::{dear_prices, rule, with_messages},
    harness::{Reply, TestGateway, WAIT, chat, streamed},
};

const CHAT: &str = "/v1/chat/completions";
const MESSAGES: &str = "/v1/messages";
const NO_STORE: (&str, &str) = ("cache-control", "no-store");

/// A gateway at [`dear_prices`], with a Messages upstream, every tenant held to `usd` a day.
async fn budgeted(usd: f64) -> TestGateway {
    TestGateway::start(|config| {
        dear_prices(config);
        with_messages(config);
        config.budgets = vec![rule(Some("*"), None, usd, "day")];
    })
    .await
}

fn messages_stream(content: &str) -> Value {
    json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 64,
        "stream": true,
        "messages": [{"role": "user", "content": content}],
    })
}

async fn post_no_store(gateway: &TestGateway, path: &str, body: &Value) -> Reply {
    gateway
        .post_with(
            path,
            body,
            &[NO_STORE, ("authorization", "Bearer sk-no-store")],
        )
        .await
}

/// Sends `no-store` streams made by `body` until one is refused; returns the
/// served ones and the refusal.
async fn stream_until_refused(
    gateway: &TestGateway,
    path: &str,
    body: impl Fn(usize) -> Value,
) -> (Vec<Reply>, Reply) {
    let mut served = Vec::new();
    for i in 0..6 {
        let reply = post_no_store(gateway, path, &body(i)).await;
        if reply.status == StatusCode::TOO_MANY_REQUESTS {
            return (served, reply);
        }
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
        assert_eq!(reply.cache(), "BYPASS");
        served.push(reply);
    }
    panic!(
        "six no-store streams were served against a budget for about one: {} upstream calls",
        gateway.provider.calls()
    );
}

fn assert_budget_refusal(refused: &Reply) {
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let body = refused.json();
    let code = body["error"]["code"]
        .as_str()
        .or_else(|| body["error"]["type"].as_str());
    assert!(
        code == Some("budget_exceeded") || body.to_string().contains("budget"),
        "{body}"
    );
}

/// `name{labels...} value` lines of the gateway's `/metrics` that start with `prefix`.
async fn metric_lines(gateway: &TestGateway, prefix: &str) -> Vec<String> {
    let text = gateway.get("/metrics").await.body;
    String::from_utf8_lossy(&text)
        .lines()
        .filter(|line| line.starts_with(prefix))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_store_chat_streams_spend_the_budget_until_the_tenant_is_refused() {
    let gateway = budgeted(0.003).await;
    let (served, refused) = stream_until_refused(&gateway, CHAT, |i| {
        streamed(chat(&format!("a no-store stream, number {i}")))
    })
    .await;
    assert!(!served.is_empty(), "the first call is within the budget");
    assert_budget_refusal(&refused);
    for reply in &served {
        let text = String::from_utf8_lossy(&reply.body);
        // Byte for byte as the provider sent it to a caller who did not ask for usage.
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        assert!(!text.contains("usage"), "no usage was asked for: {text}");
    }
    // Upstream, the stream asked for usage (as a coalesced stream does).
    let sent = gateway.provider.requests();
    let asked: Value = serde_json::from_slice(&sent[0].body).unwrap();
    assert_eq!(asked["stream_options"]["include_usage"], true, "{asked}");
    // The spend is on the books too.
    let cost = metric_lines(&gateway, "corral_cost_usd_total{model=\"gpt-4o-mini\"").await;
    assert!(
        cost.iter().any(|line| line.contains("upstream")),
        "{cost:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_who_asked_for_usage_gets_the_no_store_stream_byte_for_byte() {
    let gateway = budgeted(100.0).await;
    let mut body = streamed(chat("usage, please"));
    body["stream_options"] = json!({"include_usage": true});
    let reply = post_no_store(&gateway, CHAT, &body).await;
    assert_eq!(reply.status, StatusCode::OK);
    let text = String::from_utf8_lossy(&reply.body);
    assert!(text.contains("\"usage\":{"), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let tokens = metric_lines(
        &gateway,
        "corral_tokens_total{model=\"gpt-4o-mini\",kind=\"output\",source=\"upstream\"}",
    )
    .await;
    assert_eq!(tokens.len(), 1, "{tokens:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_store_messages_streams_spend_the_budget_until_the_tenant_is_refused() {
    let gateway = budgeted(0.003).await;
    let (served, refused) = stream_until_refused(&gateway, MESSAGES, |i| {
        messages_stream(&format!("a no-store Messages stream, number {i}"))
    })
    .await;
    assert!(!served.is_empty(), "the first call is within the budget");
    assert_budget_refusal(&refused);
    for reply in &served {
        let text = String::from_utf8_lossy(&reply.body);
        assert!(text.contains("event: message_stop"), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_no_store_stream_is_charged_an_estimate_and_metrics_say_so() {
    let gateway = budgeted(0.003).await;
    gateway.provider.set_truncate_streams(true);
    let (served, refused) = stream_until_refused(&gateway, CHAT, |i| {
        streamed(chat(&format!("a no-store stream that breaks, number {i}")))
    })
    .await;
    assert!(!served.is_empty());
    assert_budget_refusal(&refused);
    let estimated = metric_lines(&gateway, "corral_usage_estimated_total{").await;
    assert!(
        estimated.iter().any(
            |line| line.contains("model=\"gpt-4o-mini\"") && line.contains("reason=\"broken\"")
        ),
        "{estimated:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_no_store_stream_is_billed_when_its_caller_leaves() {
    // Any billed call uses this budget up.
    let gateway = budgeted(0.000_001).await;
    gateway.provider.hold_stream_ends();
    let mut response = gateway
        .client
        .post(format!("{}{CHAT}", gateway.url))
        .header(NO_STORE.0, NO_STORE.1)
        .header("authorization", "Bearer sk-no-store")
        .json(&streamed(chat("a stream its caller leaves")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let first = tokio::time::timeout(WAIT, response.chunk())
        .await
        .unwrap()
        .unwrap();
    assert!(first.is_some());
    assert!(
        gateway.provider.wait_for_streams_at_end(1, WAIT).await,
        "the stream waits before its end"
    );
    drop(response);
    // Billed as the body is dropped: its tokens reach the books.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let tokens = metric_lines(
            &gateway,
            "corral_tokens_total{model=\"gpt-4o-mini\",kind=\"input\",source=\"upstream\"}",
        )
        .await;
        if !tokens.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the abandoned stream was never billed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gateway.provider.release_stream_ends();
    let refused = post_no_store(&gateway, CHAT, &streamed(chat("and another"))).await;
    assert_budget_refusal(&refused);
}
