//! One model, many accounts (issue 38): an upstream's `members` are a pool
//! of equivalent accounts, each a mock provider on its own port with its own
//! key. Calls spread by weight (or stay with their session), a member that
//! answers 429, 503 or not at all passes the call on to the next before any
//! byte reached a caller, a 429 cools a member (its quota bucket with it)
//! for the provider's time, and the pool is one key: one flight and one
//! cache whatever member answers.

use std::{collections::HashMap, time::Duration};

use corral::config::{Affinity, Config, MemberConfig, Secret};
use mock_upstream::{FailureMode, MockProvider, MockSettings, Scripted};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{TestGateway, chat, streamed};

pub(crate) const CHAT: &str = "/v1/chat/completions";

/// A member at `base_url` with key `sk-member-{name}`.
pub(crate) fn member(name: &str, base_url: String) -> MemberConfig {
    MemberConfig {
        name: name.into(),
        base_url: Some(base_url),
        api_key_env: None,
        provider: None,
        api_version: None,
        deployments: Default::default(),
        entra: None,
        region: None,
        aws: None,
        credentials_file: None,
        credentials_env: None,
        service_account: None,
        weight: 1,
        priority: 0,
        quota: None,
        connect_timeout: None,
        request_timeout: None,
        first_byte_timeout: None,
        rate: None,
        max_concurrency: None,
        breaker_failures: None,
        breaker_cool_down: None,
        api_key: Some(Secret::new(format!("sk-member-{name}"))),
    }
}

/// Mocks, one per member.
pub(crate) async fn mocks(n: usize) -> Vec<MockProvider> {
    let mut mocks = Vec::new();
    for _ in 0..n {
        mocks.push(MockProvider::start(MockSettings::default()).await.unwrap());
    }
    mocks
}

/// The first upstream made a pool of `members`, failing over through all of them.
pub(crate) fn pooled(config: &mut Config, members: Vec<MemberConfig>, affinity: Affinity) {
    let upstream = &mut config.upstreams[0];
    upstream.members = members;
    upstream.affinity = affinity;
    config.retry.max_attempts = 6;
}

/// The first upstream a pool of `first`, and `spare` (priority 1) tried only
/// once `first` cannot take a call.
pub(crate) fn first_and_spare(config: &mut Config, first: MemberConfig, mut spare: MemberConfig) {
    spare.priority = 1;
    pooled(config, vec![first, spare], Affinity::None);
}

/// `n` identical callers, held at the members until all of them wait on
/// the one flight.
pub(crate) async fn herd_on(
    gateway: &TestGateway,
    members: &[&MockProvider],
    body: &Value,
    n: usize,
) -> Vec<crate::harness::Reply> {
    members.iter().for_each(|mock| mock.hold());
    let tasks: Vec<_> = (0..n).map(|_| gateway.spawn_post(CHAT, body)).collect();
    gateway.wait_for_waiters(n).await;
    members.iter().for_each(|mock| mock.release());
    crate::harness::collect(tasks).await
}

/// A base URL where nothing listens.
pub(crate) async fn closed_port() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}/v1")
}

/// Which member (by key) each mock's calls carried.
pub(crate) fn keys_seen(mock: &MockProvider) -> Vec<String> {
    mock.requests()
        .iter()
        .map(|request| request.header("authorization").unwrap_or("-").to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_share_the_calls_and_a_higher_priority_waits_until_the_others_cool() {
    let [a, b, c] = <[MockProvider; 3]>::try_from(mocks(3).await).ok().unwrap();
    let gateway = TestGateway::start(|config| {
        let mut heavy = member("a", a.base_url());
        heavy.weight = 3;
        let mut spare = member("c", c.base_url());
        spare.priority = 1;
        pooled(
            config,
            vec![heavy, member("b", b.base_url()), spare],
            Affinity::None,
        );
    })
    .await;
    for i in 0..400 {
        let reply = gateway.post(CHAT, &chat(&format!("distinct {i}"))).await;
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    }
    let (on_a, on_b) = (a.calls(), b.calls());
    assert_eq!(on_a + on_b, 400, "every call on a or b");
    // 3:1 of 400 is 300; the tolerance is about five standard deviations.
    assert!((250..=350).contains(&on_a), "a: {on_a}, b: {on_b}");
    assert_eq!(
        c.calls(),
        0,
        "the priority-1 member waits while the others are healthy"
    );
    assert!(keys_seen(&a).iter().all(|key| key == "Bearer sk-member-a"));
    assert!(keys_seen(&b).iter().all(|key| key == "Bearer sk-member-b"));
    // Both priority-0 members out of quota for a minute: everything goes to c.
    for mock in [&a, &b] {
        mock.set_failure(Some(
            FailureMode::always(429).with_retry_after(Duration::from_secs(60)),
        ));
    }
    for i in 0..40 {
        let reply = gateway.post(CHAT, &chat(&format!("cooling {i}"))).await;
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    }
    assert_eq!(c.calls(), 40, "every call reached c");
    assert!(
        a.calls() - on_a <= 1 && b.calls() - on_b <= 1,
        "each cooling member met at most one call: a {} b {}",
        a.calls() - on_a,
        b.calls() - on_b
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_a_503_and_a_closed_port_fail_over_and_cool_for_the_providers_time() {
    let [limited, sick, healthy] = <[MockProvider; 3]>::try_from(mocks(3).await).ok().unwrap();
    limited.set_failure(Some(
        FailureMode::always(429).with_retry_after(Duration::from_millis(3000)),
    ));
    sick.set_failure(Some(FailureMode::always(503)));
    let closed = closed_port().await;
    let gateway = TestGateway::start(|config| {
        pooled(
            config,
            vec![
                member("limited", limited.base_url()),
                member("sick", sick.base_url()),
                member("closed", closed),
                member("healthy", healthy.base_url()),
            ],
            Affinity::None,
        );
    })
    .await;
    for i in 0..30 {
        let reply = gateway.post(CHAT, &chat(&format!("failover {i}"))).await;
        assert_eq!(reply.status, StatusCode::OK, "{i}: {:?}", reply.body);
    }
    assert_eq!(
        healthy.calls(),
        30,
        "every answer came from the healthy member"
    );
    assert_eq!(
        limited.calls(),
        1,
        "the 429's member got no request while its 3 s cooled"
    );
    assert_eq!(
        sick.calls(),
        1,
        "the 503's member cools for the pool's cooldown"
    );
    // Its time is up: it takes one probe, and with it traffic again.
    limited.set_failure(None);
    gateway.clock.advance(Duration::from_millis(3001));
    for i in 0..30 {
        let reply = gateway.post(CHAT, &chat(&format!("back {i}"))).await;
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    }
    assert!(
        limited.calls() > 1,
        "the member came back after its cooldown: {}",
        limited.calls()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_providers_words_set_the_pause_and_a_quota_bucket_cools_together() {
    let [first, sibling, other] = <[MockProvider; 3]>::try_from(mocks(3).await).ok().unwrap();
    let gateway = TestGateway::start(|config| {
        let mut one = member("org-key-1", first.base_url());
        one.quota = Some("org".into());
        let mut two = member("org-key-2", sibling.base_url());
        two.quota = Some("org".into());
        pooled(
            config,
            vec![one, two, member("other", other.base_url())],
            Affinity::Session,
        );
        config.upstreams[0].cooldown = Duration::from_secs(5);
    })
    .await;
    // OpenAI's rate-limit reset names the pause: 20 s, not the pool's 5 s.
    let limited = |reset: &str| {
        Scripted {
        status: 429,
        headers: vec![
            ("x-ratelimit-remaining-requests".into(), "0".into()),
            ("x-ratelimit-reset-requests".into(), reset.into()),
        ],
        body: json!({"error": {"message": "rate limited", "type": "requests", "code": "rate_limit_exceeded"}})
            .to_string(),
    }
    };
    // Whichever org key a session lands on first answers 429: both org keys cool.
    first.push_script(limited("20s"));
    sibling.push_script(limited("20s"));
    let mut on_org = 0;
    for i in 0..20 {
        let mut body = chat(&format!("bucket {i}"));
        body["prompt_cache_key"] = json!(format!("session {i}"));
        let reply = gateway.post(CHAT, &body).await;
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
        on_org = first.calls() + sibling.calls();
        if on_org == 1 {
            break;
        }
    }
    assert_eq!(on_org, 1, "a session landed on an org key and met its 429");
    for i in 0..20 {
        let reply = gateway.post(CHAT, &chat(&format!("after {i}"))).await;
        assert_eq!(reply.status, StatusCode::OK);
    }
    assert_eq!(
        first.calls() + sibling.calls(),
        1,
        "one key's 429 paused its quota sibling too"
    );
    // Past the pool's 5 s, within the provider's 20 s: still cooling.
    gateway.clock.advance(Duration::from_secs(6));
    for i in 0..20 {
        let reply = gateway.post(CHAT, &chat(&format!("six seconds {i}"))).await;
        assert_eq!(reply.status, StatusCode::OK);
    }
    assert_eq!(first.calls() + sibling.calls(), 1, "the provider said 20 s");
    gateway.clock.advance(Duration::from_secs(15));
    for i in 0..40 {
        let reply = gateway
            .post(CHAT, &chat(&format!("twenty seconds {i}")))
            .await;
        assert_eq!(reply.status, StatusCode::OK);
    }
    assert!(first.calls() + sibling.calls() > 1, "the org is back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callers_400_and_a_stream_cut_midway_move_no_call() {
    let [a, b] = <[MockProvider; 2]>::try_from(mocks(2).await).ok().unwrap();
    let gateway = TestGateway::start(|config| {
        first_and_spare(config, member("a", a.base_url()), member("b", b.base_url()));
    })
    .await;
    a.push_script(Scripted::json(
        400,
        json!({"error": {"message": "bad request", "type": "invalid_request_error", "code": null}})
            .to_string(),
    ));
    let reply = gateway.post(CHAT, &chat("a caller's mistake")).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.json()["error"]["message"], "bad request");
    assert_eq!((a.calls(), b.calls()), (1, 0), "no other member was asked");
    // A stream cut after its first events: every reader gets an error event,
    // and no other member is asked (bytes reached callers).
    a.set_truncate_streams(true);
    let readers = herd_on(&gateway, &[&a, &b], &streamed(chat("cut midway")), 3).await;
    for reply in &readers {
        let text = String::from_utf8_lossy(&reply.body);
        assert!(text.contains("\"error\""), "an error event: {text}");
    }
    assert_eq!((a.calls(), b.calls()), (2, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_stays_on_one_member_and_only_a_stopped_members_sessions_move() {
    let mocks = mocks(3).await;
    let urls: Vec<String> = mocks.iter().map(MockProvider::base_url).collect();
    let gateway = TestGateway::start(|config| {
        let members = ["a", "b", "c"]
            .iter()
            .zip(&urls)
            .map(|(name, url)| member(name, url.clone()))
            .collect();
        pooled(config, members, Affinity::Session);
    })
    .await;
    let member_of = |reply: &crate::harness::Reply| {
        reply
            .header("x-corral-member")
            .unwrap_or_else(|| panic!("a MISS names its member: {:?}", reply.headers))
            .to_owned()
    };
    // Each of the ways a session is named keeps its 30 requests on one member:
    // a body field (`prompt_cache_key`, or Anthropic's `metadata.user_id`,
    // read alike), or a header.
    type Header<'a> = Option<(&'a str, &'a str)>;
    let named: [(&str, Option<&str>, Header); 3] = [
        ("prompt_cache_key", Some("pck-1"), None),
        (
            "x-claude-code-session-id",
            None,
            Some(("x-claude-code-session-id", "cc-session-1")),
        ),
        ("session-id", None, Some(("session-id", "plain-session-1"))),
    ];
    for (how, cache_key, header) in named {
        let mut seen = HashMap::new();
        for i in 0..30 {
            let mut body = chat(&format!("{how} turn {i}"));
            if let Some(key) = cache_key {
                body["prompt_cache_key"] = json!(key);
            }
            let headers: Vec<(&str, &str)> = header.into_iter().collect();
            let reply = gateway.post_with(CHAT, &body, &headers).await;
            assert_eq!(reply.status, StatusCode::OK);
            *seen.entry(member_of(&reply)).or_insert(0) += 1;
        }
        assert_eq!(seen.len(), 1, "{how}: one member for the session: {seen:?}");
    }
    // 60 sessions spread over the members.
    let mut homes = Vec::new();
    for session in 0..60 {
        let mut body = chat(&format!("session {session} opening"));
        body["prompt_cache_key"] = json!(format!("s-{session}"));
        let reply = gateway.post(CHAT, &body).await;
        homes.push(member_of(&reply));
    }
    for name in ["a", "b", "c"] {
        assert!(
            homes.iter().any(|home| home == name),
            "{name} has sessions: {homes:?}"
        );
    }
    // Member b stops: its sessions move, every other session stays home.
    let mut mocks = mocks;
    drop(mocks.remove(1));
    for (session, home) in homes.iter().enumerate() {
        let mut body = chat(&format!("session {session} second turn"));
        body["prompt_cache_key"] = json!(format!("s-{session}"));
        let reply = gateway.post(CHAT, &body).await;
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
        let now = member_of(&reply);
        if home == "b" {
            assert_ne!(now, "b");
        } else {
            assert_eq!(&now, home, "session {session} stayed on its member");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_is_one_key_one_flight_for_every_member() {
    let [a, b] = <[MockProvider; 2]>::try_from(mocks(2).await).ok().unwrap();
    let gateway = TestGateway::start(|config| {
        pooled(
            config,
            vec![member("a", a.base_url()), member("b", b.base_url())],
            Affinity::Session,
        );
    })
    .await;
    let body = chat("one answer for the whole pool");
    let replies = herd_on(&gateway, &[&a, &b], &body, 200).await;
    assert!(replies.iter().all(|reply| reply.status == StatusCode::OK));
    assert_eq!(
        a.calls() + b.calls(),
        1,
        "one upstream call across the pool"
    );
    // Callers whose sessions would pick either member share the answer.
    for session in 0..20 {
        let mut other = body.clone();
        other["prompt_cache_key"] = json!(format!("elsewhere {session}"));
        let reply = gateway.post(CHAT, &other).await;
        assert_eq!(reply.cache(), "HIT", "session {session}");
    }
    assert_eq!(a.calls() + b.calls(), 1);
}

/// The pool's key outlives its members: after a restart on the same Redis,
/// with member `b` removed and `c` added, the answer member `a` or `b` made
/// is still a HIT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pools_answers_outlive_a_change_of_its_members() {
    let redis = crate::redis_server::RedisServer::spawn().await;
    let [a, b, c] = <[MockProvider; 3]>::try_from(mocks(3).await).ok().unwrap();
    let body = chat("an answer the pool keeps");
    let before = TestGateway::start(|config| {
        pooled(
            config,
            vec![member("a", a.base_url()), member("b", b.base_url())],
            Affinity::Session,
        );
        config.redis = Some(crate::harness::redis_at(&redis.url()));
    })
    .await;
    before.wait_connected().await;
    assert_eq!(before.post(CHAT, &body).await.cache(), "MISS");
    before.stop().await;
    let after = TestGateway::start(|config| {
        let mut heavy = member("a", a.base_url());
        heavy.weight = 5;
        pooled(
            config,
            vec![heavy, member("c", c.base_url())],
            Affinity::Session,
        );
        config.redis = Some(crate::harness::redis_at(&redis.url()));
    })
    .await;
    after.wait_connected().await;
    let reply = after.post(CHAT, &body).await;
    assert_eq!(reply.cache(), "HIT", "{:?}", reply.headers);
    assert_eq!(a.calls() + b.calls() + c.calls(), 1);
}

/// Anthropic's session naming, `metadata.user_id`, keeps a session on one
/// member of a Messages pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anthropic_user_id_keeps_its_session_on_one_member() {
    let [a, b] = <[MockProvider; 2]>::try_from(mocks(2).await).ok().unwrap();
    let gateway = TestGateway::start(|config| {
        let mut anthropic = config.upstreams[0].clone();
        anthropic.name = "claude".into();
        anthropic.api = corral::config::Api::Anthropic;
        anthropic.models = vec!["claude-*".into()];
        anthropic.members = vec![member("a", a.base_url()), member("b", b.base_url())];
        config.upstreams.push(anthropic);
    })
    .await;
    for user in ["user_1_session_x", "user_2_session_y"] {
        let mut seen = std::collections::BTreeSet::new();
        for turn in 0..30 {
            let body = json!({
                "model": "claude-sonnet-4-5",
                "max_tokens": 64,
                "temperature": 0,
                "metadata": {"user_id": user},
                "messages": [{"role": "user", "content": format!("{user} turn {turn}")}],
            });
            let reply = gateway
                .post_with("/v1/messages", &body, &[("x-api-key", "sk-ant-caller")])
                .await;
            assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
            seen.insert(reply.header("x-corral-member").unwrap_or("-").to_owned());
        }
        assert_eq!(seen.len(), 1, "{user}: one member: {seen:?}");
    }
}

/// A 429 that says `Retry-After: 7` pauses its member 7 s; one that names no
/// time pauses it for the pool's `cooldown` (here 2 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_and_a_bare_429_set_their_pauses() {
    let [a, b] = <[MockProvider; 2]>::try_from(mocks(2).await).ok().unwrap();
    let gateway = TestGateway::start(|config| {
        first_and_spare(config, member("a", a.base_url()), member("b", b.base_url()));
        config.upstreams[0].cooldown = Duration::from_secs(2);
    })
    .await;
    let limited = |headers: Vec<(String, String)>| Scripted {
        status: 429,
        headers,
        body: json!({"error": {"message": "slow down", "type": "requests", "code": null}})
            .to_string(),
    };
    // Ten distinct calls: on `a` unless it cools (then on the spare `b`).
    async fn ten_calls(gateway: &TestGateway, tag: &str) {
        for i in 0..10 {
            let reply = gateway.post(CHAT, &chat(&format!("{tag} {i}"))).await;
            assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
        }
    }
    a.push_script(limited(vec![("retry-after".into(), "7".into())]));
    ten_calls(&gateway, "retry-after").await;
    assert_eq!(a.calls(), 1, "paused after its 429");
    gateway.clock.advance(Duration::from_secs(6));
    ten_calls(&gateway, "six seconds").await;
    assert_eq!(a.calls(), 1, "still within its 7 s");
    gateway.clock.advance(Duration::from_millis(1001));
    ten_calls(&gateway, "seven seconds").await;
    assert_eq!(a.calls(), 11, "back after 7 s: every call on a");
    // A bare 429: the pool's 2 s.
    a.push_script(limited(Vec::new()));
    ten_calls(&gateway, "bare").await;
    assert_eq!(a.calls(), 12);
    gateway.clock.advance(Duration::from_millis(2001));
    ten_calls(&gateway, "after the pool's cooldown").await;
    assert_eq!(a.calls(), 22, "back after the pool's 2 s");
}
