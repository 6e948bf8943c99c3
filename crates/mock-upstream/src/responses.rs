//! The mock's answer to `POST /v1/responses` (OpenAI Responses), a pure function of the request
//! body like the chat answers: the output text embeds a digest of `instructions`, `input` and
//! `previous_response_id`, so requests that differ in any of them get different answers.
//!
//! A streamed answer is the event sequence OpenAI sends for a text answer, each event framed
//! `event: <type>\ndata: <json>\n\n` and numbered by `sequence_number`: `response.created`,
//! `response.in_progress`, `response.output_item.added`, `response.content_part.added`, one
//! `response.output_text.delta` per word, `response.output_text.done`,
//! `response.content_part.done`, `response.output_item.done`, `response.completed` (the whole
//! response, usage included). No `[DONE]`. A truncated stream stops after the first delta, so
//! it never reaches `response.completed`.
//!
//! A request that forces a tool call (`tool_choice` `"required"`, or `{"type": "function",
//! "name": ...}`) is answered with a `function_call` item instead of text: the first function
//! tool (or the named one), its `arguments` a JSON object with a placeholder for each required
//! parameter (by its schema type), its `call_id` derived from the request so identical requests
//! get identical calls. Streamed, the item comes as `response.output_item.added`, one
//! `response.function_call_arguments.delta`, `response.function_call_arguments.done` and
//! `response.output_item.done`. Under `"auto"` a real model may call a tool or answer; the mock
//! always answers, so offering tools never changes an answer by surprise, and an agent whose
//! runner drops a forced choice once its tool ran (the Agents SDK's `reset_tool_choice`) gets a
//! call, then text.

use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::openai::{
    Answer, InvalidRequest, SseEvents, approx_tokens, canonical_json, flag, message_text, model,
    now_secs, parse_object, short_digest, word_count, word_pieces,
};

/// How much of the user's text the reply quotes.
const QUOTE_CHARS: usize = 60;

/// `POST /v1/responses`.
pub(super) fn responses(body: &[u8], call: u64) -> Result<Answer, InvalidRequest> {
    let request = parse_object(body)?;
    let model = model(&request)?;
    let input = match request.get("input") {
        Some(input @ (Value::String(_) | Value::Array(_))) => input,
        Some(_) => {
            return Err(InvalidRequest(
                "Invalid type for 'input': expected a string or an array.".to_owned(),
            ));
        }
        None => {
            return Err(InvalidRequest(
                "Missing required parameter: 'input'.".to_owned(),
            ));
        }
    };
    let stream = flag(&request, "stream")?;
    let background = flag(&request, "background")?;

    let text = reply(&request, input);
    let forced = forced_call(&request)?;
    let input_chars = input_text(input).chars().count()
        + request
            .get("instructions")
            .and_then(Value::as_str)
            .map_or(0, |i| i.chars().count());
    let output_tokens = match &forced {
        Some(call) => approx_tokens(call.arguments.chars().count()),
        None => word_count(&text),
    };
    let input_tokens = approx_tokens(input_chars);
    let usage = json!({
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    });
    let message_id = format!("msg_mock_{call}");
    let part = |text: &str| json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
    let message = |status: &str, content: Value| {
        json!({
            "id": message_id, "type": "message", "status": status, "role": "assistant",
            "content": content,
        })
    };
    let response = |status: &str, output: Value, usage: Value| {
        json!({
            "id": format!("resp_mock_{call}"),
            "object": "response",
            "created_at": now_secs(),
            "status": status,
            "background": background,
            "error": null,
            "incomplete_details": null,
            "instructions": request.get("instructions").cloned().unwrap_or(Value::Null),
            "max_output_tokens": request.get("max_output_tokens").cloned().unwrap_or(Value::Null),
            "metadata": request.get("metadata").cloned().unwrap_or(json!({})),
            "model": model,
            "output": output,
            "parallel_tool_calls": true,
            "previous_response_id": request.get("previous_response_id").cloned().unwrap_or(Value::Null),
            "prompt_cache_key": request.get("prompt_cache_key").cloned().unwrap_or(Value::Null),
            "reasoning": {"effort": null, "summary": null},
            "safety_identifier": request.get("safety_identifier").cloned().unwrap_or(Value::Null),
            "store": request.get("store").cloned().unwrap_or(json!(true)),
            "temperature": request.get("temperature").cloned().unwrap_or(json!(1.0)),
            "text": {"format": {"type": "text"}},
            "tool_choice": request.get("tool_choice").cloned().unwrap_or(json!("auto")),
            "tools": request.get("tools").cloned().unwrap_or(json!([])),
            "top_p": request.get("top_p").cloned().unwrap_or(json!(1.0)),
            "truncation": "disabled",
            "usage": usage,
            "user": request.get("user").cloned().unwrap_or(Value::Null),
        })
    };

    if background && !stream {
        // A background job is answered at once, queued; its result is fetched later.
        return Ok(Answer::Json(response("queued", json!([]), Value::Null)));
    }
    if let Some(forced) = forced {
        let item_id = format!("fc_mock_{call}");
        let done = forced.item(&item_id, "completed", &forced.arguments);
        let complete = response("completed", json!([done]), usage);
        if !stream {
            return Ok(Answer::Json(complete));
        }
        let start = response("in_progress", json!([]), Value::Null);
        let at = json!({"item_id": item_id, "output_index": 0});
        let mut events = Events::default();
        events.push("response.created", json!({"response": start}));
        events.push("response.in_progress", json!({"response": start}));
        events.push(
            "response.output_item.added",
            json!({"output_index": 0, "item": forced.item(&item_id, "in_progress", "")}),
        );
        let first_content = events.0.len();
        events.push(
            "response.function_call_arguments.delta",
            with(&at, json!({"delta": forced.arguments})),
        );
        events.push(
            "response.function_call_arguments.done",
            with(&at, json!({"arguments": forced.arguments})),
        );
        events.push(
            "response.output_item.done",
            json!({"output_index": 0, "item": done}),
        );
        events.push("response.completed", json!({"response": complete}));
        return Ok(Answer::Stream(SseEvents {
            events: events.0,
            content_type: SseEvents::EVENT_STREAM,
            first_content,
            padding: None,
        }));
    }
    let done = message("completed", json!([part(&text)]));
    let complete = response("completed", json!([done]), usage);
    if !stream {
        return Ok(Answer::Json(complete));
    }

    let start = response("in_progress", json!([]), Value::Null);
    let at = json!({"item_id": message_id, "output_index": 0, "content_index": 0});
    let mut events = Events::default();
    events.push("response.created", json!({"response": start}));
    events.push("response.in_progress", json!({"response": start}));
    events.push(
        "response.output_item.added",
        json!({"output_index": 0, "item": message("in_progress", json!([]))}),
    );
    events.push(
        "response.content_part.added",
        with(&at, json!({"part": part("")})),
    );
    let first_content = events.0.len();
    for piece in word_pieces(&text) {
        events.push(
            "response.output_text.delta",
            with(&at, json!({"delta": piece, "logprobs": []})),
        );
    }
    events.push(
        "response.output_text.done",
        with(&at, json!({"text": text, "logprobs": []})),
    );
    events.push(
        "response.content_part.done",
        with(&at, json!({"part": part(&text)})),
    );
    events.push(
        "response.output_item.done",
        json!({"output_index": 0, "item": done}),
    );
    events.push("response.completed", json!({"response": complete}));
    Ok(Answer::Stream(SseEvents {
        events: events.0,
        content_type: SseEvents::EVENT_STREAM,
        first_content,
        padding: None,
    }))
}

/// A call to a function tool, as the model would make it.
struct Call {
    name: String,
    call_id: String,
    arguments: String,
}

impl Call {
    /// The `function_call` output item (`ResponseFunctionToolCall`).
    fn item(&self, id: &str, status: &str, arguments: &str) -> Value {
        json!({
            "type": "function_call",
            "id": id,
            "call_id": self.call_id,
            "name": self.name,
            "arguments": arguments,
            "status": status,
        })
    }
}

/// The call a request forces, if it does: `tool_choice` `"required"` calls the first function
/// tool, `{"type": "function", "name": ...}` the one named. Anything else (`"auto"`, `"none"`,
/// absent, a built-in tool type) is answered with text.
fn forced_call(request: &Map<String, Value>) -> Result<Option<Call>, InvalidRequest> {
    let functions: Vec<&Value> = request
        .get("tools")
        .and_then(Value::as_array)
        .map(|tools| {
            tools
                .iter()
                .filter(|tool| tool.get("type").and_then(Value::as_str) == Some("function"))
                .collect()
        })
        .unwrap_or_default();
    let name = |tool: &Value| tool.get("name").and_then(Value::as_str).map(str::to_owned);
    let tool = match request.get("tool_choice") {
        Some(Value::String(choice)) if choice == "required" => {
            Some(functions.first().copied().ok_or_else(|| {
                InvalidRequest::new("Tool choice 'required' must be specified with 'tools'.")
            })?)
        }
        Some(choice @ Value::Object(_)) if choice["type"] == "function" => {
            let wanted = choice.get("name").and_then(Value::as_str);
            Some(
                functions
                    .iter()
                    .copied()
                    .find(|tool| name(tool).as_deref() == wanted)
                    .ok_or_else(|| {
                        InvalidRequest::new(format!(
                            "Tool choice '{}' not found in 'tools' parameter.",
                            wanted.unwrap_or_default()
                        ))
                    })?,
            )
        }
        _ => None,
    };
    Ok(tool.map(|tool| {
        let name = name(tool).unwrap_or_default();
        let arguments = placeholder_arguments(tool.get("parameters")).to_string();
        let shaping = json!({"input": request.get("input"), "tool": name});
        Call {
            call_id: format!("call_{}", short_digest(&canonical_json(&shaping))),
            name,
            arguments,
        }
    }))
}

/// Arguments that satisfy a parameters schema: each required property (every property, for a
/// strict schema) gets a placeholder of its type, or the first of its `enum`.
fn placeholder_arguments(schema: Option<&Value>) -> Value {
    let Some(properties) = schema
        .and_then(|schema| schema.get("properties"))
        .and_then(Value::as_object)
    else {
        return json!({});
    };
    let required: Vec<&str> = schema
        .and_then(|schema| schema.get("required"))
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let arguments = properties
        .iter()
        .filter(|(name, _)| required.contains(&name.as_str()))
        .map(|(name, property)| (name.clone(), placeholder(property)))
        .collect();
    Value::Object(arguments)
}

fn placeholder(property: &Value) -> Value {
    if let Some(first) = property
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|values| values.first())
    {
        return first.clone();
    }
    let kind = match property.get("type") {
        Some(Value::Array(kinds)) => kinds.iter().find_map(Value::as_str),
        Some(kind) => kind.as_str(),
        None => None,
    };
    match kind {
        Some("string") => json!("mock"),
        Some("integer" | "number") => json!(1),
        Some("boolean") => json!(true),
        Some("array") => json!([]),
        Some("object") => placeholder_arguments(Some(property)),
        _ => Value::Null,
    }
}

/// The reply: a digest of everything that shapes the answer, then the last user text quoted.
fn reply(request: &Map<String, Value>, input: &Value) -> String {
    let shaping = json!({
        "instructions": request.get("instructions"),
        "input": input,
        "previous_response_id": request.get("previous_response_id"),
    });
    let digest = short_digest(&canonical_json(&shaping));
    let quote: String = match input {
        Value::String(text) => text.clone(),
        Value::Array(items) => items
            .iter()
            .rev()
            .find(|item| item.get("role").and_then(Value::as_str) == Some("user"))
            .map(message_text)
            .unwrap_or_default(),
        _ => String::new(),
    }
    .chars()
    .take(QUOTE_CHARS)
    .collect();
    format!("mock response to {digest}: {quote}")
        .trim_end()
        .to_owned()
}

/// All of the input's text, for its token count.
fn input_text(input: &Value) -> String {
    match input {
        Value::String(text) => text.clone(),
        Value::Array(items) => items.iter().map(message_text).collect(),
        _ => String::new(),
    }
}

/// `base`'s members, then `extra`'s.
fn with(base: &Value, extra: Value) -> Value {
    let mut object = base.as_object().cloned().unwrap_or_default();
    if let Value::Object(extra) = extra {
        object.extend(extra);
    }
    Value::Object(object)
}

/// Events framed and numbered as they are pushed.
#[derive(Default)]
struct Events(Vec<Bytes>);

impl Events {
    fn push(&mut self, kind: &str, mut event: Value) {
        event["type"] = json!(kind);
        event["sequence_number"] = json!(self.0.len());
        self.0
            .push(Bytes::from(format!("event: {kind}\ndata: {event}\n\n")));
    }
}

#[cfg(test)]
#[path = "responses_tests.rs"]
mod tests;
