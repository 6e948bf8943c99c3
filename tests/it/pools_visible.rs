//! A pool made visible (issue 38, item 7): `/metrics` names the member of
//! each upstream call, counts each failover from one member to another and
//! shows which members are cooling; `/stats` and the savings page show calls
//! and spend by member; `GET /v1/models` lists a pool's models once.

use std::time::Duration;

use corral::config::{Affinity, ModelPrice, PriceTable};
use mock_upstream::{FailureMode, MockProvider, MockSettings};
use reqwest::StatusCode;
use serde_json::Value;

use crate::{
    dashboard::{chromium, chromium_or_skip},
    harness::{TestGateway, chat, streamed},
    pools::{CHAT, first_and_spare, member, mocks, pooled},
};

/// The value of the series whose line begins `series` (name and labels,
/// exactly as encoded), if `/metrics` has it.
fn series_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.parse().ok())
}

async fn scrape(gateway: &TestGateway) -> String {
    let reply = gateway.get("/metrics").await;
    assert_eq!(reply.status, StatusCode::OK);
    String::from_utf8(reply.body.to_vec()).unwrap()
}

/// One price, so every answer costs something.
fn priced(config: &mut corral::Config) {
    config.pricing.models = PriceTable(vec![(
        "gpt-4o-mini".into(),
        ModelPrice {
            input: 1.0,
            output: 2.0,
            cached_input: None,
            cache_write: None,
        },
    )]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_name_the_member_count_the_failover_and_show_the_cooling() {
    let [limited, healthy] = <[MockProvider; 2]>::try_from(mocks(2).await).ok().unwrap();
    limited.set_failure(Some(
        FailureMode::always(429).with_retry_after(Duration::from_millis(3000)),
    ));
    let mut pool = String::new();
    let gateway = TestGateway::start(|config| {
        priced(config);
        // The spare is tried only after the first member failed the call.
        first_and_spare(
            config,
            member("limited", limited.base_url()),
            member("healthy", healthy.base_url()),
        );
        pool = config.upstreams[0].name.clone();
    })
    .await;
    let text = scrape(&gateway).await;
    for name in ["limited", "healthy"] {
        let cooling = format!(r#"corral_member_cooling{{upstream="{pool}",member="{name}"}}"#);
        assert_eq!(
            series_value(&text, &cooling),
            Some(0.0),
            "{cooling}:\n{text}"
        );
    }

    let reply = gateway.post(CHAT, &chat("moved on")).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    assert_eq!(reply.header("x-corral-member"), Some("healthy"));
    assert_eq!((limited.calls(), healthy.calls()), (1, 1));

    let text = scrape(&gateway).await;
    let answered = format!(
        r#"corral_upstream_requests_total{{upstream="{pool}",member="healthy",model="gpt-4o-mini",status="200"}}"#
    );
    assert_eq!(
        series_value(&text, &answered),
        Some(1.0),
        "{answered}:\n{text}"
    );
    for series in [
        format!(r#"corral_upstream_retries_total{{upstream="{pool}",member="healthy"}}"#),
        format!(r#"corral_upstream_duration_seconds_count{{upstream="{pool}",member="healthy"}}"#),
    ] {
        assert_eq!(series_value(&text, &series), Some(1.0), "{series}:\n{text}");
    }
    let failover = format!(
        r#"corral_failovers_total{{upstream="{pool}",from="limited",to="healthy",reason="429"}}"#
    );
    assert_eq!(
        series_value(&text, &failover),
        Some(1.0),
        "{failover}:\n{text}"
    );
    let cooling =
        |name: &str| format!(r#"corral_member_cooling{{upstream="{pool}",member="{name}"}}"#);
    assert_eq!(
        series_value(&text, &cooling("limited")),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        series_value(&text, &cooling("healthy")),
        Some(0.0),
        "{text}"
    );

    // Its 3 s are up: no longer cooling (its next caller is its probe).
    gateway.clock.advance(Duration::from_millis(3001));
    let text = scrape(&gateway).await;
    assert_eq!(
        series_value(&text, &cooling("limited")),
        Some(0.0),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_and_the_savings_page_show_calls_and_spend_by_member() {
    let [first, spare] = <[MockProvider; 2]>::try_from(mocks(2).await).ok().unwrap();
    let mut pool = String::new();
    let gateway = TestGateway::start(|config| {
        priced(config);
        let mut second = member("spare", spare.base_url());
        second.priority = 1;
        pooled(
            config,
            vec![member("first", first.base_url()), second],
            Affinity::None,
        );
        pool = config.upstreams[0].name.clone();
    })
    .await;
    for i in 0..4 {
        let reply = gateway.post(CHAT, &chat(&format!("on first {i}"))).await;
        assert_eq!(reply.header("x-corral-member"), Some("first"));
    }
    // A streamed answer is the member's too.
    let reply = gateway
        .post(CHAT, &streamed(chat("streamed on first")))
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    // First out of quota: its next call fails over, the rest go to the spare.
    first.set_failure(Some(
        FailureMode::always(429).with_retry_after(Duration::from_secs(60)),
    ));
    for i in 0..3 {
        let reply = gateway.post(CHAT, &chat(&format!("on spare {i}"))).await;
        assert_eq!(reply.header("x-corral-member"), Some("spare"));
    }
    let reply = gateway
        .post(CHAT, &streamed(chat("streamed on spare")))
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!((first.calls(), spare.calls()), (6, 4));
    // A HIT is no member's call.
    assert_eq!(gateway.post(CHAT, &chat("on first 0")).await.cache(), "HIT");

    let stats: Value = gateway.get("/stats").await.json();
    let members = stats["members"].as_array().expect("/stats lists members");
    assert_eq!(members.len(), 2, "{members:?}");
    let line = |name: &str| {
        members
            .iter()
            .find(|m| m["member"] == name)
            .unwrap_or_else(|| panic!("{name} in {members:?}"))
    };
    let (on_first, on_spare) = (line("first"), line("spare"));
    assert_eq!(on_first["upstream"], pool.as_str());
    assert_eq!(
        (on_first["calls"].as_u64(), on_spare["calls"].as_u64()),
        (Some(5), Some(4))
    );
    assert_eq!(
        (on_first["answers"].as_u64(), on_spare["answers"].as_u64()),
        (Some(5), Some(4))
    );
    let (first_cost, spare_cost) = (
        on_first["cost_nano_usd"].as_u64().unwrap(),
        on_spare["cost_nano_usd"].as_u64().unwrap(),
    );
    assert!(first_cost > 0 && spare_cost > 0, "{members:?}");
    // Counted once: the members' calls and spend are the upstream's.
    assert_eq!(stats["upstream"]["calls"].as_u64(), Some(9));
    assert_eq!(
        first_cost + spare_cost,
        stats["cost_nano_usd"]["upstream"].as_u64().unwrap(),
        "{stats}"
    );

    let Some(browser) = chromium_or_skip() else {
        return;
    };
    let dom = chromium(&browser, &format!("{}/", gateway.url), "--dump-dom").await;
    assert!(dom.contains("data-state=\"ready\""), "{dom}");
    for (name, calls) in [("first", 5), ("spare", 4)] {
        let row = format!(r#"data-member="{pool}/{name}" data-calls="{calls}""#);
        assert!(dom.contains(&row), "{row} on the page:\n{dom}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_models_asks_a_pool_once_and_lists_each_model_once() {
    let [a, b] = <[MockProvider; 2]>::try_from(mocks(2).await).ok().unwrap();
    let whisper = MockProvider::start(MockSettings {
        models: Some(vec!["gpt-4o-mini".into(), "whisper-1".into()]),
        ..MockSettings::default()
    })
    .await
    .unwrap();
    let gateway = TestGateway::start(|config| {
        pooled(
            config,
            vec![member("a", a.base_url()), member("b", b.base_url())],
            Affinity::None,
        );
        let mut second = config.upstreams[0].clone();
        second.name = "second".into();
        second.members = Vec::new();
        second.base_url = whisper.base_url();
        second.models = vec!["whisper-*".into()];
        config.upstreams[0].models = vec!["gpt-*".into()];
        config.upstreams.push(second);
    })
    .await;
    let reply = gateway.get("/v1/models").await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    let listed = reply.json();
    let ids: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| entry["id"].as_str().unwrap())
        .collect();
    let mut unique = ids.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), ids.len(), "each model once: {ids:?}");
    assert!(
        ids.contains(&"gpt-4o-mini") && ids.contains(&"whisper-1"),
        "{ids:?}"
    );
    let asked = |mock: &MockProvider| {
        mock.received()
            .iter()
            .filter(|line| line.starts_with("GET ") && line.contains("/models"))
            .count()
    };
    assert_eq!(asked(&a) + asked(&b), 1, "the pool was asked once");
    assert_eq!(asked(&whisper), 1);
}
