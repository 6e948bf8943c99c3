//! `coalesce.cancel_when_abandoned`: an upstream stream every caller left is
//! cancelled (and not cached), on one instance and with Redis; a caller on
//! another instance that still reads the mirrored stream keeps it alive (the
//! owner's mirror is no caller); and a cancel is this instance's decision,
//! never remembered for the other instances.

use std::time::Duration;

use mock_upstream::{MockProvider, MockSettings};
use serde_json::{Value, json};

use crate::{
    harness::{Fleet, TestGateway, WAIT, chat, read_events, read_to_end, redis_at, streamed},
    redis_server::RedisServer,
};

const PATH: &str = "/v1/chat/completions";

/// A provider whose stream events come 200 ms apart: seconds of stream.
async fn slow_provider() -> MockProvider {
    MockProvider::start(MockSettings {
        stream_chunk_delay: Duration::from_millis(200),
        ..MockSettings::default()
    })
    .await
    .unwrap()
}

fn plain(body: &Value) -> Value {
    let mut plain = body.clone();
    plain["stream"] = json!(false);
    plain
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_every_caller_left_is_cancelled_and_not_cached() {
    let provider = slow_provider().await;
    let gateway = TestGateway::start_with(provider, |config| {
        config.coalesce.cancel_when_abandoned = true;
    })
    .await;
    let body = streamed(chat("a stream its only reader walks away from"));
    let mut reader = gateway.open(PATH, &body).await;
    read_events(&mut reader, &mut Vec::new(), 2).await;
    drop(reader);
    // The flight ends as soon as the stream is cancelled, well before its end.
    gateway.wait_idle().await;
    let next = gateway.post(PATH, &plain(&body)).await;
    assert_eq!(next.cache(), "MISS", "the cancelled stream was not stored");
    assert_eq!(gateway.provider.calls(), 2);
}

async fn abandoning_fleet(redis: &RedisServer) -> Fleet {
    let url = redis.url();
    Fleet::start_with(slow_provider().await, 2, move |config| {
        config.redis = Some(redis_at(&url));
        config.coalesce.cancel_when_abandoned = true;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_on_another_instance_keeps_the_stream_alive() {
    let redis = RedisServer::spawn().await;
    let fleet = abandoning_fleet(&redis).await;
    let (a, b) = (&fleet.instances[0], &fleet.instances[1]);
    let body = streamed(chat("a stream read on two instances, left on one"));
    let mut owner = a.open(PATH, &body).await;
    read_events(&mut owner, &mut Vec::new(), 2).await;
    let mut follower = b.open(PATH, &body).await;
    let mut relayed = Vec::new();
    read_events(&mut follower, &mut relayed, 1).await;
    // The follower's relay has said it reads (its heartbeat is in Redis).
    tokio::time::timeout(WAIT, async {
        loop {
            if !redis.keys("*:readers:*").await.is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the relay's heartbeat appears");
    drop(owner);
    read_to_end(&mut follower, &mut relayed).await;
    let text = String::from_utf8_lossy(&relayed);
    assert!(text.ends_with("data: [DONE]\n\n"), "whole: {text}");
    assert!(!text.contains("\"error\""), "{text}");
    assert_eq!(fleet.provider.calls(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_left_everywhere_is_cancelled_and_the_cancel_is_not_remembered() {
    let redis = RedisServer::spawn().await;
    let fleet = abandoning_fleet(&redis).await;
    let (a, b) = (&fleet.instances[0], &fleet.instances[1]);
    let body = streamed(chat("a stream nobody reads to its end"));
    let mut owner = a.open(PATH, &body).await;
    read_events(&mut owner, &mut Vec::new(), 2).await;
    drop(owner);
    a.wait_idle().await;
    // Not stored, and the cancel answers nobody elsewhere: a new call.
    let next = b.post(PATH, &plain(&body)).await;
    assert_eq!(next.status, reqwest::StatusCode::OK, "{:?}", next.body);
    assert_eq!(next.cache(), "MISS");
    assert_eq!(fleet.provider.calls(), 2);
}
