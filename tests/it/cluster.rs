//! Cluster-wide dedup through a real redis-server on an ephemeral port: four
//! in-process instances (and, where an owner must die, a real corral process).

use std::{
    collections::HashSet,
    process::Stdio,
    time::{Duration, Instant},
};

use corral::{
    config::RedisConfig,
    fingerprint::{CacheKey, Endpoint, Fingerprint, KeyInput},
    tenant::TenantScope,
};
use mock_upstream::FailureMode;
use reqwest::StatusCode;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::{
    harness::{Fleet, TestGateway, WAIT, chat, collect, count_status},
    redis_server::{RedisCluster, RedisServer},
};

const PATH: &str = "/v1/chat/completions";

/// Test instances are debug builds sharing two cores with a thousand clients
/// (and, on a developer's machine, with other builds): a Redis round trip can
/// exceed the production 150 ms deadline there without Redis being unwell, and
/// past the deadline corral rightly fails open into extra upstream calls. Tests
/// that are not about Redis failing count exact calls, so they allow 8 s: a
/// bound far above any healthy round trip, still finite.
pub(crate) fn redis_config(url: &str) -> RedisConfig {
    RedisConfig {
        url: Some(url.to_owned()),
        op_timeout: Duration::from_secs(8),
        poll_interval: Duration::from_millis(200),
        ..RedisConfig::default()
    }
}

/// [`redis_config`] for a Redis Cluster: its nodes instead of one URL.
pub(crate) fn cluster_config(cluster: &RedisCluster) -> RedisConfig {
    RedisConfig {
        url: None,
        nodes: cluster.urls(),
        cluster: true,
        ..redis_config("redis://unused")
    }
}

fn assert_one_answer(replies: &[crate::harness::Reply]) {
    assert!(
        replies.iter().all(|r| r.status == StatusCode::OK),
        "statuses: {:?}",
        replies.iter().map(|r| r.status).collect::<HashSet<_>>()
    );
    let bodies: HashSet<&[u8]> = replies.iter().map(|r| r.body.as_ref()).collect();
    assert_eq!(bodies.len(), 1, "every caller gets the same body");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_instances_make_one_upstream_call_five_times_in_a_row() {
    let redis = RedisServer::spawn().await;
    let fleet = Fleet::start(4, |config| config.redis = Some(redis_config(&redis.url()))).await;
    for round in 1..=5u64 {
        let body = chat(&format!("cluster herd round {round}"));
        let replies = fleet.herd_on_one_call(PATH, &body, 1000).await;
        assert_eq!(
            fleet.provider.calls(),
            round,
            "round {round}: one call for the cluster"
        );
        assert_one_answer(&replies);
        assert_eq!(count_status(&replies, "MISS"), 1, "round {round}");
        assert_eq!(
            count_status(&replies, "COALESCED"),
            999,
            "round {round}: {:?}",
            replies
                .iter()
                .fold(std::collections::BTreeMap::new(), |mut seen, r| {
                    *seen.entry(r.cache().to_owned()).or_insert(0) += 1;
                    seen
                })
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_cold_prompts_with_fifty_callers_each_make_twenty_calls() {
    let redis = RedisServer::spawn().await;
    let fleet = Fleet::start(4, |config| config.redis = Some(redis_config(&redis.url()))).await;
    let bodies: Vec<(Value, usize)> = (0..20)
        .map(|i| (chat(&format!("cold prompt {i}")), 50))
        .collect();
    fleet.provider.hold();
    let tasks = fleet.spread(PATH, &bodies);
    fleet.wait_for_waiters(1000).await;
    fleet.provider.release();
    let replies = collect(tasks).await;
    assert!(replies.iter().all(|r| r.status == StatusCode::OK));
    let errors: Vec<u64> = fleet
        .instances
        .iter()
        .map(|i| i.state.cluster().unwrap().errors())
        .collect();
    assert_eq!(
        fleet.provider.calls(),
        20,
        "redis errors per instance: {errors:?}"
    );
    let distinct: HashSet<&[u8]> = replies.iter().map(|r| r.body.as_ref()).collect();
    assert_eq!(distinct.len(), 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_entry_read_on_every_instance_is_refreshed_once() {
    let redis = RedisServer::spawn().await;
    let fleet = Fleet::start(4, |config| {
        config.redis = Some(redis_config(&redis.url()));
        config.cache.soft_ttl = Duration::from_secs(1);
        config.cache.hard_ttl = Duration::from_secs(30);
        config.cache.early_refresh_beta = 0.0;
    })
    .await;
    let body = chat("stale everywhere");
    let first = fleet.instances[0].post(PATH, &body).await;
    assert_eq!(first.cache(), "MISS");
    fleet.clock.advance(Duration::from_millis(1500));
    fleet.provider.hold();
    // Held upstream: these can only be answered from the stale entry.
    let replies = collect(fleet.spread(PATH, &[(body.clone(), 40)])).await;
    assert_eq!(count_status(&replies, "STALE"), 40);
    fleet.instances[0].wait_for_calls(2).await;
    fleet.provider.release();
    for instance in &fleet.instances {
        instance.wait_idle().await;
    }
    assert_eq!(
        fleet.provider.calls(),
        2,
        "one refresh for the whole cluster"
    );
    for instance in &fleet.instances {
        let reply = instance.post(PATH, &body).await;
        assert_eq!(reply.cache(), "HIT");
        assert_ne!(
            reply.json()["id"],
            first.json()["id"],
            "the refreshed answer everywhere"
        );
    }
    assert_eq!(fleet.provider.calls(), 2);
}

/// Starts the real `corral` binary; returns it and its base URL once it prints its ready line.
async fn spawn_corral(config_yaml: &str) -> (tokio::process::Child, String, std::path::PathBuf) {
    let path = std::env::temp_dir().join(format!("corral-it-{:x}.yaml", rand::random::<u64>()));
    std::fs::write(&path, config_yaml).unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_corral"))
        .arg("--config")
        .arg(&path)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("corral binary starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let url = tokio::time::timeout(WAIT, async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(url) = line.strip_prefix("corral listening on ") {
                return url.to_owned();
            }
        }
        panic!("corral exited before it was ready");
    })
    .await
    .expect("corral became ready");
    (child, url, path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_owner_instance_is_killed_another_takes_over_once() {
    let redis = RedisServer::spawn().await;
    let lock_ttl = Duration::from_secs(1);
    let fleet = Fleet::start(3, |config| {
        let mut redis_config = redis_config(&redis.url());
        redis_config.lock_ttl = lock_ttl;
        config.redis = Some(redis_config);
    })
    .await;
    let yaml = format!(
        "listen: 127.0.0.1:0\nupstreams:\n  - {{name: mock, base_url: '{}'}}\nredis:\n  url: '{}'\n  lock_ttl: 1s\n",
        fleet.provider.base_url(),
        redis.url()
    );
    let (mut owner, owner_url, config_path) = spawn_corral(&yaml).await;
    fleet.provider.hold();
    let body = chat("the owner will die");
    let owner_request = {
        let body = body.clone();
        tokio::spawn(async move {
            reqwest::Client::new()
                .post(format!("{owner_url}{PATH}"))
                .json(&body)
                .send()
                .await
        })
    };
    fleet.instances[0].wait_for_calls(1).await;
    let followers = fleet.spread(PATH, &[(body.clone(), 30)]);
    fleet.wait_for_waiters(30).await;
    owner.kill().await.expect("SIGKILL the owner");
    let killed_at = Instant::now();
    assert!(
        owner_request.await.unwrap().is_err(),
        "the owner's own client lost its connection"
    );
    // The lease expires; one survivor takes over and calls upstream once more.
    fleet.instances[0].wait_for_calls(2).await;
    fleet.provider.release();
    let replies = collect(followers).await;
    let elapsed = killed_at.elapsed();
    assert_one_answer(&replies);
    assert_eq!(
        fleet.provider.calls(),
        2,
        "one new upstream call, not one per instance"
    );
    assert!(
        elapsed < lock_ttl + Duration::from_secs(10),
        "took {elapsed:?}"
    );
    let _ = std::fs::remove_file(config_path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_then_killed_degrades_and_recovers_without_a_restart() {
    let mut redis = RedisServer::spawn().await;
    // Short enough to show the bound, with headroom for a loaded CI machine
    // (the production default is 150 ms).
    let op_timeout = Duration::from_millis(400);
    let fleet = Fleet::start(4, |config| {
        let mut redis_config = redis_config(&redis.url());
        redis_config.op_timeout = op_timeout;
        redis_config.breaker_cool_down = Duration::from_millis(300);
        config.redis = Some(redis_config);
    })
    .await;
    fleet.provider.set_latency(Duration::from_millis(200));
    let warm = fleet.instances[0]
        .post(PATH, &chat("before the outage"))
        .await;
    assert_eq!(warm.status, StatusCode::OK);

    redis.signal("STOP");
    let body = chat("during the outage");
    let started = Instant::now();
    let replies = collect(fleet.spread(PATH, &[(body.clone(), 40)])).await;
    let elapsed = started.elapsed();
    assert!(
        replies.iter().all(|r| r.status == StatusCode::OK),
        "Redis down never fails a caller"
    );
    // Bound: a few Redis deadlines before the breaker opens, plus the upstream call.
    assert!(
        elapsed < Duration::from_secs(15),
        "callers waited {elapsed:?}"
    );
    let outage_calls = fleet.provider.calls() - 1;
    assert!(
        outage_calls <= 4,
        "at most one call per instance, made {outage_calls}"
    );
    for instance in &fleet.instances {
        let cluster = instance.state.cluster().unwrap();
        assert!(cluster.errors() > 0, "the failures were counted");
        let exposition = instance.get("/metrics").await;
        let text = String::from_utf8_lossy(&exposition.body).into_owned();
        let counted = text
            .lines()
            .find(|line| line.starts_with("corral_redis_errors_total"))
            .and_then(|line| line.split_whitespace().last())
            .and_then(|value| value.parse::<f64>().ok());
        assert!(
            counted.is_some_and(|n| n > 0.0),
            "and exported: {counted:?}"
        );
        assert_eq!(instance.get("/readyz").await.json()["status"], "degraded");
    }

    // Killed while still stopped: had it resumed first, the old connections
    // would answer for a moment and close the breakers (the purge poller's
    // reads come every 250 ms), so the waits below could pass before an
    // instance saw its connection die, and the herd would meet dead connections.
    redis.kill().await;
    redis.restart().await;
    for instance in &fleet.instances {
        let cluster = instance.state.cluster().unwrap();
        let mut breaker = cluster.breaker().watch();
        tokio::time::timeout(
            WAIT,
            breaker.wait_for(|s| *s == corral::breaker::BreakerState::Closed),
        )
        .await
        .expect("breaker closes after Redis returns")
        .unwrap();
        let mut subscribed = cluster.subscribed();
        tokio::time::timeout(WAIT, subscribed.wait_for(|s| *s))
            .await
            .expect("subscriber reconnects")
            .unwrap();
    }
    let before = fleet.provider.calls();
    let replies = fleet.herd(PATH, &chat("after the outage"), 200).await;
    assert_one_answer(&replies);
    assert_eq!(
        fleet.provider.calls() - before,
        1,
        "cluster-wide dedup is back"
    );
}

fn a_key() -> CacheKey {
    let scope = TenantScope::of_credential(None, Some(b"sk-lock-test"));
    let fingerprint = Fingerprint::of(&KeyInput {
        endpoint: Endpoint::ChatCompletions,
        upstream: "mock",
        scope: &scope,
        headers: &[],
        query: &[],
        body: b"{}",
    });
    CacheKey { scope, fingerprint }
}

#[tokio::test]
async fn only_the_owner_can_release_its_lock() {
    let redis = RedisServer::spawn().await;
    let stop = tokio_util::sync::CancellationToken::new();
    let metrics =
        corral::metrics::Metrics::new(&corral::Config::for_tests("http://127.0.0.1:1/v1"));
    let cluster =
        corral::cluster::Cluster::start(&redis_config(&redis.url()), stop.clone(), metrics);
    tokio::time::timeout(WAIT, cluster.connected())
        .await
        .expect("connects");
    let key = a_key();
    let corral::cluster::LockAttempt::Acquired(old) = cluster.try_lock(&key).await.unwrap() else {
        panic!("a free lock is acquired");
    };
    assert!(matches!(
        cluster.try_lock(&key).await.unwrap(),
        corral::cluster::LockAttempt::Held(token) if token == old.token
    ));
    // The old owner's lease lapsed and a new owner took the lock.
    let mut conn = redis.client().await;
    let name = cluster.keys().lock(&key);
    let _: () = redis::cmd("SET")
        .arg(&name)
        .arg("new-owner")
        .arg("PX")
        .arg(10_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        !cluster.release(&old).await.unwrap(),
        "the old owner releases nothing"
    );
    assert!(
        !cluster.extend(&old).await.unwrap(),
        "nor extends the new lease"
    );
    let holder: Option<String> = redis::cmd("GET")
        .arg(&name)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(holder.as_deref(), Some("new-owner"));
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_upstream_sees_one_attempt_sequence_per_error_ttl() {
    let redis = RedisServer::spawn().await;
    let error_ttl = Duration::from_millis(500);
    let fleet = Fleet::start(4, |config| {
        config.redis = Some(redis_config(&redis.url()));
        config.cache.error_ttl = error_ttl;
        config.retry.max_attempts = 2;
    })
    .await;
    fleet.provider.set_failure(Some(FailureMode::always(500)));
    let body = chat("the provider is down");
    let load_for = Duration::from_secs(3);
    let started = Instant::now();
    let mut workers = Vec::new();
    for instance in &fleet.instances {
        for _ in 0..3 {
            let handle = instance.clone_handle();
            let body = body.clone();
            workers.push(tokio::spawn(async move {
                let mut sent = 0u64;
                while started.elapsed() < load_for {
                    let reply = handle.post_with(PATH, &body, &[]).await;
                    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
                    sent += 1;
                }
                sent
            }));
        }
    }
    let mut requests = 0;
    for worker in workers {
        requests += worker.await.unwrap();
    }
    let windows = (load_for.as_millis() / error_ttl.as_millis()) as u64 + 2;
    let calls = fleet.provider.calls();
    assert!(requests > 100, "steady load: {requests} requests");
    assert!(
        calls <= 2 * windows,
        "{calls} upstream attempts for {requests} requests over {windows} windows"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_finish_when_the_subscriber_is_killed_or_redis_restarts_empty() {
    let mut redis = RedisServer::spawn().await;
    let poll = Duration::from_millis(200);
    let fleet = Fleet::start(2, |config| config.redis = Some(redis_config(&redis.url()))).await;
    let (owner, follower) = (&fleet.instances[0], &fleet.instances[1]);

    // Announcements lost: every subscriber connection is killed mid-wait.
    fleet.provider.hold();
    let body = chat("lost announcement");
    let owner_request = fleet.instances[0].spawn_post(PATH, &body);
    owner.wait_for_calls(1).await;
    let followers: Vec<_> = (0..5).map(|_| follower.spawn_post(PATH, &body)).collect();
    follower.wait_for_waiters(5).await;
    redis.kill_pubsub_clients().await;
    fleet.provider.release();
    let released = Instant::now();
    let mut replies = collect(followers).await;
    let waited = released.elapsed();
    replies.push(owner_request.await.unwrap());
    assert_one_answer(&replies);
    assert_eq!(fleet.provider.calls(), 1);
    // Found by the poll backstop, not by waiting out `wait_timeout` (180 s):
    // generous for a loaded machine, far below the timeout.
    assert!(
        waited < poll + Duration::from_secs(10),
        "followers waited {waited:?}"
    );

    // Redis restarted empty: the lock and the record are gone mid-wait.
    fleet.provider.hold();
    let body = chat("redis restarts");
    let owner_request = fleet.instances[0].spawn_post(PATH, &body);
    owner.wait_for_calls(2).await;
    let followers: Vec<_> = (0..5).map(|_| follower.spawn_post(PATH, &body)).collect();
    follower.wait_for_waiters(5).await;
    redis.restart().await;
    // At most one extra call: a follower takes over the vanished lock.
    let took_over = fleet
        .provider
        .wait_for_calls(3, Duration::from_secs(3))
        .await;
    fleet.provider.release();
    let mut replies = collect(followers).await;
    replies.push(owner_request.await.unwrap());
    assert!(replies.iter().all(|r| r.status == StatusCode::OK));
    assert!(
        fleet.provider.calls() <= 3,
        "at most one extra call, took over: {took_over}"
    );
}

/// In a stampede every caller of an instance misses its L1 at once; they
/// share one Redis read of the entry rather than queueing one read each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_that_miss_l1_together_share_one_redis_read() {
    const CALLERS: usize = 200;
    let redis = RedisServer::spawn().await;
    // Redis is paused below for longer than a production op timeout.
    let patient = |config: &mut corral::Config| {
        config.redis = Some(RedisConfig {
            op_timeout: Duration::from_secs(30),
            ..redis_config(&redis.url())
        })
    };
    let fleet = Fleet::start(1, patient).await;
    let body = chat("one redis read for the whole herd");
    assert_eq!(fleet.instances[0].post(PATH, &body).await.cache(), "MISS");
    // A fresh instance: its L1 is empty, the answer is in Redis.
    let reader =
        TestGateway::start_shared(fleet.provider.clone(), fleet.clock.clone(), patient).await;
    reader.wait_connected().await;
    let cluster = reader
        .state
        .cluster()
        .cloned()
        .expect("redis is configured");
    let gets_before = redis.command_calls("get").await;

    // Redis answers nobody for a while: every caller that arrives meanwhile
    // either sends its own GET (and waits) or joins the one in progress.
    let mut conn = redis.client().await;
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1500)
        .arg("ALL")
        .query_async(&mut conn)
        .await
        .unwrap();
    let tasks: Vec<_> = (0..CALLERS)
        .map(|_| reader.spawn_post(PATH, &body))
        .collect();
    let replies = collect(tasks).await;

    assert_eq!(
        count_status(&replies, "HIT"),
        CALLERS,
        "all served from Redis"
    );
    assert_eq!(fleet.provider.calls(), 1, "no second upstream call");
    let gets = redis.command_calls("get").await - gets_before;
    assert!(
        gets <= 2,
        "{CALLERS} callers sent {gets} GETs ({} joined a read in progress)",
        cluster.shared_reads()
    );
    assert!(cluster.shared_reads() > 0);
}

#[tokio::test]
async fn a_corrupted_or_foreign_value_is_a_miss_never_served() {
    let redis = RedisServer::spawn().await;
    let fleet = Fleet::start(1, |config| config.redis = Some(redis_config(&redis.url()))).await;
    let writer = &fleet.instances[0];
    let a = writer.post(PATH, &chat("prompt a")).await;
    let b = writer.post(PATH, &chat("prompt b")).await;
    assert_eq!((a.cache(), b.cache()), ("MISS", "MISS"));
    let dump = redis.dump().await;
    let entry_of = |reply: &crate::harness::Reply| {
        let fp = reply.header("x-corral-fingerprint").unwrap().to_owned();
        dump.iter()
            .find(|(k, _)| k.contains(":resp:") && k.contains(&fp))
            .cloned()
            .expect("the entry is in Redis")
    };
    let (key_a, _) = entry_of(&a);
    let (_, value_b) = entry_of(&b);
    let mut conn = redis.client().await;

    // A fresh instance (empty L1) reads only Redis.
    for poison in [b"garbage".to_vec(), value_b] {
        let _: () = redis::cmd("SET")
            .arg(&key_a)
            .arg(poison)
            .query_async(&mut conn)
            .await
            .unwrap();
        let reader =
            TestGateway::start_shared(fleet.provider.clone(), fleet.clock.clone(), |config| {
                config.redis = Some(redis_config(&redis.url()));
            })
            .await;
        reader.wait_connected().await;
        let calls = fleet.provider.calls();
        let reply = reader.post(PATH, &chat("prompt a")).await;
        assert_eq!(reply.cache(), "MISS", "a bad value is never served");
        assert_ne!(reply.body, b.body);
        assert_eq!(fleet.provider.calls(), calls + 1);
        assert!(
            reader.state.cluster().unwrap().rejected_values() >= 1,
            "and it is counted"
        );
    }
}

#[tokio::test]
async fn every_key_corral_writes_has_a_ttl_and_no_credential() {
    let redis = RedisServer::spawn().await;
    let fleet = Fleet::start(1, |config| config.redis = Some(redis_config(&redis.url()))).await;
    let gateway = &fleet.instances[0];
    gateway
        .post_with(
            PATH,
            &chat("ttl check"),
            &[("authorization", "Bearer sk-never-in-redis")],
        )
        .await;
    fleet.provider.set_failure(Some(FailureMode::always(400)));
    gateway.post(PATH, &chat("negative entry")).await;
    gateway.wait_idle().await;
    let mut conn = redis.client().await;
    let dump = redis.dump().await;
    assert!(dump.len() >= 2, "{dump:?}");
    for (key, value) in dump {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(ttl > 0, "{key} has no TTL");
        assert!(!key.contains("sk-never") && !String::from_utf8_lossy(&value).contains("sk-never"));
    }
}

#[tokio::test]
async fn corral_starts_and_serves_with_redis_down() {
    // Nothing listens on port 1: Redis is down from the start.
    let gateway = TestGateway::start(|config| {
        config.redis = Some(redis_config("redis://127.0.0.1:1"));
    })
    .await;
    let body = chat("no redis at all");
    let first = gateway.post(PATH, &body).await;
    assert_eq!(first.status, StatusCode::OK);
    let again = gateway.post(PATH, &body).await;
    assert_eq!(again.cache(), "HIT", "the L1 still serves");
    assert_eq!(gateway.provider.calls(), 1);
    let ready = gateway.get("/readyz").await;
    assert_eq!(
        ready.status,
        StatusCode::OK,
        "ready: corral serves without Redis"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_master_redis_cluster_dedups_across_four_instances() {
    let cluster = RedisCluster::spawn().await;
    let fleet = Fleet::start(4, |config| config.redis = Some(cluster_config(&cluster))).await;
    for round in 1..=3u64 {
        let replies = fleet
            .herd(PATH, &chat(&format!("cluster mode {round}")), 1000)
            .await;
        let errors: Vec<u64> = fleet
            .instances
            .iter()
            .map(|i| i.state.cluster().unwrap().errors())
            .collect();
        assert_eq!(errors, [0, 0, 0, 0], "redis errors per instance");
        assert_one_answer(&replies);
        assert_eq!(fleet.provider.calls(), round);
    }
}

#[tokio::test]
async fn a_full_redis_skips_the_write_and_still_answers() {
    let redis =
        RedisServer::spawn_with(&["--maxmemory", "2mb", "--maxmemory-policy", "noeviction"]).await;
    let mut conn = redis.client().await;
    // Fill Redis until it refuses writes.
    let filler = vec![b'x'; 64 * 1024];
    for i in 0..1000 {
        let result: redis::RedisResult<()> = redis::cmd("SET")
            .arg(format!("filler:{i}"))
            .arg(&filler)
            .query_async(&mut conn)
            .await;
        if result.is_err() {
            break;
        }
    }
    let gateway =
        TestGateway::start(|config| config.redis = Some(redis_config(&redis.url()))).await;
    gateway.wait_connected().await;
    let body = chat("redis is full");
    let reply = gateway.post(PATH, &body).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(
        gateway.state.cluster().unwrap().errors() > 0,
        "the refused write is counted"
    );
    let again = gateway.post(PATH, &body).await;
    assert_eq!(again.cache(), "HIT", "L1 still has it");
    assert_eq!(
        gateway.state.cluster().unwrap().status(),
        "up",
        "a refusal is not an outage"
    );
}
