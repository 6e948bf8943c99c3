//! Budgets that cache hits never burn: a tenant over its spend budget or token
//! rate is refused a new upstream call (429 in its API's shape, `Retry-After`
//! to the window's end), while its cached prompts and the flights it already
//! shares are served; other tenants are served throughout; across instances
//! with Redis the spend is one, and survives restarts.

use std::time::Duration;

use corral::{
    budget::BudgetRule,
    config::{Api, Config, ModelPrice, PriceTable, TenantLimitsConfig},
};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{
    harness::{Fleet, Reply, TestGateway, chat, redis_at},
    redis_server::RedisServer,
};

const PATH: &str = "/v1/chat/completions";
const MESSAGES: &str = "/v1/messages";

/// $100 per million tokens, in and out, for every model the budget tests
/// call (chat, Messages, Gemini, images): a short chat costs about $0.002.
/// Shared by the tests of every path that spends (`no_store_billing`,
/// `budget_paths`, `tenant_keys`).
pub(crate) fn dear_prices(config: &mut Config) {
    let dear = ModelPrice {
        input: 100.0,
        output: 100.0,
        cached_input: None,
        cache_write: None,
    };
    config.pricing.models = PriceTable(
        ["gpt-4o-mini", "gpt-image-1", "claude-*", "gemini-*"]
            .into_iter()
            .map(|model| (model.into(), dear))
            .collect(),
    );
}

/// An `api: anthropic` upstream on the same mock, serving `claude-*`.
pub(crate) fn with_messages(config: &mut Config) {
    let mut anthropic = config.upstreams[0].clone();
    anthropic.name = "anthropic".into();
    anthropic.api = Api::Anthropic;
    anthropic.models = vec!["claude-*".into()];
    config.upstreams.push(anthropic);
}

pub(crate) fn rule(
    tenant: Option<&str>,
    upstream: Option<&str>,
    usd: f64,
    per: &str,
) -> BudgetRule {
    BudgetRule {
        tenant: tenant.map(str::to_owned),
        upstream: upstream.map(str::to_owned),
        usd,
        per: per.parse().unwrap(),
    }
}

/// A gateway at [`dear_prices`] with `rules`.
async fn budgeted(rules: Vec<BudgetRule>) -> TestGateway {
    TestGateway::start(|config| {
        dear_prices(config);
        config.budgets = rules;
    })
    .await
}

/// `key`'s caller posting `body` in a task of its own.
fn spawn_as(gateway: &TestGateway, key: &str, body: &Value) -> tokio::task::JoinHandle<Reply> {
    let (handle, body, auth) = (gateway.clone_handle(), body.clone(), auth(key));
    tokio::spawn(async move {
        handle
            .post_with(PATH, &body, &[("authorization", auth.as_str())])
            .await
    })
}

pub(crate) fn auth(key: &str) -> String {
    format!("Bearer {key}")
}

pub(crate) async fn post_as(gateway: &TestGateway, key: &str, path: &str, body: &Value) -> Reply {
    let auth = auth(key);
    gateway
        .post_with(path, body, &[("authorization", auth.as_str())])
        .await
}

/// The tenant's name as budgets and `/stats` know it.
fn tenant_of(gateway: &TestGateway, key: &str) -> std::sync::Arc<str> {
    gateway
        .state
        .auth()
        .tenant_label(Some(key.as_bytes()), None)
}

fn remaining(reply: &Reply) -> f64 {
    reply
        .header("x-corral-budget-remaining-usd")
        .expect("a billed answer says what is left")
        .parse()
        .unwrap()
}

/// Seconds from the gateway's clock to the end of its window of `length`.
fn seconds_to_end(gateway: &TestGateway, length: Duration) -> u64 {
    let now = corral::clock::Clock::now_ms(&*gateway.clock);
    let length = length.as_millis() as u64;
    (length - now % length).div_ceil(1000)
}

/// Sends tenant `key` distinct prompts until one is refused; returns the
/// served replies and the refusal.
async fn spend_until_refused(gateway: &TestGateway, key: &str, tag: &str) -> (Vec<Reply>, Reply) {
    let mut served = Vec::new();
    for i in 0..50 {
        let reply = post_as(gateway, key, PATH, &chat(&format!("{tag} {i}"))).await;
        if reply.status == StatusCode::TOO_MANY_REQUESTS {
            return (served, reply);
        }
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
        served.push(reply);
    }
    panic!("{key} was never refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_daily_budget_is_refused_new_calls_and_served_everything_shared() {
    let gateway = TestGateway::start(|config| {
        dear_prices(config);
        with_messages(config);
        config.budgets = vec![rule(Some("*"), None, 0.01, "day")];
    })
    .await;
    let before = gateway.provider.calls();
    let first = post_as(&gateway, "sk-a", PATH, &chat("a's cached question")).await;
    assert_eq!(first.cache(), "MISS");
    let (served, refused) = spend_until_refused(&gateway, "sk-a", "a spends").await;
    let calls_served = 1 + served.len() as u64;
    assert!(
        calls_served >= 3,
        "$0.01 lasts a few calls ({calls_served})"
    );
    // Served while something was left; the last billed answer used it up.
    let last = served.last().unwrap();
    assert_eq!(remaining(last), 0.0);
    assert!(remaining(&served[served.len() - 2]) > 0.0);
    assert_eq!(
        gateway.provider.calls() - before,
        calls_served,
        "the refusal went nowhere"
    );

    // OpenAI's shape, Retry-After to the next UTC midnight, not worth an SDK retry.
    let error = &refused.json()["error"];
    assert_eq!(error["code"], "budget_exceeded");
    assert!(
        error["message"].as_str().unwrap().contains("budget"),
        "{error}"
    );
    let midnight = seconds_to_end(&gateway, Duration::from_secs(86_400));
    let retry_after: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!(
        retry_after.abs_diff(midnight) <= 1,
        "{retry_after} vs {midnight}"
    );
    assert_eq!(refused.header("x-should-retry"), Some("false"));

    // Anthropic's shape for a Messages request.
    let message = json!({"model": "claude-sonnet-4-5", "max_tokens": 64,
        "messages": [{"role": "user", "content": "a's message"}]});
    let refused = post_as(&gateway, "sk-a", MESSAGES, &message).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let body = refused.json();
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "rate_limit_error");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("budget"),
        "{body}"
    );

    // A's cached prompt is still answered; B is served.
    let again = post_as(&gateway, "sk-a", PATH, &chat("a's cached question")).await;
    assert_eq!((again.status, again.cache()), (StatusCode::OK, "HIT"));
    let b = post_as(&gateway, "sk-b", PATH, &chat("b's question")).await;
    assert_eq!((b.status, b.cache()), (StatusCode::OK, "MISS"));
    assert!(remaining(&b) > 0.0);
    let b = post_as(&gateway, "sk-b", MESSAGES, &message).await;
    assert_eq!(b.status, StatusCode::OK);

    // /metrics: the rule's budget and the most one tenant (A) billed
    // against it; tenants are never labels (their own uses are on /stats).
    let metrics = String::from_utf8(gateway.get("/metrics").await.body.to_vec()).unwrap();
    let gauge = |name: &str| -> f64 {
        let prefix = format!("{name}{{budget=\"every tenant\",per=\"day\"}} ");
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no {prefix} in {metrics}"))
            .parse()
            .unwrap()
    };
    assert_eq!(gauge("corral_budget_usd"), 0.01);
    assert!(gauge("corral_budget_spent_usd") >= 0.01);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_sharing_a_flight_started_before_the_limit_get_its_answer() {
    let gateway = budgeted(vec![rule(Some("*"), None, 0.01, "day")]).await;
    let body = chat("a's long question");
    gateway.provider.hold();
    let owner = spawn_as(&gateway, "sk-a", &body);
    gateway.wait_for_calls(1).await;
    // Meanwhile A's other calls use the budget up.
    let (a, upstream) = (tenant_of(&gateway, "sk-a"), "mock".into());
    gateway
        .state
        .budgets()
        .spend(&a, &upstream, Some(10_000_000_000_000), 0);
    let followers: Vec<_> = (0..5).map(|_| spawn_as(&gateway, "sk-a", &body)).collect();
    gateway.wait_for_waiters(6).await;
    gateway.provider.release();
    let owner = owner.await.unwrap();
    assert_eq!((owner.status, owner.cache()), (StatusCode::OK, "MISS"));
    for follower in followers {
        let follower = follower.await.unwrap();
        assert_eq!(
            (follower.status, follower.cache()),
            (StatusCode::OK, "COALESCED")
        );
        assert_eq!(follower.body, owner.body);
    }
    assert_eq!(gateway.provider.calls(), 1);
    let refused = post_as(&gateway, "sk-a", PATH, &chat("a new question")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_window_rolls_over_and_the_tenant_is_served_again() {
    let gateway = budgeted(vec![rule(Some("*"), None, 0.004, "5s")]).await;
    let (_, refused) = spend_until_refused(&gateway, "sk-a", "in window one").await;
    let retry_after: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=5).contains(&retry_after), "{retry_after}");
    assert!(
        refused.header("x-should-retry").is_none(),
        "a short wait is worth the SDK's retry"
    );
    gateway.clock.advance(Duration::from_secs(retry_after));
    let served = post_as(&gateway, "sk-a", PATH, &chat("in window two")).await;
    assert_eq!((served.status, served.cache()), (StatusCode::OK, "MISS"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_rate_counts_billed_tokens_and_a_thousand_hits_count_nothing() {
    let gateway = TestGateway::start(|config| {
        config.limits.per_tenant = Some(TenantLimitsConfig {
            tokens_per_minute: Some(1000),
            ..TenantLimitsConfig::default()
        });
    })
    .await;
    let cached = post_as(&gateway, "sk-a", PATH, &chat("a cached question")).await;
    assert_eq!(cached.cache(), "MISS");
    for _ in 0..1000 {
        let hit = post_as(&gateway, "sk-a", PATH, &chat("a cached question")).await;
        assert_eq!((hit.status, hit.cache()), (StatusCode::OK, "HIT"));
    }
    // About 300 billed tokens a call: the fourth passes 1,000.
    let long = "word ".repeat(1000);
    let mut billed = cached.json()["usage"]["total_tokens"].as_u64().unwrap();
    let mut i = 0;
    let refused = loop {
        let reply = post_as(&gateway, "sk-a", PATH, &chat(&format!("{i} {long}"))).await;
        if reply.status == StatusCode::TOO_MANY_REQUESTS {
            break reply;
        }
        assert_eq!(reply.status, StatusCode::OK);
        assert!(billed < 1000, "served although {billed} tokens were billed");
        billed += reply.json()["usage"]["total_tokens"].as_u64().unwrap();
        i += 1;
        assert!(i < 20, "never refused");
    };
    assert!(billed >= 1000);
    assert_eq!(refused.json()["error"]["code"], "token_rate_exceeded");
    let b = post_as(&gateway, "sk-b", PATH, &chat(&format!("b {long}"))).await;
    assert_eq!(b.status, StatusCode::OK, "another tenant has its own rate");
    let hit = post_as(&gateway, "sk-a", PATH, &chat("a cached question")).await;
    assert_eq!(hit.cache(), "HIT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_cap_on_an_upstream_refuses_every_tenants_misses_and_serves_hits() {
    let gateway = budgeted(vec![rule(None, Some("mock"), 0.01, "month")]).await;
    let cached = post_as(&gateway, "sk-b", PATH, &chat("b's cached question")).await;
    assert_eq!(cached.cache(), "MISS");
    let (_, refused) = spend_until_refused(&gateway, "sk-a", "a spends the account").await;
    assert!(
        refused.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("upstream mock"),
        "{:?}",
        refused.body
    );
    let b = post_as(&gateway, "sk-b", PATH, &chat("b's new question")).await;
    assert_eq!(
        b.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the cap is the account's"
    );
    let hit = post_as(&gateway, "sk-b", PATH, &chat("b's cached question")).await;
    assert_eq!((hit.status, hit.cache()), (StatusCode::OK, "HIT"));
}

/// Two instances with Redis: A's spend on each counts toward one budget; the
/// overshoot is at most one call (calls go one at a time, and both instances
/// flush after each); two new instances on the same Redis refuse A from its
/// first request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_a_tenants_budget_and_restarts_keep_it() {
    let redis = RedisServer::spawn().await;
    let adjust = |config: &mut Config| {
        dear_prices(config);
        config.budgets = vec![rule(Some("*"), None, 0.01, "day")];
        config.redis = Some(redis_at(&redis.url()));
    };
    let fleet = Fleet::start(2, adjust).await;
    for gateway in &fleet.instances {
        gateway.wait_connected().await;
    }
    let mut spent = Vec::new();
    let mut refused = None;
    for i in 0..50 {
        let gateway = &fleet.instances[i % 2];
        let reply = post_as(gateway, "sk-a", PATH, &chat(&format!("a on both {i}"))).await;
        if reply.status == StatusCode::TOO_MANY_REQUESTS {
            refused = Some((i % 2, reply));
            break;
        }
        assert_eq!(reply.status, StatusCode::OK);
        spent.push(remaining(&reply));
        // Each sends what it spent, then each reads what all sent.
        for gateway in fleet.instances.iter().chain(&fleet.instances) {
            gateway.state.budgets().flush().await.expect("Redis is up");
        }
    }
    let (_, refused) = refused.unwrap_or_else(|| panic!("A was refused: {spent:?}"));
    assert_eq!(refused.json()["error"]["code"], "budget_exceeded");
    assert!(spent.len() >= 3, "{spent:?}");
    // Each instance's answer says what is left of the one budget: it falls
    // with every call, whichever instance made it.
    assert!(spent.windows(2).all(|pair| pair[1] < pair[0]), "{spent:?}");
    // The overshoot is at most the last call's cost.
    let per_call = spent[0] - spent[1];
    let total = fleet.instances[0].state.budgets().uses()[0].spent_usd;
    assert!(
        total >= 0.01 && total <= 0.01 + 1.5 * per_call,
        "{total} (a call ≈ {per_call})"
    );
    let b = post_as(&fleet.instances[1], "sk-b", PATH, &chat("b on two")).await;
    assert_eq!(b.status, StatusCode::OK);

    for gateway in fleet.instances {
        gateway.stop().await;
    }
    let restarted = Fleet::start(2, adjust).await;
    for gateway in &restarted.instances {
        gateway.wait_connected().await;
        let refused = post_as(gateway, "sk-a", PATH, &chat("a after the restart")).await;
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    }
}

/// B3: a model no price names is not free against a USD budget. Its tokens
/// spend at `pricing.unpriced` (here $100 per million), or by default at the
/// dearest rates the snapshot knows; its cost on `/metrics` stays unpriced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unpriced_model_spends_against_the_budget_and_is_refused() {
    for configured in [true, false] {
        let gateway = TestGateway::start(|config| {
            config.upstreams[0].models = vec!["my-finetune".into()];
            config.pricing.models = PriceTable(Vec::new());
            config.pricing.snapshot = true;
            config.pricing.unpriced = configured.then_some(ModelPrice {
                input: 100.0,
                output: 100.0,
                cached_input: None,
                cache_write: None,
            });
            config.budgets = vec![rule(Some("*"), None, 0.004, "day")];
        })
        .await;
        let mut served = 0;
        let refused = loop {
            assert!(served < 50, "configured {configured}: never refused");
            let mut body = chat(&format!("unpriced {served}"));
            body["model"] = json!("my-finetune");
            let reply = post_as(&gateway, "sk-a", PATH, &body).await;
            if reply.status == StatusCode::TOO_MANY_REQUESTS {
                break reply;
            }
            assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
            served += 1;
        };
        assert_eq!(refused.json()["error"]["code"], "budget_exceeded");
        assert!(
            served >= 1,
            "configured {configured}: the first call is served"
        );
        let metrics = gateway.get("/metrics").await;
        let text = String::from_utf8_lossy(&metrics.body);
        assert!(
            text.lines()
                .any(|line| line.starts_with("corral_unpriced_tokens_total")
                    && line.contains("my-finetune")),
            "its tokens are counted as unpriced:\n{text}"
        );
    }
}
