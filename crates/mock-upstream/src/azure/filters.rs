//! Azure's content filter, as a client sees it: the annotations on every answer, and the two
//! verdicts a test can ask for by a marker in a user message.
//!
//! A plain answer carries `prompt_filter_results` (one entry per prompt) and a
//! `content_filter_results` per choice. A stream opens with a chunk that has no choices, only
//! the prompt's annotations (empty `id`, `object` and `model`, `created` 0); every content chunk
//! carries `content_filter_results` (empty: the filter ran on a buffer, not on each token); after
//! each choice's finish chunk comes an annotation chunk for that choice, with its
//! `content_filter_results` and `content_filter_offsets`, `finish_reason: null` and no `delta`;
//! then the usage chunk, if asked for, and `[DONE]`, as OpenAI sends them.
//!
//! [`CONTENT_FILTER_400_TRIGGER`] in a user message (chat), the prompt (completions) or the
//! input (Responses) gets Azure's 400 `content_filter` error: a billed call whose prompt the
//! filter refused. [`CONTENT_FILTER_FINISH_TRIGGER`] (chat and completions) gets a 200 whose
//! choices end with `finish_reason: "content_filter"`, the completion's `violence` category
//! filtered; the content is what the mock would have said, as Azure may return a partial one.

use axum::http::StatusCode;
use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::Operation;
use crate::openai::{Answer, PadChunk, SseEvents, message_text, sse};

/// In a user message, the prompt or the input: Azure's 400 `content_filter` error.
pub const CONTENT_FILTER_400_TRIGGER: &str = "[[content_filter_400]]";
/// In a user message or the prompt: a 200 whose choices finish with `content_filter`.
pub const CONTENT_FILTER_FINISH_TRIGGER: &str = "[[content_filter_finish]]";

/// What the content filter makes of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    Clean,
    /// The prompt is refused: 400 `content_filter`.
    Blocked,
    /// The completion is cut: `finish_reason: "content_filter"`.
    FinishFiltered,
}

impl Verdict {
    pub(super) fn of(operation: Operation, request: &Map<String, Value>) -> Self {
        let text = user_text(operation, request);
        if text.contains(CONTENT_FILTER_400_TRIGGER) {
            Self::Blocked
        } else if text.contains(CONTENT_FILTER_FINISH_TRIGGER)
            && matches!(
                operation,
                Operation::ChatCompletions | Operation::Completions
            )
        {
            Self::FinishFiltered
        } else {
            Self::Clean
        }
    }
}

/// The text the user wrote, where the triggers are looked for: the user messages of a chat,
/// the prompt of a completion, the input of a Responses call (a string, or its user items).
fn user_text(operation: Operation, request: &Map<String, Value>) -> String {
    let user_messages = |list: &Value| -> String {
        list.as_array()
            .into_iter()
            .flatten()
            .filter(|item| item.get("role").and_then(Value::as_str) == Some("user"))
            .map(message_text)
            .collect()
    };
    match operation {
        Operation::ChatCompletions => request.get("messages").map(user_messages),
        Operation::Completions => request.get("prompt").map(|prompt| match prompt {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        }),
        Operation::Responses => request.get("input").map(|input| match input {
            Value::String(text) => text.clone(),
            list => user_messages(list),
        }),
        Operation::Embeddings => None,
    }
    .unwrap_or_default()
}

/// The prompt's length in characters (all messages, or the prompt), where completion offsets
/// start: Azure counts `content_filter_offsets` from the beginning of the prompt.
pub(super) fn prompt_chars(request: &Map<String, Value>) -> usize {
    let messages: usize = request
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|message| message_text(message).chars().count())
        .sum();
    let prompt = match request.get("prompt") {
        Some(Value::String(text)) => text.chars().count(),
        _ => 0,
    };
    messages + prompt
}

fn safe() -> Value {
    json!({"filtered": false, "severity": "safe"})
}

fn not_detected() -> Value {
    json!({"filtered": false, "detected": false})
}

/// A prompt's annotations when nothing was found.
fn prompt_filters() -> Value {
    json!({
        "hate": safe(),
        "jailbreak": not_detected(),
        "self_harm": safe(),
        "sexual": safe(),
        "violence": safe(),
    })
}

/// A completion's annotations; `filtered` flags its `violence` as Azure flags a cut completion.
fn completion_filters(filtered: bool) -> Value {
    let violence = if filtered {
        json!({"filtered": true, "severity": "high"})
    } else {
        safe()
    };
    json!({
        "hate": safe(),
        "protected_material_code": not_detected(),
        "protected_material_text": not_detected(),
        "self_harm": safe(),
        "sexual": safe(),
        "violence": violence,
    })
}

fn prompt_filter_results() -> Value {
    json!([{"prompt_index": 0, "content_filter_results": prompt_filters()}])
}

/// Azure's 400 for a prompt its filter refused.
pub(super) fn prompt_blocked() -> Answer {
    let mut verdict = prompt_filters();
    verdict["violence"] = json!({"filtered": true, "severity": "medium"});
    Answer::Blocked {
        status: StatusCode::BAD_REQUEST,
        body: json!({"error": {
            "message": "The response was filtered due to the prompt triggering Azure OpenAI's \
                content management policy. Please modify your prompt and retry. To learn more \
                about our content filtering policies please read our documentation: \
                https://go.microsoft.com/fwlink/?linkid=2198766",
            "type": null,
            "param": "prompt",
            "code": "content_filter",
            "status": 400,
            "innererror": {
                "code": "ResponsibleAIPolicyViolation",
                "content_filter_result": verdict,
            },
        }}),
    }
}

/// Which OpenAI answer is being annotated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Chat,
    Completion,
}

/// The OpenAI answer with Azure's annotations, cut by the filter if `filtered`.
pub(super) fn annotate(answer: Answer, kind: Kind, filtered: bool, prompt_chars: usize) -> Answer {
    match answer {
        Answer::Json(mut value) => {
            value["prompt_filter_results"] = prompt_filter_results();
            for choice in choices(&mut value) {
                choice["content_filter_results"] = completion_filters(filtered);
                if filtered {
                    choice["finish_reason"] = json!("content_filter");
                }
            }
            Answer::Json(value)
        }
        Answer::Stream(events) => Answer::Stream(annotate_stream(
            events,
            StreamAnnotations {
                kind,
                filtered,
                prompt_chars,
            },
        )),
        blocked @ Answer::Blocked { .. } => blocked,
    }
}

fn choices(value: &mut Value) -> impl Iterator<Item = &mut Value> {
    value
        .get_mut("choices")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
}

#[derive(Debug, Clone, Copy)]
struct StreamAnnotations {
    kind: Kind,
    filtered: bool,
    prompt_chars: usize,
}

/// The stream with the prompt's annotation chunk first, each chunk's choices annotated, and
/// (chat) each choice's annotation chunk after its finish chunk. Padding chunks are made from
/// an annotated content chunk too, so a padded stream stays Azure's.
fn annotate_stream(events: SseEvents, how: StreamAnnotations) -> SseEvents {
    let SseEvents {
        events,
        content_type,
        first_content,
        padding,
    } = events;
    // The mock's OpenAI chunks all carry `usage` (null) once usage is asked for; Azure's own
    // chunks then do too.
    let with_usage = events
        .first()
        .and_then(chunk_of)
        .is_some_and(|chunk| chunk.get("usage").is_some());
    let mut opening = json!({
        "id": "", "object": "", "created": 0, "model": "", "choices": [],
        "prompt_filter_results": prompt_filter_results(),
    });
    if with_usage {
        opening["usage"] = Value::Null;
    }
    let mut annotated = vec![sse(&opening)];
    let mut content_chars: Vec<usize> = Vec::new();
    for event in events {
        let Some(mut chunk) = chunk_of(&event) else {
            annotated.push(event);
            continue;
        };
        let mut finished = Vec::new();
        for choice in choices(&mut chunk) {
            let index = choice["index"].as_u64().unwrap_or(0);
            let slot = usize::try_from(index).unwrap_or(0);
            if content_chars.len() <= slot {
                content_chars.resize(slot + 1, 0);
            }
            let text = match how.kind {
                Kind::Chat => choice["delta"]["content"].as_str(),
                Kind::Completion => choice["text"].as_str(),
            };
            content_chars[slot] += text.map_or(0, |text| text.chars().count());
            let finishes = !choice["finish_reason"].is_null();
            choice["content_filter_results"] = if finishes && how.filtered {
                choice["finish_reason"] = json!("content_filter");
                completion_filters(true)
            } else {
                json!({})
            };
            if finishes {
                finished.push((index, content_chars[slot]));
            }
        }
        annotated.push(sse(&chunk));
        if how.kind == Kind::Chat {
            for (index, chars) in finished {
                annotated.push(sse(&choice_annotation(index, chars, how, with_usage)));
            }
        }
    }
    let padding = padding.and_then(|chunk| {
        let mut template = Vec::new();
        chunk.with(PadChunk::MARK, &mut template);
        let mut template = chunk_of(&Bytes::from(template))?;
        for choice in choices(&mut template) {
            choice["content_filter_results"] = json!({});
        }
        PadChunk::around_mark(&sse(&template))
    });
    SseEvents {
        events: annotated,
        content_type,
        first_content: first_content + 1,
        padding,
    }
}

/// The annotation chunk Azure sends after choice `index` finished, `content_chars` long.
fn choice_annotation(
    index: u64,
    content_chars: usize,
    how: StreamAnnotations,
    with_usage: bool,
) -> Value {
    let end = how.prompt_chars + content_chars;
    let mut chunk = json!({
        "id": "", "object": "", "created": 0, "model": "",
        "choices": [{
            "index": index,
            "finish_reason": null,
            "content_filter_results": completion_filters(how.filtered),
            "content_filter_offsets": {
                "check_offset": end,
                "start_offset": how.prompt_chars,
                "end_offset": end,
            },
        }],
    });
    if with_usage {
        chunk["usage"] = Value::Null;
    }
    chunk
}

/// The JSON of a `data: {...}` event; `None` for `[DONE]` (or anything else).
fn chunk_of(event: &Bytes) -> Option<Value> {
    let data = std::str::from_utf8(event)
        .ok()?
        .strip_prefix("data: ")?
        .trim_end();
    serde_json::from_str(data).ok().filter(Value::is_object)
}
