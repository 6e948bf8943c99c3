//! State stays with its account (issue 38, item 6): a stored response, a
//! file, a batch live in the provider account (pool member) that made them,
//! so a request naming one goes to that member whatever its affinity, and
//! nowhere else: that member cooling, the caller gets its 429, never
//! another account's "not found". Cluster-wide, through Redis.

use std::time::Duration;

use corral::config::{Affinity, Config, PassRule};
use mock_upstream::{FailureMode, MockProvider};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{
    cluster::redis_config,
    harness::{Fleet, TestGateway},
    pools::{member, mocks, pooled},
    redis_server::RedisServer,
};

const RESPONSES: &str = "/v1/responses";

/// A two-member pool (a, b) by session, whose stored responses and files
/// the pass-through may read (corral sends its own keys: allowed explicitly).
fn two_members(config: &mut Config, a: &MockProvider, b: &MockProvider) {
    pooled(
        config,
        vec![member("a", a.base_url()), member("b", b.base_url())],
        Affinity::Session,
    );
    config.passthrough.allow = ["/v1/responses/*", "/v1/files", "/v1/files/*"]
        .into_iter()
        .map(|rule| PassRule::parse(rule).unwrap())
        .collect();
}

fn ask(input: &str) -> Value {
    json!({"model": "gpt-4o-mini", "input": input})
}

/// A session whose requests the pool sends to `wanted` (found by asking:
/// distinct, unstored requests, so nothing is pinned by the search).
async fn session_on(gateway: &TestGateway, wanted: &str) -> String {
    for i in 0..64 {
        let session = format!("session-{wanted}-{i}");
        let mut body = ask(&format!("where does {session} go?"));
        body["store"] = json!(false);
        let reply = gateway
            .post_with(RESPONSES, &body, &[("x-session-affinity", &session)])
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
        if reply.header("x-corral-member") == Some(wanted) {
            return session;
        }
    }
    panic!("no session of 64 lands on {wanted}");
}

/// Lines `mock` received for `path` (any method).
fn received_for(mock: &MockProvider, path: &str) -> usize {
    mock.received()
        .iter()
        .filter(|line| {
            line.split(' ')
                .nth(1)
                .is_some_and(|target| target.starts_with(path))
        })
        .count()
}

/// Makes a stored response on a (by a session that lands there) and returns
/// its id and a session that lands on b.
async fn stored_on_a(gateway: &TestGateway) -> (String, String) {
    let on_a = session_on(gateway, "a").await;
    let on_b = session_on(gateway, "b").await;
    let made = gateway
        .post_with(
            RESPONSES,
            &ask("remember: the code is 7"),
            &[("x-session-affinity", &on_a)],
        )
        .await;
    assert_eq!(made.status, StatusCode::OK, "{:?}", made.body);
    assert_eq!(made.header("x-corral-member"), Some("a"));
    let id = made.json()["id"].as_str().unwrap().to_owned();
    (id, on_b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_responses_follow_ups_reach_its_member_and_a_cooling_one_answers_429() {
    let [a, b] = <[MockProvider; 2]>::try_from(mocks(2).await).ok().unwrap();
    let gateway = TestGateway::start(|config| two_members(config, &a, &b)).await;
    let (id, on_b) = stored_on_a(&gateway).await;
    let b_calls = b.calls();
    for turn in 0..4 {
        let mut follow_up = ask(&format!("what was the code? ({turn})"));
        follow_up["previous_response_id"] = json!(id);
        let reply = gateway
            .post_with(RESPONSES, &follow_up, &[("x-session-affinity", &on_b)])
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
        assert_eq!(reply.header("x-corral-member"), Some("a"), "turn {turn}");
    }
    assert_eq!(b.calls(), b_calls, "b never asked about a's response");
    // A read of the stored response (the pass-through picks by weight):
    // every one reaches a.
    let read = format!("{RESPONSES}/{id}");
    for _ in 0..8 {
        let reply = gateway
            .get_with(&read, &[("x-session-affinity", &on_b)])
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    }
    assert_eq!(received_for(&a, &read), 8, "a: {:?}", a.received());
    assert_eq!(received_for(&b, &read), 0, "b: {:?}", b.received());
    // a out of quota: the caller meets a's 429, and b is asked nothing.
    a.set_failure(Some(
        FailureMode::always(429).with_retry_after(Duration::from_secs(60)),
    ));
    let (b_calls, b_lines) = (b.calls(), b.received().len());
    let mut follow_up = ask("and now?");
    follow_up["previous_response_id"] = json!(id);
    let reply = gateway
        .post_with(RESPONSES, &follow_up, &[("x-session-affinity", &on_b)])
        .await;
    assert_eq!(
        reply.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{:?}",
        reply.body
    );
    let reply = gateway.get(&read).await;
    assert_eq!(
        reply.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{:?}",
        reply.body
    );
    assert_eq!(b.calls(), b_calls, "no other member is asked");
    assert_eq!(b.received().len(), b_lines, "b: {:?}", b.received());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pin_made_on_one_instance_is_honoured_by_another() {
    let redis = RedisServer::spawn().await;
    let [a, b] = <[MockProvider; 2]>::try_from(mocks(2).await).ok().unwrap();
    let fleet = Fleet::start_with(a.clone(), 2, |config| {
        two_members(config, &a, &b);
        config.redis = Some(redis_config(&redis.url()));
    })
    .await;
    let (id, on_b) = stored_on_a(&fleet.instances[0]).await;
    let other = &fleet.instances[1];
    let b_calls = b.calls();
    for turn in 0..4 {
        let mut follow_up = ask(&format!("what was the code, elsewhere? ({turn})"));
        follow_up["previous_response_id"] = json!(id);
        let reply = other
            .post_with(RESPONSES, &follow_up, &[("x-session-affinity", &on_b)])
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
        assert_eq!(reply.header("x-corral-member"), Some("a"), "turn {turn}");
    }
    assert_eq!(b.calls(), b_calls);
    let read = format!("{RESPONSES}/{id}");
    for _ in 0..8 {
        assert_eq!(other.get(&read).await.status, StatusCode::OK);
    }
    assert_eq!(received_for(&b, &read), 0, "b: {:?}", b.received());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_made_through_the_passthrough_is_read_from_its_member() {
    let [a, b] = <[MockProvider; 2]>::try_from(mocks(2).await).ok().unwrap();
    let gateway = TestGateway::start(|config| two_members(config, &a, &b)).await;
    // Uploads spread by weight: make files until one is made on b.
    let mut made_on_b = None;
    for _ in 0..32 {
        let before = received_for(&b, "/v1/files");
        let reply = gateway
            .post("/v1/files", &json!({"purpose": "batch", "file": "a line"}))
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
        if received_for(&b, "/v1/files") > before {
            made_on_b = Some(reply.json()["id"].as_str().unwrap().to_owned());
            break;
        }
    }
    let id = made_on_b.expect("one of 32 uploads lands on b");
    let read = format!("/v1/files/{id}");
    for _ in 0..8 {
        let reply = gateway.get(&read).await;
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
        assert_eq!(reply.json()["id"], json!(id));
    }
    assert_eq!(received_for(&b, &read), 8, "b: {:?}", b.received());
    assert_eq!(received_for(&a, &read), 0, "a: {:?}", a.received());
}
