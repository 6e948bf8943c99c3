//! `assemble` and `synthesize`: a stream and its non-stream equivalent, both ways.

use bytes::Bytes;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::{event, json_of};
use crate::{
    sse::DONE_EVENT,
    wire::{
        ConvertError,
        chat::{assemble, synthesize},
    },
};

fn done() -> Bytes {
    Bytes::from_static(DONE_EVENT)
}

fn chat_chunk(choices: Value) -> Bytes {
    event(
        &json!({
            "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1700000000,
            "model": "gpt-4o-mini", "system_fingerprint": "fp_1", "choices": choices,
            "obfuscation": "x9",
        })
        .to_string(),
    )
}

fn delta(delta: Value, finish_reason: Value) -> Bytes {
    chat_chunk(
        json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason}]),
    )
}

#[test]
fn tool_calls_are_assembled_from_their_deltas() {
    let events = vec![
        delta(
            json!({"role": "assistant", "content": null, "refusal": null}),
            json!(null),
        ),
        delta(
            json!({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                   "function": {"name": "get_weather", "arguments": ""}}]}),
            json!(null),
        ),
        delta(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\":"}}]}),
            json!(null),
        ),
        delta(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"Paris\"}"}}]}),
            json!(null),
        ),
        delta(
            json!({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                                   "function": {"name": "get_time", "arguments": "{}"}}]}),
            json!(null),
        ),
        delta(json!({}), json!("tool_calls")),
        done(),
    ];
    let answer = assemble(&events).unwrap();
    assert_eq!(
        answer,
        json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1700000000,
            "model": "gpt-4o-mini", "system_fingerprint": "fp_1",
            "choices": [{
                "index": 0,
                "message": {
                    "role": "assistant", "content": null, "refusal": null,
                    "tool_calls": [
                        {"id": "call_a", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                        {"id": "call_b", "type": "function",
                         "function": {"name": "get_time", "arguments": "{}"}},
                    ],
                },
                "logprobs": null,
                "finish_reason": "tool_calls",
            }],
        })
    );
}

#[test]
fn content_refusal_logprobs_and_usage_are_assembled_across_interleaved_choices() {
    let lp =
        |token: &str| json!({"token": token, "logprob": -0.5, "bytes": [1], "top_logprobs": []});
    let events = vec![
        chat_chunk(json!([
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null},
            {"index": 1, "delta": {"role": "assistant", "content": "", "refusal": null}, "logprobs": null, "finish_reason": null},
        ])),
        chat_chunk(
            json!([{"index": 1, "delta": {"refusal": "I can't"}, "logprobs": null, "finish_reason": null}]),
        ),
        chat_chunk(
            json!([{"index": 0, "delta": {"content": "Hé"}, "logprobs": {"content": [lp("Hé")], "refusal": null}, "finish_reason": null}]),
        ),
        chat_chunk(
            json!([{"index": 1, "delta": {"refusal": " help."}, "logprobs": null, "finish_reason": null}]),
        ),
        // Some servers repeat the role on every delta: it must not become "assistantassistant".
        chat_chunk(
            json!([{"index": 0, "delta": {"role": "assistant", "content": "llo", "refusal": null}, "logprobs": {"content": [lp("llo")], "refusal": null}, "finish_reason": null}]),
        ),
        chat_chunk(json!([{"index": 0, "delta": {}, "logprobs": null, "finish_reason": "length"}])),
        chat_chunk(json!([{"index": 1, "delta": {}, "logprobs": null, "finish_reason": "stop"}])),
        event(
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13}}"#,
        ),
        done(),
        event(r#"{"ignored":"after done"}"#),
    ];
    let answer = assemble(&events).unwrap();
    assert_eq!(
        answer["choices"],
        json!([
            {"index": 0, "message": {"role": "assistant", "content": "Héllo", "refusal": null},
             "logprobs": {"content": [lp("Hé"), lp("llo")], "refusal": null}, "finish_reason": "length"},
            {"index": 1, "message": {"role": "assistant", "content": "", "refusal": "I can't help."},
             "logprobs": null, "finish_reason": "stop"},
        ])
    );
    assert_eq!(answer["usage"]["total_tokens"], 13);
    assert!(
        answer.get("obfuscation").is_none(),
        "per-chunk members are dropped"
    );
}

#[test]
fn a_text_completion_stream_is_assembled() {
    let chunk = |text: &str, logprobs: Value, finish: Value| {
        event(
            &json!({"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "gpt-3.5-turbo-instruct",
                    "choices": [{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish}]})
            .to_string(),
        )
    };
    let lp = |token: &str, offset: u64| json!({"tokens": [token], "token_logprobs": [-0.25], "top_logprobs": [{"index": -0.25}], "text_offset": [offset]});
    let events = vec![
        chunk("Once", lp("Once", 0), json!(null)),
        chunk(" upon", lp(" upon", 4), json!(null)),
        chunk("", json!(null), json!("stop")),
        done(),
    ];
    assert_eq!(
        assemble(&events).unwrap(),
        json!({
            "id": "cmpl-1", "object": "text_completion", "created": 1, "model": "gpt-3.5-turbo-instruct",
            "choices": [{
                "text": "Once upon", "index": 0, "finish_reason": "stop",
                "logprobs": {
                    "tokens": ["Once", " upon"], "token_logprobs": [-0.25, -0.25],
                    "top_logprobs": [{"index": -0.25}, {"index": -0.25}], "text_offset": [0, 4],
                },
            }],
        })
    );
}

#[test]
fn what_cannot_be_assembled_says_why() {
    assert_eq!(assemble(&[]), Err(ConvertError::Empty));
    assert_eq!(assemble(&[done()]), Err(ConvertError::Empty));
    assert_eq!(
        assemble(&[Bytes::from_static(b"event: x\n\n")]),
        Err(ConvertError::NotJson { index: 0 })
    );
    assert_eq!(
        assemble(&[
            delta(json!({"content": "a"}), json!(null)),
            crate::sse::error_event("cut")
        ]),
        Err(ConvertError::ErrorEvent { index: 1 })
    );
    let text = event(r#"{"object":"text_completion","choices":[{"text":"a","index":0}]}"#);
    assert!(matches!(
        assemble(&[delta(json!({"content": "a"}), json!(null)), text]),
        Err(ConvertError::MixedObjects { index: 1, .. })
    ));
    assert_eq!(
        assemble(&[event(r#"{"object":"response.chunk","choices":[]}"#)]),
        Err(ConvertError::UnsupportedObject("response.chunk".to_owned()))
    );
    assert!(synthesize(&json!({"object": "list", "data": []})).is_err());
}

#[test]
fn a_synthesized_stream_has_the_shape_of_a_real_one() {
    let answer = json!({
        "id": "chatcmpl-9", "object": "chat.completion", "created": 5, "model": "gpt-4o",
        "system_fingerprint": "fp_9",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi there"},
                     "logprobs": null, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    });
    let events = synthesize(&answer).unwrap();
    let chunks: Vec<Value> = events.iter().filter_map(|e| json_of(e)).collect();
    assert_eq!(events.last(), Some(&done()));
    assert_eq!(chunks.len(), 4, "role, content, finish, usage");
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    assert_eq!(
        chunks[1]["choices"][0]["delta"],
        json!({"content": "Hi there"})
    );
    assert_eq!(chunks[2]["choices"][0]["finish_reason"], "stop");
    for chunk in &chunks[..3] {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["id"], "chatcmpl-9");
        assert_eq!(chunk["usage"], Value::Null);
        assert!(chunk.get("usage").is_some(), "announced, as OpenAI does");
    }
    assert_eq!(chunks[3]["choices"], json!([]));
    assert_eq!(chunks[3]["usage"], answer["usage"]);
    assert_eq!(assemble(&events).unwrap(), answer);
}

fn text_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "\\PC{0,200}",
        any::<String>(),
        "[a-z ]{60,140}",
    ]
}

fn usage_strategy() -> impl Strategy<Value = Option<Value>> {
    proptest::option::of(
        (0_u64..100_000, 0_u64..100_000).prop_map(|(prompt, completion)| {
            json!({"prompt_tokens": prompt, "completion_tokens": completion,
               "total_tokens": prompt + completion})
        }),
    )
}

fn finish_strategy() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!("stop")),
        Just(json!("length")),
        Just(json!("tool_calls")),
        Just(json!("content_filter")),
    ]
}

fn message_strategy() -> impl Strategy<Value = Value> {
    (
        proptest::option::of(text_strategy()),
        0_u8..3,
        text_strategy(),
        proptest::collection::vec(("[a-z_]{1,12}", text_strategy()), 0..3),
    )
        .prop_map(|(content, refusal_kind, refusal, calls)| {
            let mut message = json!({"role": "assistant", "content": content});
            match refusal_kind {
                0 => {}
                1 => message["refusal"] = Value::Null,
                _ => message["refusal"] = json!(refusal),
            }
            if !calls.is_empty() {
                let calls: Vec<Value> = calls
                    .iter()
                    .enumerate()
                    .map(|(i, (name, arguments))| {
                        json!({"id": format!("call_{i}"), "type": "function",
                               "function": {"name": name, "arguments": arguments}})
                    })
                    .collect();
                message["tool_calls"] = json!(calls);
            }
            message
        })
}

fn chat_answer() -> impl Strategy<Value = Value> {
    (
        proptest::collection::vec((message_strategy(), finish_strategy()), 1..4),
        usage_strategy(),
        any::<bool>(),
    )
        .prop_map(|(choices, usage, fingerprint)| {
            let choices: Vec<Value> = choices
                .into_iter()
                .enumerate()
                .map(|(index, (message, finish_reason))| {
                    json!({"index": index, "message": message, "logprobs": null, "finish_reason": finish_reason})
                })
                .collect();
            let mut answer = json!({"id": "chatcmpl-p", "object": "chat.completion", "created": 42,
                                    "model": "gpt-4o-mini", "choices": choices});
            if fingerprint {
                answer["system_fingerprint"] = json!("fp_p");
            }
            if let Some(usage) = usage {
                answer["usage"] = usage;
            }
            answer
        })
}

fn text_answer() -> impl Strategy<Value = Value> {
    (
        proptest::collection::vec((text_strategy(), finish_strategy()), 1..4),
        usage_strategy(),
    )
        .prop_map(|(choices, usage)| {
            let choices: Vec<Value> = choices
                .into_iter()
                .enumerate()
                .map(|(index, (text, finish_reason))| {
                    json!({"text": text, "index": index, "logprobs": null, "finish_reason": finish_reason})
                })
                .collect();
            let mut answer = json!({"id": "cmpl-p", "object": "text_completion", "created": 42,
                                    "model": "gpt-3.5-turbo-instruct", "choices": choices});
            if let Some(usage) = usage {
                answer["usage"] = usage;
            }
            answer
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn synthesize_then_assemble_gives_back_the_chat_answer(answer in chat_answer()) {
        let events = synthesize(&answer).unwrap();
        prop_assert_eq!(events.last(), Some(&done()));
        prop_assert_eq!(assemble(&events).unwrap(), answer);
    }

    #[test]
    fn synthesize_then_assemble_gives_back_the_text_answer(answer in text_answer()) {
        let events = synthesize(&answer).unwrap();
        prop_assert_eq!(assemble(&events).unwrap(), answer);
    }

    #[test]
    fn a_synthesized_stream_survives_the_relay_unchanged(answer in chat_answer()) {
        let events = synthesize(&answer).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let summary = runtime.block_on(async {
            let (_log, writer) = super::chat_log(usize::MAX);
            crate::sse::relay(super::body(events.clone()), writer, std::time::Duration::from_secs(5)).await
        });
        prop_assert!(summary.completed());
        prop_assert_eq!(summary.events, events, "already canonical: byte for byte");
    }
}

/// Azure's stream: a first chunk with no object, id or model and no choices
/// (its prompt's filter results), and trailing chunks of filter results
/// without a delta. Assembled as the answer its content chunks make.
#[test]
fn azures_filter_chunks_assemble_into_the_answer() {
    let filter = json!({"hate": {"filtered": false, "severity": "safe"}});
    let events = vec![
        event(
            &json!({"id": "", "object": "", "created": 0, "model": "", "choices": [],
                "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": filter}]})
            .to_string(),
        ),
        delta(json!({"role": "assistant", "content": "Hel"}), Value::Null),
        delta(json!({"content": "lo"}), json!("stop")),
        chat_chunk(json!([{"index": 0, "finish_reason": null, "content_filter_results": filter}])),
        done(),
    ];
    let answer = assemble(&events).unwrap();
    assert_eq!(
        answer["id"], "chatcmpl-1",
        "the first real id, not Azure's empty one"
    );
    assert_eq!(answer["model"], "gpt-4o-mini");
    assert_eq!(answer["created"], 1700000000);
    assert_eq!(answer["object"], "chat.completion");
    assert_eq!(answer["choices"][0]["message"]["content"], "Hello");
    assert_eq!(answer["choices"][0]["finish_reason"], "stop");
    assert_eq!(answer["prompt_filter_results"][0]["prompt_index"], 0);
}
