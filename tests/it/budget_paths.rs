//! Budgets hold on every path a call can take upstream: a percent-encoded
//! spelling of a deduplicated endpoint is that endpoint (cached, coalesced,
//! budgeted); a paid pass-through call (images, audio, anything not known to
//! be free) is admitted by the budgets, booked as a call and spends the usage
//! its answer reports; a background refresh (STALE's, or XFetch's early one)
//! is the gateway's own call, spending no tenant's budget but counted by the
//! upstream's account cap.

use std::{sync::Arc, time::Duration};

use mock_upstream::Scripted;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{
    budgets::{auth, dear_prices, post_as, rule},
    harness::{Reply, TestGateway, WAIT, chat, embedding, exact_ttls},
};

const PATH: &str = "/v1/chat/completions";
const IMAGES: &str = "/v1/images/generations";

async fn get_as(gateway: &TestGateway, key: &str, path: &str) -> Reply {
    gateway
        .get_with(path, &[("authorization", auth(key).as_str())])
        .await
}

/// A pass-through `POST /v1/audio/transcriptions` (multipart, naming its model) as `key`.
async fn transcribe_as(gateway: &TestGateway, key: &str) -> Reply {
    let boundary = "corral-budget-paths";
    let upload = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n--{boundary}--\r\n"
    );
    let content_type = format!("multipart/form-data; boundary={boundary}");
    let auth = auth(key);
    gateway
        .post_raw(
            "/v1/audio/transcriptions",
            upload,
            &[
                ("content-type", content_type.as_str()),
                ("authorization", auth.as_str()),
            ],
        )
        .await
}

/// The tenant's name as budgets and `/stats` know it.
fn tenant_of(gateway: &TestGateway, key: &str) -> Arc<str> {
    gateway
        .state
        .auth()
        .tenant_label(Some(key.as_bytes()), None)
}

/// What the budget of `subject` (`tenant x`, `upstream mock`) spent in its window.
fn spent(gateway: &TestGateway, subject: &str) -> f64 {
    gateway
        .state
        .budgets()
        .uses()
        .into_iter()
        .find(|used| used.subject == subject)
        .map_or(0.0, |used| used.spent_usd)
}

/// The `/stats` entry of tenant `name`, if it has one.
async fn tenant_stats(gateway: &TestGateway, name: &str) -> Option<Value> {
    let stats = gateway.get("/stats").await.json();
    stats["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|tenant| tenant["name"] == name)
        .cloned()
}

fn assert_budget_refusal(reply: &Reply) {
    assert_eq!(
        reply.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{:?}",
        reply.body
    );
    assert_eq!(reply.json()["error"]["code"], "budget_exceeded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_percent_encoded_deduplicated_path_is_that_endpoint() {
    let gateway = TestGateway::start(|config| {
        dear_prices(config);
        config.budgets = vec![rule(Some("*"), None, 0.01, "day")];
    })
    .await;
    let body = chat("spelled three ways");
    let first = post_as(&gateway, "sk-a", "/v1/chat/%63ompletions", &body).await;
    assert_eq!(
        (first.status, first.cache()),
        (StatusCode::OK, "MISS"),
        "deduplicated, not proxied"
    );
    for path in ["/v1/%63hat/completions", PATH, "/v1/chat/%63%6Fmpletions"] {
        let again = post_as(&gateway, "sk-a", path, &body).await;
        assert_eq!(
            (again.status, again.cache()),
            (StatusCode::OK, "HIT"),
            "{path}"
        );
        assert_eq!(again.body, first.body, "{path}");
    }
    assert_eq!(gateway.provider.calls(), 1);
    let embedded = post_as(&gateway, "sk-a", "/v1/%65mbeddings", &embedding("encoded")).await;
    assert_eq!(
        (embedded.status, embedded.cache()),
        (StatusCode::OK, "MISS")
    );

    // The encoded spelling spends the budget and is refused past it.
    let mut refused = None;
    for i in 0..50 {
        let reply = post_as(
            &gateway,
            "sk-a",
            "/v1/chat/%63ompletions",
            &chat(&format!("spend {i}")),
        )
        .await;
        if reply.status == StatusCode::TOO_MANY_REQUESTS {
            refused = Some(reply);
            break;
        }
        assert_eq!(reply.cache(), "MISS", "{:?}", reply.body);
    }
    let refused = refused.expect("the encoded path was refused once the budget was spent");
    assert_budget_refusal(&refused);
    let calls = gateway.provider.calls();
    let proxied = post_as(
        &gateway,
        "sk-a",
        "/v1/chat/%63ompletions",
        &chat("one more"),
    )
    .await;
    assert_budget_refusal(&proxied);
    assert_eq!(gateway.provider.calls(), calls, "the refusal went nowhere");
}

/// gpt-image-1's answer with its `usage` (after the image data, as OpenAI
/// sends it): 100k output tokens at $100 per million are $10.
const IMAGE_WITH_USAGE: &str = r#"{"created":1700000000,"data":[{"b64_json":"bW9jayBpbWFnZSAiYSIgd2l0aCAifSIgYW5kIFwiZXNjYXBlc1wi","revised_prompt":"a \"usage\": {\"input_tokens\": 1} in a prompt, } ]"}],"output_format":"png","usage":{"input_tokens":50,"input_tokens_details":{"image_tokens":0,"text_tokens":50},"output_tokens":100000,"total_tokens":100050}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paid_pass_through_calls_are_budgeted_booked_and_spend_what_they_report() {
    let gateway = TestGateway::start(|config| {
        dear_prices(config);
        config.budgets = vec![rule(Some("*"), None, 0.01, "day")];
    })
    .await;
    let a = tenant_of(&gateway, "sk-a");
    let image = json!({"model": "gpt-image-1", "prompt": "a corral at dawn"});
    gateway
        .provider
        .push_script(Scripted::json(200, IMAGE_WITH_USAGE));
    let drawn = post_as(&gateway, "sk-a", IMAGES, &image).await;
    assert_eq!(drawn.status, StatusCode::OK, "{:?}", drawn.body);
    assert_eq!(drawn.body, IMAGE_WITH_USAGE, "relayed byte for byte");
    // Booked once the body ended (bounded poll: the booking follows the last byte).
    let deadline = tokio::time::Instant::now() + WAIT;
    while spent(&gateway, &format!("tenant {a}")) < 10.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the image's usage was never spent: {:?}",
            gateway.state.budgets().uses()
        );
        tokio::task::yield_now().await;
    }
    let booked = tenant_stats(&gateway, &a).await.expect("a is in the books");
    assert_eq!(booked["answers"]["upstream"], 1, "{booked}");
    assert!(
        booked["cost_usd"]["upstream"].as_f64().unwrap() >= 10.0,
        "{booked}"
    );
    let calls = gateway.provider.calls();

    // Over its budget, A is refused every paid call, in OpenAI's shape, sent nowhere.
    assert_budget_refusal(&post_as(&gateway, "sk-a", IMAGES, &image).await);
    assert_budget_refusal(&transcribe_as(&gateway, "sk-a").await);
    assert_budget_refusal(&post_as(&gateway, "sk-a", PATH, &chat("a's question")).await);
    assert_eq!(gateway.provider.calls(), calls, "the refusals went nowhere");
    // Free calls still pass.
    let models = get_as(&gateway, "sk-a", "/v1/models").await;
    assert_eq!(models.status, StatusCode::OK);

    // Another tenant is served; an answer without usage is a call of unknown usage.
    let b = tenant_of(&gateway, "sk-b");
    let theirs = post_as(&gateway, "sk-b", IMAGES, &image).await;
    assert_eq!(theirs.status, StatusCode::OK);
    assert_eq!(transcribe_as(&gateway, "sk-b").await.status, StatusCode::OK);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let booked = tenant_stats(&gateway, &b).await;
        if booked
            .as_ref()
            .is_some_and(|booked| booked["answers"]["upstream"] == 2)
        {
            let stats = gateway.get("/stats").await.json();
            assert_eq!(stats["usage_unknown"]["upstream"], 2, "{stats}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "b's calls were never booked: {booked:?}"
        );
        tokio::task::yield_now().await;
    }
    assert_eq!(spent(&gateway, &format!("tenant {b}")), 0.0);
}

/// A refresh, STALE's or XFetch's: the hitter's budget pays nothing for it,
/// the upstream's account cap counts it, and the books name the gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_refresh_is_the_gateways_own_call() {
    for early in [false, true] {
        let gateway = TestGateway::start(|config| {
            dear_prices(config);
            if early {
                exact_ttls(config, Duration::from_secs(60), Duration::from_secs(120));
                config.cache.early_refresh_beta = 1e12;
            } else {
                exact_ttls(config, Duration::from_secs(1), Duration::from_secs(60));
            }
            config.budgets = vec![
                rule(Some("*"), None, 100.0, "day"),
                rule(None, Some("mock"), 100.0, "day"),
            ];
        })
        .await;
        let a = tenant_of(&gateway, "sk-a");
        let body = chat("refreshed for everyone");
        let first = post_as(&gateway, "sk-a", PATH, &body).await;
        assert_eq!(first.cache(), "MISS");
        let paid = spent(&gateway, &format!("tenant {a}"));
        assert!(paid > 0.0);
        assert_eq!(spent(&gateway, "upstream mock"), paid);

        // Past the soft TTL; or, for XFetch, past half of it (where its draw
        // with a huge beta always refreshes early).
        let later = if early { 31_000 } else { 1_500 };
        gateway.clock.advance(Duration::from_millis(later));
        let hit = post_as(&gateway, "sk-a", PATH, &body).await;
        assert_eq!(hit.cache(), if early { "HIT" } else { "STALE" });
        gateway.wait_for_calls(2).await;
        gateway.wait_idle().await;
        assert_eq!(gateway.provider.calls(), 2, "early {early}");

        assert_eq!(
            spent(&gateway, &format!("tenant {a}")),
            paid,
            "the hitter paid nothing for the refresh (early {early})"
        );
        let account = spent(&gateway, "upstream mock");
        assert!(
            (account - 2.0 * paid).abs() < 1e-9,
            "the account cap counted the refresh: {account} vs {paid} (early {early})"
        );
        assert!(
            gateway
                .state
                .budgets()
                .uses()
                .iter()
                .all(|used| used.subject != "tenant gateway"),
            "the gateway has no tenant budget"
        );
        let own = tenant_stats(&gateway, "gateway")
            .await
            .expect("the books name the gateway's own call");
        assert_eq!(own["answers"]["upstream"], 1, "{own}");
        let theirs = tenant_stats(&gateway, &a).await.unwrap();
        assert_eq!(
            theirs["answers"],
            json!({"upstream": 1, "saved": 1}),
            "{theirs}"
        );
    }
}

/// The gateway's own refresh is refused by a spent account cap (and the
/// stale entry is still served), whatever the hitter's own budget says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_account_cap_refuses_the_gateways_refresh_and_a_spent_tenant_does_not() {
    for (tenant_usd, account_usd, refreshed) in
        [(100.0, 0.000_001, false), (0.000_001, 100.0, true)]
    {
        let gateway = TestGateway::start(|config| {
            dear_prices(config);
            exact_ttls(config, Duration::from_secs(1), Duration::from_secs(60));
            config.budgets = vec![
                rule(Some("*"), None, tenant_usd, "day"),
                rule(None, Some("mock"), account_usd, "day"),
            ];
        })
        .await;
        let body = chat("capped refresh");
        assert_eq!(post_as(&gateway, "sk-a", PATH, &body).await.cache(), "MISS");
        gateway.clock.advance(Duration::from_millis(1500));
        let stale = post_as(&gateway, "sk-a", PATH, &body).await;
        assert_eq!((stale.status, stale.cache()), (StatusCode::OK, "STALE"));
        gateway.wait_idle().await;
        assert_eq!(
            gateway.provider.calls(),
            1 + u64::from(refreshed),
            "tenant ${tenant_usd}, account ${account_usd}"
        );
    }
}
