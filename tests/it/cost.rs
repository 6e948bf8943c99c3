//! Cost truth: the provider's usage billed kind by kind at the snapshot's
//! prices, exactly; unpriced models counted, not dropped; the cluster ledger
//! in a real Redis summing two instances and surviving their restart.

use std::time::Duration;

use corral::pricing::snapshot;
use mock_upstream::Scripted;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{
    harness::{TestGateway, chat},
    metrics::{scrape, sum},
    redis_server::RedisServer,
};

const CHAT: &str = "/v1/chat/completions";

/// Picodollars per token of a snapshot price (USD per million tokens, at most six decimals).
fn picos(usd_per_million: f64) -> u128 {
    (usd_per_million * 1e6).round() as u128
}

/// The embedded snapshot's entry for `id`.
fn snapshot_price(id: &str) -> corral::pricing::SnapshotModel {
    snapshot()
        .models
        .iter()
        .find(|model| model.id == id)
        .unwrap_or_else(|| panic!("{id} is not in the snapshot"))
        .clone()
}

async fn stats(gateway: &TestGateway) -> Value {
    let reply = gateway.get("/stats").await;
    assert_eq!(reply.status, StatusCode::OK);
    reply.json()
}

/// A complete chat answer whose usage has cached and reasoning parts.
fn answer_with(model: &str, usage: Value) -> Scripted {
    Scripted::json(
        200,
        json!({
            "id": "chatcmpl-cost", "object": "chat.completion", "created": 1, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "42"},
                         "logprobs": null, "finish_reason": "stop"}],
            "usage": usage,
        })
        .to_string(),
    )
}

/// Done when: prompt 1000 (800 cached), completion 100 (60 reasoning) on a
/// priced model costs 200 x input + 800 x cached_input + 100 x output per
/// million, exactly, and 9 repeats add exactly 9 times that to `saved`.
#[tokio::test]
async fn cached_and_reasoning_tokens_are_billed_at_their_own_prices_exactly() {
    let gateway = TestGateway::start(|_| {}).await;
    let model = "gpt-4o-mini";
    let price = snapshot_price(model);
    let cached_price = price.cached_input.expect("OpenAI prices cached input");
    assert!(
        cached_price < price.input,
        "the test needs a discount to see"
    );
    gateway.provider.push_script(answer_with(
        model,
        json!({
            "prompt_tokens": 1000, "completion_tokens": 100, "total_tokens": 1100,
            "prompt_tokens_details": {"cached_tokens": 800, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 60, "audio_tokens": 0},
        }),
    ));
    let body = chat("what does a cached prompt cost?");
    for i in 0..10 {
        let reply = gateway.post(CHAT, &body).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.cache(), if i == 0 { "MISS" } else { "HIT" });
    }
    assert_eq!(gateway.provider.calls(), 1);

    let one = 200 * picos(price.input) + 800 * picos(cached_price) + 100 * picos(price.output);
    let m = scrape(&gateway).await;
    let labels = |source| [("model", model), ("source", source)];
    let usd = |picos: u128| picos as f64 / 1e12;
    assert_eq!(
        sum(&m, "corral_cost_usd_total", &labels("upstream")),
        usd(one),
        "exactly the kinds at their prices"
    );
    assert_eq!(
        sum(&m, "corral_cost_usd_total", &labels("saved")),
        usd(9 * one)
    );
    let tokens = |kind, source| {
        sum(
            &m,
            "corral_tokens_total",
            &[("model", model), ("kind", kind), ("source", source)],
        )
    };
    assert_eq!(tokens("input", "upstream"), 200.0);
    assert_eq!(tokens("cached_input", "upstream"), 800.0);
    assert_eq!(tokens("output", "upstream"), 40.0);
    assert_eq!(tokens("reasoning", "upstream"), 60.0);
    assert_eq!(tokens("reasoning", "saved"), 9.0 * 60.0);
    assert_eq!(
        sum(
            &m,
            "gen_ai_client_token_usage_sum",
            &[
                ("gen_ai_request_model", model),
                ("gen_ai_token_type", "input")
            ]
        ),
        1000.0,
        "the GenAI convention counts cached input inside input"
    );

    let s = stats(&gateway).await;
    assert_eq!(s["scope"], "instance", "no Redis: this instance's books");
    assert_eq!(s["cost_nano_usd"]["upstream"], (one / 1000) as u64);
    assert_eq!(s["cost_nano_usd"]["saved"], (9 * one / 1000) as u64);
    assert_eq!(s["tokens"]["saved"]["cached_input"], 9 * 800);
    assert_eq!(s["tokens"]["saved"]["prompt"], 9 * 1000);
    assert_eq!(s["pricing"]["snapshot"]["as_of"], snapshot().as_of.as_str());
    let tenant = &s["tenants"][0];
    assert_eq!(tenant["answers"], json!({"upstream": 1, "saved": 9}));
    assert_eq!(tenant["cost_nano_usd"], s["cost_nano_usd"]);
    assert_eq!(
        tenant["name"].as_str().unwrap(),
        "anonymous",
        "no credential: the anonymous tenant"
    );
    assert_eq!(s["upstreams"][0]["name"], "mock");
    assert_eq!(s["upstreams"][0]["cost_nano_usd"], s["cost_nano_usd"]);
}

#[tokio::test]
async fn an_unpriced_models_tokens_are_counted_and_flagged() {
    let gateway = TestGateway::start(|_| {}).await;
    let mut body = chat("a model nobody prices");
    body["model"] = json!("acme-private-7b");
    let reply = gateway.post(CHAT, &body).await;
    assert_eq!(reply.status, StatusCode::OK);
    let usage = &reply.json()["usage"];
    let total =
        usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap();
    assert!(total > 0);
    let repeat = gateway.post(CHAT, &body).await;
    assert_eq!(repeat.cache(), "HIT");

    let m = scrape(&gateway).await;
    let unpriced = |source| {
        sum(
            &m,
            "corral_unpriced_tokens_total",
            &[("model", "other"), ("source", source)],
        )
    };
    assert_eq!(unpriced("upstream"), total as f64);
    assert_eq!(unpriced("saved"), total as f64);
    assert_eq!(sum(&m, "corral_cost_usd_total", &[("model", "other")]), 0.0);
    let s = stats(&gateway).await;
    assert_eq!(
        s["unpriced_tokens"],
        json!({"upstream": total, "saved": total})
    );
    let other = s["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["model"] == "other")
        .expect("the unpriced model is listed");
    assert_eq!(other["priced"], false);
    assert_eq!(other["unpriced_tokens"]["upstream"], total);
}

fn shared_redis(url: &str) -> impl Fn(&mut corral::Config) + '_ {
    move |config| {
        // A loaded test machine can take longer than production's 150 ms.
        config.redis = Some(crate::harness::redis_at(url));
        // The explicit flushes below are what the test waits on.
        config.ledger.flush_interval = Duration::from_secs(3600);
    }
}

async fn flushed(gateway: &TestGateway) {
    gateway.wait_connected().await;
    gateway
        .state
        .flush_ledger()
        .await
        .expect("the ledger flush reaches Redis");
}

fn tokens_of(reply: &crate::harness::Reply) -> (u128, u128) {
    let usage = &reply.json()["usage"];
    (
        usage["prompt_tokens"].as_u64().unwrap().into(),
        usage["completion_tokens"].as_u64().unwrap().into(),
    )
}

/// Done when: two instances sharing Redis, after traffic on both, `/stats` on
/// either reports the sum; after restarting both, the totals remain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_report_the_cluster_sum_and_it_survives_their_restart() {
    let redis = RedisServer::spawn().await;
    let url = redis.url();
    let provider = mock_upstream::MockProvider::start(mock_upstream::MockSettings::default())
        .await
        .unwrap();
    let a = TestGateway::start_with(provider.clone(), shared_redis(&url)).await;
    let b = TestGateway::start_with(provider.clone(), shared_redis(&url)).await;
    a.wait_connected().await;
    b.wait_connected().await;
    let team = |key: &str| format!("Bearer {key}");

    // a: one paid answer and two hits; b: another paid answer and one hit.
    let first = chat("cluster ledger, first prompt");
    let second = chat("cluster ledger, second prompt");
    let key_a = team("sk-ledger-tenant-a");
    let key_b = team("sk-ledger-tenant-b");
    let paid_a = a
        .post_with(CHAT, &first, &[("authorization", &key_a)])
        .await;
    for _ in 0..2 {
        assert_eq!(
            a.post_with(CHAT, &first, &[("authorization", &key_a)])
                .await
                .cache(),
            "HIT"
        );
    }
    let paid_b = b
        .post_with(CHAT, &second, &[("authorization", &key_b)])
        .await;
    assert_eq!(
        b.post_with(CHAT, &second, &[("authorization", &key_b)])
            .await
            .cache(),
        "HIT"
    );
    assert_eq!((paid_a.cache(), paid_b.cache()), ("MISS", "MISS"));
    assert_eq!(provider.calls(), 2);

    let price = snapshot_price("gpt-4o-mini");
    let cost = |(prompt, completion): (u128, u128)| {
        prompt * picos(price.input) + completion * picos(price.output)
    };
    let (one_a, one_b) = (cost(tokens_of(&paid_a)), cost(tokens_of(&paid_b)));
    let spent_nanos = (one_a + one_b) / 1000;
    let saved_nanos = (2 * one_a + one_b) / 1000;

    flushed(&a).await;
    flushed(&b).await;
    flushed(&a).await;
    for (name, gateway) in [("a", &a), ("b", &b)] {
        let s = stats(gateway).await;
        assert_eq!(s["scope"], "cluster", "{name}");
        assert_eq!(
            s["upstream"]["calls"], 2,
            "{name}: both instances' calls: {s:#}"
        );
        assert_eq!(s["saved_responses"]["total"], 3, "{name}");
        assert_eq!(s["cost_nano_usd"]["upstream"], spent_nanos as u64, "{name}");
        assert_eq!(s["cost_nano_usd"]["saved"], saved_nanos as u64, "{name}");
        assert_eq!(
            s["tenants"].as_array().unwrap().len(),
            2,
            "{name}: {}",
            s["tenants"]
        );
        assert_eq!(s["requests"]["total"], 5, "{name}");
    }
    // `/metrics` stays per instance: Prometheus sums the instances itself.
    assert_eq!(
        sum(&scrape(&a).await, "corral_upstream_requests_total", &[]),
        1.0
    );
    let before = stats(&a).await;

    // Restart both: their last counts flush on shutdown, the new instances read the ledger.
    a.stop().await;
    b.stop().await;
    let a = TestGateway::start_with(provider.clone(), shared_redis(&url)).await;
    let b = TestGateway::start_with(provider.clone(), shared_redis(&url)).await;
    flushed(&a).await;
    flushed(&b).await;
    for gateway in [&a, &b] {
        let s = stats(gateway).await;
        assert_eq!(s["scope"], "cluster");
        for field in [
            "upstream",
            "saved_responses",
            "tokens",
            "cost_nano_usd",
            "requests",
            "tenants",
            "upstreams",
        ] {
            assert_eq!(s[field], before[field], "{field} after the restart");
        }
        assert_eq!(
            sum(
                &scrape(gateway).await,
                "corral_upstream_requests_total",
                &[]
            ),
            0.0,
            "a new instance's own counters start at zero"
        );
    }

    // Every ledger key has a retention TTL and no credential.
    let mut conn = redis.client().await;
    for (key, value) in redis.dump().await {
        if !key.contains("{ledger}") {
            continue;
        }
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(ttl > 0, "{key} has no TTL");
        let text = String::from_utf8_lossy(&value);
        assert!(
            !text.contains("sk-ledger") && !key.contains("sk-ledger"),
            "{key}"
        );
    }
}

/// The ledger keeps counting while Redis is away and adds it all, once, when it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_made_while_redis_is_away_reach_the_ledger_once_later() {
    let redis = RedisServer::spawn().await;
    let url = redis.url();
    let gateway = TestGateway::start(|config| {
        shared_redis(&url)(config);
        let redis = config.redis.as_mut().unwrap();
        redis.op_timeout = Duration::from_millis(400);
        redis.breaker_cool_down = Duration::from_millis(300);
    })
    .await;
    flushed(&gateway).await;

    redis.signal("STOP");
    let reply = gateway
        .post(CHAT, &chat("counted while Redis sleeps"))
        .await;
    assert_eq!(
        reply.status,
        StatusCode::OK,
        "Redis never decides an answer"
    );
    // Redis receives the batch but cannot answer in time: its fate is unknown here.
    assert!(
        gateway.state.flush_ledger().await.is_err(),
        "the flush fails open"
    );
    let s = stats(&gateway).await;
    assert_eq!(s["ledger_stale"], true);
    assert_eq!(s["upstream"]["calls"], 1, "counted meanwhile, and shown");

    redis.signal("CONT");
    let cluster = gateway.state.cluster().unwrap();
    let mut breaker = cluster.breaker().watch();
    tokio::time::timeout(
        crate::harness::WAIT,
        breaker.wait_for(|s| *s == corral::breaker::BreakerState::Closed),
    )
    .await
    .expect("the breaker closes once Redis is back")
    .unwrap();
    // The batch in doubt is resent with its id: applied once, whether or not
    // Redis ran it when it woke up.
    flushed(&gateway).await;
    flushed(&gateway).await;
    let s = stats(&gateway).await;
    assert_eq!(s["scope"], "cluster");
    assert_eq!(s["ledger_stale"], false);
    assert_eq!(s["upstream"]["calls"], 1, "added once: not lost, not twice");
    let mut conn = redis.client().await;
    let calls: i64 = redis::cmd("HGET")
        .arg(corral::cluster::ledger_key("corral"))
        .arg("call|mock|200|gpt-4o-mini")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(calls, 1);
}

/// `/stats` names a tenant by its gateway key's label, else by a short scope;
/// never by the key, and never on a Prometheus label.
#[tokio::test]
async fn tenants_are_attributed_by_key_label_or_short_scope_never_by_key() {
    use corral::{config::Secret, tenant::key_hash};
    let gateway = TestGateway::start(|config| {
        config.auth.key_hashes = vec![key_hash(b"gw-search-team"), key_hash(b"gw-unlabelled")];
        config.auth.labels_by_hash = vec![(key_hash(b"gw-search-team"), "team-search".to_owned())];
        config.upstreams[0].api_key = Some(Secret::new("sk-provider".to_owned()));
    })
    .await;
    let body = chat("who asked?");
    for key in ["gw-search-team", "gw-search-team", "gw-unlabelled"] {
        let reply = gateway
            .post_with(CHAT, &body, &[("authorization", &format!("Bearer {key}"))])
            .await;
        assert_eq!(reply.status, StatusCode::OK);
    }
    let s = stats(&gateway).await;
    let tenants = s["tenants"].as_array().unwrap();
    assert_eq!(tenants.len(), 2, "{tenants:?}");
    let labelled = tenants
        .iter()
        .find(|t| t["name"] == "team-search")
        .expect("the label");
    assert_eq!(labelled["answers"], json!({"upstream": 1, "saved": 1}));
    let other = tenants.iter().find(|t| t["name"] != "team-search").unwrap();
    let name = other["name"].as_str().unwrap();
    assert_eq!(name.len(), 13, "a tag and 12 hex digits: {name}");
    assert_eq!(other["answers"], json!({"upstream": 1, "saved": 0}));
    let stats_text = gateway.get("/stats").await.body;
    let metrics_text = gateway.get("/metrics").await.body;
    let (stats_text, metrics_text) = (
        std::str::from_utf8(&stats_text).unwrap(),
        std::str::from_utf8(&metrics_text).unwrap(),
    );
    assert!(
        !stats_text.contains("gw-") && !metrics_text.contains("gw-"),
        "no gateway key on /stats or /metrics"
    );
    assert!(
        !metrics_text.contains("team-search"),
        "tenants are not Prometheus labels"
    );
}
