use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::fingerprint::{Normalization, canonical_body_with};

const LIMITS: InputLimits = InputLimits {
    max_json_depth: 32,
    max_messages: 4,
};

fn event(value: Value) -> Bytes {
    named_event(value["type"].as_str().unwrap(), &value)
}

/// A stream as the API sends it: thinking, text, a tool call, pings between.
fn api_stream() -> Vec<Bytes> {
    vec![
        event(json!({"type": "message_start", "message": {
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 25, "cache_creation_input_tokens": 10, "cache_read_input_tokens": 40, "output_tokens": 1},
        }})),
        event(
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
        ),
        event(json!({"type": "ping"})),
        event(
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Let me "}}),
        ),
        event(
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "think."}}),
        ),
        event(
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "sig=="}}),
        ),
        event(json!({"type": "content_block_stop", "index": 0})),
        event(
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
        ),
        event(
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Hello, "}}),
        ),
        event(
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "world."}}),
        ),
        event(json!({"type": "content_block_stop", "index": 1})),
        event(
            json!({"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}}),
        ),
        event(
            json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": ""}}),
        ),
        event(
            json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "{\"city\": \"Par"}}),
        ),
        event(
            json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "is\"}"}}),
        ),
        event(json!({"type": "content_block_stop", "index": 2})),
        event(
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 42}}),
        ),
        event(json!({"type": "message_stop"})),
    ]
}

fn api_message() -> Value {
    json!({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
        "content": [
            {"type": "thinking", "thinking": "Let me think.", "signature": "sig=="},
            {"type": "text", "text": "Hello, world."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
        ],
        "stop_reason": "tool_use", "stop_sequence": null,
        "usage": {"input_tokens": 25, "cache_creation_input_tokens": 10, "cache_read_input_tokens": 40, "output_tokens": 42},
    })
}

#[test]
fn a_stream_assembles_as_the_sdk_accumulates_it() {
    assert_eq!(MESSAGES.assemble(&api_stream()).unwrap(), api_message());
}

#[test]
fn an_answer_synthesizes_to_events_that_assemble_back_to_it() {
    let message = api_message();
    let events = MESSAGES.synthesize(&message).unwrap();
    assert_eq!(MESSAGES.assemble(&events).unwrap(), message);
    // Every event is framed as the API frames it, and the stream ends complete.
    let kinds: Vec<String> = events
        .iter()
        .map(|event| {
            let text = std::str::from_utf8(event).unwrap();
            let (name, data) = text
                .strip_prefix("event: ")
                .and_then(|rest| rest.split_once("\ndata: "))
                .unwrap();
            let data: Value = serde_json::from_str(data.strip_suffix("\n\n").unwrap()).unwrap();
            assert_eq!(data["type"], name);
            name.to_owned()
        })
        .collect();
    assert_eq!(kinds.first().map(String::as_str), Some("message_start"));
    assert_eq!(kinds.last().map(String::as_str), Some("message_stop"));
    let last = MESSAGES_STREAM.read(Some("message_stop"), r#"{"type":"message_stop"}"#);
    assert!(matches!(last, Frame::Complete { .. }));
    // The start has no content and no stop reason yet; the usage comes whole.
    let start = event_value(&events[0]).unwrap();
    assert_eq!(start["message"]["content"], json!([]));
    assert_eq!(start["message"]["stop_reason"], Value::Null);
    assert_eq!(
        MESSAGES_STREAM.stream_usage(&events),
        Usage::from_body(message.to_string().as_bytes())
    );
}

#[test]
fn citations_server_tools_and_whole_blocks_survive_the_round_trip() {
    let message = json!({
        "id": "msg_2", "type": "message", "role": "assistant", "model": "claude-x",
        "content": [
            {"type": "text", "text": "The sky is blue.", "citations": [
                {"type": "char_location", "cited_text": "blue", "document_index": 0, "start_char_index": 0, "end_char_index": 4},
            ]},
            {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "sky"}},
            {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "tool_use", "id": "toolu_2", "name": "noop", "input": {}},
        ],
        "stop_reason": "end_turn", "stop_sequence": null,
        "stop_details": null,
        "container": {"id": "c-1", "expires_at": "2026-12-04T00:00:00Z"},
        "usage": {"input_tokens": 3, "output_tokens": 5, "server_tool_use": {"web_search_requests": 1}},
    });
    let events = MESSAGES.synthesize(&message).unwrap();
    assert_eq!(MESSAGES.assemble(&events).unwrap(), message);
}

#[test]
fn events_are_read_by_their_type() {
    let stream = &MESSAGES_STREAM;
    assert!(matches!(
        stream.read(Some("message_stop"), r#"{"type":"message_stop"}"#),
        Frame::Complete {
            event: Some(_),
            usage: None
        }
    ));
    let Frame::Failed(error) = stream.read(
        Some("error"),
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
    ) else {
        panic!("an error event fails the stream")
    };
    assert!(error.starts_with(b"event: error\ndata: {"));
    // A ping is relayed, in corral's framing whatever the provider's spacing.
    let Frame::Event { event, usage: None } = stream.read(Some("ping"), r#"{"type": "ping"}"#)
    else {
        panic!("a ping is relayed")
    };
    assert_eq!(&event[..], b"event: ping\ndata: {\"type\":\"ping\"}\n\n");
    // The data's type names the event, even without an event line.
    let Frame::Event { usage: Some(usage), .. } = stream.read(
        None,
        r#"{"type":"message_start","message":{"usage":{"input_tokens":7,"cache_read_input_tokens":3,"output_tokens":1}}}"#,
    ) else {
        panic!("message_start carries the input usage")
    };
    assert_eq!((usage.prompt_tokens, usage.cached_tokens), (10, 3));
    assert!(matches!(stream.read(None, "not json"), Frame::Malformed(_)));
    assert!(matches!(stream.read(None, "[1]"), Frame::Malformed(_)));
    assert!(matches!(stream.read(None, "{}"), Frame::Malformed(_)));
    assert!(stream.done_event().is_none());
}

#[test]
fn a_broken_stream_ends_with_an_anthropic_error_event() {
    let event = MESSAGES_STREAM.error_event("the upstream stream ended early", 9);
    let text = std::str::from_utf8(&event).unwrap();
    let data = text
        .strip_prefix("event: error\ndata: ")
        .and_then(|rest| rest.strip_suffix("\n\n"))
        .unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(data).unwrap(),
        json!({"type": "error", "error": {"type": "api_error", "message": "the upstream stream ended early"}})
    );
    // And an error event never assembles into an answer.
    let mut events = api_stream();
    events.insert(3, event);
    assert!(matches!(
        MESSAGES.assemble(&events),
        Err(ConvertError::ErrorEvent { index: 3 })
    ));
    assert!(matches!(
        MESSAGES.assemble(&api_stream()[..5]),
        Err(ConvertError::Empty)
    ));
}

#[test]
fn the_stream_usage_merges_start_and_delta() {
    let usage = MESSAGES_STREAM.stream_usage(&api_stream()).unwrap();
    assert_eq!(usage.prompt_tokens, 75);
    assert_eq!(usage.cached_tokens, 40);
    assert_eq!(usage.cache_write_tokens, 10);
    assert_eq!(usage.completion_tokens, 42);
    // A delta with cumulative input counts (as the API now sends) wins.
    let mut events = api_stream();
    let last = events.len() - 2;
    events[last] = event(
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
        "usage": {"input_tokens": 30, "output_tokens": 50}}),
    );
    let usage = MESSAGES_STREAM.stream_usage(&events).unwrap();
    assert_eq!((usage.prompt_tokens, usage.completion_tokens), (80, 50));
}

#[test]
fn only_a_stopped_message_is_complete() {
    assert!(MESSAGES.is_complete(api_message().to_string().as_bytes()));
    let mut open = api_message();
    open["stop_reason"] = Value::Null;
    assert!(!MESSAGES.is_complete(open.to_string().as_bytes()));
    assert!(!MESSAGES.is_complete(br#"{"type":"error","error":{}}"#));
    assert!(!MESSAGES.is_complete(b"not json"));
}

fn body(value: Value) -> Map<String, Value> {
    value.as_object().unwrap().clone()
}

fn request() -> Value {
    json!({"model": "claude-sonnet-4-5", "max_tokens": 100,
        "messages": [{"role": "user", "content": "Hi"}]})
}

#[test]
fn only_what_corral_reads_is_checked_the_rest_is_anthropics() {
    assert!(MESSAGES.check(&body(request()), LIMITS).is_ok());
    let refused = [
        (
            json!({"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "x"}], "stream": "yes"}),
            "stream",
        ),
        (
            json!({"model": "m", "max_tokens": 9, "messages": vec![json!({"role": "user", "content": "x"}); 5]}),
            "messages",
        ),
    ];
    for (value, field) in refused {
        let error = MESSAGES.check(&body(value.clone()), LIMITS).unwrap_err();
        assert_eq!(
            error.status(),
            axum::http::StatusCode::BAD_REQUEST,
            "{value}"
        );
        assert!(error.to_string().contains(field), "{value}: {error}");
    }
    // Anthropic's own rules: its 400 (or its answer) is the provider's to give.
    for passed in [
        json!({"model": "m", "messages": []}),
        json!({"model": "m", "max_tokens": 0, "messages": []}),
        json!({"model": "m", "max_tokens": "9", "messages": []}),
        json!({"model": "m", "max_tokens": 9}),
        json!({"model": "m", "max_tokens": 9, "messages": [{"role": "system", "content": "x"}]}),
        json!({"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": 7}]}),
        json!({"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": [{"type": "hologram"}]}]}),
        json!({"model": "m", "max_tokens": 9, "messages": [], "temperature": 2}),
        json!({"model": "m", "max_tokens": 9, "messages": [], "system": 5, "new_field": {"a": 1}}),
    ] {
        assert!(
            MESSAGES.check(&body(passed.clone()), LIMITS).is_ok(),
            "{passed}"
        );
    }
}

#[test]
fn a_container_is_mutable_state_and_is_not_deduplicated() {
    assert!(MESSAGES.dedupable(&body(request())));
    let mut contained = request();
    contained["container"] = json!("container_011");
    assert!(!MESSAGES.dedupable(&body(contained)));
}

#[test]
fn only_temperature_zero_is_deterministic() {
    assert!(
        !MESSAGES.is_deterministic(&body(request())),
        "no temperature: sampled"
    );
    let mut zero = request();
    zero["temperature"] = json!(0.0);
    assert!(MESSAGES.is_deterministic(&body(zero)));
    let mut warm = request();
    warm["temperature"] = json!(0.7);
    assert!(!MESSAGES.is_deterministic(&body(warm)));
}

fn key(value: Value) -> Vec<u8> {
    canonical_body_with(&body(value), Normalization::default(), MESSAGES.keying())
}

#[test]
fn everything_but_stream_metadata_and_eager_input_streaming_is_keyed() {
    let base = key(request());
    let with = |field: &str, value: Value| {
        let mut request = request();
        request[field] = value;
        key(request)
    };
    assert_eq!(with("stream", json!(true)), base);
    assert_eq!(with("metadata", json!({"user_id": "u-1"})), base);
    assert_eq!(with("metadata", json!({"user_id": "u-2"})), base);
    // A streaming AI SDK request marks its tools for fine-grained streaming.
    let tool = json!({"name": "t", "input_schema": {}});
    let mut eager = tool.clone();
    eager["eager_input_streaming"] = json!(true);
    assert_eq!(with("tools", json!([eager])), with("tools", json!([tool])));
    for (field, value) in [
        ("system", json!("Be brief.")),
        ("temperature", json!(0)),
        ("max_tokens", json!(101)),
        ("tools", json!([{"name": "t", "input_schema": {}}])),
        (
            "thinking",
            json!({"type": "enabled", "budget_tokens": 1024}),
        ),
        ("stop_sequences", json!(["END"])),
        ("top_k", json!(5)),
        ("service_tier", json!("auto")),
    ] {
        assert_ne!(with(field, value), base, "{field} is keyed");
    }
    // Message text is normalized as chat's is.
    let mut spaced = request();
    spaced["messages"][0]["content"] = json!("  Hi\r\n");
    assert_eq!(key(spaced), base);
}

proptest! {
    /// Any text, split anywhere into deltas, assembles to the same message, and that message
    /// synthesizes to a stream that assembles back to it.
    #[test]
    fn text_round_trips(text in "\\PC{0,300}", cut in 0usize..300) {
        let cut = text.char_indices().map(|(at, _)| at).chain([text.len()]).nth(cut).unwrap_or(text.len());
        let (head, tail) = text.split_at(cut);
        let events = vec![
            event(json!({"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant",
                "model": "c", "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": 1, "output_tokens": 1}}})),
            event(json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})),
            event(json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": head}})),
            event(json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": tail}})),
            event(json!({"type": "content_block_stop", "index": 0})),
            event(json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 2}})),
            event(json!({"type": "message_stop"})),
        ];
        let message = MESSAGES.assemble(&events).unwrap();
        prop_assert_eq!(message["content"][0]["text"].as_str(), Some(text.as_str()));
        let again = MESSAGES.assemble(&MESSAGES.synthesize(&message).unwrap()).unwrap();
        prop_assert_eq!(again, message);
    }
}

/// A provider's odd stream never panics the assembler: a `message_start`
/// that already carries a block, then deltas for it (or for a block that
/// does not exist), is accumulated or refused as malformed.
#[test]
fn a_message_start_with_content_is_accumulated_not_a_panic() {
    let start = event(
        json!({"type": "message_start", "message": {"id": "m", "type": "message",
        "role": "assistant", "model": "c", "content": [{"type": "text", "text": "Hel"}],
        "stop_reason": null, "usage": {"input_tokens": 1, "output_tokens": 0}}}),
    );
    let delta = |index: u64| {
        event(json!({"type": "content_block_delta", "index": index,
            "delta": {"type": "text_delta", "text": "lo"}}))
    };
    let end = [
        event(json!({"type": "content_block_stop", "index": 0})),
        event(
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}}),
        ),
        event(json!({"type": "message_stop"})),
    ];
    let mut events = vec![start.clone(), delta(0)];
    events.extend(end.iter().cloned());
    let message = MESSAGES.assemble(&events).unwrap();
    assert_eq!(message["content"][0]["text"], "Hello");
    let mut beyond = vec![start, delta(7)];
    beyond.extend(end);
    assert!(MESSAGES.assemble(&beyond).is_err());
}
