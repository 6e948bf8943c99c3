//! The mock's answers to Anthropic's Messages API (`POST /v1/messages`, `POST
//! /v1/messages/count_tokens`), as pure functions of the request, in the wire format of the
//! official SDK's types (`Message`, `Usage`, `RawMessageStreamEvent`).
//!
//! As on the OpenAI surface, everything a test compares is derived from the request alone: the
//! reply embeds a digest of the canonical `system` and `messages`, token counts follow from text
//! lengths, and only `id` (the call number) varies between two identical calls. `stream`,
//! `metadata` and the sampling parameters do not change the reply, so a streamed answer
//! accumulates to exactly the non-stream one.
//!
//! Prompt caching is modelled deterministically so that both cache counters can be observed: a
//! `system` prompt marked with `cache_control` is billed as read from the cache
//! (`cache_read_input_tokens`), every marked message block as written to it
//! (`cache_creation_input_tokens`), and the rest as `input_tokens`.

use axum::Json;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::openai::{
    Answer, InvalidRequest, SseEvents, approx_tokens, message_text, quoting_reply, word_count,
    word_pieces,
};

/// The beta under which a message may carry its own `output_config` (dated, e.g.
/// `per-turn-control-2026-07-01`).
const PER_TURN_CONTROL_BETA: &str = "per-turn-control-";

/// `POST /v1/messages`: a `message`, or its stream of events.
pub(super) fn messages(
    headers: &HeaderMap,
    body: &[u8],
    call: u64,
) -> Result<Answer, InvalidRequest> {
    require_version(headers)?;
    let request = parse_object(body)?;
    let model = model(&request)?;
    let max_tokens = match request.get("max_tokens") {
        None => return Err(InvalidRequest::new("max_tokens: Field required")),
        Some(value) => value.as_u64().filter(|n| *n >= 1).ok_or_else(|| {
            InvalidRequest::new(
                "max_tokens: Input should be a valid integer greater than or equal to 1",
            )
        })?,
    };
    let prompt = Prompt::of(&request)?;
    prompt.check_turn_controls(headers)?;
    let stream = match request.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(on)) => *on,
        Some(_) => {
            return Err(InvalidRequest::new(
                "stream: Input should be a valid boolean",
            ));
        }
    };
    if let Some(temperature) = request.get("temperature")
        && !temperature
            .as_f64()
            .is_some_and(|t| (0.0..=1.0).contains(&t))
    {
        return Err(InvalidRequest::new(
            "temperature: Input should be a number between 0 and 1",
        ));
    }

    // The reply is cut at `max_tokens` words, as the real API stops at its token budget.
    let full = prompt.reply();
    let words: Vec<&str> = word_pieces(&full);
    let (text, stop_reason) = match usize::try_from(max_tokens) {
        Ok(budget) if budget < words.len() => {
            (words[..budget].concat().trim_end().to_owned(), "max_tokens")
        }
        _ => (full.clone(), "end_turn"),
    };
    let usage = prompt.usage(word_count(&text));
    let id = format!("msg_mock_{call}");

    if !stream {
        return Ok(Answer::Json(json!({
            "id": id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": stop_reason,
            "stop_sequence": null,
            "usage": usage,
        })));
    }

    // As the API streams: the message with empty content and the input usage, the block, a
    // ping, one delta per word, then the stop reason with the output usage, then the end.
    let mut start_usage = usage.clone();
    start_usage["output_tokens"] = json!(1);
    let mut events = vec![
        sse(&json!({
            "type": "message_start",
            "message": {
                "id": id,
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [],
                "stop_reason": null,
                "stop_sequence": null,
                "usage": start_usage,
            },
        })),
        sse(&json!({
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "text", "text": ""},
        })),
        sse(&json!({"type": "ping"})),
    ];
    let first_content = events.len();
    for piece in word_pieces(&text) {
        events.push(sse(&json!({
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": piece},
        })));
    }
    events.push(sse(&json!({"type": "content_block_stop", "index": 0})));
    events.push(sse(&json!({
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": null},
        "usage": {"output_tokens": usage["output_tokens"]},
    })));
    events.push(sse(&json!({"type": "message_stop"})));
    Ok(Answer::Stream(SseEvents {
        events,
        content_type: SseEvents::EVENT_STREAM,
        first_content,
        padding: None,
    }))
}

/// `POST /v1/messages/count_tokens`: the input tokens the same request would be billed.
pub(super) fn count_tokens(headers: &HeaderMap, body: &[u8]) -> Result<Answer, InvalidRequest> {
    require_version(headers)?;
    let request = parse_object(body)?;
    model(&request)?;
    let prompt = Prompt::of(&request)?;
    prompt.check_turn_controls(headers)?;
    Ok(Answer::Json(json!({"input_tokens": prompt.total_tokens()})))
}

/// An error body in Anthropic's shape.
pub(super) fn error(status: StatusCode, kind: &str, message: &str) -> Response {
    let body = json!({"type": "error", "error": {"type": kind, "message": message}});
    (status, Json(body)).into_response()
}

/// Anthropic's `error.type` for a status.
pub(super) fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "invalid_request_error",
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        504 => "timeout_error",
        529 => "overloaded_error",
        _ => "api_error",
    }
}

/// The API refuses a request without an `anthropic-version` header.
fn require_version(headers: &HeaderMap) -> Result<(), InvalidRequest> {
    match headers.get("anthropic-version") {
        Some(version) if !version.is_empty() => Ok(()),
        _ => Err(InvalidRequest::new("anthropic-version: header is required")),
    }
}

/// What the reply and the usage are computed from.
struct Prompt<'a> {
    system: Option<&'a Value>,
    messages: &'a Value,
    list: &'a [Value],
}

impl<'a> Prompt<'a> {
    fn of(request: &'a Map<String, Value>) -> Result<Self, InvalidRequest> {
        let messages = request
            .get("messages")
            .ok_or_else(|| InvalidRequest::new("messages: Field required"))?;
        let list = messages
            .as_array()
            .ok_or_else(|| InvalidRequest::new("messages: Input should be a valid list"))?;
        if list.is_empty() {
            return Err(InvalidRequest::new(
                "messages: at least one message is required",
            ));
        }
        for (i, message) in list.iter().enumerate() {
            match message.get("role").and_then(Value::as_str) {
                Some("user" | "assistant") => {}
                // A system turn inside `messages` (what Claude Code sends mid-conversation) is
                // accepted anywhere but first with content: the opening system prompt belongs
                // in `system`. The content-less directive form is accepted at any position.
                Some("system") if i > 0 || is_empty_content(message.get("content")) => {}
                Some("system") => {
                    return Err(InvalidRequest::new(
                        "messages.0: use the top-level 'system' parameter for the initial system \
                         prompt; the directive-only form (content: [] with output_config) is \
                         accepted at any position",
                    ));
                }
                _ => {
                    return Err(InvalidRequest::new(format!(
                        "messages.{i}.role: Input should be 'user', 'assistant' or 'system'"
                    )));
                }
            }
            match message.get("content") {
                Some(Value::String(_)) => {}
                Some(Value::Array(blocks))
                    if blocks
                        .iter()
                        .all(|b| b.get("type").is_some_and(Value::is_string)) => {}
                _ => {
                    return Err(InvalidRequest::new(format!(
                        "messages.{i}.content: Input should be a valid string or a list of content blocks"
                    )));
                }
            }
        }
        // A prefill (the last message the assistant's) may not end in white space.
        if let Some(last) = list.last()
            && last.get("role").and_then(Value::as_str) == Some("assistant")
            && message_text(last).ends_with(char::is_whitespace)
        {
            return Err(InvalidRequest::new(
                "messages: final assistant content cannot end with trailing whitespace",
            ));
        }
        let system = match request.get("system") {
            None | Some(Value::Null) => None,
            Some(system @ (Value::String(_) | Value::Array(_))) => Some(system),
            Some(_) => {
                return Err(InvalidRequest::new(
                    "system: Input should be a valid string or a list of text blocks",
                ));
            }
        };
        Ok(Self {
            system,
            messages,
            list,
        })
    }

    /// A system turn's `output_config` (its own effort, say) exists only under the
    /// `per-turn-control` beta; without it the API refuses the field as it refuses any unknown
    /// one, which is how a client learns to fall back to a request without such turns.
    fn check_turn_controls(&self, headers: &HeaderMap) -> Result<(), InvalidRequest> {
        let allowed = headers
            .get_all("anthropic-beta")
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .any(|beta| beta.trim().starts_with(PER_TURN_CONTROL_BETA));
        match self
            .list
            .iter()
            .position(|message| message.get("output_config").is_some())
        {
            Some(i) if !allowed => Err(InvalidRequest::new(format!(
                "messages.{i}.output_config: Extra inputs are not permitted"
            ))),
            _ => Ok(()),
        }
    }

    /// A digest of the system prompt and every message, then the last user text quoted.
    fn reply(&self) -> String {
        quoting_reply(
            &json!({
                "system": self.system,
                "messages": self.messages,
            }),
            self.list,
            |m| text_of(m.get("content")),
        )
    }

    /// Input tokens by how they are billed: (uncached, read from the cache, written to it).
    fn split(&self) -> (u64, u64, u64) {
        let system_chars = self.system.map_or(0, |s| text_of(Some(s)).chars().count());
        let (mut input, mut read, mut written) = (0u64, 0u64, 0u64);
        if system_chars > 0 {
            if self.system.is_some_and(marked) {
                read += approx_tokens(system_chars);
            } else {
                input += approx_tokens(system_chars);
            }
        }
        for message in self.list {
            match message.get("content") {
                Some(Value::Array(blocks)) => {
                    for block in blocks {
                        let tokens = approx_tokens(text_of(Some(block)).chars().count());
                        if block.get("cache_control").is_some_and(|c| !c.is_null()) {
                            written += tokens;
                        } else {
                            input += tokens;
                        }
                    }
                }
                content => input += approx_tokens(text_of(content).chars().count()),
            }
        }
        (input.max(1), read, written)
    }

    fn total_tokens(&self) -> u64 {
        let (input, read, written) = self.split();
        input + read + written
    }

    fn usage(&self, output_tokens: u64) -> Value {
        let (input, read, written) = self.split();
        json!({
            "input_tokens": input,
            "cache_creation_input_tokens": written,
            "cache_read_input_tokens": read,
            "output_tokens": output_tokens,
        })
    }
}

/// Whether a message's content is absent or empty (a string or a list of blocks).
fn is_empty_content(content: Option<&Value>) -> bool {
    match content {
        None | Some(Value::Null) => true,
        Some(Value::String(text)) => text.is_empty(),
        Some(Value::Array(blocks)) => blocks.is_empty(),
        Some(_) => false,
    }
}

/// Whether a system prompt carries a `cache_control` breakpoint (on any of its blocks).
fn marked(system: &Value) -> bool {
    system.as_array().is_some_and(|blocks| {
        blocks
            .iter()
            .any(|b| b.get("cache_control").is_some_and(|c| !c.is_null()))
    })
}

/// The text of a content value: a string, a block's `text`, or a list of blocks' texts.
fn text_of(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(blocks)) => blocks.iter().map(|b| text_of(Some(b))).collect(),
        Some(Value::Object(block)) => block
            .get("text")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        _ => String::new(),
    }
}

fn parse_object(body: &[u8]) -> Result<Map<String, Value>, InvalidRequest> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(InvalidRequest::new(
            "The request body must be a JSON object.",
        )),
        Err(error) => Err(InvalidRequest::new(format!(
            "There was an issue with your request body: {error}"
        ))),
    }
}

fn model(request: &Map<String, Value>) -> Result<String, InvalidRequest> {
    match request.get("model") {
        Some(Value::String(model)) if !model.is_empty() => Ok(model.clone()),
        None => Err(InvalidRequest::new("model: Field required")),
        Some(_) => Err(InvalidRequest::new("model: Input should be a valid string")),
    }
}

/// One event as the API frames it: its type on the `event:` line, the JSON on `data:`.
fn sse(event: &Value) -> Bytes {
    let kind = event["type"].as_str().unwrap_or("message");
    Bytes::from(format!("event: {kind}\ndata: {event}\n\n"))
}

#[cfg(test)]
mod tests;
