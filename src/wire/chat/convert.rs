//! Chat's and Completions' conversions: one cache entry for both kinds of caller: [`assemble`] turns a completed stream into the
//! non-stream answer it is equivalent to, and [`synthesize`] turns a non-stream answer into a
//! valid stream.
//!
//! Deltas are merged the way the official OpenAI SDKs accumulate them: strings concatenate,
//! objects merge member by member, list items that carry an `index` (tool calls) merge with
//! the item of the same index and other list items (logprobs, annotations) are appended, and
//! a `null` never erases what came before. `index`, `type`, `role` and `id` are replaced
//! rather than concatenated, because some OpenAI-compatible servers repeat them on every
//! delta. Only the members a non-stream answer has are kept: per-chunk members such as
//! `obfuscation` have no equivalent and are dropped.

use bytes::Bytes;
use serde_json::{Map, Value, json};

use crate::{
    sse::{DONE_EVENT, data_event, done_event, event_json},
    wire::{ConvertError, pieces},
};

/// The two streamed endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Completion {
    /// `/v1/chat/completions`: `chat.completion.chunk` → `chat.completion`.
    Chat,
    /// `/v1/completions`: `text_completion` chunks → `text_completion`.
    Text,
}

impl Completion {
    fn of_chunk(object: &str) -> Option<Self> {
        match object {
            "chat.completion.chunk" => Some(Self::Chat),
            "text_completion" => Some(Self::Text),
            _ => None,
        }
    }

    fn of_answer(object: &str) -> Option<Self> {
        match object {
            "chat.completion" => Some(Self::Chat),
            "text_completion" => Some(Self::Text),
            _ => None,
        }
    }

    fn chunk_object(self) -> &'static str {
        match self {
            Self::Chat => "chat.completion.chunk",
            Self::Text => "text_completion",
        }
    }

    fn answer_object(self) -> &'static str {
        match self {
            Self::Chat => "chat.completion",
            Self::Text => "text_completion",
        }
    }
}

/// Top-level members a non-stream answer shares with its chunks; each takes its first
/// value in the stream that says something (Azure's `prompt_filter_results`, on its
/// first chunk, is its non-stream answer's too).
const HEADER_FIELDS: [&str; 6] = [
    "id",
    "created",
    "model",
    "system_fingerprint",
    "service_tier",
    "prompt_filter_results",
];

/// Delta members that are replaced, not concatenated.
const REPLACED_FIELDS: [&str; 4] = ["index", "type", "role", "id"];

/// One choice while its deltas are merged.
#[derive(Debug, Default)]
struct ChoiceAcc {
    /// Chat: the merged `delta` objects. Text: unused.
    message: Map<String, Value>,
    /// Text: the concatenated `text`.
    text: String,
    logprobs: Value,
    finish_reason: Value,
}

/// The non-stream answer equivalent to a completed stream of `chat.completion.chunk` or
/// `text_completion` events (in corral's framing, `[DONE]` optional; events after it are
/// ignored).
///
/// A choice whose stream never gave a `finish_reason` comes out with `finish_reason: null`:
/// the cache's completeness check then refuses it, as it refuses a non-stream answer like it.
pub fn assemble(events: &[Bytes]) -> Result<Value, ConvertError> {
    let mut kind: Option<Completion> = None;
    let mut header = Map::new();
    let mut choices: Vec<(u64, ChoiceAcc)> = Vec::new();
    let mut usage = Value::Null;

    for (index, event) in events.iter().enumerate() {
        if event == DONE_EVENT {
            break;
        }
        let chunk = match event_json(event).map(serde_json::from_slice::<Value>) {
            Some(Ok(Value::Object(chunk))) => chunk,
            _ => return Err(ConvertError::NotJson { index }),
        };
        if chunk.get("error").is_some_and(|error| !error.is_null()) {
            return Err(ConvertError::ErrorEvent { index });
        }
        let list = match chunk.get("choices") {
            None | Some(Value::Null) => &[][..],
            Some(Value::Array(list)) => list.as_slice(),
            Some(_) => return Err(ConvertError::Malformed("choices")),
        };
        // Azure's first chunk (its prompt's filter results) says no object:
        // `"object": ""`, as if it were absent.
        let found = match chunk
            .get("object")
            .and_then(Value::as_str)
            .filter(|object| !object.is_empty())
        {
            Some(object) => Some(
                Completion::of_chunk(object)
                    .ok_or_else(|| ConvertError::UnsupportedObject(object.to_owned()))?,
            ),
            // Some servers leave `object` out; the first choice still tells.
            None => list.first().and_then(|choice| {
                if choice.get("delta").is_some() {
                    Some(Completion::Chat)
                } else if choice.get("text").is_some() {
                    Some(Completion::Text)
                } else {
                    None
                }
            }),
        };
        match (kind, found) {
            (Some(expected), Some(found)) if expected != found => {
                return Err(ConvertError::MixedObjects {
                    index,
                    expected: expected.chunk_object().to_owned(),
                    found: found.chunk_object().to_owned(),
                });
            }
            (None, found) => kind = found,
            _ => {}
        }
        for field in HEADER_FIELDS {
            match chunk.get(field) {
                Some(value) if !is_placeholder(value) && !has_value(&header, field) => {
                    header.insert(field.to_owned(), value.clone());
                }
                _ => {}
            }
        }
        if let Some(counts) = chunk.get("usage").filter(|usage| !usage.is_null()) {
            usage = counts.clone();
        }
        for (position, choice) in list.iter().enumerate() {
            let choice_index = choice
                .get("index")
                .and_then(Value::as_u64)
                .unwrap_or(position as u64);
            let acc = match choices.iter().position(|(i, _)| *i == choice_index) {
                Some(at) => &mut choices[at].1,
                None => {
                    choices.push((choice_index, ChoiceAcc::default()));
                    &mut choices.last_mut().ok_or(ConvertError::Empty)?.1
                }
            };
            if let Some(Value::Object(delta)) = choice.get("delta") {
                merge_object(&mut acc.message, delta);
            }
            if let Some(Value::String(text)) = choice.get("text") {
                acc.text.push_str(text);
            }
            if let Some(logprobs) = choice.get("logprobs") {
                merge_value("logprobs", &mut acc.logprobs, logprobs);
            }
            if let Some(reason) = choice.get("finish_reason").filter(|r| !r.is_null()) {
                acc.finish_reason = reason.clone();
            }
        }
    }

    let kind = kind.ok_or(ConvertError::Empty)?;
    choices.sort_by_key(|(index, _)| *index);
    let choices: Vec<Value> = choices
        .into_iter()
        .map(|(index, acc)| match kind {
            Completion::Chat => json!({
                "index": index,
                "message": finish_message(acc.message),
                "logprobs": acc.logprobs,
                "finish_reason": acc.finish_reason,
            }),
            Completion::Text => json!({
                "text": acc.text,
                "index": index,
                "logprobs": acc.logprobs,
                "finish_reason": acc.finish_reason,
            }),
        })
        .collect();

    let mut answer = header;
    answer.insert("object".to_owned(), json!(kind.answer_object()));
    answer.insert("choices".to_owned(), Value::Array(choices));
    if !usage.is_null() {
        answer.insert("usage".to_owned(), usage);
    }
    Ok(Value::Object(answer))
}

/// A header field's value that says nothing: null, or the empty `id`,
/// `model` and zero `created` of Azure's first chunk (which carries only its
/// prompt's filter results).
fn is_placeholder(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::String(text) => text.is_empty(),
        Value::Number(number) => number.as_u64() == Some(0),
        _ => false,
    }
}

fn has_value(map: &Map<String, Value>, field: &str) -> bool {
    map.get(field).is_some_and(|value| !value.is_null())
}

/// The merged deltas as a non-stream `message`: `role` and `content` always present (content
/// `null` when no text came, as for a tool-call-only answer), tool calls in index order
/// without the stream-only `index`.
fn finish_message(mut message: Map<String, Value>) -> Value {
    if !has_value(&message, "role") {
        message.insert("role".to_owned(), json!("assistant"));
    }
    message.entry("content").or_insert(Value::Null);
    if let Some(Value::Array(calls)) = message.get_mut("tool_calls") {
        calls.sort_by_key(|call| call.get("index").and_then(Value::as_u64));
        for call in calls.iter_mut() {
            if let Value::Object(call) = call {
                call.remove("index");
            }
        }
    }
    Value::Object(message)
}

fn merge_object(acc: &mut Map<String, Value>, delta: &Map<String, Value>) {
    for (key, value) in delta {
        match acc.get_mut(key) {
            Some(existing) => merge_value(key, existing, value),
            None => {
                acc.insert(key.clone(), value.clone());
            }
        }
    }
}

fn merge_value(key: &str, acc: &mut Value, delta: &Value) {
    if delta.is_null() {
        return;
    }
    if acc.is_null() || REPLACED_FIELDS.contains(&key) {
        *acc = delta.clone();
        return;
    }
    match (acc, delta) {
        (Value::String(acc), Value::String(delta)) => acc.push_str(delta),
        (Value::Object(acc), Value::Object(delta)) => merge_object(acc, delta),
        (Value::Array(acc), Value::Array(delta)) => merge_list(acc, delta),
        (acc, delta) => *acc = delta.clone(),
    }
}

/// Items with an `index` merge into the item with the same index; others are appended.
fn merge_list(acc: &mut Vec<Value>, delta: &[Value]) {
    for item in delta {
        // Only an integer `index` identifies an item: a logprobs map may have a token
        // spelled "index", with a float value.
        let index = item.get("index").filter(|index| index.as_u64().is_some());
        let existing = index.and_then(|index| {
            acc.iter_mut()
                .find(|existing| existing.get("index") == Some(index))
        });
        match (existing, item) {
            (Some(Value::Object(existing)), Value::Object(item)) => merge_object(existing, item),
            _ => acc.push(item.clone()),
        }
    }
}

/// A valid stream equivalent to a non-stream `chat.completion` or `text_completion` answer:
/// per choice a role chunk, content chunks (at most 64 characters each), tool-call and other
/// message chunks, a finish chunk (carrying the choice's logprobs), then the usage chunk when
/// the answer has usage, and `[DONE]`.
///
/// The stream is the one a caller who asked for usage would receive (every chunk carries
/// `"usage": null` when the answer has usage); serve it through a [`StreamLog`] reader, or
/// [`without_usage`](super::without_usage), to a caller who did not.
///
/// [`StreamLog`]: super::StreamLog
pub fn synthesize(response: &Value) -> Result<Vec<Bytes>, ConvertError> {
    let object = response
        .get("object")
        .and_then(Value::as_str)
        .ok_or(ConvertError::Malformed("object"))?;
    let kind = Completion::of_answer(object)
        .ok_or_else(|| ConvertError::UnsupportedObject(object.to_owned()))?;
    let choices = response
        .get("choices")
        .and_then(Value::as_array)
        .ok_or(ConvertError::Malformed("choices"))?;
    let usage = response.get("usage").filter(|usage| !usage.is_null());

    let mut header = Map::new();
    for field in HEADER_FIELDS {
        if let Some(value) = response.get(field) {
            header.insert(field.to_owned(), value.clone());
        }
    }
    header.insert("object".to_owned(), json!(kind.chunk_object()));
    let chunk = |choice: Value| {
        let mut chunk = header.clone();
        chunk.insert("choices".to_owned(), json!([choice]));
        if usage.is_some() {
            chunk.insert("usage".to_owned(), Value::Null);
        }
        data_event(&Value::Object(chunk))
    };

    let mut events = Vec::new();
    for (position, choice) in choices.iter().enumerate() {
        let index = choice
            .get("index")
            .cloned()
            .unwrap_or_else(|| json!(position));
        let logprobs = choice.get("logprobs").cloned().unwrap_or(Value::Null);
        let finish_reason = choice.get("finish_reason").cloned().unwrap_or(Value::Null);
        match kind {
            Completion::Chat => {
                let message = choice
                    .get("message")
                    .and_then(Value::as_object)
                    .ok_or(ConvertError::Malformed("choices[].message"))?;
                let delta = |delta: Value| {
                    chunk(json!({
                        "index": index, "delta": delta, "logprobs": null, "finish_reason": null,
                    }))
                };
                for delta_value in chat_deltas(message) {
                    events.push(delta(delta_value));
                }
                events.push(chunk(json!({
                    "index": index, "delta": {}, "logprobs": logprobs, "finish_reason": finish_reason,
                })));
            }
            Completion::Text => {
                let text = choice.get("text").and_then(Value::as_str).unwrap_or("");
                for piece in pieces(text) {
                    events.push(chunk(json!({
                        "text": piece, "index": index, "logprobs": null, "finish_reason": null,
                    })));
                }
                events.push(chunk(json!({
                    "text": "", "index": index, "logprobs": logprobs, "finish_reason": finish_reason,
                })));
            }
        }
    }
    if let Some(usage) = usage {
        let mut last = header.clone();
        last.insert("choices".to_owned(), json!([]));
        last.insert("usage".to_owned(), usage.clone());
        events.push(data_event(&Value::Object(last)));
    }
    events.push(done_event());
    Ok(events)
}

/// The deltas that rebuild `message` when merged: the role chunk (with `content: ""`, or
/// `null` when the message has no text, and `refusal: null` when the message has the field),
/// the content pieces, the refusal, one chunk per tool call, and one chunk with any other
/// members (`function_call`, `annotations`, `audio`, ...) as they are.
fn chat_deltas(message: &Map<String, Value>) -> Vec<Value> {
    let role = message
        .get("role")
        .cloned()
        .unwrap_or_else(|| json!("assistant"));
    let content = message.get("content").and_then(Value::as_str);
    let mut first = Map::new();
    first.insert("role".to_owned(), role);
    first.insert(
        "content".to_owned(),
        content.map_or(Value::Null, |_| json!("")),
    );
    if message.contains_key("refusal") {
        first.insert("refusal".to_owned(), Value::Null);
    }
    let mut deltas = vec![Value::Object(first)];
    for piece in pieces(content.unwrap_or("")) {
        deltas.push(json!({"content": piece}));
    }
    if let Some(refusal) = message.get("refusal").filter(|r| !r.is_null()) {
        deltas.push(json!({"refusal": refusal}));
    }
    if let Some(Value::Array(calls)) = message.get("tool_calls") {
        for (index, call) in calls.iter().enumerate() {
            let mut call = call.as_object().cloned().unwrap_or_default();
            call.insert("index".to_owned(), json!(index));
            deltas.push(json!({"tool_calls": [call]}));
        }
    }
    let rest: Map<String, Value> = message
        .iter()
        .filter(|(key, _)| !matches!(key.as_str(), "role" | "content" | "refusal" | "tool_calls"))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    if !rest.is_empty() {
        deltas.push(Value::Object(rest));
    }
    deltas
}
