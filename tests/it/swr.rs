//! Stale-while-revalidate on a hand-moved clock: fresh, stale with exactly one
//! background refresh, refreshed, then a miss past the hard TTL.

use std::time::Duration;

use crate::harness::{TestGateway, chat, count_status, exact_ttls};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swr_timeline_with_one_refresh() {
    let gateway = TestGateway::start(|config| {
        exact_ttls(config, Duration::from_secs(1), Duration::from_secs(4));
    })
    .await;
    let path = "/v1/chat/completions";
    let body = chat("stale but servable");

    let first = gateway.post(path, &body).await;
    assert_eq!(first.cache(), "MISS");
    gateway.clock.advance(Duration::from_millis(500));
    let fresh = gateway.post(path, &body).await;
    assert_eq!(fresh.cache(), "HIT");
    assert_eq!(fresh.body, first.body);

    // Past the soft TTL. The provider is held, so these can only be answered
    // from the stale entry: they are served at once, while one refresh waits upstream.
    gateway.clock.advance(Duration::from_millis(1000));
    gateway.provider.hold();
    let stale: Vec<_> = (0..20)
        .map(|_| {
            let handle = gateway.clone_handle();
            let body = body.clone();
            tokio::spawn(async move { handle.post_with(path, &body, &[]).await })
        })
        .collect();
    let mut replies = Vec::new();
    for task in stale {
        replies.push(task.await.unwrap());
    }
    assert_eq!(count_status(&replies, "STALE"), 20);
    assert!(replies.iter().all(|r| r.body == first.body));
    gateway.wait_for_calls(2).await;
    gateway.provider.release();
    gateway.wait_idle().await;
    assert_eq!(
        gateway.provider.calls(),
        2,
        "exactly one refresh for twenty stale hits"
    );

    let refreshed = gateway.post(path, &body).await;
    assert_eq!(refreshed.cache(), "HIT");
    assert_ne!(
        refreshed.json()["id"],
        first.json()["id"],
        "the refreshed answer is served"
    );

    // The refreshed entry was stored at t=1.5s: its hard TTL ends at t=5.5s.
    gateway.clock.advance(Duration::from_millis(4100));
    let expired = gateway.post(path, &body).await;
    assert_eq!(expired.cache(), "MISS");
    assert_eq!(gateway.provider.calls(), 3);
}

#[tokio::test]
async fn xfetch_refreshes_a_fresh_entry_early_and_beta_zero_never_does() {
    let path = "/v1/chat/completions";
    for (beta, refreshes) in [(1e12, 1), (0.0, 0)] {
        let gateway = TestGateway::start(|config| {
            config.cache.soft_ttl = Duration::from_secs(60);
            config.cache.hard_ttl = Duration::from_secs(120);
            config.cache.early_refresh_beta = beta;
        })
        .await;
        let body = chat("refresh me early");
        assert_eq!(gateway.post(path, &body).await.cache(), "MISS");
        // Well before the soft expiry: with a huge beta the XFetch condition holds
        // for any draw, with beta 0 it never does. Either way the caller gets a HIT.
        gateway.clock.advance(Duration::from_secs(30));
        assert_eq!(gateway.post(path, &body).await.cache(), "HIT");
        gateway.wait_idle().await;
        assert_eq!(gateway.provider.calls(), 1 + refreshes, "beta {beta}");
    }
}
