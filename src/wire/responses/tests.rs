//! The Responses adapter: stream ↔ object, the relay's completing and failing events, keying.

use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};

use super::*;
use crate::{
    fingerprint::{Normalization, canonical_body_with},
    sse::{BrokenStream, LogEnd, LogLimits, RelayOutcome, StreamLog, relay},
};

fn answer() -> Value {
    json!({
        "id": "resp_1",
        "object": "response",
        "created_at": 1_700_000_000,
        "status": "completed",
        "model": "gpt-4o-mini",
        "output": [
            {
                "id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
                "content": [{
                    "type": "output_text", "annotations": [], "logprobs": [],
                    "text": "A long answer. ".repeat(10),
                }],
            },
            {
                "id": "fc_1", "type": "function_call", "status": "completed",
                "call_id": "call_1", "name": "lookup", "arguments": "{\"q\":\"x\"}",
            },
        ],
        "usage": {
            "input_tokens": 12,
            "input_tokens_details": {"cached_tokens": 4},
            "output_tokens": 30,
            "output_tokens_details": {"reasoning_tokens": 5},
            "total_tokens": 42,
        },
    })
}

fn data(event: &Bytes) -> Value {
    event_value(event).expect("a framed event")
}

fn log() -> (StreamLog, crate::sse::StreamWriter) {
    StreamLog::with_limits(
        &RESPONSES_STREAM,
        LogLimits {
            max_bytes: 1 << 20,
            max_reader_lag: usize::MAX,
            tally: None,
        },
    )
}

async fn relay_events(events: Vec<Bytes>) -> (crate::sse::RelaySummary, StreamLog) {
    let (log, writer) = log();
    let body = futures::stream::iter(events.into_iter().map(Ok::<_, std::io::Error>));
    let summary = tokio::time::timeout(
        Duration::from_secs(10),
        relay(body, writer, Duration::from_secs(5)),
    )
    .await
    .expect("the relay ends");
    (summary, log)
}

#[test]
fn a_synthesized_stream_is_numbered_named_and_assembles_back() {
    let events = RESPONSES.synthesize(&answer()).unwrap();
    for (n, event) in events.iter().enumerate() {
        let value = data(event);
        let kind = value["type"].as_str().unwrap();
        assert!(
            event.starts_with(format!("event: {kind}\ndata: ").as_bytes()),
            "{event:?}"
        );
        assert_eq!(value["sequence_number"], n, "{event:?}");
    }
    let kinds: Vec<String> = events
        .iter()
        .map(|e| data(e)["type"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(kinds.first().unwrap(), "response.created");
    assert_eq!(kinds[1], "response.in_progress");
    assert_eq!(kinds.last().unwrap(), "response.completed");
    assert!(kinds.contains(&"response.function_call_arguments.done".to_owned()));
    // The text deltas concatenate to the text; none is longer than a piece.
    let deltas: Vec<Value> = events
        .iter()
        .map(data)
        .filter(|v| v["type"] == "response.output_text.delta")
        .collect();
    assert!(deltas.len() > 1);
    let text: String = deltas
        .iter()
        .map(|v| v["delta"].as_str().unwrap())
        .collect();
    assert_eq!(text, answer()["output"][0]["content"][0]["text"]);
    // The stream starts without output or usage, in progress.
    let created = data(&events[0]);
    assert_eq!(created["response"]["status"], "in_progress");
    assert_eq!(created["response"]["output"], json!([]));
    assert!(created["response"]["usage"].is_null());
    assert_eq!(RESPONSES.assemble(&events).unwrap(), answer());
}

#[tokio::test]
async fn a_stream_completes_on_response_completed_without_a_done_event() {
    let events = RESPONSES.synthesize(&answer()).unwrap();
    let (summary, log) = relay_events(events.clone()).await;
    assert_eq!(summary.outcome, RelayOutcome::Completed);
    assert_eq!(log.end(), Some(LogEnd::Done));
    // Byte for byte: nothing added, nothing rewritten.
    assert_eq!(summary.events, events);
    let usage = summary.usage.expect("usage of response.completed");
    assert_eq!(
        (usage.prompt_tokens, usage.cached_tokens),
        (12, 4),
        "{usage:?}"
    );
    assert_eq!(
        (usage.completion_tokens, usage.reasoning_tokens),
        (30, 5),
        "{usage:?}"
    );
    assert_eq!(
        RESPONSES_STREAM.event_usage(summary.events.last().unwrap()),
        Some(usage)
    );
    // A replay serves the very same events.
    let replay = StreamLog::replay(&RESPONSES_STREAM, events.clone());
    assert_eq!(replay.events(), events);
}

#[tokio::test]
async fn a_stream_cut_before_response_completed_ends_with_an_error_event() {
    let mut events = RESPONSES.synthesize(&answer()).unwrap();
    events.pop();
    let count = events.len();
    let (summary, log) = relay_events(events).await;
    assert_eq!(
        summary.outcome,
        RelayOutcome::Broken(BrokenStream::EndedWithoutDone)
    );
    assert!(matches!(log.end(), Some(LogEnd::Failed(_))));
    let last = summary.events.last().unwrap();
    assert!(last.starts_with(b"event: error\ndata: "), "{last:?}");
    let error = data(last);
    assert_eq!(error["type"], "error");
    assert_eq!(error["code"], BROKEN_STREAM_CODE);
    assert_eq!(error["sequence_number"], count);
    assert!(RESPONSES.assemble(&summary.events).is_err());
}

#[tokio::test]
async fn failed_incomplete_and_error_events_fail_the_stream_as_they_came() {
    for kind in ["response.failed", "response.incomplete", "error"] {
        let mut events = RESPONSES.synthesize(&answer()).unwrap();
        events.truncate(3);
        let failed = named_event(kind, &json!({"type": kind, "sequence_number": 3}));
        events.push(failed.clone());
        let (summary, _log) = relay_events(events).await;
        assert_eq!(
            summary.outcome,
            RelayOutcome::Broken(BrokenStream::UpstreamError),
            "{kind}"
        );
        assert_eq!(summary.events.last(), Some(&failed), "{kind}");
    }
}

#[tokio::test]
async fn provider_framing_is_made_canonical() {
    // No `event:` line, CRLF line endings, spacing: read by the data's type.
    let raw = "data:{\"type\":\"response.created\",\"sequence_number\":0, \"response\":{}}\r\n\r\n\
               event: response.completed\r\ndata: {\"type\":\"response.completed\",\"sequence_number\":1,\"response\":{\"object\":\"response\",\"status\":\"completed\"}}\r\n\r\n";
    let (summary, _log) = relay_events(vec![Bytes::from(raw)]).await;
    assert_eq!(summary.outcome, RelayOutcome::Completed);
    assert!(summary.events[0].starts_with(b"event: response.created\ndata: {"));
    assert_eq!(summary.events.len(), 2);
    let (summary, _log) = relay_events(vec![Bytes::from_static(b"data: {\"a\":1}\n\n")]).await;
    assert!(matches!(
        summary.outcome,
        RelayOutcome::Broken(BrokenStream::Malformed { .. })
    ));
}

#[test]
fn keyed_and_delivery_fields() {
    let key = |body: Value| {
        let Value::Object(body) = body else { panic!() };
        canonical_body_with(&body, Normalization::default(), RESPONSES.keying())
    };
    let base =
        json!({"model": "m", "input": [{"role": "user", "content": " hi\r\n"}], "temperature": 0});
    let with = |field: &str, value: Value| {
        let mut body = base.clone();
        body[field] = value;
        body
    };
    for (field, value) in [
        ("user", json!("u-1")),
        ("stream", json!(true)),
        ("stream_options", json!({"include_obfuscation": false})),
        ("safety_identifier", json!("s-1")),
        ("prompt_cache_key", json!("session-1")),
        ("metadata", json!({"run": "1"})),
        (
            "client_metadata",
            json!({"session_id": "s", "turn_id": "t"}),
        ),
    ] {
        assert_eq!(key(with(field, value)), key(base.clone()), "{field}");
    }
    // The id of an item that carries its content only names it; an
    // item_reference's id is its content, and so is a stored reasoning item's.
    let input = |items: Value| key(with("input", items));
    assert_eq!(
        input(json!([{"type": "message", "id": "msg_1", "role": "user", "content": "hi"}])),
        input(json!([{"type": "message", "id": "msg_2", "role": "user", "content": "hi"}])),
    );
    assert_eq!(
        input(
            json!([{"type": "function_call", "id": "fc_1", "call_id": "c", "name": "f", "arguments": "{}"}])
        ),
        input(json!([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}])),
    );
    for kept in [
        json!({"type": "item_reference", "id": "msg_1"}),
        json!({"type": "reasoning", "id": "rs_1", "summary": []}),
        json!({"type": "some_future_item", "id": "x_1"}),
    ] {
        let mut other = kept.clone();
        other["id"] = json!("other");
        assert_ne!(input(json!([kept])), input(json!([other])), "{kept}");
    }
    let encrypted = |id: &str| json!([{"type": "reasoning", "id": id, "summary": [], "encrypted_content": "gAAA"}]);
    assert_eq!(input(encrypted("rs_1")), input(encrypted("rs_2")));
    // The call id links a call to its output: keyed.
    assert_ne!(
        input(json!([{"type": "function_call_output", "call_id": "a", "output": "1"}])),
        input(json!([{"type": "function_call_output", "call_id": "b", "output": "1"}])),
    );
    for (field, value) in [
        ("previous_response_id", json!("resp_a")),
        ("instructions", json!("Be terse.")),
        ("tools", json!([{"type": "function", "name": "f"}])),
        ("reasoning", json!({"effort": "high"})),
        ("text", json!({"format": {"type": "json_object"}})),
        ("include", json!(["reasoning.encrypted_content"])),
        ("store", json!(false)),
    ] {
        assert_ne!(key(with(field, value)), key(base.clone()), "{field}");
    }
    assert_ne!(
        key(with("previous_response_id", json!("resp_a"))),
        key(with("previous_response_id", json!("resp_b")))
    );
    // Input text is normalized like chat messages.
    assert_eq!(
        key(with("input", json!([{"role": "user", "content": "hi"}]))),
        key(base.clone())
    );
}

#[test]
fn sampling_background_conversation_and_completeness() {
    let body = |value: Value| match value {
        Value::Object(body) => body,
        _ => panic!(),
    };
    assert!(!RESPONSES.is_deterministic(&body(json!({"model": "m"}))));
    assert!(RESPONSES.is_deterministic(&body(json!({"model": "m", "temperature": 0}))));
    assert!(RESPONSES.dedupable(&body(json!({"model": "m", "background": false}))));
    assert!(!RESPONSES.dedupable(&body(json!({"model": "m", "background": true}))));
    assert!(!RESPONSES.dedupable(&body(json!({"model": "m", "conversation": "conv_1"}))));
    // Mutable provider state by reference: the latest prompt template, vector stores.
    assert!(!RESPONSES.dedupable(&body(json!({"model": "m", "prompt": {"id": "pmpt_1"}}))));
    assert!(!RESPONSES.dedupable(&body(
        json!({"model": "m", "prompt": {"id": "pmpt_1", "version": null}})
    )));
    assert!(RESPONSES.dedupable(&body(
        json!({"model": "m", "prompt": {"id": "pmpt_1", "version": "3"}})
    )));
    assert!(!RESPONSES.dedupable(&body(
        json!({"model": "m", "tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]})
    )));
    assert!(RESPONSES.dedupable(&body(
        json!({"model": "m", "tools": [{"type": "function", "name": "f"}]})
    )));
    assert!(RESPONSES.is_complete(answer().to_string().as_bytes()));
    let mut incomplete = answer();
    incomplete["status"] = json!("incomplete");
    assert!(!RESPONSES.is_complete(incomplete.to_string().as_bytes()));
    assert!(!RESPONSES.is_complete(b"{\"object\":\"response\""));
    let limits = InputLimits {
        max_json_depth: 32,
        max_messages: 100,
    };
    // The provider's rules are the provider's; corral checks what it reads.
    let odd = RESPONSES.check(
        &body(json!({"model": "m", "previous_response_id": 7})),
        limits,
    );
    assert!(odd.is_ok());
    let bad = RESPONSES.check(&body(json!({"model": "m", "background": "yes"})), limits);
    assert!(bad.unwrap_err().to_string().contains("background"));
    let upstream = RESPONSES.stream_request(&body(json!({"model": "m"})));
    let sent: Value = serde_json::from_slice(&upstream.body).unwrap();
    assert_eq!(sent, json!({"model": "m", "stream": true}));
}
