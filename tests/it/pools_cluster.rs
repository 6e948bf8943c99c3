//! Pools across a fleet (issue 38): with Redis, a cooldown one instance
//! learned from a member's 429 is honoured by every instance within about a
//! second, so the fleet does not each meet the same 429.

use std::time::{Duration, Instant};

use corral::config::Affinity;
use mock_upstream::{FailureMode, MockProvider};
use reqwest::StatusCode;

use crate::{
    cluster::redis_config,
    harness::{Fleet, WAIT, chat},
    pools::{CHAT, member, mocks, pooled},
    redis_server::RedisServer,
};

/// Calls in a row that must all miss the cooling member before it counts as
/// left alone: with two members and no affinity, a member still in the pick
/// gets about half of them (2^-40 that it gets none).
const QUIET_RUN: usize = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cooldown_met_by_one_instance_stops_the_others_traffic_to_that_member() {
    let redis = RedisServer::spawn().await;
    let [a, b] = <[MockProvider; 2]>::try_from(mocks(2).await).ok().unwrap();
    a.set_failure(Some(
        FailureMode::always(429).with_retry_after(Duration::from_secs(60)),
    ));
    let fleet = Fleet::start(2, |config| {
        config.redis = Some(redis_config(&redis.url()));
        pooled(
            config,
            vec![member("a", a.base_url()), member("b", b.base_url())],
            Affinity::None,
        );
    })
    .await;
    let (first, second) = (&fleet.instances[0], &fleet.instances[1]);

    // Instance 1 meets a's 429 (without affinity, within a few calls) and
    // fails the call over to b.
    for i in 0.. {
        assert!(i < 200, "instance 1 never reached a");
        let reply = first.post(CHAT, &chat(&format!("first {i}"))).await;
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
        if a.calls() > 0 {
            break;
        }
    }
    assert_eq!(a.calls(), 1, "instance 1 cooled a after its one 429");
    // a would answer now: only the shared cooldown keeps instance 2 away.
    a.set_failure(None);

    // Instance 2 stops sending to a once it polled the cooldown (about a
    // second); the bound is far above that, for a loaded machine.
    let deadline = Instant::now() + WAIT / 3;
    let (mut quiet, mut sent) = (0, 0);
    while quiet < QUIET_RUN {
        assert!(
            Instant::now() < deadline,
            "instance 2 kept calling the cooling member: {} of its {sent} calls reached a",
            a.calls() - 1
        );
        let before = a.calls();
        let reply = second.post(CHAT, &chat(&format!("second {sent}"))).await;
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
        sent += 1;
        quiet = if a.calls() == before { quiet + 1 } else { 0 };
    }
    assert!(b.calls() >= QUIET_RUN as u64);
    let keys = redis.keys("*cooldowns*").await;
    assert_eq!(keys.len(), 1, "one key for the pool: {keys:?}");
}
