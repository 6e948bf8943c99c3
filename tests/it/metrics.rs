//! `/metrics` and `/stats`: exact counts of upstream calls, saved responses,
//! tokens and USD, read back through a real Prometheus text parser.

use std::time::Duration;

use corral::config::{Config, ModelPrice, PriceTable};
use mock_upstream::Scripted;
use prometheus_parse::{Scrape, Value as Sample};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{Reply, TestGateway, chat, count_status, embedding};

const CHAT: &str = "/v1/chat/completions";
/// The price the tests bill gpt-4o-mini at (USD per million tokens).
const INPUT: f64 = 0.15;
const OUTPUT: f64 = 0.60;

/// A complete chat answer from a provider that reports no `usage`.
const NO_USAGE: &str = r#"{"id":"chatcmpl-x","object":"chat.completion","model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"no usage here"},"finish_reason":"stop"}]}"#;

fn price(input: f64, output: f64) -> ModelPrice {
    ModelPrice {
        input,
        output,
        cached_input: None,
        cache_write: None,
    }
}

fn priced(config: &mut Config) {
    config.pricing.as_of = Some("2026-03-21".into());
    config.pricing.models = PriceTable(vec![
        ("gpt-4o-mini".into(), price(INPUT, OUTPUT)),
        ("gpt-4o-mini-*".into(), price(INPUT, OUTPUT)),
        ("text-embedding-3-small".into(), price(0.02, 0.0)),
    ]);
}

/// `/metrics`, parsed by `prometheus-parse`, after checking that every line is
/// well-formed (the parser itself skips what it cannot read).
pub(crate) async fn scrape(gateway: &TestGateway) -> Scrape {
    let reply = gateway.get("/metrics").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let text = std::str::from_utf8(&reply.body).expect("UTF-8").to_owned();
    assert_well_formed(&text);
    Scrape::parse(text.lines().map(|line| Ok(line.to_owned()))).expect("parses")
}

/// Each line is a `# HELP`/`# TYPE` comment or `name{labels} value`, the name
/// belonging to a declared family, the value a number.
fn assert_well_formed(text: &str) {
    let mut families: Vec<String> = Vec::new();
    for line in text.lines().filter(|line| !line.is_empty()) {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            families.push(name.to_owned());
            continue;
        }
        if line.starts_with("# HELP ") {
            continue;
        }
        assert!(!line.starts_with('#'), "unexpected comment: {line}");
        let (series, value) = line.rsplit_once(' ').expect("series value");
        assert!(
            value.parse::<f64>().is_ok() || value == "+Inf",
            "bad value in {line}"
        );
        let name = series.split('{').next().unwrap();
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad name in {line}"
        );
        if let Some(labels) = series.strip_prefix(name) {
            if !labels.is_empty() {
                assert!(labels.starts_with('{') && labels.ends_with('}'), "{line}");
            }
        }
        assert!(
            families.iter().any(|family| name == family
                || [
                    family.clone() + "_bucket",
                    family.clone() + "_sum",
                    family.clone() + "_count"
                ]
                .contains(&name.to_owned())),
            "{name} belongs to no declared family"
        );
    }
}

/// Sum of the samples of `metric` whose labels include `labels`.
/// `corral_requests_total` of `endpoint`, as (MISS, COALESCED, HIT).
pub(crate) fn requests_by_cache(scrape: &Scrape, endpoint: &str) -> (f64, f64, f64) {
    let requests = |cache| {
        sum(
            scrape,
            "corral_requests_total",
            &[("endpoint", endpoint), ("cache", cache)],
        )
    };
    (requests("MISS"), requests("COALESCED"), requests("HIT"))
}

/// `corral_tokens_total` of `model`'s `kind` tokens (`input`, `output`, ...) from `source`
/// (`upstream` or `saved`).
pub(crate) fn model_tokens(scrape: &Scrape, model: &str, kind: &str, source: &str) -> f64 {
    sum(
        scrape,
        "corral_tokens_total",
        &[("model", model), ("kind", kind), ("source", source)],
    )
}

pub(crate) fn sum(scrape: &Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match &s.value {
            Sample::Counter(v) | Sample::Gauge(v) | Sample::Untyped(v) => *v,
            Sample::Histogram(buckets) => buckets
                .iter()
                .find(|b| b.less_than.is_infinite())
                .map_or(0.0, |b| b.count),
            Sample::Summary(_) => panic!("no summaries expected"),
        })
        .sum()
}

fn usage_of(reply: &Reply) -> (u64, u64) {
    let usage = &reply.json()["usage"];
    (
        usage["prompt_tokens"].as_u64().expect("prompt_tokens"),
        usage["completion_tokens"].as_u64().unwrap_or(0),
    )
}

async fn stats(gateway: &TestGateway) -> Value {
    let reply = gateway.get("/stats").await;
    assert_eq!(reply.status, StatusCode::OK);
    reply.json()
}

async fn concurrent(gateway: &TestGateway, body: &Value, n: usize) -> Vec<Reply> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let handle = gateway.clone_handle();
            let body = body.clone();
            tokio::spawn(async move { handle.post_with(CHAT, &body, &[]).await })
        })
        .collect();
    let mut replies = Vec::new();
    for task in tasks {
        replies.push(task.await.unwrap());
    }
    replies
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_coalesced_and_fifty_cached_repeats_are_ninety_nine_saved_responses() {
    let gateway = TestGateway::start(priced).await;
    let body = chat("how much did corral save us?");
    let herd = gateway.herd(CHAT, &body, 50, &[]).await;
    assert!(herd.iter().all(|r| r.status == StatusCode::OK));
    assert_eq!(count_status(&herd, "MISS"), 1);
    assert_eq!(count_status(&herd, "COALESCED"), 49);
    let repeats = concurrent(&gateway, &body, 50).await;
    assert_eq!(count_status(&repeats, "HIT"), 50);
    assert_eq!(gateway.provider.calls(), 1);

    let (prompt, completion) = usage_of(&herd[0]);
    assert!(prompt > 0 && completion > 0, "the mock reports usage");
    let one_cost = (prompt as f64 * INPUT + completion as f64 * OUTPUT) / 1e6;

    let m = scrape(&gateway).await;
    let model = ("model", "gpt-4o-mini");
    assert_eq!(sum(&m, "corral_upstream_requests_total", &[]), 1.0);
    assert_eq!(
        sum(
            &m,
            "corral_upstream_requests_total",
            &[("upstream", "mock"), model, ("status", "200")]
        ),
        1.0
    );
    assert_eq!(sum(&m, "corral_upstream_retries_total", &[]), 0.0);
    assert_eq!(sum(&m, "corral_saved_responses_total", &[model]), 99.0);
    assert_eq!(
        sum(&m, "corral_saved_responses_total", &[("via", "coalesced")]),
        49.0
    );
    assert_eq!(
        sum(&m, "corral_saved_responses_total", &[("via", "hit")]),
        50.0
    );
    let tokens = |kind, source| model_tokens(&m, "gpt-4o-mini", kind, source);
    assert_eq!(tokens("input", "saved"), 99.0 * prompt as f64);
    assert_eq!(tokens("output", "saved"), 99.0 * completion as f64);
    assert_eq!(tokens("input", "upstream"), prompt as f64);
    assert_eq!(tokens("output", "upstream"), completion as f64);
    let saved_usd = sum(&m, "corral_cost_usd_total", &[model, ("source", "saved")]);
    let spent_usd = sum(
        &m,
        "corral_cost_usd_total",
        &[model, ("source", "upstream")],
    );
    assert!(
        (saved_usd - 99.0 * one_cost).abs() < 1e-9,
        "saved {saved_usd} != {}",
        99.0 * one_cost
    );
    assert!((spent_usd - one_cost).abs() < 1e-9, "spent {spent_usd}");
    assert_eq!(requests_by_cache(&m, "chat"), (1.0, 49.0, 50.0));
    assert_eq!(
        sum(
            &m,
            "corral_request_duration_seconds",
            &[("endpoint", "chat")]
        ),
        100.0,
        "one latency observation per request"
    );
    assert_eq!(sum(&m, "corral_upstream_duration_seconds", &[]), 1.0);

    // /stats reads the same counters.
    let s = stats(&gateway).await;
    assert_eq!(s["requests"]["total"], 100);
    for cache in ["HIT", "STALE", "MISS", "COALESCED", "BYPASS", "ERROR"] {
        assert_eq!(
            s["requests"]["by_cache"][cache].as_f64().unwrap(),
            sum(&m, "corral_requests_total", &[("cache", cache)]),
            "{cache}"
        );
    }
    assert_eq!(s["upstream"]["calls"], 1);
    assert_eq!(s["upstream"]["retries"], 0);
    assert_eq!(s["saved_responses"]["total"], 99);
    assert_eq!(s["saved_responses"]["hit"], 50);
    assert_eq!(s["saved_responses"]["coalesced"], 49);
    assert_eq!(s["dedup_ratio"], 0.99);
    assert_eq!(s["tokens"]["saved"]["prompt"], 99 * prompt);
    assert_eq!(s["tokens"]["saved"]["completion"], 99 * completion);
    assert_eq!(s["tokens"]["upstream"]["prompt"], prompt);
    assert_eq!(s["cost_usd"]["saved"].as_f64().unwrap(), saved_usd);
    assert_eq!(s["cost_usd"]["upstream"].as_f64().unwrap(), spent_usd);
    assert_eq!(s["pricing_as_of"], "2026-03-21");
    let models = s["models"].as_array().unwrap();
    assert_eq!(models.len(), 1, "{models:?}");
    assert_eq!(models[0]["model"], "gpt-4o-mini");
    assert_eq!(models[0]["priced"], true);
    assert_eq!(models[0]["upstream_calls"], 1);
    assert_eq!(models[0]["cost_usd"]["saved"].as_f64().unwrap(), saved_usd);
    let history = s["history"].as_array().unwrap();
    assert!(history.len() >= 2, "start and now");
    assert_eq!(
        history.last().unwrap()["saved_usd"].as_f64().unwrap(),
        saved_usd
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exposition_parses_and_carries_every_contracted_family() {
    let gateway = TestGateway::start(priced).await;
    assert_eq!(gateway.post(CHAT, &chat("one")).await.cache(), "MISS");
    assert_eq!(gateway.post(CHAT, &chat("one")).await.cache(), "HIT");
    let bypass = gateway
        .post_with(CHAT, &chat("two"), &[("cache-control", "no-store")])
        .await;
    assert_eq!(bypass.cache(), "BYPASS");
    let embedded = gateway.post("/v1/embeddings", &embedding("vectors")).await;
    assert_eq!(embedded.status, StatusCode::OK);
    let bad = gateway.post_raw(CHAT, "{not json", &[]).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    gateway.provider.push_script(Scripted::json(200, NO_USAGE));
    assert_eq!(gateway.post(CHAT, &chat("three")).await.cache(), "MISS");

    let m = scrape(&gateway).await;
    for family in [
        "corral_requests_total",
        "corral_upstream_requests_total",
        "corral_upstream_retries_total",
        "corral_tokens_total",
        "corral_cost_usd_total",
        "corral_saved_responses_total",
        "corral_inflight_flights",
        "corral_waiters",
        "corral_request_duration_seconds",
        "corral_upstream_duration_seconds",
        "corral_redis_errors_total",
        "corral_cache_entries",
        "corral_usage_estimated_total",
    ] {
        assert!(
            m.docs.contains_key(family) || m.samples.iter().any(|s| s.metric == family),
            "{family} missing"
        );
    }
    let kind = |metric: &str| {
        m.samples
            .iter()
            .find(|s| s.metric == metric)
            .map(|s| std::mem::discriminant(&s.value))
    };
    assert_eq!(
        kind("corral_requests_total"),
        Some(std::mem::discriminant(&Sample::Counter(0.0)))
    );
    assert_eq!(
        kind("corral_waiters"),
        Some(std::mem::discriminant(&Sample::Gauge(0.0)))
    );
    assert_eq!(
        kind("corral_request_duration_seconds"),
        Some(std::mem::discriminant(&Sample::Histogram(vec![])))
    );
    assert_eq!(sum(&m, "corral_redis_errors_total", &[]), 0.0);
    assert_eq!(
        sum(&m, "corral_requests_total", &[("cache", "BYPASS")]),
        1.0
    );
    assert_eq!(sum(&m, "corral_requests_total", &[("cache", "ERROR")]), 1.0);
    // The answer without usage was billed an estimate, and says so.
    assert_eq!(
        sum(
            &m,
            "corral_usage_estimated_total",
            &[("reason", "unreported")]
        ),
        1.0
    );
    assert_eq!(
        sum(
            &m,
            "corral_requests_total",
            &[("endpoint", "embeddings"), ("cache", "MISS")]
        ),
        1.0
    );
    // Four calls: two MISSes, the BYPASS and the embedding; the HIT and the 400 made none.
    assert_eq!(sum(&m, "corral_upstream_requests_total", &[]), 4.0);
    assert_eq!(gateway.provider.calls(), 4);
    // Embeddings count their input tokens, and no completion tokens.
    let (input, _) = usage_of(&embedded);
    let embedding_model = ("model", "text-embedding-3-small");
    assert_eq!(
        sum(
            &m,
            "corral_tokens_total",
            &[embedding_model, ("kind", "input"), ("source", "upstream")]
        ),
        input as f64
    );
    assert_eq!(
        sum(
            &m,
            "corral_tokens_total",
            &[embedding_model, ("kind", "output")]
        ),
        0.0
    );
    let cost = sum(&m, "corral_cost_usd_total", &[embedding_model]);
    assert!((cost - input as f64 * 0.02 / 1e6).abs() < 1e-12, "{cost}");
    // corral_cache_entries is present (above) but approximate: moka counts lazily.

    // The shipped Grafana dashboard queries only families this exposition has.
    let exported: Vec<&str> = m.docs.keys().map(String::as_str).collect();
    let dashboard: Value = serde_json::from_str(include_str!("../../deploy/grafana/corral.json"))
        .expect("the dashboard is JSON");
    let mut titles = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        titles.push(panel["title"].as_str().unwrap().to_lowercase());
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            for (at, _) in expr.match_indices("corral_") {
                let name: String = expr[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                let family = name.strip_suffix("_bucket").unwrap_or(&name);
                assert!(
                    exported.contains(&family),
                    "{family} in `{expr}` is not exported"
                );
            }
        }
    }
    for needed in [
        "cache status",
        "dedup ratio",
        "per hour",
        "upstream latency",
        "retries",
        "redis errors",
    ] {
        assert!(
            titles.iter().any(|t| t.contains(needed)),
            "no `{needed}` panel in {titles:?}"
        );
    }
}

#[tokio::test]
async fn model_labels_stay_bounded_and_carry_no_tenant_prompt_or_fingerprint() {
    let gateway = TestGateway::start(priced).await;
    let token = "sk-tenant-label-canary-123";
    let auth = format!("Bearer {token}");
    let prompt = "label canary prompt";
    let mut dated = chat(prompt);
    dated["model"] = json!("gpt-4o-mini-2024-07-18");
    let mut invented = chat(prompt);
    invented["model"] = json!("model-a-caller-made-up-7f3a");
    let a = gateway
        .post_with(CHAT, &dated, &[("authorization", &auth)])
        .await;
    let b = gateway
        .post_with(CHAT, &invented, &[("authorization", &auth)])
        .await;
    assert_eq!((a.status, b.status), (StatusCode::OK, StatusCode::OK));

    let m = scrape(&gateway).await;
    assert_eq!(
        sum(
            &m,
            "corral_upstream_requests_total",
            &[("model", "gpt-4o-mini-*")]
        ),
        1.0,
        "a dated snapshot is billed under its glob"
    );
    assert_eq!(
        sum(&m, "corral_upstream_requests_total", &[("model", "other")]),
        1.0,
        "an unpriced, unrouted-by-name model is `other`"
    );
    assert_eq!(
        sum(&m, "corral_cost_usd_total", &[("model", "other")]),
        0.0,
        "no price, no invented cost"
    );
    let fingerprints: Vec<String> = [&a, &b]
        .iter()
        .map(|r| r.header("x-corral-fingerprint").unwrap().to_owned())
        .collect();
    for sample in &m.samples {
        for (name, value) in sample.labels.iter() {
            assert!(
                [
                    "endpoint",
                    "cache",
                    "upstream",
                    "member",
                    "from",
                    "to",
                    "model",
                    "status",
                    "kind",
                    "source",
                    "via",
                    "le",
                    "gen_ai_operation_name",
                    "gen_ai_request_model",
                    "gen_ai_token_type",
                    "reason"
                ]
                .contains(&name.as_str()),
                "unexpected label {name}"
            );
            assert!(
                !value.contains(token) && !value.contains(prompt),
                "{name}={value}"
            );
            assert!(
                !value.contains("made-up") && !value.contains("2024-07-18"),
                "a caller's model name became a label: {value}"
            );
            for fingerprint in &fingerprints {
                assert!(!value.contains(&fingerprint[..12]), "{name}={value}");
            }
        }
    }
}

#[tokio::test]
async fn an_upstream_answer_without_usage_is_billed_an_estimate_and_a_saving_stays_unknown() {
    let gateway = TestGateway::start(priced).await;
    gateway.provider.push_script(Scripted::json(200, NO_USAGE));
    let body = chat("a provider that omits usage");
    assert_eq!(gateway.post(CHAT, &body).await.cache(), "MISS");
    assert_eq!(gateway.post(CHAT, &body).await.cache(), "HIT");

    let m = scrape(&gateway).await;
    let model = ("model", "gpt-4o-mini");
    // The call was paid for: billed an estimate (request bytes / 4), which
    // `/metrics` says; what a hit saved of it is not invented.
    assert_eq!(
        sum(
            &m,
            "corral_usage_estimated_total",
            &[model, ("reason", "unreported")]
        ),
        1.0
    );
    assert_eq!(
        sum(
            &m,
            "corral_usage_unknown_total",
            &[model, ("source", "upstream")]
        ),
        0.0
    );
    assert_eq!(
        sum(
            &m,
            "corral_usage_unknown_total",
            &[model, ("source", "saved")]
        ),
        1.0
    );
    assert_eq!(sum(&m, "corral_saved_responses_total", &[model]), 1.0);
    assert!(sum(&m, "corral_tokens_total", &[("source", "upstream")]) > 0.0);
    assert_eq!(sum(&m, "corral_tokens_total", &[("source", "saved")]), 0.0);
    let s = stats(&gateway).await;
    assert_eq!(s["usage_unknown"], json!({"upstream": 0, "saved": 1}));
    assert_eq!(s["cost_usd"]["saved"], 0.0);
}

#[tokio::test]
async fn retries_failures_and_errors_are_counted_once_per_call() {
    let gateway = TestGateway::start(|config| {
        priced(config);
        config.retry.max_attempts = 3;
    })
    .await;
    let overloaded =
        r#"{"error":{"message":"busy","type":"overloaded","param":null,"code":"overloaded"}}"#;
    gateway
        .provider
        .push_script(Scripted::json(503, overloaded));
    assert_eq!(
        gateway.post(CHAT, &chat("after one retry")).await.status,
        StatusCode::OK
    );
    let invalid =
        r#"{"error":{"message":"no","type":"invalid_request_error","param":null,"code":null}}"#;
    gateway.provider.push_script(Scripted::json(400, invalid));
    let rejected = gateway.post(CHAT, &chat("rejected upstream")).await;
    assert_eq!(rejected.status, StatusCode::BAD_REQUEST);

    let m = scrape(&gateway).await;
    assert_eq!(gateway.provider.calls(), 3);
    assert_eq!(
        sum(&m, "corral_upstream_requests_total", &[]),
        2.0,
        "two calls, three attempts"
    );
    assert_eq!(
        sum(&m, "corral_upstream_requests_total", &[("status", "200")]),
        1.0
    );
    assert_eq!(
        sum(&m, "corral_upstream_requests_total", &[("status", "400")]),
        1.0
    );
    assert_eq!(
        sum(&m, "corral_upstream_retries_total", &[("upstream", "mock")]),
        1.0
    );
    assert_eq!(sum(&m, "corral_requests_total", &[("cache", "MISS")]), 1.0);
    assert_eq!(sum(&m, "corral_requests_total", &[("cache", "ERROR")]), 1.0);
    let s = stats(&gateway).await;
    assert_eq!(s["upstream"]["retries"], 1);
    assert_eq!(s["upstream"]["by_status"], json!({"200": 1, "400": 1}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_answer_is_saved_and_its_refresh_is_paid() {
    let gateway = TestGateway::start(|config| {
        priced(config);
        config.cache.soft_ttl = Duration::from_secs(1);
        config.cache.hard_ttl = Duration::from_secs(10);
        config.cache.early_refresh_beta = 0.0;
    })
    .await;
    let body = chat("stale but saved");
    let first = gateway.post(CHAT, &body).await;
    assert_eq!(first.cache(), "MISS");
    gateway.clock.advance(Duration::from_secs(2));
    assert_eq!(gateway.post(CHAT, &body).await.cache(), "STALE");
    gateway.wait_idle().await;

    let m = scrape(&gateway).await;
    assert_eq!(
        sum(&m, "corral_saved_responses_total", &[("via", "stale")]),
        1.0
    );
    assert_eq!(
        sum(&m, "corral_upstream_requests_total", &[]),
        2.0,
        "the first call and the background refresh"
    );
    let (prompt, _) = usage_of(&first);
    assert_eq!(
        sum(
            &m,
            "corral_tokens_total",
            &[("kind", "input"), ("source", "upstream")]
        ),
        2.0 * prompt as f64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gauges_show_the_flight_and_its_waiters_while_it_runs() {
    let gateway = TestGateway::start(priced).await;
    gateway.provider.hold();
    let body = chat("held in flight");
    let tasks: Vec<_> = (0..3)
        .map(|_| {
            let handle = gateway.clone_handle();
            let body = body.clone();
            tokio::spawn(async move { handle.post_with(CHAT, &body, &[]).await })
        })
        .collect();
    gateway.wait_for_waiters(3).await;
    let during = scrape(&gateway).await;
    assert_eq!(sum(&during, "corral_inflight_flights", &[]), 1.0);
    assert_eq!(sum(&during, "corral_waiters", &[]), 3.0);
    let s = stats(&gateway).await;
    assert_eq!(
        (s["in_flight"].as_i64(), s["waiters"].as_i64()),
        (Some(1), Some(3))
    );
    gateway.provider.release();
    for task in tasks {
        assert_eq!(task.await.unwrap().status, StatusCode::OK);
    }
    gateway.wait_idle().await;
    let after = scrape(&gateway).await;
    assert_eq!(sum(&after, "corral_inflight_flights", &[]), 0.0);
    assert_eq!(sum(&after, "corral_waiters", &[]), 0.0);
}

#[tokio::test]
async fn every_response_carries_a_request_id() {
    let gateway = TestGateway::start(priced).await;
    let sane = gateway
        .post_with(
            CHAT,
            &chat("with an id"),
            &[("x-request-id", "client-chosen-42")],
        )
        .await;
    assert_eq!(sane.header("x-request-id"), Some("client-chosen-42"));
    let long = "x".repeat(129);
    for bad in [long.as_str(), "has spaces in it"] {
        let reply = gateway
            .post_with(CHAT, &chat("with a bad id"), &[("x-request-id", bad)])
            .await;
        let id = reply.header("x-request-id").expect("a generated id");
        assert_ne!(id, bad);
        assert_eq!(id.len(), 32);
    }
    let generated = gateway.post(CHAT, &chat("without an id")).await;
    let other = gateway.post(CHAT, &chat("without an id")).await;
    assert_ne!(
        generated.header("x-request-id"),
        other.header("x-request-id")
    );
    // Errors, fallbacks and the non-API routes too.
    let error = gateway
        .post_raw(CHAT, "{", &[("x-request-id", "err-1")])
        .await;
    assert_eq!(error.status, StatusCode::BAD_REQUEST);
    assert_eq!(error.header("x-request-id"), Some("err-1"));
    for path in ["/healthz", "/metrics", "/stats", "/", "/no/such/path"] {
        let reply = gateway.get(path).await;
        assert!(reply.header("x-request-id").is_some(), "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn coalesced_and_replayed_streams_count_their_savings() {
    let gateway = TestGateway::start(priced).await;
    let mut body = chat("stream the savings");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let herd = gateway.herd(CHAT, &body, 10, &[]).await;
    assert_eq!(count_status(&herd, "MISS"), 1);
    assert_eq!(count_status(&herd, "COALESCED"), 9);
    // A streamed caller has its answer at `[DONE]`, a moment before the
    // flight stores it and ends; repeats sent in that moment would join the
    // flight (COALESCED). The repeats here are the cache's.
    gateway.wait_idle().await;
    let repeats = concurrent(&gateway, &body, 5).await;
    assert_eq!(count_status(&repeats, "HIT"), 5);
    assert_eq!(gateway.provider.calls(), 1);
    // The usage chunk the callers asked for.
    let text = std::str::from_utf8(&herd[0].body).unwrap();
    let usage: Value = text
        .split("\n\n")
        .filter_map(|frame| frame.strip_prefix("data: "))
        .filter_map(|json| serde_json::from_str::<Value>(json).ok())
        .find_map(|chunk| chunk.get("usage").filter(|u| !u.is_null()).cloned())
        .expect("a usage chunk");
    let prompt = usage["prompt_tokens"].as_f64().unwrap();
    let completion = usage["completion_tokens"].as_f64().unwrap();

    let m = scrape(&gateway).await;
    assert_eq!(
        sum(&m, "corral_upstream_requests_total", &[("status", "200")]),
        1.0
    );
    assert_eq!(sum(&m, "corral_saved_responses_total", &[]), 14.0);
    let tokens = |kind, source| {
        sum(
            &m,
            "corral_tokens_total",
            &[("kind", kind), ("source", source)],
        )
    };
    assert_eq!(tokens("input", "upstream"), prompt);
    assert_eq!(tokens("output", "upstream"), completion);
    assert_eq!(tokens("input", "saved"), 14.0 * prompt);
    assert_eq!(tokens("output", "saved"), 14.0 * completion);
    let saved = sum(&m, "corral_cost_usd_total", &[("source", "saved")]);
    let expected = 14.0 * (prompt * INPUT + completion * OUTPUT) / 1e6;
    assert!((saved - expected).abs() < 1e-9, "{saved} != {expected}");
    assert_eq!(sum(&m, "corral_usage_unknown_total", &[]), 0.0);
}
