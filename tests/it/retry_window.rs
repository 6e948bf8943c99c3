//! The retry window: a client's retry (`X-Stainless-Retry-Count` > 0, or a
//! repeated `Idempotency-Key`) of a request whose flight already finished gets
//! the answer that flight paid for, sampled or not, on any instance; a request
//! without those marks gets a fresh sample. The SDK's own retry over a slow
//! provider is in `sdk.rs`.

use std::time::Duration;

use corral::config::{RedisConfig, Secret};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{
    harness::{Fleet, Reply, TestGateway},
    redis_server::RedisServer,
};

const CHAT: &str = "/v1/chat/completions";
const RETRY: (&str, &str) = ("x-stainless-retry-count", "1");

/// A sampled request: neither cached nor served from the cache.
fn sampled(content: &str) -> Value {
    json!({
        "model": "gpt-4o-mini",
        "temperature": 1,
        "messages": [{"role": "user", "content": content}],
    })
}

fn streamed(content: &str) -> Value {
    let mut body = sampled(content);
    body["stream"] = json!(true);
    body
}

/// The mock numbers its calls in `id`: two answers with one id are one call.
fn id(reply: &Reply) -> String {
    reply.json()["id"].as_str().unwrap_or_default().to_owned()
}

fn assert_retry_hit(reply: &Reply) {
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    assert_eq!(reply.cache(), "HIT");
    assert_eq!(
        reply.header("cache-status"),
        Some("corral; hit; detail=retry")
    );
}

async fn stats(gateway: &TestGateway) -> Value {
    gateway.get("/stats").await.json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampled_repeats_without_retry_marks_are_fresh_samples() {
    let gateway = TestGateway::start(|_| {}).await;
    let first = gateway
        .post_with(CHAT, &sampled("regenerate me"), &[])
        .await;
    let again = gateway
        .post_with(
            CHAT,
            &sampled("regenerate me"),
            &[("x-stainless-retry-count", "0")],
        )
        .await;
    assert_eq!((first.cache(), again.cache()), ("MISS", "MISS"));
    assert_ne!(id(&first), id(&again), "two samples");
    assert_eq!(gateway.provider.calls(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sdk_retry_after_the_flight_finished_gets_the_paid_answer() {
    let gateway = TestGateway::start(|_| {}).await;
    let first = gateway.post(CHAT, &sampled("retry me")).await;
    assert_eq!(first.cache(), "MISS");
    let retry = gateway
        .post_with(CHAT, &sampled("retry me"), &[RETRY])
        .await;
    assert_retry_hit(&retry);
    assert_eq!(
        retry.body, first.body,
        "the answer the first attempt paid for"
    );
    assert_eq!(gateway.provider.calls(), 1);

    // Another body, or another tenant, is not a retry of it.
    let other = gateway
        .post_with(CHAT, &sampled("retry me, differently"), &[RETRY])
        .await;
    assert_eq!(other.cache(), "MISS");
    let other_tenant = gateway
        .post_with(
            CHAT,
            &sampled("retry me"),
            &[RETRY, ("authorization", "Bearer sk-another-tenant")],
        )
        .await;
    assert_eq!(other_tenant.cache(), "MISS");
    assert_ne!(id(&other_tenant), id(&first));
    assert_eq!(gateway.provider.calls(), 3);

    let stats = stats(&gateway).await;
    assert_eq!(stats["saved_responses"]["retry"], 1, "{stats}");
    let usage = first.json()["usage"].clone();
    assert_eq!(
        stats["tokens"]["saved"]["completion"], usage["completion_tokens"],
        "the retry's tokens are saved: {stats}"
    );
    let metrics = String::from_utf8_lossy(&gateway.get("/metrics").await.body).into_owned();
    assert!(
        metrics
            .lines()
            .any(|line| line.starts_with("corral_saved_responses_total{")
                && line.contains("via=\"retry\"")
                && line.ends_with(" 1")),
        "{metrics}"
    );
    // A deterministic answer the cache stored answers its retry from the cache.
    let cached = gateway.post(CHAT, &crate::harness::chat("cached")).await;
    let cached_retry = gateway
        .post_with(CHAT, &crate::harness::chat("cached"), &[RETRY])
        .await;
    assert_eq!(cached_retry.header("cache-status"), Some("corral; hit"));
    assert_eq!(cached_retry.body, cached.body);
    assert_eq!(gateway.provider.calls(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_keys_bind_one_request_per_tenant() {
    let gateway = TestGateway::start(|_| {}).await;
    let key = ("idempotency-key", "order-4711");
    let first = gateway
        .post_with(CHAT, &sampled("charge once"), &[key])
        .await;
    let repeat = gateway
        .post_with(CHAT, &sampled("charge once"), &[key])
        .await;
    assert_eq!(first.cache(), "MISS");
    assert_retry_hit(&repeat);
    assert_eq!(repeat.body, first.body, "equal answers");
    assert_eq!(gateway.provider.calls(), 1);

    let reused = gateway
        .post_with(CHAT, &sampled("charge twice"), &[key])
        .await;
    assert_eq!(reused.status, StatusCode::UNPROCESSABLE_ENTITY);
    let error = &reused.json()["error"];
    assert_eq!(error["type"], "invalid_request_error");
    assert_eq!(error["code"], "idempotency_key_reused");
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("Idempotency-Key")),
        "{error}"
    );

    // Another tenant's equal key is another key: its own call.
    let other_tenant = gateway
        .post_with(
            CHAT,
            &sampled("charge once"),
            &[key, ("authorization", "Bearer sk-another-tenant")],
        )
        .await;
    assert_eq!(other_tenant.cache(), "MISS");
    assert_ne!(id(&other_tenant), id(&first));
    // A fresh key is a new request, not a retry: a fresh sample.
    let fresh = gateway
        .post_with(
            CHAT,
            &sampled("charge once"),
            &[("idempotency-key", "order-4712")],
        )
        .await;
    assert_eq!(fresh.cache(), "MISS");
    assert_eq!(gateway.provider.calls(), 3);

    let empty = gateway
        .post_with(CHAT, &sampled("charge once"), &[("idempotency-key", "")])
        .await;
    assert_eq!(empty.status, StatusCode::BAD_REQUEST);
    assert_eq!(gateway.provider.calls(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_on_another_instance_gets_the_answer_through_redis() {
    let redis = RedisServer::spawn().await;
    let fleet = Fleet::start(2, |config| {
        config.redis = Some(RedisConfig {
            encryption_key: Some(Secret::new([0x42; 32])),
            ..crate::harness::redis_at(&redis.url())
        });
    })
    .await;
    let (a, b) = (&fleet.instances[0], &fleet.instances[1]);
    let canary = "CANARY-retry-9c1e sampled words";
    let first = a.post(CHAT, &sampled(canary)).await;
    assert_eq!(first.cache(), "MISS");
    let retry = b.post_with(CHAT, &sampled(canary), &[RETRY]).await;
    assert_retry_hit(&retry);
    assert_eq!(retry.body, first.body);
    assert_eq!(fleet.provider.calls(), 1);

    // Idempotency keys are bound cluster-wide.
    let key = ("idempotency-key", "cluster-key-1");
    let keyed = a.post_with(CHAT, &sampled("keyed"), &[key]).await;
    let conflict = b.post_with(CHAT, &sampled("not keyed"), &[key]).await;
    assert_eq!(conflict.status, StatusCode::UNPROCESSABLE_ENTITY);
    let repeat = b.post_with(CHAT, &sampled("keyed"), &[key]).await;
    assert_retry_hit(&repeat);
    assert_eq!(repeat.body, keyed.body);
    assert_eq!(fleet.provider.calls(), 2);

    // Sealed at rest, with a TTL, like every other value.
    let mut conn = redis.client().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    let retained: Vec<&String> = keys.iter().filter(|k| k.contains(":retry:")).collect();
    assert_eq!(retained.len(), 2, "{keys:?}");
    assert!(keys.iter().any(|k| k.contains(":idem:")), "{keys:?}");
    for name in keys
        .iter()
        .filter(|k| k.contains(":retry:") || k.contains(":idem:"))
    {
        let value: Vec<u8> = redis::cmd("GET")
            .arg(name)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(
            !String::from_utf8_lossy(&value).contains("CANARY-retry"),
            "{name} is stored in the clear"
        );
        let ttl: i64 = redis::cmd("PTTL")
            .arg(name)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(
            ttl > 0 && ttl <= 300_000,
            "{name} expires with the window: {ttl}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_retry_replays_the_same_events() {
    let gateway = TestGateway::start(|_| {}).await;
    let first = gateway.post(CHAT, &streamed("stream then retry")).await;
    assert_eq!(first.cache(), "MISS");
    assert!(
        String::from_utf8_lossy(&first.body).ends_with("data: [DONE]\n\n"),
        "{:?}",
        first.body
    );
    // The client reads `[DONE]` as the log's last event; the flight ends a
    // moment later, once it has kept the answer for retries. A retry in that
    // moment joins the flight instead (COALESCED: the same events, one call;
    // `a_streamed_retry_of_a_running_stream_joins_it`), so this one is sent
    // once it has ended, as a client's retry after a failure would be.
    gateway.wait_idle().await;
    let retry = gateway
        .post_with(CHAT, &streamed("stream then retry"), &[RETRY])
        .await;
    assert_retry_hit(&retry);
    assert_eq!(
        retry.header("content-type"),
        Some("text/event-stream"),
        "a stream"
    );
    assert_eq!(retry.body, first.body, "the same events, byte for byte");
    assert_eq!(gateway.provider.calls(), 1);

    // A non-streaming retry of the streamed answer gets it as one object.
    let mut plain = sampled("stream then retry");
    plain["stream"] = json!(false);
    let object = gateway.post_with(CHAT, &plain, &[RETRY]).await;
    assert_retry_hit(&object);
    let text = String::from_utf8_lossy(&first.body).into_owned();
    let id = object.json()["id"].as_str().unwrap_or_default().to_owned();
    assert!(!id.is_empty() && text.contains(&id), "{id} in {text}");
    assert_eq!(gateway.provider.calls(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_of_zero_turns_it_off() {
    let gateway = TestGateway::start(|config| config.retry.dedup_window = Duration::ZERO).await;
    gateway.post(CHAT, &sampled("no window")).await;
    let retry = gateway
        .post_with(CHAT, &sampled("no window"), &[RETRY])
        .await;
    assert_eq!(retry.cache(), "MISS");
    assert_eq!(gateway.provider.calls(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_retry_of_a_running_stream_joins_it() {
    let gateway = TestGateway::start(|_| {}).await;
    gateway.provider.hold();
    let first = {
        let handle = gateway.clone_handle();
        tokio::spawn(async move {
            handle
                .post_with(CHAT, &streamed("retry while running"), &[])
                .await
        })
    };
    gateway.wait_for_calls(1).await;
    let retry = {
        let handle = gateway.clone_handle();
        tokio::spawn(async move {
            handle
                .post_with(CHAT, &streamed("retry while running"), &[RETRY])
                .await
        })
    };
    gateway.wait_for_waiters(2).await;
    gateway.provider.release();
    let (first, retry) = (first.await.unwrap(), retry.await.unwrap());
    assert_eq!((first.cache(), retry.cache()), ("MISS", "COALESCED"));
    assert_eq!(retry.body, first.body, "the same live events");
    assert_eq!(gateway.provider.calls(), 1);
}

/// An `Idempotency-Key` whose request failed is free again: a client that
/// corrects its body after the provider's 400 and sends it under the same key
/// is served, on one instance and across a Redis-sharing fleet, and the key
/// is then bound to the corrected request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_whose_request_failed_can_carry_the_corrected_request() {
    let refused = || {
        mock_upstream::Scripted::json(
            400,
            r#"{"error":{"message":"bad prefill","type":"invalid_request_error","param":null,"code":null}}"#,
        )
    };
    let redis = RedisServer::spawn().await;
    let fleet = Fleet::start(2, |config| {
        config.redis = Some(crate::harness::redis_at(&redis.url()));
    })
    .await;
    let single = TestGateway::start(|_| {}).await;
    for (name, first, then, provider) in [
        ("one instance", &single, &single, &single.provider),
        (
            "two instances",
            &fleet.instances[0],
            &fleet.instances[1],
            &fleet.provider,
        ),
    ] {
        let key = ("idempotency-key", name);
        provider.push_script(refused());
        let failed = first.post_with(CHAT, &sampled("draft"), &[key]).await;
        assert_eq!(failed.status, StatusCode::BAD_REQUEST, "{name}");
        let corrected = then.post_with(CHAT, &sampled("corrected"), &[key]).await;
        assert_eq!(
            corrected.status,
            StatusCode::OK,
            "{name}: {:?}",
            corrected.body
        );
        let other = first.post_with(CHAT, &sampled("another"), &[key]).await;
        assert_eq!(
            other.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{name}: bound to the corrected request now"
        );
    }
}

/// Under `cache.scope: global` callers of every tenant share flights and
/// stored answers, but a sample kept for retries stays its tenant's: another
/// tenant's request marked as a retry gets a sample of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_global_cache_a_retry_never_receives_another_tenants_sample() {
    let gateway = TestGateway::start(|config| {
        config.cache.scope = corral::config::CacheScope::Global;
        config.upstreams[0].api_key = Some(Secret::new("sk-corral".into()));
        config.auth.key_hashes = vec![
            corral::tenant::key_hash(b"gw-team-a"),
            corral::tenant::key_hash(b"gw-team-b"),
        ];
    })
    .await;
    let (team_a, team_b) = (
        ("authorization", "Bearer gw-team-a"),
        ("authorization", "Bearer gw-team-b"),
    );
    let body = sampled("a sample of team a's");
    let first = gateway.post_with(CHAT, &body, &[team_a]).await;
    assert_eq!(first.cache(), "MISS");
    let other = gateway.post_with(CHAT, &body, &[team_b, RETRY]).await;
    assert_eq!(
        other.cache(),
        "MISS",
        "team b's retry is not served team a's sample"
    );
    assert_ne!(id(&other), id(&first));
    let own = gateway.post_with(CHAT, &body, &[team_a, RETRY]).await;
    assert_retry_hit(&own);
    assert_eq!(own.body, first.body);
    assert_eq!(gateway.provider.calls(), 2);
}
