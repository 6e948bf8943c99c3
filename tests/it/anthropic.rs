//! Anthropic's API through corral: an `api: anthropic` upstream gets the
//! caller's key (or corral's own) as `x-api-key` and an `anthropic-version`,
//! callers authenticate with either header, refusals on `/v1/messages*` come
//! in Anthropic's error shape, and `count_tokens` is passed through to the
//! upstream its model routes to, retried on 529 as the provider asks.
//! `POST /v1/messages` is deduplicated like chat: herds of plain and streamed
//! callers share one call, keys and keyed headers split, a broken stream fails
//! every reader and is not cached, and the metrics count its tokens.

use std::{collections::HashSet, time::Duration};

use bytes::Bytes;
use corral::{
    Config,
    config::{Api, PriceTable, Secret},
    tenant::key_hash,
};
use mock_upstream::{FailureMode, MockProvider, MockSettings, Scripted};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{
    cluster::redis_config,
    harness::{Fleet, Reply, TestGateway, WAIT, chat, count_status, named_events, streamed},
    metrics::{model_tokens, requests_by_cache, scrape, sum},
    redis_server::RedisServer,
};

pub const MODEL: &str = "claude-sonnet-4-5";

/// A second mock standing for Anthropic (the mock speaks both APIs; a
/// separate one shows which upstream a request went to).
pub async fn anthropic_mock(models: &[&str]) -> MockProvider {
    MockProvider::start(MockSettings {
        models: Some(models.iter().map(|m| (*m).to_owned()).collect()),
        ..MockSettings::default()
    })
    .await
    .expect("mock starts")
}

/// Adds `provider` as an `api: anthropic` upstream serving `claude-*`, after
/// the catch-all OpenAI one (which must not shadow it).
pub fn add_anthropic(config: &mut Config, provider: &MockProvider) {
    serve_messages(config);
    config.upstreams.last_mut().expect("just added").base_url = provider.base_url();
}

/// Adds an `api: anthropic` upstream serving `claude-*` on the first upstream's
/// provider, after the catch-all OpenAI one (which must not shadow it).
fn serve_messages(config: &mut Config) {
    let mut anthropic = config.upstreams[0].clone();
    anthropic.name = "anthropic".into();
    anthropic.api = Api::Anthropic;
    anthropic.models = vec!["claude-*".into()];
    config.upstreams.push(anthropic);
}

/// Anthropic's 529 `overloaded_error`, asking to be retried after `retry_after` seconds.
pub fn overloaded(retry_after: &str) -> Scripted {
    Scripted {
        status: 529,
        headers: vec![("retry-after".into(), retry_after.into())],
        body:
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
                .to_string(),
    }
}

pub fn count_body() -> Value {
    json!({"model": MODEL, "messages": [{"role": "user", "content": "How many tokens is this?"}]})
}

/// The Anthropic error shape, and its `error.type`.
fn anthropic_error_type(body: &Value) -> &str {
    assert_eq!(body["type"], "error", "{body}");
    assert!(body["error"]["message"].is_string(), "{body}");
    body["error"]["type"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn count_tokens_reaches_the_anthropic_upstream_with_the_callers_key_as_x_api_key() {
    let anthropic = anthropic_mock(&[MODEL]).await;
    let gateway = TestGateway::start(|config| add_anthropic(config, &anthropic)).await;

    let reply = gateway
        .post_with(
            "/v1/messages/count_tokens",
            &count_body(),
            &[
                ("x-api-key", "sk-ant-caller-a"),
                ("anthropic-beta", "token-counting-2024-11-01"),
            ],
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    assert!(reply.json()["input_tokens"].as_u64().is_some_and(|n| n > 0));
    // The current Python SDK's way (auth_token=): a bearer token, with a version of its own.
    let reply = gateway
        .post_with(
            "/v1/messages/count_tokens",
            &count_body(),
            &[
                ("authorization", "Bearer sk-ant-caller-b"),
                ("anthropic-version", "2023-01-01"),
            ],
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);

    let requests = anthropic.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].path, "/v1/messages/count_tokens");
    assert_eq!(requests[0].auth_headers(), ["x-api-key"]);
    assert_eq!(requests[0].header("x-api-key"), Some("sk-ant-caller-a"));
    assert_eq!(
        requests[0].header("anthropic-version"),
        Some("2023-06-01"),
        "the default"
    );
    assert_eq!(
        requests[0].header("anthropic-beta"),
        Some("token-counting-2024-11-01")
    );
    assert_eq!(
        requests[1].auth_headers(),
        ["x-api-key"],
        "never Authorization to Anthropic"
    );
    assert_eq!(requests[1].header("x-api-key"), Some("sk-ant-caller-b"));
    assert_eq!(requests[1].header("anthropic-version"), Some("2023-01-01"));
    assert_eq!(
        gateway.provider.received(),
        Vec::<String>::new(),
        "OpenAI's upstream saw nothing"
    );

    // A model no Anthropic upstream serves is refused in Anthropic's shape,
    // though the catch-all OpenAI upstream would take it for chat.
    let reply = gateway
        .post_with(
            "/v1/messages/count_tokens",
            &json!({"model": "gpt-4o", "messages": []}),
            &[("x-api-key", "sk-ant-caller-a")],
        )
        .await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert_eq!(anthropic_error_type(&reply.json()), "not_found_error");
    assert_eq!(anthropic.requests().len(), 2);

    // The provider's own refusal is relayed as it came.
    let reply = gateway
        .post_with(
            "/v1/messages/count_tokens",
            &json!({"model": MODEL}),
            &[("x-api-key", "sk-ant-caller-a")],
        )
        .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(anthropic_error_type(&reply.json()), "invalid_request_error");
    assert!(
        reply.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("messages")
    );
}

#[tokio::test]
async fn a_gateway_key_passes_in_either_header_and_corrals_own_key_goes_upstream() {
    let anthropic = anthropic_mock(&[MODEL]).await;
    let gateway = TestGateway::start(|config| {
        add_anthropic(config, &anthropic);
        config.auth.key_hashes = vec![key_hash(b"gw-team-key")];
        config.upstreams[0].api_key = Some(Secret::new("sk-openai-corral".into()));
        config.upstreams[1].api_key = Some(Secret::new("sk-ant-corral".into()));
    })
    .await;

    for header in ["x-api-key", "authorization"] {
        let value = if header == "x-api-key" {
            "gw-team-key"
        } else {
            "Bearer gw-team-key"
        };
        let reply = gateway
            .post_with(
                "/v1/messages/count_tokens",
                &count_body(),
                &[(header, value)],
            )
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{header}: {:?}", reply.body);
    }
    for request in anthropic.requests() {
        assert_eq!(request.auth_headers(), ["x-api-key"]);
        assert_eq!(request.header("x-api-key"), Some("sk-ant-corral"));
    }
    // An OpenAI client with the same gateway key, in the x-api-key header.
    let reply = gateway
        .post_with(
            "/v1/chat/completions",
            &chat("hi"),
            &[("x-api-key", "gw-team-key")],
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    let openai = gateway.provider.requests();
    assert_eq!(openai[0].auth_headers(), ["authorization"]);
    assert_eq!(
        openai[0].header("authorization"),
        Some("Bearer sk-openai-corral")
    );
    // The gateway key went nowhere.
    for request in anthropic.requests().iter().chain(&openai) {
        assert!(
            request
                .headers
                .iter()
                .all(|(_, value)| !value.contains("gw-team-key")),
            "{:?}",
            request.headers
        );
    }

    // Refused: no key, an unknown key; each in its route's shape.
    for headers in [vec![], vec![("x-api-key", "gw-wrong")]] {
        let reply = gateway
            .post_with("/v1/messages/count_tokens", &count_body(), &headers)
            .await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
        assert_eq!(anthropic_error_type(&reply.json()), "authentication_error");
        let reply = gateway
            .post_with("/v1/chat/completions", &chat("hi"), &headers)
            .await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
        assert_eq!(reply.json()["error"]["code"], "invalid_api_key");
    }
    assert_eq!(anthropic.calls(), 2);
}

#[tokio::test]
async fn an_overloaded_anthropic_upstream_is_retried_after_its_retry_after() {
    let anthropic = anthropic_mock(&[MODEL]).await;
    let gateway = TestGateway::start(|config| add_anthropic(config, &anthropic)).await;
    anthropic.push_script(overloaded("0.3"));
    let reply = gateway
        .post_with(
            "/v1/messages/count_tokens",
            &count_body(),
            &[("x-api-key", "sk-ant-a")],
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    assert!(reply.json()["input_tokens"].is_u64());
    let requests = anthropic.requests();
    assert_eq!(requests.len(), 2, "one 529, one retry");
    // A lower bound only: corral waited at least what the provider asked
    // (its own backoff in tests is at most 100 ms).
    assert!(
        requests[1].at - requests[0].at >= Duration::from_millis(300),
        "{:?}",
        requests[1].at - requests[0].at
    );
}

#[tokio::test]
async fn the_model_list_includes_the_anthropic_upstreams_models() {
    let anthropic = anthropic_mock(&[MODEL, "claude-haiku-4-5"]).await;
    let gateway = TestGateway::start(|config| add_anthropic(config, &anthropic)).await;
    let reply = gateway.get("/v1/models").await;
    assert_eq!(reply.status, StatusCode::OK);
    let mut ids: Vec<String> = reply.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|model| model["id"].as_str().unwrap().to_owned())
        .collect();
    ids.sort_unstable();
    assert!(
        ids.contains(&MODEL.to_owned()) && ids.contains(&"claude-haiku-4-5".to_owned()),
        "{ids:?}"
    );
    assert!(ids.contains(&"gpt-4o".to_owned()), "{ids:?}");
    let asked: Vec<_> = anthropic
        .received()
        .into_iter()
        .filter(|line| line == "GET /v1/models")
        .collect();
    assert_eq!(asked.len(), 1);
}

/// A gateway whose one mock serves both APIs: `gateway.provider` answers the
/// OpenAI upstream and the `api: anthropic` one, so the harness's holds,
/// herds and call counts cover Messages.
pub async fn messages_gateway(adjust: impl FnOnce(&mut Config)) -> TestGateway {
    TestGateway::start(|config| {
        serve_messages(config);
        adjust(config);
    })
    .await
}

/// [`messages_gateway`]'s pair of instances, sharing `redis`.
async fn messages_fleet(redis: &RedisServer) -> Fleet {
    Fleet::start(2, |config| {
        config.redis = Some(redis_config(&redis.url()));
        serve_messages(config);
    })
    .await
}

const MESSAGES: &str = "/v1/messages";
const KEY: (&str, &str) = ("x-api-key", "sk-ant-caller");

/// A deterministic Messages request (temperature 0: stored).
fn message(text: &str) -> Value {
    json!({
        "model": MODEL,
        "max_tokens": 128,
        "temperature": 0,
        "system": "Be terse.",
        "messages": [{"role": "user", "content": text}],
    })
}

fn streaming(text: &str) -> Value {
    streamed(message(text))
}

/// The message a stream amounts to, accumulated as the SDK's `accumulate_event` does.
fn accumulated(reply: &Reply) -> Value {
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    let events = named_events(&reply.body);
    assert_eq!(
        events.last().map(|(name, _)| name.as_str()),
        Some("message_stop")
    );
    let mut message = events[0].1["message"].clone();
    for (name, data) in &events[1..] {
        match name.as_str() {
            "content_block_start" => message["content"]
                .as_array_mut()
                .unwrap()
                .push(data["content_block"].clone()),
            "content_block_delta" => {
                let index = data["index"].as_u64().unwrap() as usize;
                let text = message["content"][index]["text"]
                    .as_str()
                    .unwrap()
                    .to_owned();
                message["content"][index]["text"] =
                    json!(text + data["delta"]["text"].as_str().unwrap());
            }
            "message_delta" => {
                message["stop_reason"] = data["delta"]["stop_reason"].clone();
                message["stop_sequence"] = data["delta"]["stop_sequence"].clone();
                for (field, value) in data["usage"].as_object().unwrap() {
                    message["usage"][field] = value.clone();
                }
            }
            _ => {}
        }
    }
    message
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_herd_of_messages_is_one_call_and_a_repeat_is_a_hit() {
    let gateway = messages_gateway(|_| {}).await;
    let herd = gateway
        .herd(MESSAGES, &message("a herd"), 100, &[KEY])
        .await;
    assert!(herd.iter().all(|r| r.status == StatusCode::OK));
    assert_eq!(count_status(&herd, "MISS"), 1);
    assert_eq!(count_status(&herd, "COALESCED"), 99);
    let bodies: HashSet<&Bytes> = herd.iter().map(|r| &r.body).collect();
    assert_eq!(bodies.len(), 1, "one answer for all");
    assert_eq!(herd[0].json()["type"], "message");
    assert_eq!(gateway.provider.calls(), 1);
    let sent = &gateway.provider.requests()[0];
    assert_eq!(sent.path, "/v1/messages");
    assert_eq!(sent.auth_headers(), ["x-api-key"]);
    assert_eq!(sent.header("x-api-key"), Some("sk-ant-caller"));
    gateway.wait_idle().await;
    let repeat = gateway
        .post_with(MESSAGES, &message("a herd"), &[KEY])
        .await;
    assert_eq!(repeat.cache(), "HIT");
    assert_eq!(repeat.body, herd[0].body);
    assert_eq!(gateway.provider.calls(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_and_plain_callers_share_one_call() {
    let gateway = messages_gateway(|_| {}).await;
    // A streaming caller owns the flight, so the upstream call streams and the
    // plain callers get the message its events amount to.
    let (stream_replies, plain_replies) = gateway
        .mixed_herd(
            MESSAGES,
            &streaming("mixed callers"),
            &message("mixed callers"),
            60,
            &[KEY],
        )
        .await;
    let streamed: HashSet<String> = stream_replies
        .iter()
        .map(|reply| accumulated(reply).to_string())
        .collect();
    let plain: HashSet<String> = plain_replies
        .iter()
        .map(|reply| {
            assert_eq!(reply.status, StatusCode::OK);
            reply.json().to_string()
        })
        .collect();
    assert_eq!(
        streamed, plain,
        "a plain caller gets what the stream accumulates to"
    );
    // The live stream relays the provider's ping.
    let live = named_events(&stream_replies[0].body);
    assert!(live.iter().any(|(name, _)| name == "ping"));

    // Both kinds of repeat are served from the cache; the stream is synthesized.
    gateway.wait_idle().await;
    let hit = gateway
        .post_with(MESSAGES, &message("mixed callers"), &[KEY])
        .await;
    assert_eq!(hit.cache(), "HIT");
    assert_eq!(hit.json().to_string(), *plain.iter().next().unwrap());
    let replayed = gateway
        .post_with(MESSAGES, &streaming("mixed callers"), &[KEY])
        .await;
    assert_eq!(replayed.cache(), "HIT");
    assert_eq!(replayed.header("content-type"), Some("text/event-stream"));
    assert_eq!(accumulated(&replayed), hit.json());
    assert_eq!(gateway.provider.calls(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_temperature_0_messages_are_coalesced_but_not_stored() {
    let sampled = |text: &str| {
        let mut body = message(text);
        body.as_object_mut().unwrap().remove("temperature");
        body
    };
    let gateway = messages_gateway(|_| {}).await;
    let herd = gateway
        .herd(MESSAGES, &sampled("sampled"), 20, &[KEY])
        .await;
    assert_eq!(count_status(&herd, "COALESCED"), 19);
    gateway.wait_idle().await;
    let repeat = gateway
        .post_with(MESSAGES, &sampled("sampled"), &[KEY])
        .await;
    assert_eq!(repeat.cache(), "MISS", "a sampled answer is not stored");
    assert_eq!(gateway.provider.calls(), 2);

    let storing = messages_gateway(|config| config.cache.sampled = true).await;
    storing
        .post_with(MESSAGES, &sampled("sampled"), &[KEY])
        .await;
    storing.wait_idle().await;
    let repeat = storing
        .post_with(MESSAGES, &sampled("sampled"), &[KEY])
        .await;
    assert_eq!(repeat.cache(), "HIT", "stored under cache.sampled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_and_keyed_headers_split_and_delivery_fields_do_not() {
    let gateway = messages_gateway(|_| {}).await;
    // Two keys at once: both go upstream (the second arrives while the first is held).
    gateway.provider.hold();
    let handle = gateway.clone_handle();
    let tasks: Vec<_> = ["sk-ant-a", "sk-ant-b"]
        .into_iter()
        .map(|key| {
            let handle = handle.clone();
            tokio::spawn(async move {
                handle
                    .post_with(MESSAGES, &message("whose?"), &[("x-api-key", key)])
                    .await
            })
        })
        .collect();
    gateway.wait_for_calls(2).await;
    gateway.provider.release();
    for task in tasks {
        assert_eq!(task.await.unwrap().cache(), "MISS");
    }
    let keys: HashSet<String> = gateway
        .provider
        .requests()
        .iter()
        .map(|r| r.header("x-api-key").unwrap().to_owned())
        .collect();
    assert_eq!(keys, HashSet::from(["sk-ant-a".into(), "sk-ant-b".into()]));
    gateway.wait_idle().await;

    let cache = |reply: Reply| reply.cache().to_owned();
    // One key in either header is one tenant.
    let bearer = [("authorization", "Bearer sk-ant-a")];
    assert_eq!(
        cache(
            gateway
                .post_with(MESSAGES, &message("whose?"), &bearer)
                .await
        ),
        "HIT"
    );
    // Who asked, and how it is delivered, are not keyed.
    let mut tagged = message("whose?");
    tagged["metadata"] = json!({"user_id": "user-42"});
    let a = [("x-api-key", "sk-ant-a")];
    assert_eq!(cache(gateway.post_with(MESSAGES, &tagged, &a).await), "HIT");
    // What changes the answer is.
    let version = [
        ("x-api-key", "sk-ant-a"),
        ("anthropic-version", "2023-01-01"),
    ];
    assert_eq!(
        cache(
            gateway
                .post_with(MESSAGES, &message("whose?"), &version)
                .await
        ),
        "MISS"
    );
    let beta = [
        ("x-api-key", "sk-ant-a"),
        ("anthropic-beta", "output-128k-2025-02-19"),
    ];
    assert_eq!(
        cache(gateway.post_with(MESSAGES, &message("whose?"), &beta).await),
        "MISS"
    );
    let mut budget = message("whose?");
    budget["max_tokens"] = json!(64);
    assert_eq!(
        cache(gateway.post_with(MESSAGES, &budget, &a).await),
        "MISS"
    );
    assert_eq!(gateway.provider.calls(), 5);
    let sent = gateway.provider.requests();
    assert_eq!(sent[2].header("anthropic-version"), Some("2023-01-01"));
    assert_eq!(
        sent[3].header("anthropic-beta"),
        Some("output-128k-2025-02-19")
    );
    assert_eq!(
        sent[3].header("anthropic-version"),
        Some("2023-06-01"),
        "the default"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_stream_fails_every_reader_in_anthropics_shape_and_is_not_cached() {
    let gateway = messages_gateway(|_| {}).await;
    gateway.provider.set_truncate_streams(true);
    let body = streaming("this stream will break");
    let replies = gateway.herd(MESSAGES, &body, 20, &[KEY]).await;
    let bodies: HashSet<&Bytes> = replies.iter().map(|r| &r.body).collect();
    assert_eq!(bodies.len(), 1, "every reader got the same events");
    let events = named_events(&replies[0].body);
    let (name, error) = events.last().unwrap();
    assert_eq!(name, "error");
    assert_eq!(error["error"]["type"], "api_error");
    assert!(error["error"]["message"].is_string());
    assert!(events.iter().all(|(name, _)| name != "message_stop"));
    let next = gateway
        .post_after_a_cut(MESSAGES, &message("this stream will break"), &[KEY])
        .await;
    assert_eq!(next.json()["stop_reason"], "end_turn");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_is_retried_and_a_lasting_one_relayed_as_anthropic_sent_it() {
    let gateway = messages_gateway(|_| {}).await;
    gateway.provider.push_script(overloaded("0.2"));
    let reply = gateway.post_with(MESSAGES, &message("busy?"), &[KEY]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(gateway.provider.calls(), 2, "the 529 and its retry");
    let sent = gateway.provider.requests();
    assert!(sent[1].at - sent[0].at >= Duration::from_millis(200));

    gateway.provider.set_failure(Some(FailureMode::always(529)));
    let reply = gateway
        .post_with(MESSAGES, &message("still busy?"), &[KEY])
        .await;
    assert_eq!(reply.status.as_u16(), 529);
    assert_eq!(reply.json()["error"]["type"], "overloaded_error");
    assert_eq!(
        reply.header("x-should-retry"),
        Some("false"),
        "corral retried already"
    );
    assert_eq!(gateway.provider.calls(), 5, "three attempts");
}

#[tokio::test]
async fn refusals_on_messages_are_in_anthropics_shape() {
    let gateway = messages_gateway(|config| config.limits.max_body_bytes = 4096).await;
    let refused = |reply: &Reply, status: u16, kind: &str| {
        assert_eq!(reply.status.as_u16(), status, "{:?}", reply.body);
        assert_eq!(
            anthropic_error_type(&reply.json()),
            kind,
            "{:?}",
            reply.body
        );
    };
    // What corral refuses itself (it cannot parse, route or bound it); the
    // provider's own rules are the provider's (`provider_rules.rs`).
    refused(
        &gateway.post_raw(MESSAGES, "{not json", &[KEY]).await,
        400,
        "invalid_request_error",
    );
    let mut unknown = message("hi");
    unknown["model"] = json!("gpt-4o");
    refused(
        &gateway.post_with(MESSAGES, &unknown, &[KEY]).await,
        404,
        "not_found_error",
    );
    let huge = message(&"x".repeat(8192));
    refused(
        &gateway.post_with(MESSAGES, &huge, &[KEY]).await,
        413,
        "request_too_large",
    );
    assert_eq!(
        gateway.provider.received(),
        Vec::<String>::new(),
        "nothing went upstream"
    );

    let guarded = messages_gateway(|config| {
        config.auth.key_hashes = vec![key_hash(b"gw-key")];
        for upstream in &mut config.upstreams {
            upstream.api_key = Some(Secret::new("sk-corral".into()));
        }
    })
    .await;
    refused(
        &guarded.post(MESSAGES, &message("hi")).await,
        401,
        "authentication_error",
    );
    refused(
        &guarded
            .post_with(MESSAGES, &message("hi"), &[("x-api-key", "gw-nope")])
            .await,
        401,
        "authentication_error",
    );
    let reply = guarded
        .post_with(MESSAGES, &message("hi"), &[("x-api-key", "gw-key")])
        .await;
    assert_eq!(reply.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_count_messages_tokens_cache_reads_and_writes_under_the_model() {
    // The embedded price snapshot prices claude-sonnet-4-5 (input, cache read and write, output).
    let gateway = messages_gateway(|config| config.pricing.models = PriceTable(vec![])).await;
    let body = json!({
        "model": MODEL,
        "max_tokens": 64,
        "temperature": 0,
        "stream": true,
        "system": [{"type": "text", "text": "A long and stable system prompt, cached.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "A document, written to the cache.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "And a question?"},
        ]}],
    });
    let herd = gateway.herd(MESSAGES, &body, 10, &[KEY]).await;
    let usage = accumulated(&herd[0])["usage"].clone();
    gateway.wait_idle().await;
    let mut plain = body.clone();
    plain.as_object_mut().unwrap().remove("stream");
    let repeat = gateway.post_with(MESSAGES, &plain, &[KEY]).await;
    assert_eq!(repeat.cache(), "HIT");
    assert_eq!(repeat.json()["usage"], usage);
    assert_eq!(gateway.provider.calls(), 1);
    let count = |field: &str| usage[field].as_f64().unwrap();
    let (input, read, write, output) = (
        count("input_tokens"),
        count("cache_read_input_tokens"),
        count("cache_creation_input_tokens"),
        count("output_tokens"),
    );
    assert!(
        input > 0.0 && read > 0.0 && write > 0.0 && output > 0.0,
        "{usage}"
    );

    let m = scrape(&gateway).await;
    let model = ("model", MODEL);
    assert_eq!(sum(&m, "corral_saved_responses_total", &[model]), 10.0);
    let tokens = |kind, source| model_tokens(&m, MODEL, kind, source);
    for (kind, n) in [
        ("input", input),
        ("cached_input", read),
        ("cache_write", write),
        ("output", output),
    ] {
        assert_eq!(tokens(kind, "upstream"), n, "{kind}");
        assert_eq!(tokens(kind, "saved"), 10.0 * n, "{kind}");
    }
    // genai-prices: $3 input, $0.30 cache read, $3.75 cache write, $15 output per million.
    let one = (input * 3.0 + read * 0.3 + write * 3.75 + output * 15.0) / 1e6;
    let saved = sum(&m, "corral_cost_usd_total", &[model, ("source", "saved")]);
    assert!(
        (saved - 10.0 * one).abs() < 1e-9,
        "{saved} != {}",
        10.0 * one
    );
    assert_eq!(requests_by_cache(&m, "messages"), (1.0, 9.0, 1.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_flight_reaches_another_instance_in_anthropics_shape() {
    let redis = RedisServer::spawn().await;
    let fleet = messages_fleet(&redis).await;
    // The first instance's stream breaks: its readers get the error event, and
    // the flight's failure is recorded for the cluster.
    fleet.provider.set_truncate_streams(true);
    let first = fleet.instances[0]
        .post_with(MESSAGES, &streaming("a failing flight"), &[KEY])
        .await;
    assert_eq!(named_events(&first.body).last().unwrap().0, "error");
    fleet.instances[0].wait_idle().await;
    // The second instance answers the same request (the same bytes: a
    // remembered failure answers no other) from that record, without a call,
    // in Anthropic's shape.
    let second = fleet.instances[1]
        .post_with(MESSAGES, &streaming("a failing flight"), &[KEY])
        .await;
    assert_eq!(second.status, StatusCode::BAD_GATEWAY, "{:?}", second.body);
    assert_eq!(anthropic_error_type(&second.json()), "api_error");
    assert_eq!(fleet.provider.calls(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_messages_stream_is_shared_live_across_instances() {
    let redis = RedisServer::spawn().await;
    let fleet = messages_fleet(&redis).await;
    let body = streaming("relay this Messages stream to another instance");
    // The owner's call is held until a caller on each instance waits on it.
    fleet.provider.hold();
    let tasks: Vec<_> = fleet
        .instances
        .iter()
        .map(|instance| {
            let handle = instance.clone_handle();
            let body = body.clone();
            tokio::spawn(async move { handle.post_with(MESSAGES, &body, &[KEY]).await })
        })
        .collect();
    fleet.wait_for_waiters(2).await;
    // Released only once the other instance follows the owner's mirror (its
    // relay blocks in XREAD): it then reads the stream live, never a replay.
    let mut conn = redis.client().await;
    tokio::time::timeout(WAIT, async {
        loop {
            let clients: String = redis::cmd("CLIENT")
                .arg("LIST")
                .query_async(&mut conn)
                .await
                .unwrap();
            if clients.contains("cmd=xread") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the follower's relay reads the owner's mirror");
    fleet.provider.release();
    let replies: Vec<Reply> = crate::harness::collect(tasks).await;
    assert_eq!(fleet.provider.calls(), 1, "one call for the cluster");
    let mut statuses: Vec<&str> = replies.iter().map(Reply::cache).collect();
    statuses.sort_unstable();
    assert_eq!(statuses, ["COALESCED", "MISS"]);
    // The provider's own events (its ping included; a synthesized replay has
    // none) reached the other instance byte for byte, through Redis.
    assert_eq!(replies[0].body, replies[1].body);
    let events = named_events(&replies[1].body);
    assert!(events.iter().any(|(name, _)| name == "ping"));
    assert_eq!(events.last().unwrap().0, "message_stop");
}
