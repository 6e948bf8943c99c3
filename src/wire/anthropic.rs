//! Anthropic Messages (`POST /v1/messages`), sent to `api: anthropic` upstreams.
//!
//! A stream is a sequence of named events, each `event: <type>\ndata: <json>\n\n` whose JSON
//! carries the same `type`: `message_start` (the message with empty content and the input
//! usage), per content block `content_block_start`, its `content_block_delta`s (`text_delta`,
//! `input_json_delta`, `thinking_delta`, `signature_delta`, `citations_delta`) and
//! `content_block_stop`, then `message_delta` (stop reason, output usage) and last
//! `message_stop`. `ping` events may come anywhere; they are relayed. There is no `[DONE]`:
//! the stream is complete (cacheable) only on `message_stop`. An `error` event, or a stream cut
//! before `message_stop`, fails every reader and nothing is cached.
//!
//! One stream and one `message` object are the same answer: [`assemble`](Wire::assemble)
//! accumulates the events as the SDK's `get_final_message()` does, and
//! [`synthesize`](Wire::synthesize) rebuilds an event sequence that accumulates back to the
//! object (usage included: `message_delta` repeats the cumulative input counts, as the API does).
//!
//! The request is keyed on every field but `stream` and the label fields (`metadata`, whose
//! `user_id` says who asked, not what was asked; tools' `eager_input_streaming`, a stream-only
//! delivery flag); the `anthropic-version` and `anthropic-beta` headers are keyed too
//! (`request::KEYED_HEADERS`). `messages` text is normalized like chat's. Only what corral reads
//! is checked: roles, `system` turns, block types and `max_tokens` are Anthropic's to judge. The API has no
//! seed: a request without `temperature: 0` is sampled (the current SDKs send no temperature
//! unless told), so it is coalesced always and stored only under `cache.sampled: true`.
//! Refusals are in Anthropic's error shape.

use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::Wire;
use crate::{
    config::Api,
    error::{ErrorShape, GatewayError},
    fingerprint::{BodyKeying, Endpoint},
    sse::{
        self, Format, Frame, StreamFormat, UpstreamStreamRequest, named_event,
        named_event_value as event_value, read_named,
    },
    usage::Usage,
    validate::{self, InputLimits},
    wire::{ConvertError, pieces},
};

/// The Messages adapter.
#[derive(Debug)]
pub struct MessagesWire;

pub static MESSAGES: MessagesWire = MessagesWire;

/// The Messages stream format.
#[derive(Debug)]
pub struct MessagesStream;

pub static MESSAGES_STREAM: MessagesStream = MessagesStream;

/// The event that completes a stream.
const MESSAGE_STOP: &str = "message_stop";

static KEYING: BodyKeying = BodyKeying {
    delivery: &["stream"],
    // `metadata.user_id` (its one member) says who asked, not what.
    labels: &["metadata"],
    // Fine-grained tool streaming: how a tool call's input is streamed (the
    // AI SDK sets it on streaming requests only), not what the call is.
    item_labels: &[("tools", "eager_input_streaming")],
    messages: Some("messages"),
    content: "content",
    inline_item: None,
};

impl Wire for MessagesWire {
    fn keying(&self) -> &'static BodyKeying {
        &KEYING
    }

    fn api(&self) -> Api {
        Api::Anthropic
    }

    fn error_shape(&self) -> ErrorShape {
        ErrorShape::Anthropic
    }

    /// What corral reads (`stream`, the conversation's length); Anthropic's
    /// own rules (roles, `system` messages, block types, `max_tokens`,
    /// ranges) are Anthropic's: its 400 is relayed as it came.
    fn check(&self, body: &Map<String, Value>, limits: InputLimits) -> Result<(), GatewayError> {
        validate::check_fields(Endpoint::Messages, body, limits)
    }

    /// Not a request that runs in a `container` (code execution's files and
    /// state, by reference: the same body means another context once the
    /// container changed).
    fn dedupable(&self, body: &Map<String, Value>) -> bool {
        body.get("container").is_none_or(Value::is_null)
    }

    /// The API has no seed: only `temperature: 0` asks for a reproducible answer.
    fn is_deterministic(&self, body: &Map<String, Value>) -> bool {
        body.get("temperature")
            .and_then(Value::as_f64)
            .is_some_and(|t| t == 0.0)
    }

    fn stream_format(&self) -> Format {
        &MESSAGES_STREAM
    }

    /// The stream always carries usage (`message_start`, `message_delta`):
    /// only `stream` is forced.
    fn stream_request(&self, body: &Map<String, Value>) -> UpstreamStreamRequest {
        sse::force_stream(body)
    }

    fn assemble(&self, events: &[Bytes]) -> Result<Value, ConvertError> {
        assemble(events)
    }

    fn synthesize(&self, answer: &Value) -> Result<Vec<Bytes>, ConvertError> {
        synthesize(answer)
    }

    /// A `message` with its `stop_reason`: the API sets it on every finished
    /// answer (`end_turn`, `max_tokens`, `tool_use`, ...).
    fn is_complete(&self, body: &[u8]) -> bool {
        serde_json::from_slice::<Value>(body).is_ok_and(|value| {
            value.get("type").and_then(Value::as_str) == Some("message")
                && value.get("stop_reason").is_some_and(Value::is_string)
        })
    }
}

impl StreamFormat for MessagesStream {
    fn read(&self, name: Option<&str>, data: &str) -> Frame {
        let (kind, event) = match read_named(name, data) {
            Ok(read) => read,
            Err(malformed) => return malformed,
        };
        match kind.as_str() {
            MESSAGE_STOP => Frame::Complete {
                event: Some(event),
                usage: None,
            },
            "error" => Frame::Failed(event),
            // The input counts, for a stream that breaks later. A complete stream's usage is
            // the assembled message's (the relay keeps the last a frame reported, and the
            // output count comes in `message_delta`, without the input).
            "message_start" => {
                let usage = self.event_usage(&event);
                Frame::Event { event, usage }
            }
            _ => Frame::Event { event, usage: None },
        }
    }

    fn done_event(&self) -> Option<Bytes> {
        None
    }

    /// An `error` event in Anthropic's shape.
    fn error_event(&self, message: &str, _position: usize) -> Bytes {
        named_event(
            "error",
            &json!({"type": "error", "error": {"type": "api_error", "message": message}}),
        )
    }

    /// `message_start`'s usage (input), or a `message_delta`'s when it reports input counts.
    fn event_usage(&self, event: &[u8]) -> Option<Usage> {
        let value = event_value(event)?;
        let usage = match value.get("type").and_then(Value::as_str)? {
            "message_start" => value.get("message")?.get("usage")?,
            "message_delta" => value.get("usage")?,
            _ => return None,
        };
        usage_of(usage)
    }

    /// The stream's usage: `message_start`'s, with the counts `message_delta` reports laid
    /// over it (the output, and cumulative input counts where the API sends them).
    fn stream_usage(&self, events: &[Bytes]) -> Option<Usage> {
        let mut usage = Map::new();
        for event in events {
            let Some(value) = event_value(event) else {
                continue;
            };
            let reported = match value.get("type").and_then(Value::as_str) {
                Some("message_start") => value.get("message").and_then(|m| m.get("usage")),
                Some("message_delta") => value.get("usage"),
                _ => None,
            };
            if let Some(Value::Object(reported)) = reported {
                overlay(&mut usage, reported);
            }
        }
        usage_of(&Value::Object(usage))
    }
}

/// Anthropic's `usage` object as [`Usage`].
fn usage_of(usage: &Value) -> Option<Usage> {
    Usage::from_body(&serde_json::to_vec(&json!({ "usage": usage })).ok()?)
}

/// `into`'s members replaced by `from`'s non-null ones.
fn overlay(into: &mut Map<String, Value>, from: &Map<String, Value>) {
    for (name, value) in from {
        if !value.is_null() {
            into.insert(name.clone(), value.clone());
        }
    }
}

/// The `message` a complete stream amounts to, accumulated as the SDK's
/// `accumulate_event` does: the `message_start` message, each block started,
/// its deltas applied, the stop reason and usage of `message_delta`.
fn assemble(events: &[Bytes]) -> Result<Value, ConvertError> {
    let mut message: Option<Map<String, Value>> = None;
    // Per block: the `partial_json` of its `input_json_delta`s so far.
    let mut json_buffers: Vec<String> = Vec::new();
    for (index, event) in events.iter().enumerate() {
        let Some(Value::Object(mut object)) = event_value(event) else {
            return Err(ConvertError::NotJson { index });
        };
        let kind = object
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        if kind == "error" {
            return Err(ConvertError::ErrorEvent { index });
        }
        if kind == "message_start" {
            match object.remove("message") {
                Some(Value::Object(start)) => message = Some(start),
                _ => return Err(ConvertError::Malformed("message_start.message")),
            }
            continue;
        }
        let Some(message) = message.as_mut() else {
            if kind == "ping" {
                continue;
            }
            return Err(ConvertError::Malformed("an event before message_start"));
        };
        match kind.as_str() {
            "content_block_start" => {
                let block = object
                    .remove("content_block")
                    .filter(Value::is_object)
                    .ok_or(ConvertError::Malformed("content_block_start.content_block"))?;
                blocks(message)?.push(block);
                json_buffers.push(String::new());
            }
            "content_block_delta" => {
                let at = block_index(&object)?;
                let delta = object
                    .get("delta")
                    .and_then(Value::as_object)
                    .ok_or(ConvertError::Malformed("content_block_delta.delta"))?;
                let blocks = blocks(message)?;
                // `message_start` may carry blocks of its own: a buffer for each block there is.
                if json_buffers.len() < blocks.len() {
                    json_buffers.resize(blocks.len(), String::new());
                }
                let block = blocks
                    .get_mut(at)
                    .and_then(Value::as_object_mut)
                    .ok_or(ConvertError::Malformed("content_block_delta.index"))?;
                apply_delta(block, delta, &mut json_buffers[at])?;
            }
            "content_block_stop" => {
                let at = block_index(&object)?;
                let buffer = json_buffers
                    .get(at)
                    .ok_or(ConvertError::Malformed("content_block_stop.index"))?;
                if !buffer.is_empty() {
                    let input: Value = serde_json::from_str(buffer)
                        .map_err(|_| ConvertError::Malformed("input_json_delta.partial_json"))?;
                    if let Some(block) = blocks(message)?.get_mut(at) {
                        block["input"] = input;
                    }
                }
            }
            "message_delta" => {
                if let Some(Value::Object(delta)) = object.get("delta") {
                    for (name, value) in delta {
                        // `stop_reason` and `stop_sequence` always; the rest when given.
                        if !value.is_null()
                            || matches!(name.as_str(), "stop_reason" | "stop_sequence")
                        {
                            message.insert(name.clone(), value.clone());
                        }
                    }
                }
                if let Some(Value::Object(reported)) = object.get("usage") {
                    match message.get_mut("usage") {
                        Some(Value::Object(usage)) => overlay(usage, reported),
                        _ => {
                            message.insert("usage".to_owned(), Value::Object(reported.clone()));
                        }
                    }
                }
            }
            MESSAGE_STOP => return Ok(Value::Object(message.clone())),
            // `ping`, and event types newer than this adapter: nothing to accumulate.
            _ => {}
        }
    }
    Err(ConvertError::Empty)
}

fn blocks(message: &mut Map<String, Value>) -> Result<&mut Vec<Value>, ConvertError> {
    message
        .entry("content")
        .or_insert_with(|| json!([]))
        .as_array_mut()
        .ok_or(ConvertError::Malformed("message.content"))
}

fn block_index(event: &Map<String, Value>) -> Result<usize, ConvertError> {
    event
        .get("index")
        .and_then(Value::as_u64)
        .and_then(|i| usize::try_from(i).ok())
        .ok_or(ConvertError::Malformed("index"))
}

/// One `content_block_delta` applied to its block.
fn apply_delta(
    block: &mut Map<String, Value>,
    delta: &Map<String, Value>,
    json_buffer: &mut String,
) -> Result<(), ConvertError> {
    let text = |field: &'static str| {
        delta
            .get(field)
            .and_then(Value::as_str)
            .ok_or(ConvertError::Malformed("content_block_delta.delta"))
    };
    let append = |block: &mut Map<String, Value>, field: &str, piece: &str| {
        let mut whole = block
            .get(field)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        whole.push_str(piece);
        block.insert(field.to_owned(), Value::String(whole));
    };
    match delta.get("type").and_then(Value::as_str) {
        Some("text_delta") => append(block, "text", text("text")?),
        Some("thinking_delta") => append(block, "thinking", text("thinking")?),
        Some("signature_delta") => {
            block.insert("signature".to_owned(), json!(text("signature")?));
        }
        Some("input_json_delta") => json_buffer.push_str(text("partial_json")?),
        Some("citations_delta") => {
            let citation = delta
                .get("citation")
                .cloned()
                .ok_or(ConvertError::Malformed("citations_delta.citation"))?;
            match block.get_mut("citations") {
                Some(Value::Array(citations)) => citations.push(citation),
                _ => {
                    block.insert("citations".to_owned(), json!([citation]));
                }
            }
        }
        // A delta type newer than this adapter: nothing it knows to accumulate.
        _ => {}
    }
    Ok(())
}

/// A valid event sequence equivalent to a `message`: its start (empty content, the usage),
/// per content block its start, deltas and stop, then `message_delta` (stop reason, usage)
/// and `message_stop`. It accumulates back to the message.
fn synthesize(answer: &Value) -> Result<Vec<Bytes>, ConvertError> {
    let message = answer
        .as_object()
        .ok_or(ConvertError::Malformed("message"))?;
    match message.get("type").and_then(Value::as_str) {
        Some("message") => {}
        Some(other) => return Err(ConvertError::UnsupportedObject(other.to_owned())),
        None => return Err(ConvertError::Malformed("type")),
    }
    let content = match message.get("content") {
        Some(Value::Array(content)) => content.as_slice(),
        None | Some(Value::Null) => &[][..],
        Some(_) => return Err(ConvertError::Malformed("content")),
    };
    let mut events = Vec::new();
    let mut start = message.clone();
    start.insert("content".to_owned(), json!([]));
    start.insert("stop_reason".to_owned(), Value::Null);
    start.insert("stop_sequence".to_owned(), Value::Null);
    let mut delta = Map::new();
    for field in ["stop_reason", "stop_sequence"] {
        delta.insert(
            field.to_owned(),
            message.get(field).cloned().unwrap_or(Value::Null),
        );
    }
    for field in ["stop_details", "container"] {
        if let Some(value) = start.remove(field) {
            if !value.is_null() {
                delta.insert(field.to_owned(), value);
            }
            start.insert(field.to_owned(), Value::Null);
        }
    }
    push(
        &mut events,
        json!({"type": "message_start", "message": start}),
    );
    for (index, block) in content.iter().enumerate() {
        synthesize_block(&mut events, index, block)?;
    }
    // The counts `accumulate_event` lays over the start's: output, and the
    // cumulative input counts the API repeats here.
    let mut usage = Map::new();
    if let Some(Value::Object(whole)) = message.get("usage") {
        for field in [
            "input_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
            "output_tokens",
            "server_tool_use",
        ] {
            if let Some(value) = whole.get(field).filter(|v| !v.is_null()) {
                usage.insert(field.to_owned(), value.clone());
            }
        }
    }
    usage.entry("output_tokens").or_insert(json!(0));
    push(
        &mut events,
        json!({"type": "message_delta", "delta": delta, "usage": usage}),
    );
    push(&mut events, json!({"type": MESSAGE_STOP}));
    Ok(events)
}

/// One content block: started without what its deltas carry, the deltas, stopped.
fn synthesize_block(
    events: &mut Vec<Bytes>,
    index: usize,
    block: &Value,
) -> Result<(), ConvertError> {
    let fields = block
        .as_object()
        .ok_or(ConvertError::Malformed("content[]"))?;
    let mut started = fields.clone();
    let mut deltas = Vec::new();
    match fields.get("type").and_then(Value::as_str) {
        Some("text") => {
            let text = fields
                .get("text")
                .and_then(Value::as_str)
                .unwrap_or_default();
            started.insert("text".to_owned(), json!(""));
            started.remove("citations");
            deltas.extend(pieces(text).map(|piece| json!({"type": "text_delta", "text": piece})));
            if let Some(Value::Array(citations)) = fields.get("citations") {
                deltas.extend(
                    citations
                        .iter()
                        .map(|citation| json!({"type": "citations_delta", "citation": citation})),
                );
            }
        }
        Some("thinking") => {
            let thinking = fields
                .get("thinking")
                .and_then(Value::as_str)
                .unwrap_or_default();
            started.insert("thinking".to_owned(), json!(""));
            started.insert("signature".to_owned(), json!(""));
            deltas.extend(
                pieces(thinking).map(|piece| json!({"type": "thinking_delta", "thinking": piece})),
            );
            if let Some(signature) = fields.get("signature").filter(|s| s.is_string()) {
                deltas.push(json!({"type": "signature_delta", "signature": signature}));
            }
        }
        Some("tool_use" | "server_tool_use") => {
            let input = fields.get("input").cloned().unwrap_or_else(|| json!({}));
            started.insert("input".to_owned(), json!({}));
            if input.as_object().is_none_or(|input| !input.is_empty()) {
                deltas.push(json!({"type": "input_json_delta", "partial_json": input.to_string()}));
            }
        }
        // Blocks the API sends whole (redacted thinking, tool results, ...).
        _ => {}
    }
    push(
        events,
        json!({"type": "content_block_start", "index": index, "content_block": started}),
    );
    for delta in deltas {
        push(
            events,
            json!({"type": "content_block_delta", "index": index, "delta": delta}),
        );
    }
    push(
        events,
        json!({"type": "content_block_stop", "index": index}),
    );
    Ok(())
}

fn push(events: &mut Vec<Bytes>, event: Value) {
    let kind = event["type"].as_str().unwrap_or("message").to_owned();
    events.push(named_event(&kind, &event));
}

#[cfg(test)]
mod tests;
