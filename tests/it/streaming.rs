//! Streaming coalescing: one upstream SSE stream shared live by every
//! identical caller, replayed from the cache, mixed with non-stream callers,
//! across instances, and broken streams.

use std::{collections::HashSet, time::Duration};

use bytes::Bytes;
use corral::config::RedisConfig;
use mock_upstream::{MockProvider, MockSettings};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{
    harness::{
        Fleet, Reply, TestGateway, assert_event_stream, chat, collect, count_status, read_events,
        read_to_end, redis_at, relayed_live, slow_stream_fleet, stream_on_two_instances, streamed,
    },
    redis_server::RedisServer,
};

const PATH: &str = "/v1/chat/completions";

fn streaming(content: &str) -> Value {
    streamed(chat(content))
}

/// The `data:` payloads of an SSE body, in order.
fn events(body: &[u8]) -> Vec<String> {
    let text = std::str::from_utf8(body).expect("SSE is UTF-8");
    text.split("\n\n")
        .filter(|frame| !frame.trim().is_empty())
        .map(|frame| {
            frame
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not a data event: {frame:?}"))
                .to_owned()
        })
        .collect()
}

/// Checks a complete, parseable OpenAI stream and returns its assembled content.
fn assembled_content(reply: &Reply) -> String {
    assert_event_stream(reply);
    let events = events(&reply.body);
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "ends with [DONE]"
    );
    let mut content = String::new();
    let mut finished = false;
    for event in &events[..events.len() - 1] {
        let chunk: Value = serde_json::from_str(event).expect("every event is JSON");
        assert_eq!(chunk["object"], "chat.completion.chunk");
        if let Some(choice) = chunk["choices"].get(0) {
            content.push_str(choice["delta"]["content"].as_str().unwrap_or_default());
            finished |= choice["finish_reason"].is_string();
        }
    }
    assert!(finished, "the stream carries a finish_reason");
    content
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_identical_streams_share_one_upstream_stream() {
    let gateway = TestGateway::start(|_| {}).await;
    let body = streaming("stream to five hundred");
    let replies = gateway.herd(PATH, &body, 500, &[]).await;
    assert_eq!(gateway.provider.calls(), 1);
    let bodies: HashSet<&[u8]> = replies.iter().map(|r| r.body.as_ref()).collect();
    assert_eq!(bodies.len(), 1, "every caller receives the owner's bytes");
    assert_eq!(count_status(&replies, "MISS"), 1);
    assert_eq!(count_status(&replies, "COALESCED"), 499);
    let content = assembled_content(&replies[0]);
    // A streamed caller has its answer at `[DONE]`, a moment before the
    // flight stores it and ends; a repeat sent in that moment would join the
    // flight (COALESCED). The repeat here is the cache's.
    gateway.wait_idle().await;
    let plain = gateway.post(PATH, &chat("stream to five hundred")).await;
    assert_eq!(plain.cache(), "HIT", "the completed stream was cached");
    assert_eq!(
        plain.json()["choices"][0]["message"]["content"],
        content.as_str()
    );
    assert_eq!(gateway.provider.calls(), 1);
    // Upstream was asked for usage; these callers did not ask and do not see it.
    let sent = gateway.provider.requests()[0].json().unwrap();
    assert_eq!(sent["stream_options"]["include_usage"], true);
    assert!(
        !events(&replies[0].body)
            .iter()
            .any(|e| e.contains("\"usage\""))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_joining_halfway_receives_the_whole_stream() {
    let provider = MockProvider::start(MockSettings {
        stream_chunk_delay: Duration::from_millis(25),
        ..MockSettings::default()
    })
    .await
    .unwrap();
    let gateway = TestGateway::start_with(provider, |_| {}).await;
    let body = streaming("a long answer that streams word by word so that someone can join late");
    let mut owner = gateway.open(PATH, &body).await;
    assert_eq!(owner.headers()["x-corral-cache"], "MISS");
    let mut owner_bytes = Vec::new();
    // Read a few events first: the follower joins a stream already under way.
    read_events(&mut owner, &mut owner_bytes, 4).await;
    let follower = gateway.post(PATH, &body).await;
    read_to_end(&mut owner, &mut owner_bytes).await;
    assert_eq!(follower.cache(), "COALESCED", "joined the live flight");
    assert_eq!(
        follower.body,
        Bytes::from(owner_bytes),
        "byte for byte the owner's stream"
    );
    assert_eq!(gateway.provider.calls(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_share_one_upstream_stream_through_redis() {
    let redis = RedisServer::spawn().await;
    let fleet = Fleet::start(3, |config| {
        config.redis = Some(RedisConfig {
            poll_interval: Duration::from_millis(200),
            ..redis_at(&redis.url())
        });
    })
    .await;
    let body = streaming("streamed across the cluster");
    let replies = fleet.herd(PATH, &body, 300).await;
    assert_eq!(
        fleet.provider.calls(),
        1,
        "one upstream call in the cluster"
    );
    let contents: HashSet<String> = replies.iter().map(assembled_content).collect();
    assert_eq!(contents.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_and_non_stream_callers_share_one_call() {
    let gateway = TestGateway::start(|_| {}).await;
    let content = "mixed callers";
    gateway.provider.hold();
    let handle = gateway.clone_handle();
    let mut tasks = Vec::new();
    for i in 0..200 {
        let handle = handle.clone();
        let body = if i % 2 == 0 {
            streaming(content)
        } else {
            chat(content)
        };
        tasks.push(tokio::spawn(async move {
            (i % 2 == 0, handle.post_with(PATH, &body, &[]).await)
        }));
    }
    gateway.wait_for_waiters(200).await;
    gateway.provider.release();
    let mut streamed = HashSet::new();
    let mut plain = HashSet::new();
    for task in tasks {
        let (is_stream, reply) = task.await.unwrap();
        if is_stream {
            streamed.insert(assembled_content(&reply));
        } else {
            assert_eq!(reply.status, StatusCode::OK);
            let json = reply.json();
            assert_eq!(json["object"], "chat.completion");
            plain.insert(
                json["choices"][0]["message"]["content"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            );
        }
    }
    assert_eq!(gateway.provider.calls(), 1);
    assert_eq!(streamed.len(), 1);
    assert_eq!(streamed, plain, "both kinds see the same answer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_leaving_after_the_first_chunk_does_not_cut_the_stream() {
    let provider = MockProvider::start(MockSettings {
        stream_chunk_delay: Duration::from_millis(20),
        ..MockSettings::default()
    })
    .await
    .unwrap();
    let gateway = TestGateway::start_with(provider, |_| {}).await;
    let body = streaming("the owner hangs up early but the others keep listening");
    gateway.provider.hold();
    let owner = {
        let client = gateway.client.clone();
        let url = format!("{}{PATH}", gateway.url);
        let body = body.clone();
        tokio::spawn(async move {
            let mut response = client.post(url).json(&body).send().await.unwrap();
            // One chunk, then the connection is dropped.
            response.chunk().await.unwrap();
        })
    };
    gateway.wait_for_calls(1).await;
    let followers: Vec<_> = (0..10)
        .map(|_| {
            let handle = gateway.clone_handle();
            let body = body.clone();
            tokio::spawn(async move { handle.post_with(PATH, &body, &[]).await })
        })
        .collect();
    gateway.wait_for_waiters(11).await;
    gateway.provider.release();
    owner.await.unwrap();
    let replies = collect(followers).await;
    let contents: HashSet<String> = replies.iter().map(assembled_content).collect();
    assert_eq!(contents.len(), 1, "every follower got the complete stream");
    gateway.wait_idle().await;
    let cached = gateway.post(PATH, &body).await;
    assert_eq!(cached.cache(), "HIT", "the stream was cached");
    assert_eq!(assembled_content(&cached), *contents.iter().next().unwrap());
    assert_eq!(gateway.provider.calls(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_stream_fails_every_follower_and_is_not_cached() {
    let gateway = TestGateway::start(|_| {}).await;
    gateway.provider.set_truncate_streams(true);
    let body = streaming("this stream will break");
    let replies = gateway.herd(PATH, &body, 20, &[]).await;
    for reply in &replies {
        let events = events(&reply.body);
        let last: Value = serde_json::from_str(events.last().unwrap()).unwrap();
        assert_eq!(
            last["error"]["code"], "upstream_stream_broken",
            "{events:?}"
        );
        assert!(!events.iter().any(|e| e == "[DONE]"));
    }
    assembled_content(&gateway.post_after_a_cut(PATH, &body, &[]).await);
}

#[tokio::test]
async fn cached_answers_serve_both_kinds_of_caller() {
    let gateway = TestGateway::start(|_| {}).await;
    // Non-stream first: a stream request replays it as SSE.
    let plain = gateway.post(PATH, &chat("cached both ways")).await;
    let replayed = gateway.post(PATH, &streaming("cached both ways")).await;
    assert_eq!(replayed.cache(), "HIT");
    assert_eq!(
        assembled_content(&replayed),
        plain.json()["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
    );
    // A caller who asks for usage gets the usage chunk; one who does not, does not.
    let mut with_usage = streaming("cached both ways");
    with_usage["stream_options"] = json!({"include_usage": true});
    let usage_reply = gateway.post(PATH, &with_usage).await;
    let usage_events = events(&usage_reply.body);
    let usage_chunk: Value = serde_json::from_str(&usage_events[usage_events.len() - 2]).unwrap();
    assert_eq!(usage_chunk["usage"], plain.json()["usage"]);
    assert_eq!(gateway.provider.calls(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_on_another_instance_relays_the_stream_live() {
    let redis = RedisServer::spawn().await;
    let fleet = slow_stream_fleet(redis_at(&redis.url())).await;
    let body = streaming("relay this stream live to another instance of the gateway please");
    relayed_live(&fleet, PATH, &body, 2).await;
    let keys: Vec<String> = redis.dump().await.into_iter().map(|(k, _)| k).collect();
    assert!(keys.iter().any(|k| k.contains(":events:")), "{keys:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirrored_stream_events_are_encrypted_at_rest() {
    let redis = RedisServer::spawn().await;
    let fleet = slow_stream_fleet(RedisConfig {
        encryption_key: Some(corral::config::Secret::new([0x42; 32])),
        ..redis_at(&redis.url())
    })
    .await;
    let canary = "CANARY-7f3a streamed secret words for the relay";
    let body = streaming(canary);
    let (owner_bytes, follower) = stream_on_two_instances(&fleet, PATH, &body, 2).await;
    assert_eq!(
        follower.body,
        Bytes::from(owner_bytes),
        "relayed live through the encrypted stream"
    );
    assert!(String::from_utf8_lossy(&follower.body).contains("CANARY-7f3a"));

    let mut conn = redis.client().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*:events:*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let entries: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(&keys[0])
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    let values: Vec<Vec<u8>> = entries
        .ids
        .iter()
        .flat_map(|entry| entry.map.values())
        .map(|value| redis::from_redis_value::<Vec<u8>>(value).unwrap())
        .collect();
    assert!(values.len() > 5, "the stream holds every event");
    let canary_bytes = b"CANARY";
    assert!(
        values
            .iter()
            .all(|v| !v.windows(canary_bytes.len()).any(|w| w == canary_bytes)),
        "no event is stored in the clear"
    );
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&keys[0])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(ttl > 0);
}

/// A remote follower gets the whole stream or an error, never a clean end to
/// a stream it did not see whole: when the mirrored stream's head was trimmed
/// (`MAXLEN`, a long stream) before it joined, its stream ends with an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_follower_of_a_trimmed_stream_gets_an_error_not_an_end() {
    let redis = RedisServer::spawn().await;
    let fleet = slow_stream_fleet(redis_at(&redis.url())).await;
    let body = streaming("a long stream whose head the mirror trimmed before the follower joined");
    let mut owner = fleet.instances[0].open(PATH, &body).await;
    let mut owner_bytes = Vec::new();
    read_events(&mut owner, &mut owner_bytes, 3).await;
    // Trim the mirror as MAXLEN would a stream far longer than this one.
    let keys = redis.keys("*:events:*").await;
    assert_eq!(keys.len(), 1, "{keys:?}");
    let mut conn = redis.client().await;
    let _: u64 = redis::cmd("XTRIM")
        .arg(&keys[0])
        .arg("MAXLEN")
        .arg(1)
        .query_async(&mut conn)
        .await
        .unwrap();
    let follower = fleet.instances[1].post(PATH, &body).await;
    read_to_end(&mut owner, &mut owner_bytes).await;
    let text = String::from_utf8_lossy(&follower.body);
    assert!(!text.contains("[DONE]"), "no clean end: {text}");
    assert!(text.contains("\"error\""), "an error event: {text}");
    assert!(String::from_utf8_lossy(&owner_bytes).ends_with("data: [DONE]\n\n"));
    assert_eq!(fleet.provider.calls(), 1);
}

/// The owner's mirror reads the live log like any reader, and is cut like
/// one when it falls `max_reader_lag_bytes` behind: its followers elsewhere
/// then get an error, never a clean end to the events it did mirror.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_followers_of_a_mirror_that_fell_behind_get_the_whole_stream_or_an_error() {
    let redis = RedisServer::spawn().await;
    let provider = MockProvider::start(MockSettings::default()).await.unwrap();
    let url = redis.url();
    let fleet = Fleet::start_with(provider, 2, move |config| {
        config.redis = Some(redis_at(&url));
        config.coalesce.max_reader_lag_bytes = 64;
    })
    .await;
    let body = streaming("a stream that races ahead of its mirror and of every slow reader of it");
    let (_, follower) = stream_on_two_instances(&fleet, PATH, &body, 1).await;
    let text = String::from_utf8_lossy(&follower.body).into_owned();
    let mut plain = body.clone();
    plain["stream"] = json!(false);
    let whole = fleet.instances[0].post(PATH, &plain).await;
    let content = whole.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    if text.contains("[DONE]") {
        let relayed: String = text
            .split("\n\n")
            .filter_map(|event| event.strip_prefix("data: "))
            .filter_map(|data| serde_json::from_str::<Value>(data).ok())
            .filter_map(|chunk| {
                chunk["choices"][0]["delta"]["content"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect();
        assert_eq!(relayed, content, "a clean end means the whole stream");
    } else {
        assert!(text.contains("\"error\""), "else an error event: {text}");
    }
}

/// Every connection pool has a size: an instance follows at most
/// `redis.max_relay_connections` mirrored streams on connections of their
/// own; the others poll on the shared connection, and every follower still
/// gets its stream whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_streams_beyond_the_relay_connections_poll_and_redis_clients_stay_bounded() {
    const STREAMS: usize = 12;
    const PLACES: usize = 2;
    let redis = RedisServer::spawn().await;
    let fleet = slow_stream_fleet(RedisConfig {
        max_relay_connections: PLACES,
        ..redis_at(&redis.url())
    })
    .await;
    let mut conn = redis.client().await;
    let connected = |info: String| -> usize {
        info.lines()
            .find_map(|line| line.strip_prefix("connected_clients:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("INFO clients")
    };
    let info = |conn: &mut redis::aio::MultiplexedConnection| {
        let mut conn = conn.clone();
        async move {
            redis::cmd("INFO")
                .arg("clients")
                .query_async::<String>(&mut conn)
                .await
                .unwrap()
        }
    };
    let before = connected(info(&mut conn).await);
    let bodies: Vec<Value> = (0..STREAMS)
        .map(|i| {
            streaming(&format!(
                "distinct stream number {i} relayed to another instance"
            ))
        })
        .collect();
    let mut owners = Vec::new();
    for body in &bodies {
        let mut owner = fleet.instances[0].open(PATH, body).await;
        let mut bytes = Vec::new();
        read_events(&mut owner, &mut bytes, 1).await;
        owners.push((owner, bytes));
    }
    let followers: Vec<_> = bodies
        .iter()
        .map(|body| fleet.instances[1].spawn_post(PATH, body))
        .collect();
    let mut most = before;
    while !followers.iter().all(|task| task.is_finished()) {
        most = most.max(connected(info(&mut conn).await));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for ((mut owner, mut bytes), follower) in owners.into_iter().zip(followers) {
        read_to_end(&mut owner, &mut bytes).await;
        let follower = follower.await.unwrap();
        assert_eq!(follower.body, Bytes::from(bytes), "whole, through Redis");
    }
    assert!(
        most <= before + PLACES,
        "{most} Redis clients at most, {before} before: at most {PLACES} relay connections"
    );
    assert_eq!(fleet.provider.calls(), STREAMS as u64);
}

/// A model that thinks before its first event: every reader of the stream,
/// owner and follower, receives keep-alive comments while it is silent, then
/// the whole stream; the stored answer replays without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thinking_stream_keeps_its_readers_alive_and_stores_no_comment() {
    let provider = MockProvider::start(MockSettings {
        stream_first_event_delay: Duration::from_millis(1500),
        ..MockSettings::default()
    })
    .await
    .unwrap();
    let gateway = TestGateway::start_with(provider, |config| {
        config.coalesce.keepalive_interval = Duration::from_millis(100);
    })
    .await;
    let body = streaming("think before you answer");
    let replies = gateway.herd(PATH, &body, 2, &[]).await;
    for reply in &replies {
        let text = String::from_utf8_lossy(&reply.body);
        assert!(text.starts_with(": keep-alive\n\n"), "{text}");
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        let events: String = text.replace(": keep-alive\n\n", "");
        assert!(!events.contains(": keep-alive"));
    }
    let without =
        |reply: &Reply| String::from_utf8_lossy(&reply.body).replace(": keep-alive\n\n", "");
    assert_eq!(
        without(&replies[0]),
        without(&replies[1]),
        "the same events"
    );
    // A streamed caller has its answer at `[DONE]`, a moment before the
    // flight stores it and ends; a repeat sent in that moment would join the
    // flight (COALESCED). The repeat here is the cache's.
    gateway.wait_idle().await;
    let replayed = gateway.post(PATH, &body).await;
    assert_eq!(replayed.cache(), "HIT");
    assert!(!String::from_utf8_lossy(&replayed.body).contains("keep-alive"));
    assert_eq!(gateway.provider.calls(), 1);
}
