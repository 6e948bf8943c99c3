//! Gemini's native API, as far as the mock answers it: `models/{model}:
//! generateContent` and `:countTokens`, and the model list, in the shapes of
//! the `google-genai` SDK's types (`GenerateContentResponse`,
//! `CountTokensResponse`, `ListModelsResponse`) and its error body
//! (`{"error":{"code","message","status"}}`).

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::openai::{Answer, InvalidRequest, approx_tokens};

/// The model the mock lists.
const MODELS: &[&str] = &["gemini-2.5-flash", "gemini-2.5-pro"];

/// `POST /v1beta/models/{model}:{method}`, the path as it came.
pub(super) fn call(path: &str, body: &[u8], call: u64) -> Result<Answer, InvalidRequest> {
    let target = path.rsplit('/').next().unwrap_or_default();
    let (model, method) = target
        .split_once(':')
        .ok_or_else(|| InvalidRequest::new("expected models/{model}:{method}"))?;
    let request: Value = serde_json::from_slice(body)
        .map_err(|err| InvalidRequest::new(format!("Invalid JSON payload received. {err}")))?;
    let text = texts(&request);
    let prompt_tokens = approx_tokens(text.chars().count()).max(1);
    match method {
        "countTokens" => Ok(Answer::Json(json!({"totalTokens": prompt_tokens}))),
        "generateContent" => {
            let answer = format!(
                "mock gemini answer {call} to: {}",
                text.chars().take(40).collect::<String>()
            );
            let output_tokens = approx_tokens(answer.chars().count()).max(1);
            Ok(Answer::Json(json!({
                "candidates": [{
                    "content": {"role": "model", "parts": [{"text": answer}]},
                    "finishReason": "STOP",
                    "index": 0,
                }],
                "usageMetadata": {
                    "promptTokenCount": prompt_tokens,
                    "candidatesTokenCount": output_tokens,
                    "totalTokenCount": prompt_tokens + output_tokens,
                },
                "modelVersion": model,
                "responseId": format!("mock-{call}"),
            })))
        }
        other => Err(InvalidRequest::new(format!(
            "the mock does not answer `{other}`"
        ))),
    }
}

/// Every `text` part of `contents` (and `systemInstruction`), joined.
fn texts(request: &Value) -> String {
    let mut out = String::new();
    let mut add = |content: &Value| {
        for part in content["parts"].as_array().into_iter().flatten() {
            if let Some(text) = part["text"].as_str() {
                out.push_str(text);
                out.push(' ');
            }
        }
    };
    match &request["contents"] {
        Value::Array(contents) => contents.iter().for_each(&mut add),
        content @ Value::Object(_) => add(content),
        _ => {}
    }
    add(&request["systemInstruction"]);
    out
}

/// `GET /v1beta/models`.
pub(super) fn models() -> Value {
    json!({"models": MODELS.iter().map(|model| json!({
        "name": format!("models/{model}"),
        "version": "001",
        "displayName": model,
        "inputTokenLimit": 1_048_576,
        "outputTokenLimit": 65_536,
        "supportedGenerationMethods": ["generateContent", "countTokens"],
    })).collect::<Vec<_>>()})
}

/// An error body in Gemini's shape.
pub(super) fn error(status: StatusCode, message: &str) -> Response {
    let name = match status.as_u16() {
        400 | 413 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        429 => "RESOURCE_EXHAUSTED",
        503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        _ => "INTERNAL",
    };
    let body = json!({"error": {"code": status.as_u16(), "message": message, "status": name}});
    (status, Json(body)).into_response()
}
