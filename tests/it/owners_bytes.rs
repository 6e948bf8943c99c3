//! A follower gets an answer its own request could have received: when the
//! provider refuses the owner's bytes or mode (a 4xx), a follower whose bytes
//! or mode differ makes its own call, on one instance and across a fleet; a
//! refusal answers only identical bytes.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{
    anthropic::{MODEL, add_anthropic, anthropic_mock},
    harness::{Fleet, TestGateway, redis_at, streamed},
    redis_server::RedisServer,
};

const CHAT: &str = "/v1/chat/completions";

/// A chat request asking for mp3 audio output, which OpenAI streams only as pcm16.
fn spoken() -> Value {
    json!({
        "model": "gpt-4o-audio-preview",
        "temperature": 0,
        "modalities": ["text", "audio"],
        "audio": {"voice": "alloy", "format": "mp3"},
        "messages": [{"role": "user", "content": "say hello"}],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_of_the_owners_mode_is_not_a_followers_answer() {
    let gateway = TestGateway::start(|_| {}).await;
    // The streaming caller owns the flight; the plain caller of the same key joins it.
    gateway.provider.hold();
    let owner = gateway.spawn_post(CHAT, &streamed(spoken()));
    gateway.wait_for_waiters(1).await;
    let plain = gateway.spawn_post(CHAT, &spoken());
    gateway.wait_for_waiters(2).await;
    gateway.provider.release();
    let (owner, plain) = (owner.await.unwrap(), plain.await.unwrap());
    assert_eq!(owner.status, StatusCode::BAD_REQUEST, "the provider's 400");
    assert!(
        owner.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("pcm16")
    );
    assert_eq!(plain.status, StatusCode::OK, "{:?}", plain.body);
    assert_eq!(gateway.provider.calls(), 2, "the plain caller's own call");

    // Identical bytes share the refusal: one call for two streaming callers.
    gateway.wait_idle().await;
    let mut again = streamed(spoken());
    again["messages"][0]["content"] = json!("say hello twice");
    let replies = gateway.herd(CHAT, &again, 2, &[]).await;
    assert!(replies.iter().all(|r| r.status == StatusCode::BAD_REQUEST));
    assert_eq!(gateway.provider.calls(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_of_the_owners_own_fields_is_not_a_followers_answer() {
    let gateway = TestGateway::start(|_| {}).await;
    // `stream_options` leaves the key (a delivery field), and OpenAI refuses
    // it on a request that does not stream: the owner's bytes, not the follower's.
    let clean = json!({"model": "gpt-4o-mini", "temperature": 0,
        "messages": [{"role": "user", "content": "options"}]});
    let mut optioned = clean.clone();
    optioned["stream_options"] = json!({"include_usage": true});
    gateway.provider.hold();
    let owner = gateway.spawn_post(CHAT, &optioned);
    gateway.wait_for_waiters(1).await;
    let follower = gateway.spawn_post(CHAT, &clean);
    gateway.wait_for_waiters(2).await;
    gateway.provider.release();
    let (owner, follower) = (owner.await.unwrap(), follower.await.unwrap());
    assert_eq!(owner.status, StatusCode::BAD_REQUEST);
    assert_eq!(follower.status, StatusCode::OK, "{:?}", follower.body);
    assert_eq!(gateway.provider.calls(), 2);
}

/// A Messages request with a prefill (the assistant's turn begun): Anthropic
/// refuses one that ends in white space, which the key trims away.
fn prefilled(prefill: &str) -> Value {
    json!({
        "model": MODEL,
        "max_tokens": 32,
        "temperature": 0,
        "messages": [
            {"role": "user", "content": "Name a color."},
            {"role": "assistant", "content": prefill},
        ],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_prefill_on_one_instance_does_not_answer_the_valid_one_on_another() {
    let redis = RedisServer::spawn().await;
    let provider = anthropic_mock(&[MODEL]).await;
    let url = redis.url();
    let fleet = Fleet::start_with(provider.clone(), 2, |config| {
        add_anthropic(config, &provider);
        config.redis = Some(redis_at(&url));
    })
    .await;
    for instance in &fleet.instances {
        instance.wait_connected().await;
    }
    let (a, b) = (&fleet.instances[0], &fleet.instances[1]);
    let key = [("x-api-key", "sk-ant-prefill")];
    // The refused bytes own the call on `a`; the valid ones arrive on `b`
    // while it runs (or after its refusal is recorded).
    provider.hold();
    let (handle_a, handle_b) = (a.clone_handle(), b.clone_handle());
    let refused = tokio::spawn(async move {
        handle_a
            .post_with("/v1/messages", &prefilled("The color is "), &key)
            .await
    });
    a.wait_for_calls(1).await;
    let valid = tokio::spawn(async move {
        handle_b
            .post_with("/v1/messages", &prefilled("The color is"), &key)
            .await
    });
    b.wait_for_waiters(1).await;
    provider.release();
    let (refused, valid) = (refused.await.unwrap(), valid.await.unwrap());
    assert_eq!(
        refused.status,
        StatusCode::BAD_REQUEST,
        "{:?}",
        refused.body
    );
    assert_eq!(refused.json()["error"]["type"], "invalid_request_error");
    assert_eq!(valid.status, StatusCode::OK, "{:?}", valid.body);
    assert_eq!(valid.json()["type"], "message");
    assert_eq!(provider.calls(), 2);
}
