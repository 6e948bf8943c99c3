//! Gemini's native API, as far as the mock answers it: `models/{model}:`
//! `generateContent`, `:streamGenerateContent` (SSE with `alt=sse`, else a
//! streamed JSON array), `:countTokens`, `:embedContent` and
//! `:batchEmbedContents`, and the model list, in the shapes of the
//! `google-genai` SDK's types (`GenerateContentResponse`,
//! `CountTokensResponse`, `EmbedContentResponse`, `ListModelsResponse`) and
//! its error body (`{"error":{"code","message","status"}}`).
//!
//! The same methods are answered under `/v1beta/` and `/v1/` (the 3.x SDKs'
//! default): only the `POST models/{model}:{method}` form is Gemini's under
//! `/v1/`, where `GET /v1/models` stays OpenAI's list.
//!
//! As on the other surfaces, answers are functions of the request and the
//! call number, so a stream assembles to exactly the non-stream answer of the
//! same call (`generate.rs`), and vectors are functions of the text
//! (`embed.rs`).

mod embed;
mod generate;
#[cfg(test)]
mod tests;

use std::time::Duration;

use axum::Json;
use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::FailureMode;
use super::openai::{Answer, InvalidRequest, approx_tokens};

pub(super) use embed::embedded_texts;

/// The generation models the mock lists.
const MODELS: &[&str] = &["gemini-2.5-flash", "gemini-2.5-pro"];
/// The embedding model the mock lists.
const EMBEDDING_MODEL: &str = "gemini-embedding-001";
/// The methods the mock answers, as they follow `models/{model}:` in a path.
const METHODS: &[&str] = &[
    "generateContent",
    "streamGenerateContent",
    "countTokens",
    "embedContent",
    "batchEmbedContents",
];

/// `POST /v1beta/models/{model}:{method}` (or under `/v1/`), the path and query as they came.
pub(super) fn call(
    path: &str,
    query: Option<&str>,
    body: &[u8],
    call: u64,
) -> Result<Answer, InvalidRequest> {
    let (model, method) = model_method(path)
        .ok_or_else(|| InvalidRequest::new("expected models/{model}:{method}"))?;
    let request: Value = serde_json::from_slice(body)
        .map_err(|err| InvalidRequest::new(format!("Invalid JSON payload received. {err}")))?;
    match method {
        "countTokens" => {
            let prompt_tokens = approx_tokens(texts(&request).chars().count());
            Ok(Answer::Json(json!({"totalTokens": prompt_tokens})))
        }
        "generateContent" => Ok(generate::generate_content(model, &request, call)),
        "streamGenerateContent" => Ok(generate::stream_generate_content(
            model,
            &request,
            call,
            wants_sse(query),
        )),
        "embedContent" => embed::embed_content(model, &request),
        "batchEmbedContents" => embed::batch_embed_contents(model, &request),
        other => Err(InvalidRequest::new(format!(
            "the mock does not answer `{other}`"
        ))),
    }
}

/// Whether `path` names a method the mock answers (`.../models/{model}:{method}`): how a `POST`
/// under `/v1/models/` is told to be Gemini's rather than a stray OpenAI request.
pub(super) fn is_method_path(path: &str) -> bool {
    model_method(path).is_some_and(|(_, method)| METHODS.contains(&method))
}

/// `(model, method)` of `.../models/{model}:{method}`; model ids have no `:` of their own.
fn model_method(path: &str) -> Option<(&str, &str)> {
    let target = path.rsplit('/').next().unwrap_or_default();
    target.rsplit_once(':')
}

/// Whether the query asks for SSE (`alt=sse`, what the SDKs send); without it Google streams a
/// JSON array.
fn wants_sse(query: Option<&str>) -> bool {
    query
        .into_iter()
        .flat_map(|query| query.split('&'))
        .any(|pair| pair == "alt=sse")
}

/// A field of a request object by its JSON name or its proto name: Google's JSON parser takes
/// both (`generationConfig` and `generation_config`).
fn field<'a>(object: &'a Value, camel: &str, snake: &str) -> Option<&'a Value> {
    object
        .get(camel)
        .or_else(|| object.get(snake))
        .filter(|value| !value.is_null())
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
    if let Some(system) = field(request, "systemInstruction", "system_instruction") {
        add(system);
    }
    out
}

/// `GET /v1beta/models`: the generation models, then the embedding model.
pub(super) fn models() -> Value {
    let generation = MODELS.iter().map(|model| {
        json!({
            "name": format!("models/{model}"),
            "version": "001",
            "displayName": model,
            "inputTokenLimit": 1_048_576,
            "outputTokenLimit": 65_536,
            "supportedGenerationMethods": [
                "generateContent",
                "streamGenerateContent",
                "countTokens",
            ],
        })
    });
    let embedding = json!({
        "name": format!("models/{EMBEDDING_MODEL}"),
        "version": "001",
        "displayName": "Gemini Embedding 001",
        "inputTokenLimit": 2048,
        "outputTokenLimit": 1,
        "supportedGenerationMethods": ["embedContent", "batchEmbedContents", "countTokens"],
    });
    json!({"models": generation.chain([embedding]).collect::<Vec<_>>()})
}

/// An error body in Gemini's shape; `status` names the canonical code of the HTTP status.
pub(super) fn error(status: StatusCode, message: &str) -> Response {
    error_with(status, status_name(status), message, None)
}

/// An injected failure in Gemini's shape. `failure.code`, if given, replaces the canonical
/// `status` name (e.g. `FAILED_PRECONDITION`); `retry_after` is sent as Google sends it, a
/// `RetryInfo` detail, and as the `Retry-After` header every API's failures carry in the mock.
pub(super) fn failure(failure: &FailureMode, status: StatusCode) -> Response {
    let message = format!("The mock provider injected a failure ({status}).");
    let name = failure.code.as_deref().unwrap_or(status_name(status));
    let mut response = error_with(status, name, &message, failure.retry_after);
    if let Some(retry_after) = failure.retry_after {
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(whole_seconds(retry_after)));
    }
    response
}

fn error_with(
    status: StatusCode,
    name: &str,
    message: &str,
    retry_after: Option<Duration>,
) -> Response {
    let mut error = json!({"code": status.as_u16(), "message": message, "status": name});
    if let Some(retry_after) = retry_after {
        error["details"] = json!([{
            "@type": "type.googleapis.com/google.rpc.RetryInfo",
            "retryDelay": format!("{}s", whole_seconds(retry_after)),
        }]);
    }
    (status, Json(json!({"error": error}))).into_response()
}

/// The canonical code Google names an HTTP status by.
fn status_name(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 413 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        409 => "ABORTED",
        429 => "RESOURCE_EXHAUSTED",
        499 => "CANCELLED",
        501 => "NOT_IMPLEMENTED",
        503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        _ => "INTERNAL",
    }
}

fn whole_seconds(duration: Duration) -> u64 {
    duration.as_secs() + u64::from(duration.subsec_nanos() > 0)
}
