//! `POST /v1/responses` (OpenAI Responses) deduplicated like chat: one upstream call (or stream)
//! for identical callers of either kind, named events shared byte for byte, the stream cached
//! only on `response.completed`, broken streams failing every reader, `background` requests and
//! the stateful `/v1/responses/{id}` routes passed through, and the metrics under the model.

use std::collections::HashSet;

use bytes::Bytes;
use corral::config::{ModelPrice, PriceTable, Secret};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{
    harness::{
        Reply, TestGateway, assert_event_stream, named_events, redis_at, relayed_live,
        slow_stream_fleet, streamed,
    },
    metrics::{model_tokens, requests_by_cache, scrape, sum},
    redis_server::RedisServer,
};

const PATH: &str = "/v1/responses";

fn request(text: &str) -> Value {
    json!({
        "model": "gpt-4o-mini",
        "temperature": 0,
        "instructions": "Be terse.",
        "input": [{"role": "user", "content": text}],
    })
}

fn streaming(text: &str) -> Value {
    streamed(request(text))
}

/// Checks a complete Responses stream (numbered from 0, `response.completed` last, no
/// `[DONE]`) and returns its completed `response`.
fn completed(reply: &Reply) -> Value {
    assert_event_stream(reply);
    let events = named_events(&reply.body);
    for (n, (_, data)) in events.iter().enumerate() {
        assert_eq!(data["sequence_number"], n, "numbered in order");
    }
    let (name, last) = events.last().expect("events");
    assert_eq!(name, "response.completed");
    let text: String = events
        .iter()
        .filter(|(name, _)| name == "response.output_text.delta")
        .map(|(_, data)| data["delta"].as_str().unwrap())
        .collect();
    assert_eq!(text, output_text(&last["response"]), "deltas add up");
    last["response"].clone()
}

fn output_text(response: &Value) -> &str {
    response["output"][0]["content"][0]["text"]
        .as_str()
        .expect("an output text")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_and_non_stream_callers_share_one_call() {
    let gateway = TestGateway::start(|_| {}).await;
    // A streaming caller owns the flight, so the upstream call streams and the
    // non-stream callers get the response of its `response.completed`.
    let (stream_replies, plain_replies) = gateway
        .mixed_herd(
            PATH,
            &streaming("mixed callers"),
            &request("mixed callers"),
            100,
            &[],
        )
        .await;
    let streams: HashSet<String> = stream_replies
        .iter()
        .map(|reply| completed(reply).to_string())
        .collect();
    let plain: HashSet<String> = plain_replies
        .iter()
        .map(|reply| {
            assert_eq!(reply.status, StatusCode::OK);
            assert_eq!(reply.json()["object"], "response");
            reply.json().to_string()
        })
        .collect();
    assert_eq!(
        streams, plain,
        "a non-stream caller gets the response of response.completed"
    );
    let sent = gateway.provider.requests()[0].json().unwrap();
    assert!(
        sent.get("stream_options").is_none(),
        "Responses needs no usage option"
    );

    // Both kinds of repeat are served from the cache; the stream is synthesized.
    gateway.wait_idle().await;
    let hit = gateway.post(PATH, &request("mixed callers")).await;
    assert_eq!(hit.cache(), "HIT");
    assert_eq!(hit.json().to_string(), *plain.iter().next().unwrap());
    let replayed = gateway.post(PATH, &streaming("mixed callers")).await;
    assert_eq!(replayed.cache(), "HIT");
    assert_eq!(completed(&replayed), hit.json());
    assert_eq!(gateway.provider.calls(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_stream_fails_every_reader_and_is_not_cached() {
    let gateway = TestGateway::start(|_| {}).await;
    gateway.provider.set_truncate_streams(true);
    let body = streaming("this stream will break");
    let replies = gateway.herd(PATH, &body, 20, &[]).await;
    let bodies: HashSet<&Bytes> = replies.iter().map(|r| &r.body).collect();
    assert_eq!(bodies.len(), 1, "every reader got the same events");
    let events = named_events(&replies[0].body);
    let (name, error) = events.last().unwrap();
    assert_eq!(name, "error");
    assert_eq!(error["code"], "upstream_stream_broken");
    assert_eq!(error["sequence_number"], events.len() - 1);
    assert!(events.iter().all(|(name, _)| name != "response.completed"));
    completed(&gateway.post_after_a_cut(PATH, &body, &[]).await);
}

#[tokio::test]
async fn keyed_fields_split_and_delivery_fields_do_not() {
    let gateway = TestGateway::start(|_| {}).await;
    let mut a = request("chained");
    a["previous_response_id"] = json!("resp_a");
    let mut b = a.clone();
    b["previous_response_id"] = json!("resp_b");
    let first = gateway.post(PATH, &a).await;
    let second = gateway.post(PATH, &b).await;
    assert_eq!((first.cache(), second.cache()), ("MISS", "MISS"));
    assert_ne!(output_text(&first.json()), output_text(&second.json()));
    let mut delivered = a.clone();
    delivered["user"] = json!("someone-else");
    delivered["stream_options"] = json!({"include_obfuscation": false});
    assert_eq!(gateway.post(PATH, &delivered).await.cache(), "HIT");
    let mut formatted = a.clone();
    formatted["text"] = json!({"format": {"type": "json_object"}});
    assert_eq!(gateway.post(PATH, &formatted).await.cache(), "MISS");
    assert_eq!(gateway.provider.calls(), 3);
    // Sampled (no temperature): never stored, so a repeat calls again.
    let mut sampled = request("sampled");
    sampled.as_object_mut().unwrap().remove("temperature");
    assert_eq!(gateway.post(PATH, &sampled).await.cache(), "MISS");
    assert_eq!(gateway.post(PATH, &sampled).await.cache(), "MISS");
    assert_eq!(gateway.provider.calls(), 5);
    // A type corral decides by, mistaken, is an OpenAI-shaped 400 before
    // anything goes upstream (the provider's own rules are the provider's).
    let mut bad = request("bad");
    bad["background"] = json!("yes");
    let reply = gateway.post(PATH, &bad).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.json()["error"]["param"], "background");
    assert_eq!(gateway.provider.calls(), 5);
}

#[tokio::test]
async fn background_requests_and_stored_responses_pass_through() {
    let gateway = TestGateway::start(|_| {}).await;
    let mut background = request("later");
    background["background"] = json!(true);
    for _ in 0..2 {
        let reply = gateway.post(PATH, &background).await;
        assert_eq!(reply.cache(), "BYPASS");
        assert_eq!(reply.json()["status"], "queued");
    }
    assert_eq!(gateway.provider.calls(), 2, "never coalesced nor cached");
    // The stateful routes are relayed to the provider (the caller brings its own key).
    let auth = [("authorization", "Bearer sk-caller")];
    let get = gateway
        .client
        .get(format!("{}{PATH}/resp_1", gateway.url))
        .header(auth[0].0, auth[0].1)
        .send()
        .await
        .unwrap();
    assert_eq!(get.status(), StatusCode::NOT_FOUND, "the mock's own answer");
    let items = gateway
        .client
        .get(format!("{}{PATH}/resp_1/input_items", gateway.url))
        .header(auth[0].0, auth[0].1)
        .send()
        .await
        .unwrap();
    assert_eq!(items.status(), StatusCode::NOT_FOUND);
    let delete = gateway
        .client
        .delete(format!("{}{PATH}/resp_1", gateway.url))
        .header(auth[0].0, auth[0].1)
        .send()
        .await
        .unwrap();
    assert_eq!(delete.status(), StatusCode::NOT_FOUND);
    let cancel = gateway
        .post_with(&format!("{PATH}/resp_1/cancel"), &json!({}), &auth)
        .await;
    assert_eq!(cancel.status, StatusCode::NOT_FOUND);
    assert_eq!(
        gateway.provider.received()[2..],
        [
            "GET /v1/responses/resp_1",
            "GET /v1/responses/resp_1/input_items",
            "DELETE /v1/responses/resp_1",
            "POST /v1/responses/resp_1/cancel",
        ]
    );
}

#[tokio::test]
async fn stored_responses_need_the_policy_with_corrals_own_key() {
    let shared_key = |config: &mut corral::Config| {
        config.upstreams[0].api_key = Some(Secret::new("sk-corral".into()));
    };
    let gateway = TestGateway::start(shared_key).await;
    let refused = gateway.get("/v1/responses/resp_1").await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert_eq!(refused.json()["error"]["code"], "passthrough_denied");
    // The deduplicated create is served with corral's key, like chat.
    assert_eq!(
        gateway.post(PATH, &request("own key")).await.status,
        StatusCode::OK
    );
    let allowed = TestGateway::start(|config| {
        shared_key(config);
        config.passthrough.allow =
            vec![corral::config::PassRule::parse("GET /v1/responses/*").unwrap()];
    })
    .await;
    let reply = allowed.get("/v1/responses/resp_1").await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "the mock's own answer");
    assert_eq!(allowed.provider.received(), ["GET /v1/responses/resp_1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_count_tokens_and_saved_responses_under_the_model() {
    let gateway = TestGateway::start(|config| {
        config.pricing.as_of = Some("2026-03-21".into());
        config.pricing.models = PriceTable(vec![(
            "gpt-4o-mini".into(),
            ModelPrice {
                input: 0.15,
                output: 0.6,
                cached_input: None,
                cache_write: None,
            },
        )]);
    })
    .await;
    let herd = gateway.herd(PATH, &streaming("count me"), 10, &[]).await;
    let usage = completed(&herd[0])["usage"].clone();
    // The flight stores the answer after its last event reached the readers.
    gateway.wait_idle().await;
    let repeat = gateway.post(PATH, &request("count me")).await;
    assert_eq!(repeat.cache(), "HIT");
    assert_eq!(gateway.provider.calls(), 1);
    let input = usage["input_tokens"].as_f64().unwrap();
    let output = usage["output_tokens"].as_f64().unwrap();
    assert!(input > 0.0 && output > 0.0, "{usage}");

    let m = scrape(&gateway).await;
    let model = ("model", "gpt-4o-mini");
    assert_eq!(sum(&m, "corral_saved_responses_total", &[model]), 10.0);
    let tokens = |kind, source| model_tokens(&m, "gpt-4o-mini", kind, source);
    assert_eq!(tokens("input", "upstream"), input);
    assert_eq!(tokens("output", "upstream"), output);
    assert_eq!(tokens("input", "saved"), 10.0 * input);
    assert_eq!(tokens("output", "saved"), 10.0 * output);
    let saved = sum(&m, "corral_cost_usd_total", &[model, ("source", "saved")]);
    let expected = 10.0 * (input * 0.15 + output * 0.6) / 1e6;
    assert!((saved - expected).abs() < 1e-9, "{saved} != {expected}");
    assert_eq!(requests_by_cache(&m, "responses"), (1.0, 9.0, 1.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_is_shared_live_across_instances() {
    let redis = RedisServer::spawn().await;
    let fleet = slow_stream_fleet(redis_at(&redis.url())).await;
    let body = streaming("relay this Responses stream live to another instance of the gateway");
    completed(&relayed_live(&fleet, PATH, &body, 3).await);
}

/// A stored prompt template (`prompt: {id}`) is accepted; without a `version`
/// it names the latest template, which can change under the same body, so it
/// is neither coalesced nor cached (`BYPASS`). With a version it is cached.
#[tokio::test]
async fn a_prompt_template_is_cached_only_by_its_version() {
    let gateway = TestGateway::start(|_| {}).await;
    let templated = |version: Option<&str>| {
        let mut body = request("fill the template");
        body["prompt"] = json!({"id": "pmpt_123", "variables": {"city": "Sofia"}});
        if let Some(version) = version {
            body["prompt"]["version"] = json!(version);
        }
        body
    };
    for _ in 0..2 {
        let latest = gateway.post(PATH, &templated(None)).await;
        assert_eq!(latest.status, StatusCode::OK, "{:?}", latest.body);
        assert_eq!(latest.cache(), "BYPASS");
    }
    assert_eq!(gateway.provider.calls(), 2);
    let pinned = gateway.post(PATH, &templated(Some("4"))).await;
    assert_eq!(pinned.cache(), "MISS");
    assert_eq!(
        gateway.post(PATH, &templated(Some("4"))).await.cache(),
        "HIT"
    );
    assert_eq!(gateway.provider.calls(), 3);
}
