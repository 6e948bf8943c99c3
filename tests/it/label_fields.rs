//! The label fields of each API (README, "Label fields") leave the key, and
//! every other field keeps splitting it: a property test over the list and
//! its complement, for every deduplicated endpoint, with the switch on (the
//! default) and off (`cache.ignore_label_fields: false`, where the list is
//! keyed like the rest).
//!
//! The lists are written out here, not read from the adapters: the test pins
//! the documented contract, so a field dropped from (or added to) an
//! adapter's list fails it.

use corral::{
    fingerprint::{Endpoint, LabelFields, Normalization, canonical_body_with},
    wire,
};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// Fields that only deliver the answer: never keyed.
fn delivery(endpoint: Endpoint) -> &'static [&'static str] {
    match endpoint {
        Endpoint::Messages => &["stream"],
        // The method says whether a call streams; the body has no delivery field.
        Endpoint::GenerateContent | Endpoint::EmbedContent => &[],
        _ => &["stream", "stream_options"],
    }
}

/// The documented label fields of each API.
fn labels(endpoint: Endpoint) -> &'static [&'static str] {
    match endpoint {
        Endpoint::ChatCompletions | Endpoint::Completions | Endpoint::Embeddings => &[
            "user",
            "safety_identifier",
            "prompt_cache_key",
            "metadata",
            "request_id",
        ],
        Endpoint::Responses => &[
            "user",
            "safety_identifier",
            "prompt_cache_key",
            "metadata",
            "client_metadata",
        ],
        Endpoint::Messages => &["metadata"],
        Endpoint::GenerateContent | Endpoint::EmbedContent => &[],
    }
}

/// Names a body may carry: every API's labels and delivery fields (one API's
/// label is another's keyed field), the fields that shape an answer, and
/// names corral has never heard of.
fn field_name() -> impl Strategy<Value = String> {
    let known = prop::sample::select(vec![
        "user",
        "safety_identifier",
        "prompt_cache_key",
        "metadata",
        "client_metadata",
        "request_id",
        "stream",
        "stream_options",
        "model",
        "temperature",
        "top_p",
        "max_tokens",
        "seed",
        "tools",
        "tool_choice",
        "instructions",
        "previous_response_id",
        "reasoning",
        "system",
        "store",
        "service_tier",
        "text",
        "include",
    ])
    .prop_map(str::to_owned);
    prop_oneof![3 => known, 1 => "[a-z_]{1,12}"]
}

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i32>().prop_map(Value::from),
        "[a-zA-Z0-9 ]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(2, 12, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            prop::collection::btree_map("[a-z]{1,6}", inner, 0..3)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

fn endpoint() -> impl Strategy<Value = Endpoint> {
    prop::sample::select(Endpoint::ALL.to_vec())
}

/// The conversation field corral normalizes: changing it is covered by the
/// fingerprint property tests, and a random value there would only test the
/// normalizer.
fn conversation(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::Responses => "input",
        Endpoint::GenerateContent => "contents",
        Endpoint::EmbedContent => "requests",
        _ => "messages",
    }
}

fn key(endpoint: Endpoint, body: &Map<String, Value>, labels: LabelFields) -> Vec<u8> {
    let normalization = Normalization {
        labels,
        ..Normalization::default()
    };
    canonical_body_with(body, normalization, wire::of(endpoint).keying())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Changing (or adding, or removing) one top-level field: a label leaves
    /// the key unless labels are keyed, a delivery field always does, any
    /// other field always splits it.
    #[test]
    fn a_label_never_splits_the_key_and_every_other_field_does(
        endpoint in endpoint(),
        base in prop::collection::btree_map(field_name(), value(), 0..6),
        field in field_name(),
        before in prop::option::of(value()),
        after in prop::option::of(value()),
    ) {
        prop_assume!(field != conversation(endpoint) && before != after);
        let mut base: Map<String, Value> = base.into_iter().collect();
        base.remove(conversation(endpoint));
        base.insert(conversation(endpoint).to_owned(), json!([{"role": "user", "content": "hi"}]));
        let with = |value: &Option<Value>| {
            let mut body = base.clone();
            match value {
                Some(value) => body.insert(field.clone(), value.clone()),
                None => body.remove(&field),
            };
            body
        };
        let (a, b) = (with(&before), with(&after));
        let is_delivery = delivery(endpoint).contains(&field.as_str());
        let is_label = labels(endpoint).contains(&field.as_str());
        let ignored_equal = key(endpoint, &a, LabelFields::Ignored) == key(endpoint, &b, LabelFields::Ignored);
        let keyed_equal = key(endpoint, &a, LabelFields::Keyed) == key(endpoint, &b, LabelFields::Keyed);
        prop_assert_eq!(ignored_equal, is_delivery || is_label, "{:?} `{}`, labels ignored", endpoint, field);
        prop_assert_eq!(keyed_equal, is_delivery, "{:?} `{}`, labels keyed", endpoint, field);
    }

    /// Members of items: a Messages tool's `eager_input_streaming`, a
    /// Responses inline item's `id`, leave the key; any other member of a
    /// tool, and the id of an `item_reference`, split it.
    #[test]
    fn item_members_that_only_label_leave_the_key(
        member in prop_oneof![Just("eager_input_streaming".to_owned()), "[a-z_]{1,12}"],
        before in prop::option::of(value()),
        after in prop::option::of(value()),
        id_a in "[a-z0-9_]{1,10}",
        id_b in "[a-z0-9_]{1,10}",
        inline in prop::sample::select(vec!["message", "function_call", "function_call_output", "item_reference"]),
    ) {
        prop_assume!(before != after);
        let tool_with = |value: &Option<Value>| {
            let mut tool = json!({"name": "t", "input_schema": {"type": "object"}});
            if let Some(value) = value {
                tool[member.as_str()] = value.clone();
            }
            let body = json!({"model": "m", "messages": [], "tools": [tool]});
            body.as_object().unwrap().clone()
        };
        let label = member == "eager_input_streaming";
        for (labels, ignored) in [(LabelFields::Ignored, label), (LabelFields::Keyed, false)] {
            let equal = key(Endpoint::Messages, &tool_with(&before), labels)
                == key(Endpoint::Messages, &tool_with(&after), labels);
            prop_assert_eq!(equal, ignored, "tools[0].{}, {:?}", member, labels);
        }

        prop_assume!(id_a != id_b);
        let item_with = |id: &str| {
            let mut item = json!({"type": inline, "id": id, "role": "user", "content": "hi", "call_id": "c", "output": "1"});
            if inline == "item_reference" {
                item = json!({"type": "item_reference", "id": id});
            }
            let body = json!({"model": "m", "input": [item]});
            body.as_object().unwrap().clone()
        };
        let by_reference = inline == "item_reference";
        for (labels, ignored) in [(LabelFields::Ignored, !by_reference), (LabelFields::Keyed, false)] {
            let equal = key(Endpoint::Responses, &item_with(&id_a), labels)
                == key(Endpoint::Responses, &item_with(&id_b), labels);
            prop_assert_eq!(equal, ignored, "input[0].id of a {}, {:?}", inline, labels);
        }
    }
}

mod through_the_gateway {
    //! Callers that differ only in label fields share one call, and each
    //! receives its own values where the provider echoes them.

    use serde_json::{Value, json};

    use crate::harness::{Reply, TestGateway, named_events, streamed};

    const PATH: &str = "/v1/responses";

    /// A Responses request of `text` labelled for `who` (no labels: `None`).
    fn labelled(text: &str, who: Option<&str>) -> Value {
        let mut body = json!({
            "model": "gpt-4o-mini",
            "temperature": 0,
            "input": [{"role": "user", "content": text}],
        });
        if let Some(who) = who {
            body["metadata"] = json!({"run": who});
            body["prompt_cache_key"] = json!(format!("pck-{who}"));
            body["safety_identifier"] = json!(format!("sid-{who}"));
            body["user"] = json!(format!("user-{who}"));
        }
        body
    }

    /// Asserts that a `response` object echoes `who`'s labels (or none).
    fn echoes(response: &Value, who: Option<&str>, context: &str) {
        let expected = match who {
            Some(who) => json!({
                "metadata": {"run": who},
                "prompt_cache_key": format!("pck-{who}"),
                "safety_identifier": format!("sid-{who}"),
                "user": format!("user-{who}"),
            }),
            None => json!({
                "metadata": {},
                "prompt_cache_key": null,
                "safety_identifier": null,
                "user": null,
            }),
        };
        for field in ["metadata", "prompt_cache_key", "safety_identifier", "user"] {
            assert_eq!(
                response[field], expected[field],
                "{context}: `{field}` in {response}"
            );
        }
    }

    /// Every lifecycle event of a stream echoes `who`'s labels; returns the
    /// completed response.
    fn stream_echoes(reply: &Reply, who: Option<&str>) -> Value {
        let events = named_events(&reply.body);
        let mut lifecycle = 0;
        for (name, data) in &events {
            if matches!(
                name.as_str(),
                "response.created" | "response.in_progress" | "response.completed"
            ) {
                lifecycle += 1;
                echoes(&data["response"], who, name);
            }
        }
        assert_eq!(lifecycle, 3, "created, in progress, completed");
        let (last, completed) = events.last().expect("events");
        assert_eq!(last, "response.completed");
        completed["response"].clone()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn callers_differing_only_in_labels_share_one_call_and_each_gets_its_own() {
        let gateway = TestGateway::start(|_| {}).await;
        let (alice, bob) = (Some("alice"), Some("bob"));

        // Plain: alice owns the call, bob joins it.
        gateway.provider.hold();
        let first = gateway.spawn_post(PATH, &labelled("plain", alice));
        gateway.wait_for_waiters(1).await;
        let second = gateway.spawn_post(PATH, &labelled("plain", bob));
        gateway.wait_for_waiters(2).await;
        gateway.provider.release();
        let (first, second) = (first.await.unwrap(), second.await.unwrap());
        assert_eq!(gateway.provider.calls(), 1, "one call for both");
        assert_eq!((first.cache(), second.cache()), ("MISS", "COALESCED"));
        echoes(&first.json(), alice, "owner");
        echoes(&second.json(), bob, "follower");
        // The call went upstream as its owner sent it.
        let sent = gateway.provider.requests()[0].json().unwrap();
        echoes(&sent, alice, "upstream request");
        // Same answer otherwise.
        assert_eq!(first.json()["output"], second.json()["output"]);
        // A later caller with no labels is served from the cache with none.
        let later = gateway.post(PATH, &labelled("plain", None)).await;
        assert_eq!(later.cache(), "HIT");
        echoes(&later.json(), None, "hit");

        // Streamed, with a plain caller among them: every lifecycle event.
        gateway.provider.hold();
        let owner = gateway.spawn_post(PATH, &streamed(labelled("stream", alice)));
        gateway.wait_for_waiters(1).await;
        let follower = gateway.spawn_post(PATH, &streamed(labelled("stream", bob)));
        let plain = gateway.spawn_post(PATH, &labelled("stream", Some("carol")));
        gateway.wait_for_waiters(3).await;
        gateway.provider.release();
        let (owner, follower, plain) = (
            owner.await.unwrap(),
            follower.await.unwrap(),
            plain.await.unwrap(),
        );
        assert_eq!(gateway.provider.calls(), 2, "one call for the three");
        let owners = stream_echoes(&owner, alice);
        let followers = stream_echoes(&follower, bob);
        assert_eq!(owners["output"], followers["output"]);
        echoes(
            &plain.json(),
            Some("carol"),
            "plain caller of a streamed flight",
        );
        // A stream replayed from the cache, too.
        let replayed = gateway
            .post(PATH, &streamed(labelled("stream", Some("dave"))))
            .await;
        assert_eq!(replayed.cache(), "HIT");
        stream_echoes(&replayed, Some("dave"));
        assert_eq!(gateway.provider.calls(), 2);
    }
}
