//! Completion announcements are sharded by fingerprint: an instance hears
//! only about the flights its followers wait on, and a remote follower is
//! woken by the announcement, not by the backstop poll. With one Redis the
//! channels are plain (`SUBSCRIBE`/`PUBLISH`); with Redis Cluster they are
//! sharded (`SSUBSCRIBE`/`SPUBLISH`), counted by Redis itself.

use std::time::Duration;

use corral::{cluster::AnnounceCounts, config::RedisConfig};
use reqwest::StatusCode;

use crate::{
    cluster::{cluster_config, redis_config},
    harness::{Fleet, TestGateway, WAIT, chat},
    redis_server::{RedisCluster, RedisServer},
};

const PATH: &str = "/v1/chat/completions";

/// Long enough that a follower's backstop poll cannot fire during the test
/// (it first fires after half of this): what wakes the follower is the
/// announcement or nothing.
const POLL: Duration = Duration::from_secs(120);

fn counts(instance: &TestGateway) -> AnnounceCounts {
    instance.state.cluster().unwrap().announce_counts()
}

/// Resolves once `instance` is subscribed to exactly `n` announcement channels.
async fn wait_for_channels(instance: &TestGateway, n: usize) {
    let mut channels = instance.state.cluster().unwrap().announcement_channels();
    tokio::time::timeout(WAIT, channels.wait_for(|c| *c == n))
        .await
        .unwrap_or_else(|_| panic!("never subscribed to {n} channels"))
        .expect("the subscriber runs");
}

/// Resolves once a remote follower on `instance` has read the record, not
/// found it, and waits: from then on only an announcement or the poll wakes it.
async fn wait_for_parked_follower(instance: &TestGateway) {
    let mut parked = instance.state.cluster().unwrap().followers_parked();
    tokio::time::timeout(WAIT, parked.wait_for(|n| *n == 1))
        .await
        .expect("the follower never waited")
        .expect("the subscriber runs");
}

/// A answers five requests nobody on B waits on, then owns a flight that a
/// caller on B follows. B's subscriber hears exactly one announcement: the
/// followed flight's. Redis delivers one connection's messages in publish
/// order, so had B been subscribed to A's earlier completions it would have
/// received them before this one.
async fn b_hears_only_what_it_follows(fleet: &Fleet, label: &str) {
    let (a, b) = (&fleet.instances[0], &fleet.instances[1]);
    for i in 0..5 {
        let reply = a.post(PATH, &chat(&format!("{label}: A alone {i}"))).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.cache(), "MISS");
    }
    assert_eq!(counts(a).published, 5, "A announced each of its flights");
    assert_eq!(
        counts(a).delivered,
        0,
        "nobody subscribed to those channels"
    );

    fleet.provider.hold();
    let body = chat(&format!("{label}: followed from B"));
    let owner = a.spawn_post(PATH, &body);
    a.wait_for_calls(6).await;
    let follower = b.spawn_post(PATH, &body);
    // B's follower registered its interest, Redis confirmed the subscription,
    // and the follower read the record (not there yet) and waits.
    wait_for_channels(b, 1).await;
    wait_for_parked_follower(b).await;
    fleet.provider.release();
    let (owner, follower) = (owner.await.unwrap(), follower.await.unwrap());
    assert_eq!(owner.status, StatusCode::OK);
    assert_eq!(follower.status, StatusCode::OK);
    assert_eq!(owner.body, follower.body, "one answer");
    assert_eq!(fleet.provider.calls(), 6, "B made no call of its own");

    let heard = counts(b);
    assert_eq!(
        heard.received, 1,
        "B heard only the flight it followed: {heard:?}"
    );
    assert_eq!(heard.woken_by_announcement, 1, "{heard:?}");
    assert_eq!(heard.woken_by_poll, 0, "{heard:?}");
    assert_eq!(heard.subscribes, 1, "{heard:?}");
    let told = counts(a);
    assert_eq!(told.published, 6, "{told:?}");
    assert_eq!(
        told.delivered, 1,
        "the announcement reached B alone: {told:?}"
    );
    assert_eq!(
        counts(a).received,
        0,
        "A followed nothing and heard nothing"
    );
    // The follower left: B unsubscribes.
    wait_for_channels(b, 0).await;
    assert_eq!(counts(b).unsubscribes, 1);
}

/// Two instances on `redis` whose followers' backstop poll is [`POLL`].
async fn pair(redis: RedisConfig) -> Fleet {
    Fleet::start(2, move |config| {
        config.redis = Some(RedisConfig {
            poll_interval: POLL,
            ..redis.clone()
        });
    })
    .await
}

/// `calls=` of each command in `INFO commandstats`, summed over `nodes`.
async fn command_calls(nodes: &[&RedisServer], command: &str) -> u64 {
    let mut total = 0;
    for node in nodes {
        total += node.command_calls(command).await;
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_hears_only_the_flights_its_followers_wait_on() {
    let redis = RedisServer::spawn().await;
    let fleet = pair(redis_config(&redis.url())).await;
    b_hears_only_what_it_follows(&fleet, "single").await;

    // Redis counted the same: six plain publishes, one subscription made and
    // ended, and no channel left subscribed.
    let nodes = [&redis];
    assert_eq!(command_calls(&nodes, "publish").await, 6);
    assert_eq!(command_calls(&nodes, "subscribe").await, 1);
    assert_eq!(command_calls(&nodes, "unsubscribe").await, 1);
    let mut conn = redis.client().await;
    let channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(channels, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_announces_on_sharded_channels() {
    let cluster = RedisCluster::spawn().await;
    let fleet = pair(cluster_config(&cluster)).await;
    b_hears_only_what_it_follows(&fleet, "sharded").await;

    let nodes: Vec<&RedisServer> = cluster.nodes.iter().collect();
    assert_eq!(command_calls(&nodes, "spublish").await, 6);
    assert_eq!(command_calls(&nodes, "ssubscribe").await, 1);
    assert_eq!(command_calls(&nodes, "sunsubscribe").await, 1);
    assert_eq!(
        command_calls(&nodes, "publish").await,
        0,
        "no announcement crossed the cluster bus"
    );
}

/// The subscriber connection is killed while a follower waits, so the owner's
/// announcement may reach nobody: the subscriber reconnects, subscribes again
/// and wakes the follower, which re-reads and finds the record, long before
/// its backstop poll would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resubscription_wakes_the_followers_of_a_lost_channel() {
    let redis = RedisServer::spawn().await;
    let fleet = pair(redis_config(&redis.url())).await;
    let (a, b) = (&fleet.instances[0], &fleet.instances[1]);
    fleet.provider.hold();
    let body = chat("resubscribed");
    let owner = a.spawn_post(PATH, &body);
    a.wait_for_calls(1).await;
    let follower = b.spawn_post(PATH, &body);
    wait_for_channels(b, 1).await;
    wait_for_parked_follower(b).await;
    // B's subscriber is the only pub/sub client; the owner finishes while it
    // is gone, so its announcement reaches nobody.
    let killed = redis.kill_pubsub_clients().await;
    assert_eq!(killed, 1);
    fleet.provider.release();
    let owner = owner.await.unwrap();
    assert_eq!(owner.status, StatusCode::OK);
    let follower = follower.await.unwrap();
    assert_eq!(follower.status, StatusCode::OK);
    assert_eq!(follower.body, owner.body);
    assert_eq!(fleet.provider.calls(), 1);
    let heard = counts(b);
    assert_eq!(heard.woken_by_poll, 0, "{heard:?}");
    assert!(heard.woken_by_announcement >= 1, "{heard:?}");
    assert_eq!(heard.subscribes, 2, "subscribed, then again: {heard:?}");
}
