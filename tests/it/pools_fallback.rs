//! Fallback to another pool (issue 38, item 8): a pool whose every member
//! failed the call before its first byte (or is cooling, or open) sends it
//! on to its `fallback` model. Every caller of the flight gets that model's
//! answer, which says so, and it is cached only under the key a request
//! naming that model has, never under the primary's.

use std::time::Duration;

use corral::config::{Affinity, Config, Secret};
use mock_upstream::{FailureMode, MockProvider};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{
    harness::{TestGateway, chat, count_status, streamed},
    pools::{herd_on, member, mocks, pooled},
};

const CHAT: &str = "/v1/chat/completions";
const PRIMARY: &str = "gpt-4o-mini";
const FALLBACK: &str = "gpt-mini";

/// The first upstream a pool of `a` and `b` serving `gpt-4o*`, falling back
/// to `gpt-mini`, which a second upstream (`mini`, at `mini_url`) serves.
/// A pool of two members (a, b) failing every call with `status`, and its
/// fallback upstream's mock (mini), behind one gateway.
async fn primaries_failing_with(
    status: u16,
) -> (MockProvider, MockProvider, MockProvider, TestGateway) {
    let [a, b, mini] = <[MockProvider; 3]>::try_from(mocks(3).await).ok().unwrap();
    for primary in [&a, &b] {
        primary.set_failure(Some(FailureMode::always(status)));
    }
    let gateway = TestGateway::start(|config| {
        with_fallback(config, a.base_url(), b.base_url(), mini.base_url());
    })
    .await;
    (a, b, mini, gateway)
}

fn with_fallback(config: &mut Config, a: String, b: String, mini_url: String) {
    pooled(config, vec![member("a", a), member("b", b)], Affinity::None);
    let mut mini = config.upstreams[0].clone();
    mini.name = "mini".into();
    mini.members = Vec::new();
    mini.base_url = mini_url;
    mini.models = vec![FALLBACK.into()];
    mini.api_key = Some(Secret::new("sk-mini".into()));
    mini.fallback = Vec::new();
    let primary = &mut config.upstreams[0];
    primary.models = vec!["gpt-4o*".into()];
    primary.fallback = vec![FALLBACK.into()];
    config.upstreams.push(mini);
}

/// The same request naming `model`.
fn naming(mut body: Value, model: &str) -> Value {
    body["model"] = json!(model);
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_whose_members_all_fail_is_answered_by_its_fallback_and_caches_under_its_key() {
    let (a, b, mini, gateway) = primaries_failing_with(503).await;
    let body = chat("the primary pool is down");
    // Every caller of the one flight gets the fallback's answer.
    let replies = herd_on(&gateway, &[&a, &b, &mini], &body, 5).await;
    for reply in &replies {
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
        assert_eq!(
            reply.json()["model"],
            FALLBACK,
            "the answer says who answered"
        );
    }
    assert_eq!(count_status(&replies, "MISS"), 1);
    assert_eq!(mini.calls(), 1, "one call to the fallback for the flight");
    assert!(
        a.calls() >= 1 && b.calls() >= 1,
        "both members were tried first"
    );
    let sent = &mini.requests()[0];
    assert_eq!(sent.header("authorization"), Some("Bearer sk-mini"));
    let sent: Value = serde_json::from_slice(&sent.body).unwrap();
    assert_eq!(sent["model"], FALLBACK, "the body names the fallback");
    let metrics = gateway.get("/metrics").await;
    let metrics = String::from_utf8_lossy(&metrics.body);
    assert!(
        metrics
            .lines()
            .any(|line| line.starts_with("corral_failovers_total{")
                && line.contains("reason=\"fallback\"")
                && line.contains("to=\"mini\"")),
        "{metrics}"
    );

    // The primary is back (its members' cooldowns over): the same request
    // naming the primary model is not a HIT of the fallback's answer.
    a.set_failure(None);
    b.set_failure(None);
    gateway.clock.advance(Duration::from_secs(6));
    let primary = gateway.post(CHAT, &body).await;
    assert_eq!(primary.status, StatusCode::OK, "{:?}", primary.body);
    assert_eq!(primary.cache(), "MISS");
    assert_eq!(primary.json()["model"], PRIMARY);
    // One naming the fallback model is.
    let direct = gateway.post(CHAT, &naming(body, FALLBACK)).await;
    assert_eq!(direct.status, StatusCode::OK, "{:?}", direct.body);
    assert_eq!(direct.cache(), "HIT");
    assert_eq!(direct.json()["model"], FALLBACK);
    assert_eq!(mini.calls(), 1, "the fallback was not asked again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_falls_back_before_its_first_event_and_its_readers_read_the_fallbacks() {
    let (a, b, mini, gateway) = primaries_failing_with(503).await;
    let body = streamed(chat("a stream the primary cannot start"));
    let replies = herd_on(&gateway, &[&a, &b, &mini], &body, 3).await;
    for reply in &replies {
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
        let text = String::from_utf8_lossy(&reply.body);
        assert!(text.contains("\"model\":\"gpt-mini\""), "{text}");
        assert!(!text.contains("\"error\""), "{text}");
    }
    assert_eq!(mini.calls(), 1);
    // Stored under the fallback model's key: a buffered request naming it is a HIT.
    let direct = gateway
        .post(
            CHAT,
            &naming(chat("a stream the primary cannot start"), FALLBACK),
        )
        .await;
    assert_eq!(direct.cache(), "HIT", "{:?}", direct.body);
    assert_eq!(mini.calls(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callers_400_never_falls_back() {
    let (_a, _b, mini, gateway) = primaries_failing_with(400).await;
    let reply = gateway.post(CHAT, &chat("a caller's mistake")).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{:?}", reply.body);
    assert_eq!(mini.calls(), 0, "the caller's request is the problem");
}
