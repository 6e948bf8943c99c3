//! corral is never stricter than the provider it fronts: it refuses only what
//! it cannot parse, key or bound (malformed JSON, nesting, sizes, the types of
//! the fields it reads), and leaves the provider's own rules (roles, content
//! block types, unknown fields) to the provider, whose answer, a 400
//! included, is relayed as the provider sent it.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{
    anthropic::{MODEL, add_anthropic, anthropic_mock},
    harness::{Reply, TestGateway, head_only},
};

const PATH: &str = "/v1/messages";
const KEY: &str = "sk-ant-provider-rules";

async fn gateway() -> TestGateway {
    let provider = anthropic_mock(&[MODEL]).await;
    TestGateway::start_with(provider.clone(), |config| {
        add_anthropic(config, &provider);
    })
    .await
}

/// `body` sent straight to the provider, as corral would relay it.
async fn direct(gateway: &TestGateway, body: &Value) -> (StatusCode, Value) {
    let reply = gateway
        .client
        .post(format!("{}/messages", gateway.provider.base_url()))
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-06-01")
        .json(body)
        .send()
        .await
        .expect("the provider answers");
    let status = reply.status();
    (status, reply.json().await.expect("JSON"))
}

async fn through(gateway: &TestGateway, body: impl Into<reqwest::Body>) -> Reply {
    gateway
        .post_raw(
            PATH,
            body,
            &[("x-api-key", KEY), ("anthropic-version", "2023-06-01")],
        )
        .await
}

/// What only the model's output differs in between two answers of one
/// request: ids and timings are per call.
fn without_ids(mut answer: Value) -> Value {
    if let Some(object) = answer.as_object_mut() {
        object.remove("id");
    }
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_providers_own_rules_reach_the_provider_and_its_answer_is_relayed() {
    let gateway = gateway().await;
    let cases = [
        (
            "a system-role message",
            json!({"model": MODEL, "max_tokens": 64, "messages": [
                {"role": "user", "content": "hi"},
                {"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": "and again"},
            ]}),
        ),
        (
            "a system-role message first",
            json!({"model": MODEL, "max_tokens": 64, "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "hi"},
            ]}),
        ),
        (
            "an unknown content block type",
            json!({"model": MODEL, "max_tokens": 64, "messages": [
                {"role": "user", "content": [{"type": "hologram", "data": "x"}, {"type": "text", "text": "hi"}]},
            ]}),
        ),
        (
            "an unknown field",
            json!({"model": MODEL, "max_tokens": 64, "context_management": {"edits": []},
                   "messages": [{"role": "user", "content": "hi"}]}),
        ),
        (
            "no max_tokens, a temperature out of range",
            json!({"model": MODEL, "temperature": 7,
                   "messages": [{"role": "user", "content": "hi"}]}),
        ),
    ];
    for (name, body) in cases {
        let before = gateway.provider.calls();
        let reply = through(&gateway, body.to_string()).await;
        assert_eq!(
            gateway.provider.calls(),
            before + 1,
            "{name}: corral asked the provider"
        );
        let sent = gateway.provider.requests().last().unwrap().json().unwrap();
        assert_eq!(
            sent, body,
            "{name}: the body reached the provider unchanged"
        );
        let (status, answer) = direct(&gateway, &body).await;
        assert_eq!(reply.status, status, "{name}: the provider's status");
        assert_eq!(
            without_ids(reply.json()),
            without_ids(answer),
            "{name}: the provider's answer, as it sent it"
        );
    }
}

/// A Messages body of about `bytes` bytes: one screenshot-sized image block
/// per MiB, as agents send them.
fn with_images(bytes: usize) -> Value {
    let image = "A".repeat(1 << 20);
    let blocks: Vec<Value> = (0..bytes >> 20)
        .map(|_| json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": image}}))
        .chain([json!({"type": "text", "text": "What changed between these screenshots?"})])
        .collect();
    json!({"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": blocks}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_agents_send_is_served_and_only_what_corral_cannot_bound_is_refused() {
    let gateway = gateway().await;

    // 20 MB of screenshots, and a 5,000-message session: served.
    let screenshots = with_images(20 << 20).to_string();
    assert!(screenshots.len() > 20_000_000);
    let reply = through(&gateway, screenshots).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    assert_eq!(reply.json()["type"], "message");
    let session: Vec<Value> = (0..5_000)
        .map(|i| {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            json!({"role": role, "content": format!("turn {i}")})
        })
        .collect();
    let long = json!({"model": MODEL, "max_tokens": 64, "messages": session});
    let reply = through(&gateway, long.to_string()).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    assert_eq!(gateway.provider.calls(), 2);

    // What corral cannot parse, key or bound: refused by corral, in
    // Anthropic's shape, and nothing goes upstream.
    let deep = format!(
        r#"{{"model":"{MODEL}","max_tokens":64,"messages":[{{"role":"user","content":"x","extra":{}{}}}]}}"#,
        "[".repeat(100),
        "]".repeat(100)
    );
    let refused = [
        (
            "malformed JSON",
            br#"{"model": "claude", "messages": [}"#.to_vec(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "100-deep nesting",
            deep.into_bytes(),
            StatusCode::BAD_REQUEST,
        ),
    ];
    for (name, body, status) in refused {
        let reply = through(&gateway, body).await;
        assert_eq!(reply.status, status, "{name}");
        let error = reply.json();
        assert_eq!(error["type"], "error", "{name}: Anthropic's shape");
        assert!(error["error"]["message"].is_string(), "{name}");
    }
    // A 40 MB body is refused on its announced length, before it is read (a
    // client still writing it would see its connection closed, so this one
    // sends the head alone and reads the answer).
    let (status, body) = head_only(
        &gateway.url,
        PATH,
        &[("x-api-key", KEY), ("anthropic-version", "2023-06-01")],
        40 << 20,
    )
    .await;
    assert_eq!(status, 413, "{body}");
    assert!(
        body.contains("\"type\":\"error\""),
        "Anthropic's shape: {body}"
    );
    assert_eq!(gateway.provider.calls(), 2, "nothing refused went upstream");
    // The body limit is corral's own bound, and at least Anthropic's 32 MB.
    assert!(gateway.state.config().limits.max_body_bytes >= 32 << 20);
}
