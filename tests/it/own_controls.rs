//! A caller's own settings hold for it, whoever owns the flight: with
//! `coalesce.on_wait_timeout: own_call`, a caller whose wait for another
//! instance's flight runs out makes its own call, as it does on one instance.
//! (A follower's own `Cache-Control` is shown in `coalesce/tests.rs`.)

use std::time::Duration;

use corral::config::OnWaitTimeout;
use reqwest::StatusCode;

use crate::{
    harness::{Fleet, chat, redis_at},
    redis_server::RedisServer,
};

const CHAT: &str = "/v1/chat/completions";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_call_after_a_wait_holds_for_a_remote_owner_too() {
    let redis = RedisServer::spawn().await;
    let url = redis.url();
    let fleet = Fleet::start(2, |config| {
        config.redis = Some(redis_at(&url));
        config.coalesce.wait_timeout = Duration::from_secs(1);
        config.coalesce.on_wait_timeout = OnWaitTimeout::OwnCall;
    })
    .await;
    let (a, b) = (&fleet.instances[0], &fleet.instances[1]);
    let body = chat("a slow remote owner");
    fleet.provider.hold();
    let owner = a.spawn_post(CHAT, &body);
    a.wait_for_calls(1).await;
    // `b` follows `a`'s flight through Redis; its wait runs out after 1 s and
    // it calls the provider itself (which is held too, until both are there).
    let follower = b.spawn_post(CHAT, &body);
    b.wait_for_calls(2).await;
    fleet.provider.release();
    let (owner, follower) = (owner.await.unwrap(), follower.await.unwrap());
    assert_eq!(owner.status, StatusCode::OK);
    assert_eq!(follower.status, StatusCode::OK, "{:?}", follower.body);
    assert_eq!(fleet.provider.calls(), 2);
}
