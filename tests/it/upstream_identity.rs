//! A key names what answers: an upstream's identity (its API and base URL),
//! not its name. An upstream repointed under the same name (a rolling deploy
//! whose instances disagree about where `openai` is) never serves the other
//! provider's answers from the Redis both share, and two upstreams of one
//! name are refused at startup.

use corral::Config;
use mock_upstream::{MockProvider, MockSettings};
use reqwest::StatusCode;

use crate::{
    harness::{TestGateway, chat, redis_at},
    redis_server::RedisServer,
};

const PATH: &str = "/v1/chat/completions";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_repointed_under_its_name_never_serves_the_old_providers_answers() {
    let redis = RedisServer::spawn().await;
    let old_provider = MockProvider::start(MockSettings::default()).await.unwrap();
    let new_provider = MockProvider::start(MockSettings::default()).await.unwrap();
    let shared = redis_at(&redis.url());
    let (old_redis, new_redis) = (shared.clone(), shared);
    let old = TestGateway::start_with(old_provider.clone(), move |config| {
        config.redis = Some(old_redis);
    })
    .await;
    let new = TestGateway::start_with(new_provider.clone(), move |config| {
        config.redis = Some(new_redis);
    })
    .await;
    old.wait_connected().await;
    new.wait_connected().await;
    assert_eq!(
        old.state.config().upstreams[0].name,
        new.state.config().upstreams[0].name,
        "one name, two providers"
    );

    let body = chat("which provider answers?");
    let first = old.post(PATH, &body).await;
    assert_eq!((first.status, first.cache()), (StatusCode::OK, "MISS"));
    // Stored in Redis under the old provider's identity: the repointed
    // instance asks its own provider.
    let second = new.post(PATH, &body).await;
    assert_eq!((second.status, second.cache()), (StatusCode::OK, "MISS"));
    assert_eq!((old_provider.calls(), new_provider.calls()), (1, 1));
    // Each provider's answer is shared by the instances that use it.
    let again = old.post(PATH, &body).await;
    assert_eq!(again.cache(), "HIT");
    assert_eq!(again.body, first.body);
}

#[test]
fn two_upstreams_of_one_name_are_refused_with_one_clear_line() {
    let mut config = Config::for_tests("http://127.0.0.1:1/v1");
    let mut twin = config.upstreams[0].clone();
    twin.base_url = "http://127.0.0.1:2/v1".into();
    config.upstreams.push(twin);
    let error = config.validate().unwrap_err().to_string();
    assert!(error.contains("upstreams[1].name"), "{error}");
    assert!(error.contains("upstreams[0] too"), "{error}");
    assert_eq!(error.lines().count(), 1, "{error}");
}
