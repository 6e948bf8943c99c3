//! OpenAI Responses (`POST /v1/responses`).
//!
//! A stream is a sequence of named events, each `event: <type>\ndata: <json>\n\n` whose JSON
//! carries the same `type` and an increasing `sequence_number`: `response.created`,
//! `response.in_progress`, `response.output_item.added`, `response.content_part.added`,
//! `response.output_text.delta`, ..., and last `response.completed`, whose `response` is the
//! whole answer (usage included). There is no `[DONE]`. `response.failed`,
//! `response.incomplete` and `error` end a stream that must not be cached, as does a stream cut
//! before `response.completed`.
//!
//! So one stream and one object are the same answer: [`assemble`](Wire::assemble) takes the
//! `response` of `response.completed`, and [`synthesize`](Wire::synthesize) rebuilds the event
//! sequence the SDKs accumulate (items, content parts, text deltas of at most 64 characters).
//!
//! The request is keyed on every field but the delivery ones (`stream`, `stream_options`) and
//! the label fields (`user`, `safety_identifier`, `prompt_cache_key`, `metadata`,
//! `client_metadata`, the ids of inline `input` items), whose echoes in the answer each caller
//! receives as its own (`echo.rs`): `previous_response_id`, `instructions`, `tools`, `reasoning`,
//! `text` (its `format`), `include`, `store` and any field corral does not know all split the
//! key. `input` items' text is normalized like chat `messages`. A request without
//! `temperature: 0` is sampled. A `background` request (its first answer is not final) and one
//! that appends to a server-side `conversation` (the same body means another context once the
//! conversation moved on) go upstream as they came.

use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::{ConvertError, Echo, EchoedField, Wire, pieces, zero_temperature_or_seed};
use crate::{
    error::GatewayError,
    fingerprint::{BodyKeying, Endpoint},
    sse::{
        self, BROKEN_STREAM_CODE, Format, Frame, StreamFormat, UpstreamStreamRequest, named_event,
        named_event_value as event_value, read_named,
    },
    usage::Usage,
    validate::{self, InputLimits},
};

/// The Responses adapter.
#[derive(Debug)]
pub struct ResponsesWire;

pub static RESPONSES: ResponsesWire = ResponsesWire;

/// The Responses stream format.
#[derive(Debug)]
pub struct ResponsesStream;

pub static RESPONSES_STREAM: ResponsesStream = ResponsesStream;

/// The event that completes a stream.
const COMPLETED: &str = "response.completed";

/// A Responses flag corral decides by, beyond `stream`: `background` says
/// whether the request may be deduplicated at all.
const FLAGS: &[&str] = &["background"];

static KEYING: BodyKeying = BodyKeying {
    delivery: &["stream", "stream_options"],
    // Who asked (`user`, `safety_identifier`), which prompt cache to route to
    // (`prompt_cache_key`), the caller's own tags (`metadata`, and Codex's
    // `client_metadata`: session, thread and turn ids): none reaches the model.
    labels: &[
        "user",
        "safety_identifier",
        "prompt_cache_key",
        "metadata",
        "client_metadata",
    ],
    item_labels: &[],
    messages: Some("input"),
    content: "content",
    inline_item: Some(carries_content_inline),
};

/// `input` item types whose content is all in the item (messages, tool calls
/// and their outputs), so an `id` only names them: a client that mints fresh
/// ids for the same conversation asks the same question.
const INLINE_ITEM_TYPES: &[&str] = &[
    "message",
    // Codex's tool list for a turn, as a developer item.
    "additional_tools",
    "function_call",
    "function_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
    "local_shell_call",
    "local_shell_call_output",
    "shell_call",
    "shell_call_output",
    "apply_patch_call",
    "apply_patch_call_output",
    "computer_call",
    "computer_call_output",
    "web_search_call",
    "file_search_call",
    "image_generation_call",
    "code_interpreter_call",
    "mcp_call",
    "mcp_list_tools",
    "mcp_approval_request",
    "mcp_approval_response",
];

/// Whether an `input` item carries its content inline. Never an
/// `item_reference` (its id *is* its content), nor a `reasoning` or
/// `compaction` item without its `encrypted_content` (the provider looks the
/// stored content up by id), nor a type corral does not know (keyed: a split
/// is cheap, a wrong answer is not). An item without a `type` and with a
/// `role` is a message.
fn carries_content_inline(item: &Map<String, Value>) -> bool {
    match item.get("type").and_then(Value::as_str) {
        Some("reasoning" | "compaction") => {
            matches!(item.get("encrypted_content"), Some(Value::String(_)))
        }
        Some(kind) => INLINE_ITEM_TYPES.contains(&kind),
        None => item.contains_key("role"),
    }
}

/// The label fields a Responses object echoes, with what it echoes when the
/// request leaves one out.
const ECHOED: &[EchoedField] = &[
    ("metadata", || json!({})),
    ("prompt_cache_key", || Value::Null),
    ("safety_identifier", || Value::Null),
    ("user", || Value::Null),
];

/// The stream events whose `response` object echoes them.
const ECHOING_EVENTS: &[&str] = &[
    "response.created",
    "response.in_progress",
    "response.queued",
    COMPLETED,
    "response.failed",
    "response.incomplete",
];

impl Wire for ResponsesWire {
    fn keying(&self) -> &'static BodyKeying {
        &KEYING
    }

    fn echo(&self, body: &Map<String, Value>) -> Option<Echo> {
        Some(Echo::of(body, ECHOED, ECHOING_EVENTS))
    }

    fn check(&self, body: &Map<String, Value>, limits: InputLimits) -> Result<(), GatewayError> {
        validate::check_fields(Endpoint::Responses, body, limits)?;
        validate::check_flags(body, FLAGS)
    }

    fn is_deterministic(&self, body: &Map<String, Value>) -> bool {
        zero_temperature_or_seed(body)
    }

    /// Not a `background` job (its first answer is not final), nor a request
    /// that names mutable provider state by reference, whose same body means
    /// another context once that state moved on: a server-side
    /// `conversation`, a stored `prompt` template without a `version` (the
    /// latest one), a `file_search` over vector stores.
    fn dedupable(&self, body: &Map<String, Value>) -> bool {
        let background = matches!(body.get("background"), Some(Value::Bool(true)));
        let conversation = body.get("conversation").is_some_and(|c| !c.is_null());
        let latest_prompt = match body.get("prompt") {
            Some(Value::Object(prompt)) => prompt.get("version").is_none_or(Value::is_null),
            _ => false,
        };
        let searches_files = match body.get("tools") {
            Some(Value::Array(tools)) => tools
                .iter()
                .any(|tool| tool.get("type").and_then(Value::as_str) == Some("file_search")),
            _ => false,
        };
        !background && !conversation && !latest_prompt && !searches_files
    }

    fn stream_format(&self) -> Format {
        &RESPONSES_STREAM
    }

    /// The stream always carries usage (in `response.completed`): only `stream` is forced.
    fn stream_request(&self, body: &Map<String, Value>) -> UpstreamStreamRequest {
        sse::force_stream(body)
    }

    /// The `response` of the stream's `response.completed`.
    fn assemble(&self, events: &[Bytes]) -> Result<Value, ConvertError> {
        for (index, event) in events.iter().enumerate() {
            let Some(Value::Object(mut object)) = event_value(event) else {
                return Err(ConvertError::NotJson { index });
            };
            match object.get("type").and_then(Value::as_str) {
                Some(COMPLETED) => {
                    return match object.remove("response") {
                        Some(response @ Value::Object(_)) => Ok(response),
                        _ => Err(ConvertError::Malformed("response.completed.response")),
                    };
                }
                Some("error" | "response.failed" | "response.incomplete") => {
                    return Err(ConvertError::ErrorEvent { index });
                }
                _ => {}
            }
        }
        Err(ConvertError::Empty)
    }

    fn synthesize(&self, answer: &Value) -> Result<Vec<Bytes>, ConvertError> {
        synthesize(answer)
    }

    /// Complete when the response says so: `incomplete`, `failed`, `queued`
    /// and `in_progress` answers are served, never stored.
    fn is_complete(&self, body: &[u8]) -> bool {
        serde_json::from_slice::<Value>(body).is_ok_and(|value| {
            value.get("object").and_then(Value::as_str) == Some("response")
                && value.get("status").and_then(Value::as_str) == Some("completed")
        })
    }
}

impl StreamFormat for ResponsesStream {
    fn read(&self, name: Option<&str>, data: &str) -> Frame {
        let (kind, event) = match read_named(name, data) {
            Ok(read) => read,
            Err(malformed) => return malformed,
        };
        match kind.as_str() {
            COMPLETED => {
                let usage = self.event_usage(&event);
                Frame::Complete {
                    event: Some(event),
                    usage,
                }
            }
            "error" | "response.failed" | "response.incomplete" => Frame::Failed(event),
            _ => Frame::Event { event, usage: None },
        }
    }

    fn done_event(&self) -> Option<Bytes> {
        None
    }

    /// `ResponseErrorEvent`, numbered after the events so far.
    fn error_event(&self, message: &str, position: usize) -> Bytes {
        named_event(
            "error",
            &json!({
                "type": "error",
                "code": BROKEN_STREAM_CODE,
                "message": message,
                "param": null,
                "sequence_number": position,
            }),
        )
    }

    /// The usage of `response.completed` (no other event carries any).
    fn event_usage(&self, event: &[u8]) -> Option<Usage> {
        if !event.starts_with(b"event: response.completed\n") {
            return None;
        }
        let response = event_value(event)?.get_mut("response")?.take();
        Usage::from_body(&serde_json::to_vec(&response).ok()?)
    }
}

/// A valid event sequence equivalent to a `response` object: created, in progress, per
/// output item its added event, content parts (text and refusals as deltas of at most
/// [`PIECE_CHARS`](super::PIECE_CHARS) characters, function call arguments as one delta) and done event, then
/// `response.completed` with the object itself. Every event is numbered from 0.
fn synthesize(response: &Value) -> Result<Vec<Bytes>, ConvertError> {
    let object = response
        .as_object()
        .ok_or(ConvertError::Malformed("response"))?;
    match object.get("object").and_then(Value::as_str) {
        Some("response") => {}
        Some(other) => return Err(ConvertError::UnsupportedObject(other.to_owned())),
        None => return Err(ConvertError::Malformed("object")),
    }
    let output = match object.get("output") {
        Some(Value::Array(output)) => output.as_slice(),
        None | Some(Value::Null) => &[][..],
        Some(_) => return Err(ConvertError::Malformed("output")),
    };
    let mut events = Events::default();
    let mut start = object.clone();
    start.insert("status".to_owned(), json!("in_progress"));
    start.insert("output".to_owned(), json!([]));
    start.insert("usage".to_owned(), Value::Null);
    if start.contains_key("completed_at") {
        start.insert("completed_at".to_owned(), Value::Null);
    }
    let start = Value::Object(start);
    events.push("response.created", json!({ "response": start }));
    events.push("response.in_progress", json!({ "response": start }));
    for (output_index, item) in output.iter().enumerate() {
        synthesize_item(&mut events, output_index, item)?;
    }
    events.push(COMPLETED, json!({ "response": response }));
    Ok(events.events)
}

fn synthesize_item(
    events: &mut Events,
    output_index: usize,
    item: &Value,
) -> Result<(), ConvertError> {
    let fields = item
        .as_object()
        .ok_or(ConvertError::Malformed("output[]"))?;
    let item_id = fields.get("id").cloned().unwrap_or(Value::Null);
    let mut added = fields.clone();
    if added.contains_key("status") {
        added.insert("status".to_owned(), json!("in_progress"));
    }
    match fields.get("type").and_then(Value::as_str) {
        Some("message") => {
            added.insert("content".to_owned(), json!([]));
            events.push(
                "response.output_item.added",
                json!({ "output_index": output_index, "item": added }),
            );
            let parts = match fields.get("content") {
                Some(Value::Array(parts)) => parts.as_slice(),
                _ => &[][..],
            };
            for (content_index, part) in parts.iter().enumerate() {
                let at = json!({
                    "item_id": item_id, "output_index": output_index, "content_index": content_index,
                });
                synthesize_part(events, &at, part)?;
            }
        }
        Some("function_call") => {
            added.insert("arguments".to_owned(), json!(""));
            events.push(
                "response.output_item.added",
                json!({ "output_index": output_index, "item": added }),
            );
            let arguments = fields.get("arguments").and_then(Value::as_str);
            if let Some(arguments) = arguments {
                let at = json!({ "item_id": item_id, "output_index": output_index });
                events.push(
                    "response.function_call_arguments.delta",
                    merged(&at, json!({ "delta": arguments })),
                );
                events.push(
                    "response.function_call_arguments.done",
                    merged(&at, json!({ "arguments": arguments })),
                );
            }
        }
        _ => events.push(
            "response.output_item.added",
            json!({ "output_index": output_index, "item": item }),
        ),
    }
    events.push(
        "response.output_item.done",
        json!({ "output_index": output_index, "item": item }),
    );
    Ok(())
}

/// One content part of a message: added (empty), its deltas and their done event, done (whole).
fn synthesize_part(events: &mut Events, at: &Value, part: &Value) -> Result<(), ConvertError> {
    let fields = part
        .as_object()
        .ok_or(ConvertError::Malformed("output[].content[]"))?;
    let (text_field, delta_kind) = match fields.get("type").and_then(Value::as_str) {
        Some("output_text") => ("text", "response.output_text"),
        Some("refusal") => ("refusal", "response.refusal"),
        _ => {
            events.push(
                "response.content_part.added",
                merged(at, json!({ "part": part })),
            );
            events.push(
                "response.content_part.done",
                merged(at, json!({ "part": part })),
            );
            return Ok(());
        }
    };
    let text = fields
        .get(text_field)
        .and_then(Value::as_str)
        .unwrap_or_default();
    let mut empty = fields.clone();
    empty.insert(text_field.to_owned(), json!(""));
    if let Some(Value::Array(annotations)) = empty.get_mut("annotations") {
        annotations.clear();
    }
    if let Some(Value::Array(logprobs)) = empty.get_mut("logprobs") {
        logprobs.clear();
    }
    events.push(
        "response.content_part.added",
        merged(at, json!({ "part": empty })),
    );
    let is_text = text_field == "text";
    for piece in pieces(text) {
        let mut delta = json!({ "delta": piece });
        if is_text {
            delta["logprobs"] = json!([]);
        }
        events.push(&format!("{delta_kind}.delta"), merged(at, delta));
    }
    let mut done = json!({ text_field: text });
    if is_text {
        done["logprobs"] = fields.get("logprobs").cloned().unwrap_or(json!([]));
    }
    events.push(&format!("{delta_kind}.done"), merged(at, done));
    events.push(
        "response.content_part.done",
        merged(at, json!({ "part": part })),
    );
    Ok(())
}

/// `base`'s members, then `extra`'s.
fn merged(base: &Value, extra: Value) -> Value {
    let mut object = base.as_object().cloned().unwrap_or_default();
    if let Value::Object(extra) = extra {
        object.extend(extra);
    }
    Value::Object(object)
}

/// Synthesized events, numbered as they are pushed.
#[derive(Default)]
struct Events {
    events: Vec<Bytes>,
}

impl Events {
    fn push(&mut self, kind: &str, mut value: Value) {
        if let Value::Object(object) = &mut value {
            object.insert("type".to_owned(), json!(kind));
            object.insert("sequence_number".to_owned(), json!(self.events.len()));
        }
        self.events.push(named_event(kind, &value));
    }
}

#[cfg(test)]
mod tests;
