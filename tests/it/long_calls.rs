//! A call may take minutes (reasoning models; the SDKs wait 10 minutes), with
//! the shipped defaults: a non-stream answer whose head comes after 150 s is
//! answered once to every caller; a stream that runs for 150 s reaches every
//! reader, here and on another instance, whole; a stream that thinks for
//! 100 s before its first event completes, its readers kept alive meanwhile.
//! These run in real time (the provider really takes that long); they
//! assert outcomes, never durations.

use std::time::Duration;

use mock_upstream::{MockProvider, MockSettings};
use reqwest::StatusCode;
use serde_json::Value;

use crate::{
    harness::{Fleet, Reply, TestGateway, chat, count_status, events_in, redis_at, streamed},
    redis_server::RedisServer,
};

const PATH: &str = "/v1/chat/completions";

/// The shipped timeouts (the test config shortens them for everything else).
fn shipped_timeouts(config: &mut corral::Config) {
    let shipped = corral::Config::load(corral::config::EMBEDDED_DEFAULT, [])
        .expect("the shipped config loads");
    let upstream = &shipped.upstreams[0];
    for mine in &mut config.upstreams {
        mine.connect_timeout = upstream.connect_timeout;
        mine.first_byte_timeout = upstream.first_byte_timeout;
        mine.request_timeout = upstream.request_timeout;
    }
    config.coalesce.wait_timeout = shipped.coalesce.wait_timeout;
    config.coalesce.stream_stall_timeout = shipped.coalesce.stream_stall_timeout;
    config.coalesce.first_event_timeout = shipped.coalesce.first_event_timeout;
    config.coalesce.keepalive_interval = shipped.coalesce.keepalive_interval;
    config.retry.deadline = shipped.retry.deadline;
}

/// How long a test's client waits for an answer that takes minutes.
const PATIENCE: Duration = Duration::from_secs(400);

/// `n` identical callers on `gateway`, patient ones, released together once
/// all of them wait on the one flight.
async fn patient_herd(gateway: &TestGateway, body: &Value, n: usize) -> Vec<Reply> {
    gateway.provider.hold();
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (handle, body) = (gateway.patient_handle(PATIENCE), body.clone());
            tokio::spawn(async move { handle.post_with(PATH, &body, &[]).await })
        })
        .collect();
    gateway.wait_for_waiters(n).await;
    gateway.provider.release();
    let mut replies = Vec::new();
    for task in tasks {
        replies.push(task.await.expect("request task"));
    }
    replies
}

async fn provider(settings: MockSettings) -> MockProvider {
    MockProvider::start(settings).await.expect("mock starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_stream_answer_after_150_s_is_one_call_for_fifty_callers() {
    let slow = provider(MockSettings {
        latency: Duration::from_secs(150),
        ..MockSettings::default()
    })
    .await;
    let gateway = TestGateway::start_with(slow, shipped_timeouts).await;
    let replies = patient_herd(&gateway, &chat("think for two and a half minutes"), 50).await;
    for reply in &replies {
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    }
    assert_eq!(count_status(&replies, "MISS"), 1);
    assert_eq!(count_status(&replies, "COALESCED"), 49);
    assert_eq!(gateway.provider.calls(), 1, "called once, never resent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_runs_for_150_s_reaches_every_reader_whole() {
    // The reply's events, spaced so the stream runs past 150 s (and past the
    // old two-minute request bound), each gap within the stall bound.
    let body = streamed(chat("stream slowly for a long time"));
    let events = {
        let quick = provider(MockSettings::default()).await;
        let gateway = TestGateway::start_with(quick, |_| {}).await;
        events_in(&gateway.post(PATH, &body).await.body)
    };
    let gap = Duration::from_secs(150).div_f64(events.saturating_sub(1).max(1) as f64);
    assert!(
        gap < Duration::from_secs(60),
        "{events} events, {gap:?} apart"
    );
    let redis = RedisServer::spawn().await;
    let url = redis.url();
    let dripping = provider(MockSettings {
        stream_chunk_delay: gap,
        ..MockSettings::default()
    })
    .await;
    let fleet = Fleet::start_with(dripping, 2, move |config| {
        shipped_timeouts(config);
        config.redis = Some(redis_at(&url));
    })
    .await;
    // The owner on the first instance, the follower joining on the second
    // once the stream is under way; both read it to its end.
    let (a, b) = (&fleet.instances[0], &fleet.instances[1]);
    let (owner_handle, follower_handle) = (a.patient_handle(PATIENCE), b.patient_handle(PATIENCE));
    let owner_body = body.clone();
    let owner = tokio::spawn(async move { owner_handle.post_with(PATH, &owner_body, &[]).await });
    a.wait_for_calls(1).await;
    let follower = follower_handle.post_with(PATH, &body, &[]).await;
    let owner = owner.await.unwrap().body;
    assert!(owner.ends_with(b"data: [DONE]\n\n"), "{owner:?}");
    // The follower on the other instance got the same events (keep-alives
    // aside: a reader may get one in a long gap).
    let events_of = |bytes: &[u8]| String::from_utf8_lossy(bytes).replace(": keep-alive\n\n", "");
    assert_eq!(events_of(&follower.body), events_of(&owner));
    assert_eq!(follower.cache(), "COALESCED");
    assert_eq!(fleet.provider.calls(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_thinks_for_100_s_first_completes_with_keepalives() {
    let thinking = provider(MockSettings {
        stream_first_event_delay: Duration::from_secs(100),
        ..MockSettings::default()
    })
    .await;
    let gateway = TestGateway::start_with(thinking, shipped_timeouts).await;
    let body = streamed(chat("think hard before the first word"));
    let replies = patient_herd(&gateway, &body, 2).await;
    for reply in &replies {
        let text = String::from_utf8_lossy(&reply.body);
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        // 100 s of silence, a keep-alive every 15 s.
        assert!(text.matches(": keep-alive\n\n").count() >= 5, "{text}");
    }
    // A streamed caller has its answer at `[DONE]`, a moment before the
    // flight stores it and ends; a repeat sent in that moment would join the
    // flight (COALESCED). The repeat here is the cache's.
    gateway.wait_idle().await;
    let replay = gateway.post(PATH, &body).await;
    assert_eq!(replay.cache(), "HIT");
    assert!(!String::from_utf8_lossy(&replay.body).contains("keep-alive"));
    let plain: Value = gateway
        .patient_handle(PATIENCE)
        .post_with(PATH, &chat("think hard before the first word"), &[])
        .await
        .json();
    assert!(plain["choices"][0]["message"]["content"].is_string());
    assert_eq!(gateway.provider.calls(), 1);
}

/// A stream that falls silent for longer than `coalesce.stream_stall_timeout`
/// after some events ends with an error event for every reader (the owner,
/// a follower on its instance, one on another) and is not cached: the next
/// caller's request is a new upstream call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_falls_silent_ends_with_an_error_for_every_reader_and_is_not_cached() {
    let redis = RedisServer::spawn().await;
    let url = redis.url();
    let silent = provider(MockSettings::default()).await;
    // Every event but the last, then silence until released.
    silent.hold_stream_ends();
    let fleet = Fleet::start_with(silent, 2, move |config| {
        config.coalesce.stream_stall_timeout = Duration::from_secs(2);
        config.redis = Some(redis_at(&url));
    })
    .await;
    let body = streamed(chat("say a little, then fall silent"));
    // Three readers gathered on one flight before it starts.
    fleet.provider.hold();
    let readers: Vec<_> = [0, 0, 1]
        .into_iter()
        .map(|i| fleet.instances[i].spawn_post(PATH, &body))
        .collect();
    fleet.wait_for_waiters(3).await;
    fleet.provider.release();
    for reader in readers {
        let reply = reader.await.unwrap();
        assert_eq!(reply.status, StatusCode::OK, "the stream had begun");
        let text = String::from_utf8_lossy(&reply.body);
        assert!(
            events_in(&reply.body) > 2,
            "events came before the silence: {text}"
        );
        let last = text
            .split("\n\n")
            .filter(|event| event.starts_with("data: "))
            .last()
            .unwrap();
        assert!(
            last.contains("\"error\""),
            "ended with an error event: {text}"
        );
        assert!(!text.contains("[DONE]"), "{text}");
    }
    assert_eq!(fleet.provider.calls(), 1);
    fleet.provider.release_stream_ends();
    for instance in &fleet.instances {
        instance.wait_idle().await;
        let usage = instance
            .state
            .cache()
            .usage()
            .await
            .expect("an in-process cache");
        assert_eq!(usage.entries, 0, "nothing cached in process");
    }
    let keys: Vec<String> = redis.dump().await.into_iter().map(|(k, _)| k).collect();
    assert!(
        !keys
            .iter()
            .any(|k| k.contains(":resp:") || k.contains(":lock:")),
        "no lock left and nothing cached: {keys:?}"
    );
}

/// R2: an image job answers only when it is drawn. Its head may take the
/// whole `request_timeout`, not `first_byte_timeout` (a 504 after a job the
/// provider goes on drawing, and billing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_pass_through_job_is_answered_past_first_byte_timeout() {
    let gateway = TestGateway::start(|config| {
        config.upstreams[0].first_byte_timeout = Duration::from_millis(200);
        config.upstreams[0].request_timeout = Duration::from_secs(60);
    })
    .await;
    gateway.provider.set_latency(Duration::from_millis(1500));
    let image = serde_json::json!({"model": "gpt-image-1", "prompt": "a corral at dusk"});
    let reply = gateway.post("/v1/images/generations", &image).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    assert_eq!(
        reply.json()["data"][0]["revised_prompt"],
        "a corral at dusk"
    );
    assert_eq!(gateway.provider.calls(), 1);
}

/// R2: pass-through jobs that outlast even `request_timeout` are their
/// callers' slow jobs, not a sick provider: they open no breaker, so another
/// tenant's chat is still served (two failures would open this one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_pass_through_jobs_open_no_breaker_for_other_tenants() {
    let gateway = TestGateway::start(|config| {
        config.upstreams[0].first_byte_timeout = Duration::from_millis(200);
        config.upstreams[0].request_timeout = Duration::from_millis(400);
        config.upstreams[0].breaker_failures = 2;
    })
    .await;
    gateway.provider.set_latency(Duration::from_secs(2));
    let image = serde_json::json!({"model": "gpt-image-1", "prompt": "a very slow drawing"});
    for _ in 0..3 {
        let reply = gateway.post("/v1/images/generations", &image).await;
        assert_eq!(
            reply.status,
            StatusCode::GATEWAY_TIMEOUT,
            "{}",
            reply.json()
        );
    }
    gateway.provider.set_latency(Duration::ZERO);
    let reply = gateway
        .post_with(
            PATH,
            &chat("another tenant's question"),
            &[("authorization", "Bearer sk-other")],
        )
        .await;
    assert_eq!(
        reply.status,
        StatusCode::OK,
        "the circuit stayed closed: {}",
        reply.json()
    );
}

/// R3: a provider that sends a stream's head only with its first token (after
/// thinking) is waited on as long as the first event may be, not cut at
/// `first_byte_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_head_comes_with_its_first_token_waits_for_it() {
    let gateway = TestGateway::start(|config| {
        config.upstreams[0].first_byte_timeout = Duration::from_millis(200);
        config.upstreams[0].request_timeout = Duration::from_secs(60);
        config.coalesce.first_event_timeout = Duration::from_secs(30);
    })
    .await;
    gateway.provider.set_latency(Duration::from_millis(1500));
    for (body, what) in [
        (streamed(chat("a head that thinks first")), "coalesced"),
        (
            streamed(chat("a no-store head that thinks first")),
            "no-store",
        ),
    ] {
        let headers: &[(&str, &str)] = if what == "no-store" {
            &[("cache-control", "no-store")]
        } else {
            &[]
        };
        let reply = gateway.post_with(PATH, &body, headers).await;
        assert_eq!(reply.status, StatusCode::OK, "{what}: {:?}", reply.body);
        assert!(
            String::from_utf8_lossy(&reply.body).contains("data: [DONE]"),
            "{what}: the stream completes: {}",
            String::from_utf8_lossy(&reply.body)
        );
    }
    assert_eq!(gateway.provider.calls(), 2);
}
