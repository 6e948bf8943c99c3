//! The request memo (`src/memo.rs`): a request seen before is served without
//! being parsed again, and that changes nothing a caller, the provider or the
//! books can see. A request is kept the second time it is parsed (its first
//! only passes the doorkeeper), so every case here is answered from the memo
//! from its third time on (its bytes are checked), and compared with what a
//! parse gives.

use std::time::Duration;

use corral::tenant::key_hash;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{Reply, TestGateway, chat, exact_ttls};

const PATH: &str = "/v1/chat/completions";

/// The mock numbers its calls in `id`: two answers with one id are one call.
fn id(reply: &Reply) -> String {
    reply.json()["id"].as_str().unwrap_or_default().to_owned()
}

/// What the memo holds: it grows when a request is first parsed.
fn memo_bytes(gateway: &TestGateway) -> u64 {
    gateway.state.dedup().memo().bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_from_the_memo_is_answered_and_counted_as_a_parsed_one() {
    let gateway = TestGateway::start(|_| {}).await;
    let body = chat("remembered, not reparsed");
    assert_eq!(memo_bytes(&gateway), 0);
    let first = gateway.post(PATH, &body).await;
    assert_eq!(first.cache(), "MISS");
    assert_eq!(memo_bytes(&gateway), 0, "seen once: not kept yet");
    let second = gateway.post(PATH, &body).await;
    assert_eq!(
        (second.cache(), second.body.clone()),
        ("HIT", first.body.clone())
    );
    let held = memo_bytes(&gateway);
    assert!(held > 0, "the second parse of a request keeps it");

    let repeats: Vec<Reply> = {
        let mut replies = Vec::new();
        for _ in 0..3 {
            replies.push(gateway.post(PATH, &body).await);
        }
        replies
    };
    assert_eq!(
        memo_bytes(&gateway),
        held,
        "repeats add nothing: they were found"
    );
    for repeat in &repeats {
        assert_eq!(repeat.status, StatusCode::OK);
        assert_eq!(repeat.cache(), "HIT");
        assert_eq!(repeat.body, first.body);
        assert_eq!(
            repeat.header("x-corral-fingerprint"),
            first.header("x-corral-fingerprint")
        );
        assert_eq!(repeat.header("cache-status"), Some("corral; hit"));
        assert_eq!(repeat.header("content-type"), first.header("content-type"));
        // A HIT's prebuilt headers hold these two in place: each is there
        // once, with this answer's age and this caller's own request id.
        assert_eq!(repeat.headers.get_all("age").iter().count(), 1);
        assert!(repeat.header("age").unwrap().parse::<u64>().is_ok());
        assert_eq!(repeat.headers.get_all("x-request-id").iter().count(), 1);
        let id = repeat.header("x-request-id").unwrap();
        assert!(
            id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
            "{id}"
        );
    }
    let ids: std::collections::HashSet<_> = repeats
        .iter()
        .map(|repeat| repeat.header("x-request-id"))
        .collect();
    assert_eq!(ids.len(), repeats.len(), "each caller its own request id");
    assert_eq!(gateway.provider.calls(), 1);
    // Counted as hits, with the tokens they saved.
    let metrics = gateway.get("/metrics").await;
    let text = String::from_utf8_lossy(&metrics.body);
    let hits = text
        .lines()
        .find(|line| {
            line.starts_with("corral_requests_total{")
                && line.contains(r#"endpoint="chat""#)
                && line.contains(r#"cache="HIT""#)
        })
        .unwrap_or_else(|| panic!("no chat HIT series:\n{text}"));
    assert!(hits.ends_with(" 4"), "{hits}");
    let stats = gateway.get("/stats").await.json();
    assert_eq!(stats["requests"]["by_cache"]["HIT"], 4, "{stats}");
    assert_eq!(stats["saved_responses"]["total"], 4, "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_and_keyed_headers_split_what_the_memo_knows() {
    let gateway = TestGateway::start(|_| {}).await;
    let body = chat("one body, many callers");
    let a = [("authorization", "Bearer sk-memo-a")];
    let b = [("x-api-key", "sk-memo-b")];
    let a_org = [
        ("authorization", "Bearer sk-memo-a"),
        ("openai-organization", "org-2"),
    ];
    let first_a = gateway.post_with(PATH, &body, &a).await;
    let first_b = gateway.post_with(PATH, &body, &b).await;
    let first_org = gateway.post_with(PATH, &body, &a_org).await;
    assert_eq!(
        (first_a.cache(), first_b.cache(), first_org.cache()),
        ("MISS", "MISS", "MISS")
    );
    assert_eq!(gateway.provider.calls(), 3);
    // Each repeat finds its own answer, never another's: parsed the second
    // time (and kept), from the memo the third.
    let held = memo_bytes(&gateway);
    for round in 0..2 {
        for (headers, first) in [
            (&a[..], &first_a),
            (&b[..], &first_b),
            (&a_org[..], &first_org),
        ] {
            let repeat = gateway.post_with(PATH, &body, headers).await;
            assert_eq!(repeat.cache(), "HIT", "round {round}");
            assert_eq!(id(&repeat), id(first), "round {round}");
        }
        if round == 0 {
            assert!(memo_bytes(&gateway) > held, "three requests kept");
        }
    }
    // The other spelling of tenant b's key is tenant b.
    let b_bearer = gateway
        .post_with(PATH, &body, &[("authorization", "Bearer sk-memo-b")])
        .await;
    assert_eq!((b_bearer.cache(), id(&b_bearer)), ("HIT", id(&first_b)));
    // A cache control is read again, not remembered from the request without it.
    let revalidated = gateway
        .post_with(PATH, &body, &[a[0], ("cache-control", "no-cache")])
        .await;
    assert_eq!(revalidated.cache(), "MISS");
    assert_eq!(
        revalidated.header("cache-status"),
        Some("corral; fwd=request; stored")
    );
    assert_eq!(gateway.provider.calls(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_answer_known_to_the_memo_is_fetched_with_the_callers_own_request() {
    let gateway = TestGateway::start(|config| {
        exact_ttls(config, Duration::from_secs(10), Duration::from_secs(20));
    })
    .await;
    let body = chat("fetched again, byte for byte");
    let headers = [
        ("authorization", "Bearer sk-memo-expiry"),
        ("openai-beta", "assistants=v2"),
    ];
    let first = gateway.post_with(PATH, &body, &headers).await;
    assert_eq!(first.cache(), "MISS");
    for _ in 0..2 {
        // Parsed and kept, then answered from the memo.
        assert_eq!(
            gateway.post_with(PATH, &body, &headers).await.cache(),
            "HIT"
        );
    }

    gateway.clock.advance(Duration::from_secs(21));
    let herd = gateway.herd(PATH, &body, 50, &headers).await;
    assert_eq!(
        gateway.provider.calls(),
        2,
        "one call for the herd past the hard TTL"
    );
    assert!(herd.iter().all(|r| r.status == StatusCode::OK));
    assert!(herd.iter().all(|r| id(r) != id(&first)));
    let requests = gateway.provider.requests();
    assert_eq!(requests.len(), 2);
    let (before, after) = (&requests[0], &requests[1]);
    assert_eq!(after.body, before.body, "the same body went upstream");
    let keyed = |request: &mock_upstream::RecordedRequest| -> Vec<(String, String)> {
        request
            .headers
            .iter()
            .filter(|(name, _)| name == "authorization" || name == "openai-beta")
            .cloned()
            .collect()
    };
    assert_eq!(keyed(after), keyed(before));
    assert_eq!(keyed(after).len(), 2, "{:?}", after.headers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_answer_known_to_the_memo_is_served_and_refreshed_once() {
    let gateway = TestGateway::start(|config| {
        exact_ttls(config, Duration::from_secs(1), Duration::from_secs(60));
    })
    .await;
    let body = chat("stale, then refreshed from the memo");
    let first = gateway.post(PATH, &body).await;
    // Parsed and kept, then answered from the memo.
    assert_eq!(gateway.post(PATH, &body).await.cache(), "HIT");
    assert_eq!(gateway.post(PATH, &body).await.cache(), "HIT");
    gateway.clock.advance(Duration::from_secs(2));
    let stale = gateway.post(PATH, &body).await;
    assert_eq!((stale.cache(), id(&stale)), ("STALE", id(&first)));
    gateway.wait_for_calls(2).await;
    gateway.wait_idle().await;
    let refreshed = gateway.post(PATH, &body).await;
    assert_eq!(refreshed.cache(), "HIT");
    assert_ne!(id(&refreshed), id(&first), "the refresh's answer");
    assert_eq!(gateway.provider.calls(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_reaches_answers_the_memo_serves() {
    const ADMIN_KEY: &str = "adm-memo-0123456789";
    let gateway = TestGateway::start(|config| {
        config.auth.admin_key_hashes = vec![key_hash(ADMIN_KEY.as_bytes())];
    })
    .await;
    let body: Value = json!({
        "model": "gpt-4o-mini",
        "temperature": 0,
        "messages": [{"role": "user", "content": "purged while remembered"}],
    });
    let first = gateway.post(PATH, &body).await;
    // Parsed and kept, then answered from the memo.
    assert_eq!(gateway.post(PATH, &body).await.cache(), "HIT");
    assert_eq!(gateway.post(PATH, &body).await.cache(), "HIT");
    let purged = gateway
        .client
        .post(format!("{}/admin/purge", gateway.url))
        .header("authorization", format!("Bearer {ADMIN_KEY}"))
        .json(&json!({"model": "gpt-4o-mini"}))
        .send()
        .await
        .unwrap();
    assert_eq!(purged.status(), StatusCode::OK);
    let after = gateway.post(PATH, &body).await;
    assert_eq!(after.cache(), "MISS");
    assert_ne!(id(&after), id(&first));
}
