//! corral in front of Amazon Bedrock: an `api: anthropic` pool whose members
//! are `provider: bedrock` accounts (SigV4 with AWS keys, or a Bedrock API
//! key). Callers speak Anthropic's Messages API and never learn that Bedrock
//! answered: the mock verifies every signature over the exact bytes, its
//! event stream reaches the official SDK as Anthropic's SSE, a herd is one
//! InvokeModel call, a throttling frame mid-stream fails every reader and
//! keeps nothing, and Bedrock's 429s move a call to another member and cool
//! the one that sent them.

use std::time::Duration;

use corral::config::{
    Affinity, Api, AwsConfig, AwsCredentials, Config, MemberConfig, ProviderKind, Secret,
};
use mock_upstream::{
    BEDROCK_ANTHROPIC_VERSION, BEDROCK_DEFAULT_REGION, BEDROCK_MODEL_NOT_READY_TRIGGER,
    BEDROCK_TEST_ACCESS_KEY_ID, BEDROCK_TEST_API_KEY, BEDROCK_TEST_SECRET_ACCESS_KEY,
    BEDROCK_THROTTLE_MIDSTREAM_TRIGGER, FailureMode, MockProvider, MockSettings,
};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{
    harness::{Reply, TestGateway, assert_event_stream, named_events, streamed},
    metrics::{model_tokens, scrape},
    pools::{first_and_spare, member, pooled},
    sdk::Python,
};

const MESSAGES: &str = "/v1/messages";
const PUBLIC: &str = "claude-sonnet-4-5";
const BEDROCK_ID: &str = "us.anthropic.claude-sonnet-4-5-20250929-v1:0";
/// InvokeModel's path for [`BEDROCK_ID`], its `:` percent-encoded as the AWS SDKs do.
const INVOKE: &str = "/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke";
const INVOKE_STREAM: &str =
    "/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke-with-response-stream";
/// The caller's key: its tenant. The members have credentials of their own.
const KEY: (&str, &str) = ("x-api-key", "sk-ant-bedrock-caller");

async fn bedrock_mock() -> MockProvider {
    MockProvider::start(MockSettings::default())
        .await
        .expect("mock starts")
}

/// A Bedrock member at `mock`'s root: `claude-sonnet-4-5` deployed as
/// [`BEDROCK_ID`], no credential yet.
fn bedrock_member(name: &str, mock: &MockProvider) -> MemberConfig {
    let mut account = member(name, mock.bedrock_endpoint());
    account.provider = Some(ProviderKind::Bedrock);
    account.api_key = None;
    account.region = Some(BEDROCK_DEFAULT_REGION.to_owned());
    account.deployments = [(PUBLIC.to_owned(), BEDROCK_ID.to_owned())].into();
    account
}

/// A Bedrock member signing with the mock's test AWS keys.
fn sigv4_member(name: &str, mock: &MockProvider) -> MemberConfig {
    let mut account = bedrock_member(name, mock);
    account.aws = Some(aws_keys(
        BEDROCK_TEST_ACCESS_KEY_ID,
        BEDROCK_TEST_SECRET_ACCESS_KEY,
    ));
    account
}

/// An account's AWS keys, as the config holds them once read from the
/// environment (no session token).
pub(crate) fn aws_keys(access_key_id: &str, secret_access_key: &str) -> AwsConfig {
    AwsConfig {
        access_key_id_env: "AWS_ACCESS_KEY_ID".to_owned(),
        secret_access_key_env: "AWS_SECRET_ACCESS_KEY".to_owned(),
        session_token_env: None,
        credentials: Some(AwsCredentials {
            access_key_id: Secret::new(access_key_id.to_owned()),
            secret_access_key: Secret::new(secret_access_key.to_owned()),
            session_token: None,
        }),
    }
}

/// The first upstream serves Anthropic's API for `claude-*`.
fn anthropic_upstream(config: &mut Config) {
    let upstream = &mut config.upstreams[0];
    upstream.api = Api::Anthropic;
    upstream.models = vec!["claude-*".to_owned()];
}

/// A gateway whose only upstream is a pool of one SigV4 Bedrock member at `mock`.
async fn sigv4_gateway(mock: &MockProvider) -> TestGateway {
    TestGateway::start_with(mock.clone(), |config| {
        anthropic_upstream(config);
        pooled(config, vec![sigv4_member("bedrock", mock)], Affinity::None);
    })
    .await
}

/// A deterministic Messages request (temperature 0: stored).
fn message(text: &str) -> Value {
    json!({
        "model": PUBLIC,
        "max_tokens": 128,
        "temperature": 0,
        "system": "Be terse.",
        "messages": [{"role": "user", "content": text}],
    })
}

/// What the mock received as Bedrock's body: no `model`, no `stream`, and
/// Bedrock's own `anthropic_version`.
fn assert_bedrock_body(body: &Value) {
    assert!(body.get("model").is_none(), "{body}");
    assert!(body.get("stream").is_none(), "{body}");
    assert_eq!(
        body["anthropic_version"], BEDROCK_ANTHROPIC_VERSION,
        "{body}"
    );
}

/// A one-block text answer's event types as Anthropic streams them, with
/// `deltas` text deltas.
fn in_anthropics_order(deltas: usize) -> Vec<&'static str> {
    let mut order = vec!["message_start", "content_block_start", "ping"];
    order.extend(std::iter::repeat_n("content_block_delta", deltas));
    order.extend(["content_block_stop", "message_delta", "message_stop"]);
    order
}

/// The `error` event a stream ended with, checking that it was its last.
fn final_error(reply: &Reply) -> Value {
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    let events = named_events(&reply.body);
    let (name, data) = events.last().expect("the stream has events");
    assert_eq!(name, "error", "the stream ended with an error event");
    data.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anthropic_sdk_reaches_a_sigv4_bedrock_member_through_invoke_model_and_its_stream() {
    let python = Python::with_anthropic().await;
    let mock = bedrock_mock().await;
    let gateway = sigv4_gateway(&mock).await;
    let (results, stderr) = python.run_script("bedrock_member.py", &gateway.url).await;
    let context = format!("results: {results}\nstderr: {stderr}");

    // Two tenants, two calls, each signed and verified over its exact bytes.
    assert_eq!(mock.calls(), 2, "{context}");
    assert_eq!(mock.sigv4_verified(), 2, "{context}");
    assert!(mock.bedrock_refused().is_empty(), "{context}");
    let paths: Vec<String> = mock.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, [INVOKE, INVOKE_STREAM], "{context}");
    for request in mock.requests() {
        assert_bedrock_body(&request.json().expect("a JSON body"));
        assert!(
            request
                .header("authorization")
                .is_some_and(|value| value.starts_with("AWS4-HMAC-SHA256 ")),
            "{:?}",
            request.headers
        );
        assert_eq!(request.header("x-api-key"), None, "no caller key to AWS");
    }
    assert_eq!(results["plain_cache"], "MISS", "{context}");
    assert_eq!(results["stream_cache"], "MISS", "{context}");

    // The stream reached the SDK whole: its text is the plain answer's,
    // its events in Anthropic's order.
    let plain = results["plain_text"].as_str().unwrap_or_default();
    assert!(!plain.is_empty(), "{context}");
    assert_eq!(results["stream_text"], plain, "{context}");
    assert_eq!(results["final_text"], plain, "{context}");
    assert_eq!(
        results["final_stop_reason"], results["plain_stop_reason"],
        "{context}"
    );
    assert_eq!(results["final_usage"], results["plain_usage"], "{context}");
    let types: Vec<&str> = results["stream_types"]
        .as_array()
        .expect("the stream's event types")
        .iter()
        .filter_map(Value::as_str)
        // The SDK's own `text` events follow each text delta; Anthropic's are the others.
        .filter(|kind| *kind != "text")
        .collect();
    let deltas = types
        .iter()
        .filter(|kind| **kind == "content_block_delta")
        .count();
    assert!(deltas > 0, "{context}");
    // The SDK skips `ping`; the wire's own order, ping included, is
    // `a_bedrock_api_key_member_sends_its_key_as_a_bearer_token`'s.
    let mut expected = in_anthropics_order(deltas);
    expected.retain(|kind| *kind != "ping");
    assert_eq!(types, expected, "{context}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_identical_callers_make_one_bedrock_call_and_a_repeat_is_a_hit() {
    let mock = bedrock_mock().await;
    let gateway = sigv4_gateway(&mock).await;
    let body = message("a herd at Bedrock");
    let replies = gateway.herd(MESSAGES, &body, 50, &[KEY]).await;
    for reply in &replies {
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
        assert_eq!(
            reply.body, replies[0].body,
            "every caller got the same bytes"
        );
    }
    let answer = replies[0].json();
    assert_eq!(answer["type"], "message", "{answer}");
    assert!(
        answer["content"][0]["text"]
            .as_str()
            .is_some_and(|t| !t.is_empty())
    );
    assert_eq!(mock.calls(), 1);
    assert_eq!(mock.sigv4_verified(), 1);
    assert_eq!(mock.requests()[0].path, INVOKE);

    let repeat = gateway.post_with(MESSAGES, &body, &[KEY]).await;
    assert_eq!(repeat.cache(), "HIT");
    assert_eq!(repeat.json()["content"], answer["content"]);
    assert_eq!(mock.calls(), 1);

    // The call's tokens are counted under the public name, not Bedrock's id.
    let m = scrape(&gateway).await;
    assert!(model_tokens(&m, PUBLIC, "input", "upstream") > 0.0);
    assert!(model_tokens(&m, PUBLIC, "output", "upstream") > 0.0);
    assert_eq!(model_tokens(&m, BEDROCK_ID, "input", "upstream"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttling_frame_mid_stream_ends_every_reader_with_an_error_and_nothing_is_kept() {
    let mock = bedrock_mock().await;
    let gateway = sigv4_gateway(&mock).await;
    let body = streamed(message(&format!(
        "{BEDROCK_THROTTLE_MIDSTREAM_TRIGGER} throttle me halfway"
    )));
    let readers = gateway.herd(MESSAGES, &body, 5, &[KEY]).await;
    assert_eq!(mock.calls(), 1, "one shared stream");
    assert_eq!(mock.requests()[0].path, INVOKE_STREAM);
    for reply in &readers {
        let events = named_events(&reply.body);
        assert_eq!(
            events.first().map(|(name, _)| name.as_str()),
            Some("message_start"),
            "the stream had begun before the exception"
        );
        let error = final_error(reply);
        assert_eq!(error["error"]["type"], "rate_limit_error", "{error}");
        assert!(
            error["error"]["message"]
                .as_str()
                .is_some_and(|message| message.contains("Too many requests")),
            "Bedrock's own words: {error}"
        );
    }

    // Nothing of the broken stream was kept: the same request is a new call.
    gateway.wait_idle().await;
    let again = gateway.post_with(MESSAGES, &body, &[KEY]).await;
    assert_eq!(again.cache(), "MISS");
    assert_eq!(mock.calls(), 2, "a repeat makes a new call");
    final_error(&again);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bedrock_api_key_member_sends_its_key_as_a_bearer_token() {
    let mock = bedrock_mock().await;
    let gateway = TestGateway::start_with(mock.clone(), |config| {
        anthropic_upstream(config);
        let mut account = bedrock_member("bedrock-key", &mock);
        account.api_key = Some(Secret::new(BEDROCK_TEST_API_KEY.to_owned()));
        pooled(config, vec![account], Affinity::None);
    })
    .await;
    let plain = gateway
        .post_with(MESSAGES, &message("a Bedrock API key"), &[KEY])
        .await;
    assert_eq!(plain.status, StatusCode::OK, "{:?}", plain.body);
    assert_eq!(plain.json()["type"], "message");
    let live = gateway
        .post_with(
            MESSAGES,
            &streamed(message("a Bedrock API key, streamed")),
            &[KEY],
        )
        .await;
    assert_event_stream(&live);
    // Bedrock's event-stream frames, re-framed as Anthropic's SSE, in its order.
    let events = named_events(&live.body);
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    let deltas = names
        .iter()
        .filter(|name| **name == "content_block_delta")
        .count();
    assert!(deltas > 0, "{names:?}");
    assert_eq!(names, in_anthropics_order(deltas));

    let requests = mock.requests();
    let paths: Vec<&str> = requests.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(paths, [INVOKE, INVOKE_STREAM]);
    let bearer = format!("Bearer {BEDROCK_TEST_API_KEY}");
    for request in &requests {
        assert_eq!(request.header("authorization"), Some(bearer.as_str()));
        assert_eq!(request.header("x-amz-date"), None, "nothing was signed");
        assert_bedrock_body(&request.json().expect("a JSON body"));
    }
    assert_eq!(mock.sigv4_verified(), 0);
    assert!(mock.bedrock_refused().is_empty());

    // A key Bedrock no longer accepts: AWS's 403 reaches the caller in
    // Anthropic's shape, and nothing was billed.
    mock.set_bedrock_api_keys(Vec::new());
    let refused = gateway
        .post_with(MESSAGES, &message("a revoked key"), &[KEY])
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{:?}", refused.body);
    let error = refused.json();
    assert_eq!(error["type"], "error", "{error}");
    assert!(error["error"]["type"].is_string(), "{error}");
    assert_eq!(mock.bedrock_refused().len(), 1);
    assert_eq!(mock.calls(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bedrocks_throttling_and_model_not_ready_move_the_call_on_and_cool_the_member() {
    let (first, second) = (bedrock_mock().await, bedrock_mock().await);
    let gateway = TestGateway::start_with(first.clone(), |config| {
        anthropic_upstream(config);
        first_and_spare(
            config,
            sigv4_member("first", &first),
            sigv4_member("second", &second),
        );
        config.upstreams[0].cooldown = Duration::from_secs(10);
    })
    .await;
    let calls = || (first.calls(), second.calls());
    let post = |text: String| {
        let gateway = &gateway;
        async move {
            let reply = gateway.post_with(MESSAGES, &message(&text), &[KEY]).await;
            assert_eq!(reply.status, StatusCode::OK, "{text}: {:?}", reply.body);
            reply
        }
    };

    // A ThrottlingException that names its time: the call moves to the
    // second member, and the first rests for that time.
    first.set_failure(Some(
        FailureMode::always(429)
            .with_code("ThrottlingException")
            .with_retry_after(Duration::from_secs(30)),
    ));
    post("throttled on the first".to_owned()).await;
    assert_eq!(calls(), (1, 1), "moved to the second member");
    for i in 0..5 {
        post(format!("while the first rests {i}")).await;
    }
    assert_eq!(calls(), (1, 6), "the first rested for Bedrock's time");
    first.set_failure(None);
    gateway.clock.advance(Duration::from_secs(31));
    post("the first is back".to_owned()).await;
    assert_eq!(calls(), (2, 6));

    // ModelNotReadyException names no time: the pool's cooldown.
    first.set_failure(Some(
        FailureMode::always(429).with_code("ModelNotReadyException"),
    ));
    post("the model is not ready".to_owned()).await;
    assert_eq!(calls(), (3, 7), "moved to the second member");
    first.set_failure(None);
    for i in 0..3 {
        post(format!("while the model warms {i}")).await;
    }
    assert_eq!(calls(), (3, 10), "the first cooled");
    gateway.clock.advance(Duration::from_secs(11));
    post("the model is ready".to_owned()).await;
    assert_eq!(calls(), (4, 10), "back after the pool's cooldown");

    // The mock's own trigger: a model not ready on every member. Each was
    // asked once, and the caller gets Bedrock's 429 in Anthropic's shape.
    let blocked = gateway
        .post_with(
            MESSAGES,
            &message(&format!("{BEDROCK_MODEL_NOT_READY_TRIGGER} not anywhere")),
            &[KEY],
        )
        .await;
    assert_eq!(calls(), (5, 11), "both members were tried");
    assert_eq!(
        blocked.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{:?}",
        blocked.body
    );
    let error = blocked.json();
    assert_eq!(error["type"], "error", "{error}");
    for mock in [&first, &second] {
        let sent = mock.requests().last().unwrap().json().unwrap();
        assert_bedrock_body(&sent);
    }
    assert_eq!(first.sigv4_verified(), 5);
    assert_eq!(second.sigv4_verified(), 11);
}

/// The mock's Bedrock surface is what the official SDKs parse: boto3's
/// `bedrock-runtime` client and Anthropic's `AnthropicBedrock` sign requests
/// the mock verifies and read every answer, stream and error into their own
/// types (`crates/mock-upstream/tests/bedrock_sdk_check.py`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mocks_bedrock_surface_is_what_the_official_sdks_parse() {
    let python = Python::with_anthropic_clouds().await;
    let mock = bedrock_mock().await;
    let endpoint = mock.bedrock_endpoint();
    python
        .run_mock_check(
            "bedrock_sdk_check.py",
            &[endpoint.as_ref()],
            Duration::from_secs(120),
        )
        .await;
    assert!(
        mock.sigv4_verified() >= 1,
        "the check's signatures were verified"
    );
}
