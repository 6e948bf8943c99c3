//! Embeddings by the item: a batch sends upstream only the inputs nobody has
//! embedded yet, in one call, and gets back exactly what a direct call would
//! return, in its order and its `encoding_format`.

use std::collections::BTreeMap;

use base64::{Engine as _, engine::general_purpose::STANDARD as BASE64};
use mock_upstream::{FailureMode, Scripted};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{
    cluster::redis_config,
    harness::{Fleet, Reply, TestGateway, WAIT},
    metrics::{scrape, sum},
    redis_server::RedisServer,
};

const PATH: &str = "/v1/embeddings";
const MODEL: &str = "text-embedding-3-small";

fn batch(inputs: &[String], format: Option<&str>) -> Value {
    let mut body = json!({"model": MODEL, "input": inputs, "dimensions": 16});
    if let Some(format) = format {
        body["encoding_format"] = json!(format);
    }
    body
}

fn texts(prefix: &str, range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("{prefix} chunk {i}")).collect()
}

/// Every vector of an answer as f32 bit patterns, in `data` order, after
/// checking that `index` counts 0, 1, 2, ... A float must be the shortest
/// decimal of an f32, as providers print them.
fn vectors(answer: &Value) -> Vec<Vec<u32>> {
    let data = answer["data"].as_array().expect("data");
    data.iter()
        .enumerate()
        .map(|(position, datum)| {
            assert_eq!(datum["index"], position, "index of entry {position}");
            assert_eq!(datum["object"], "embedding");
            match &datum["embedding"] {
                Value::String(text) => BASE64
                    .decode(text)
                    .expect("base64")
                    .chunks_exact(4)
                    .map(|four| u32::from_le_bytes(four.try_into().unwrap()))
                    .collect(),
                Value::Array(numbers) => numbers
                    .iter()
                    .map(|number| {
                        let value = number.as_f64().expect("a number");
                        let single = value as f32;
                        let shortest: f64 =
                            serde_json::to_string(&single).unwrap().parse().unwrap();
                        assert_eq!(shortest, value, "{value} is not an f32's shortest decimal");
                        single.to_bits()
                    })
                    .collect(),
                other => panic!("not a vector: {other}"),
            }
        })
        .collect()
}

/// The same request sent to the provider directly, not through corral.
async fn direct(gateway: &TestGateway, body: &Value) -> Value {
    let response = gateway
        .client
        .post(format!("{}/embeddings", gateway.provider.base_url()))
        .json(body)
        .send()
        .await
        .expect("the provider answers");
    assert_eq!(response.status(), StatusCode::OK);
    response.json().await.expect("JSON")
}

/// The `input` of every upstream embeddings call, in order.
fn upstream_inputs(gateway: &TestGateway) -> Vec<Value> {
    gateway
        .provider
        .requests()
        .iter()
        .filter(|request| request.path.ends_with("/embeddings"))
        .map(|request| request.json().expect("JSON body")["input"].clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_with_five_new_inputs_sends_exactly_those_five_upstream() {
    let gateway = TestGateway::start(|_| {}).await;
    let old = texts("old", 0..100);
    let first = gateway.post(PATH, &batch(&old, None)).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.cache(), "MISS");
    assert_eq!(
        first.header("x-corral-items"),
        Some("hit=0, stale=0, coalesced=0, miss=100")
    );

    // The same 100 with 5 new ones in between, asked for in base64 this time.
    let new = texts("new", 0..5);
    let mut mixed = old.clone();
    for (n, text) in new.iter().enumerate() {
        mixed.insert(7 + n * 20, text.clone());
    }
    let second = gateway.post(PATH, &batch(&mixed, Some("base64"))).await;
    assert_eq!(second.status, StatusCode::OK, "{:?}", second.body);
    assert_eq!(second.cache(), "MISS");
    assert_eq!(
        second.header("x-corral-items"),
        Some("hit=100, stale=0, coalesced=0, miss=5")
    );

    let calls = upstream_inputs(&gateway);
    assert_eq!(calls.len(), 2);
    assert_eq!(
        calls[1],
        json!(new),
        "exactly the new inputs, in their relative order"
    );
    assert_eq!(
        gateway.provider.embedded_inputs(),
        105,
        "each input embedded once"
    );

    // Bit for bit what a direct call returns for the same 105 inputs, in order.
    let answer = second.json();
    let expected = direct(&gateway, &batch(&mixed, Some("base64"))).await;
    assert_eq!(answer["data"], expected["data"], "the same base64 strings");
    assert_eq!(vectors(&answer), vectors(&expected));
    assert_eq!(answer["model"], expected["model"]);
    // Billed: the one call for the five new inputs.
    let five = direct(&gateway, &batch(&new, None)).await;
    assert_eq!(answer["usage"], five["usage"]);

    // A float caller of the same inputs: all cached, the same floats a direct call gives.
    let floats = gateway.post(PATH, &batch(&mixed, Some("float"))).await;
    assert_eq!(
        floats.header("x-corral-items"),
        Some("hit=105, stale=0, coalesced=0, miss=0")
    );
    assert_eq!(floats.cache(), "HIT");
    let expected = direct(&gateway, &batch(&mixed, Some("float"))).await;
    assert_eq!(floats.json()["data"], expected["data"]);
    assert_eq!(vectors(&floats.json()), vectors(&answer));
    assert_eq!(
        floats.json()["usage"]["prompt_tokens"],
        0,
        "nothing was billed"
    );
    assert_eq!(
        upstream_inputs(&gateway).len(),
        5,
        "two through corral, three direct"
    );
}

#[tokio::test]
async fn duplicates_token_arrays_and_a_single_string_share_entries() {
    let gateway = TestGateway::start(|_| {}).await;
    let body = json!({"model": MODEL, "input": ["a", [1, 2, 3], "a", "b"]});
    let reply = gateway.post(PATH, &body).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(upstream_inputs(&gateway), [json!(["a", [1, 2, 3], "b"])]);
    let answer = reply.json();
    let got = vectors(&answer);
    assert_eq!(got.len(), 4);
    assert_eq!(got[0], got[2], "a repeated input gets its vector twice");
    assert_eq!(got, vectors(&direct(&gateway, &body).await));

    // A string input is the single-item case; a single token array too.
    let single = gateway
        .post(PATH, &json!({"model": MODEL, "input": "b"}))
        .await;
    assert_eq!(single.cache(), "HIT");
    assert_eq!(vectors(&single.json())[0], got[3]);
    let tokens = gateway
        .post(PATH, &json!({"model": MODEL, "input": [1, 2, 3]}))
        .await;
    assert_eq!(tokens.cache(), "HIT");
    assert_eq!(vectors(&tokens.json())[0], got[1]);
    // Another model, another dimension count: other entries.
    let other = gateway
        .post(
            PATH,
            &json!({"model": MODEL, "input": "b", "dimensions": 4}),
        )
        .await;
    assert_eq!(other.cache(), "MISS");
    assert_eq!(
        gateway.provider.embedded_inputs(),
        3 + 4 + 1,
        "three through corral, four direct, then `b` at four dimensions"
    );
}

#[tokio::test]
async fn an_upstream_error_or_a_partial_answer_fails_the_batch_and_caches_nothing() {
    let gateway = TestGateway::start(|config| config.retry.max_attempts = 1).await;
    let inputs = texts("fragile", 0..3);
    gateway.provider.set_failure(Some(FailureMode::always(500)));
    let failed = gateway.post(PATH, &batch(&inputs, None)).await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    gateway.provider.set_failure(None);

    // Two vectors for three inputs: an error, and nothing of it is kept.
    let partial = json!({
        "object": "list",
        "model": MODEL,
        "data": [
            {"object": "embedding", "index": 0, "embedding": [0.5]},
            {"object": "embedding", "index": 1, "embedding": [0.25]},
        ],
        "usage": {"prompt_tokens": 6, "total_tokens": 6},
    });
    gateway
        .provider
        .push_script(Scripted::json(200, partial.to_string()));
    let short = gateway.post(PATH, &batch(&inputs, None)).await;
    assert_eq!(short.status, StatusCode::BAD_GATEWAY, "{:?}", short.body);
    assert!(
        String::from_utf8_lossy(&short.body).contains("2 vectors for 3 inputs"),
        "{:?}",
        short.body
    );

    let third = gateway.post(PATH, &batch(&inputs, None)).await;
    assert_eq!(third.status, StatusCode::OK);
    assert_eq!(
        third.header("x-corral-items"),
        Some("hit=0, stale=0, coalesced=0, miss=3")
    );
    assert_eq!(
        upstream_inputs(&gateway),
        vec![json!(inputs); 3],
        "every attempt asked for all three: nothing was cached"
    );
}

#[tokio::test]
async fn too_many_inputs_or_a_bad_input_is_a_400_before_any_upstream_call() {
    let gateway = TestGateway::start(|config| config.limits.max_embedding_inputs = 3).await;
    for body in [
        batch(&texts("many", 0..4), None),
        json!({"model": MODEL, "input": ["ok", {"not": "an input"}]}),
        json!({"model": MODEL, "input": []}),
        json!({"model": MODEL, "input": "x", "encoding_format": "hex"}),
    ] {
        let reply = gateway.post(PATH, &body).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(reply.json()["error"]["type"], "invalid_request_error");
    }
    assert_eq!(gateway.provider.calls(), 0);
}

/// Sends `body` to `gateway` on a task of its own.
fn spawn_post(gateway: &TestGateway, body: Value) -> tokio::task::JoinHandle<Reply> {
    let handle = gateway.clone_handle();
    tokio::spawn(async move { handle.post_with(PATH, &body, &[]).await })
}

fn counts(gateway: &crate::harness::TestGateway) -> BTreeMap<String, u64> {
    gateway.provider.embedded_counts()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_batches_on_one_instance_embed_the_shared_input_once() {
    let gateway = TestGateway::start(|_| {}).await;
    let (a, b, c) = ("alpha".to_owned(), "bravo".to_owned(), "charlie".to_owned());
    gateway.provider.hold();
    let first = spawn_post(&gateway, batch(&[a.clone(), b.clone()], None));
    gateway.wait_for_calls(1).await;
    // The first batch's call is held: `b` is in flight, not cached.
    let second = spawn_post(&gateway, batch(&[b.clone(), c.clone()], Some("base64")));
    gateway.wait_for_calls(2).await;
    gateway.provider.release();
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert_eq!(
        first.header("x-corral-items"),
        Some("hit=0, stale=0, coalesced=0, miss=2")
    );
    assert_eq!(
        second.header("x-corral-items"),
        Some("hit=0, stale=0, coalesced=1, miss=1")
    );
    assert_eq!(upstream_inputs(&gateway), [json!([a, b]), json!([c])]);
    assert_eq!(
        counts(&gateway).values().copied().collect::<Vec<_>>(),
        [1, 1, 1]
    );
    assert_eq!(vectors(&first.json())[1], vectors(&second.json())[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_batches_on_two_instances_embed_each_input_once() {
    let redis = RedisServer::spawn().await;
    let fleet = Fleet::start(2, |config| config.redis = Some(redis_config(&redis.url()))).await;
    let (one, two) = (&fleet.instances[0], &fleet.instances[1]);
    let (a, b, c) = ("alpha".to_owned(), "bravo".to_owned(), "charlie".to_owned());
    fleet.provider.hold();
    let first = spawn_post(one, batch(&[a.clone(), b.clone()], None));
    one.wait_for_calls(1).await;
    // Instance one holds `b`'s cluster lock while its call is held: instance
    // two follows `b` and embeds only `c`.
    let second = spawn_post(two, batch(&[b.clone(), c.clone()], None));
    two.wait_for_calls(2).await;
    fleet.provider.release();
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(second.status, StatusCode::OK);
    assert_eq!(
        second.header("x-corral-items"),
        Some("hit=0, stale=0, coalesced=1, miss=1")
    );
    assert_eq!(upstream_inputs(one), [json!([a, b]), json!([c])]);
    let embedded = fleet.provider.embedded_counts();
    assert_eq!(
        embedded,
        BTreeMap::from([(a, 1), (b, 1), (c, 1)]),
        "a, b and c once each for the cluster"
    );
    assert_eq!(vectors(&first.json())[1], vectors(&second.json())[0]);

    let cached = one.post(PATH, &batch(&["charlie".to_owned()], None)).await;
    assert_eq!(
        cached.cache(),
        "HIT",
        "instance one reads instance two's entry"
    );
    tokio::time::timeout(WAIT, async {
        one.wait_idle().await;
        two.wait_idle().await;
    })
    .await
    .expect("flights end");
}

#[tokio::test]
async fn metrics_count_saved_inputs_and_their_tokens_where_known() {
    let gateway = TestGateway::start(|_| {}).await;
    let embed = |input: Value| {
        let gateway = &gateway;
        async move {
            let reply = gateway
                .post(PATH, &json!({"model": MODEL, "input": input}))
                .await;
            assert_eq!(reply.status, StatusCode::OK);
            reply
        }
    };
    // Alone: its own usage is its token count.
    let alone = embed(json!("alpha")).await;
    let alpha_tokens = alone.json()["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(alpha_tokens > 0);
    // `alpha` a hit with known tokens; `beta` and the token ids embedded together.
    let mixed = embed(json!(["alpha", "beta", [7, 8, 9]])).await;
    assert_eq!(
        mixed.header("x-corral-items"),
        Some("hit=1, stale=0, coalesced=0, miss=2")
    );
    // `beta`'s own count is unknown (it shared a call); the token ids are three tokens.
    let hits = embed(json!(["beta", [7, 8, 9]])).await;
    assert_eq!(hits.cache(), "HIT");

    let m = scrape(&gateway).await;
    assert_eq!(
        sum(&m, "corral_embedding_inputs_total", &[("via", "hit")]),
        3.0
    );
    assert_eq!(
        sum(&m, "corral_embedding_inputs_total", &[("via", "miss")]),
        3.0
    );
    assert_eq!(
        sum(&m, "corral_saved_responses_total", &[("via", "hit")]),
        3.0
    );
    assert_eq!(
        sum(
            &m,
            "corral_tokens_total",
            &[("kind", "input"), ("source", "saved")]
        ),
        (alpha_tokens + 3) as f64,
        "alpha's own count and the three token ids; beta's is not invented"
    );
    assert_eq!(
        sum(&m, "corral_usage_unknown_total", &[("source", "saved")]),
        1.0,
        "beta: saved, usage unknown"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_inputs_are_served_at_once_and_refreshed_together_in_one_call() {
    let gateway = TestGateway::start(|config| {
        config.cache.soft_ttl = std::time::Duration::from_secs(1);
        config.cache.hard_ttl = std::time::Duration::from_secs(60);
    })
    .await;
    let old = texts("aging", 0..3);
    let first = gateway.post(PATH, &batch(&old, None)).await;
    assert_eq!(first.cache(), "MISS");
    gateway
        .clock
        .advance(std::time::Duration::from_millis(1500));
    // Held upstream: the stale entries answer, and one refresh goes out for all three.
    gateway.provider.hold();
    let mut mixed = old.clone();
    mixed.push("fresh".to_owned());
    let second = spawn_post(&gateway, batch(&mixed, None));
    gateway.wait_for_calls(3).await;
    gateway.provider.release();
    let second = second.await.unwrap();
    assert_eq!(
        second.header("x-corral-items"),
        Some("hit=0, stale=3, coalesced=0, miss=1")
    );
    gateway.wait_idle().await;
    let calls = upstream_inputs(&gateway);
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert!(
        calls.contains(&json!(old)),
        "one refresh for the three stale inputs: {calls:?}"
    );
    assert!(calls.contains(&json!(["fresh"])), "{calls:?}");
    let third = gateway.post(PATH, &batch(&old, None)).await;
    assert_eq!(third.cache(), "HIT", "the refresh stored fresh entries");
}
