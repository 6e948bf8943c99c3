//! Google Vertex AI's surface, for the two publishers a gateway reaches there: Anthropic's Claude
//! (`rawPredict`, `streamRawPredict`) and Google's Gemini (`generateContent`,
//! `streamGenerateContent`, `countTokens`), below
//! `/v1/projects/{project}/locations/{location}/publishers/{publisher}/models/{model}:{method}`
//! (and the same under `/v1beta1/`, where `google-genai` sends Vertex calls).
//!
//! The door comes first: every Vertex path needs `Authorization: Bearer` with an unexpired token
//! from the mock's own Google token endpoint (`google_token.rs`), else Google's 401; then a
//! publisher or method the mock does not serve is Google's 404. Requests the door turns away are
//! not calls. Past it, a call is billed like any other (`http.rs`).
//!
//! Claude on Vertex takes the Messages body without `model` (the path names it) and with
//! `"anthropic_version"` in the body instead of the header (`vertex-2023-10-16`, or the API
//! version the `anthropic` SDK's 2.x `AnthropicVertex` sends there); Vertex itself
//! refuses a body that breaks those rules, or a `streamRawPredict` without `"stream": true`, in
//! Google's error shape. The rest is Anthropic's: the answer, its SSE stream and the Messages
//! validation errors are exactly the Anthropic surface's, as Vertex passes the partner's answer
//! through, with the path's model as `model`. Gemini on Vertex is the Gemini surface's answer,
//! the path's model as `modelVersion`. Injected failures take Google's shape on both.

use axum::http::header::AUTHORIZATION;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};

use super::openai::{Answer, InvalidRequest};
use super::{Shared, anthropic, gemini};

/// The `anthropic_version` Vertex documents for Claude's body.
pub const VERTEX_ANTHROPIC_VERSION: &str = "vertex-2023-10-16";
/// Every `anthropic_version` Claude on Vertex accepts: its own, and the API version the
/// `anthropic` SDK's `AnthropicVertex` sends since its 2.0 (the SDK's `ANTHROPIC_API_VERSION`),
/// as Bedrock's surface does. Any other value, Anthropic's older `2023-06-01` included, is
/// refused.
pub const VERTEX_ANTHROPIC_VERSIONS: [&str; 2] = [VERTEX_ANTHROPIC_VERSION, "2026-10-21"];

/// The `anthropic-version` header the Messages logic expects; Vertex callers send the version in
/// the body instead.
const MESSAGES_API_VERSION: &str = "2023-06-01";

const UNAUTHENTICATED: &str = "Request had invalid authentication credentials. Expected OAuth 2 \
     access token, login cookie or other valid authentication credential. See \
     https://developers.google.com/identity/sign-in/web/devconsole-project.";

/// The publisher a Vertex path names, as far as the mock serves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Publisher {
    Anthropic,
    Google,
}

/// What a Vertex path names: `.../publishers/{publisher}/models/{model}:{method}`.
#[derive(Debug, PartialEq, Eq)]
struct Target<'a> {
    publisher: Publisher,
    model: &'a str,
    method: &'a str,
}

impl<'a> Target<'a> {
    /// The target of `path`, if it names a publisher and method the mock serves.
    fn of(path: &'a str) -> Option<Self> {
        let rest = path
            .strip_prefix("/v1/")
            .or_else(|| path.strip_prefix("/v1beta1/"))?;
        let segments: Vec<&str> = rest.split('/').collect();
        let [
            "projects",
            project,
            "locations",
            location,
            "publishers",
            publisher,
            "models",
            target,
        ] = segments.as_slice()
        else {
            return None;
        };
        if project.is_empty() || location.is_empty() {
            return None;
        }
        let (model, method) = target.rsplit_once(':')?;
        let publisher = match (*publisher, method) {
            ("anthropic", "rawPredict" | "streamRawPredict") => Publisher::Anthropic,
            ("google", "generateContent" | "streamGenerateContent" | "countTokens") => {
                Publisher::Google
            }
            _ => return None,
        };
        (!model.is_empty()).then_some(Self {
            publisher,
            model,
            method,
        })
    }
}

/// Why Vertex's door turned a request away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    /// No bearer token the mock's Google endpoint issued and that has not expired.
    Unauthenticated,
    /// A publisher or method the mock does not serve.
    NotFound,
}

impl Refusal {
    /// Google's answer to a request refused at `path`.
    pub(super) fn response(self, path: &str) -> Response {
        match self {
            Self::Unauthenticated => gemini::error(StatusCode::UNAUTHORIZED, UNAUTHENTICATED),
            Self::NotFound => gemini::error(
                StatusCode::NOT_FOUND,
                &format!("The requested URL {path} was not found on this server."),
            ),
        }
    }
}

impl Shared {
    /// Let a Vertex request through the door, returning its publisher, or say why not: the
    /// credential is judged before the path, as Google does.
    pub(super) fn admit_vertex(
        &self,
        path: &str,
        headers: &HeaderMap,
    ) -> Result<Publisher, Refusal> {
        let token = headers
            .get(AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .unwrap_or_default();
        if !self.google.accepts(token.trim()) {
            return Err(Refusal::Unauthenticated);
        }
        Target::of(path)
            .map(|target| target.publisher)
            .ok_or(Refusal::NotFound)
    }
}

/// The answer to a Vertex call that passed the door.
pub(super) fn answer(
    path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: &[u8],
    call: u64,
) -> Result<Answer, InvalidRequest> {
    let target = Target::of(path).ok_or_else(|| InvalidRequest::new("not a Vertex model path"))?;
    match target.publisher {
        Publisher::Anthropic => claude(&target, headers, body, call),
        Publisher::Google => gemini::call(path, query, body, call),
    }
}

/// An error a Vertex call's own rules draw, in Google's shape (a billed call's verdict).
fn invalid_argument(message: &str) -> Answer {
    Answer::Blocked {
        status: StatusCode::BAD_REQUEST,
        body: json!({"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}}),
    }
}

/// Claude's `rawPredict` / `streamRawPredict`: Vertex's rules, then the Messages answer to the
/// same body with the path's model and the version header it would have come with.
fn claude(
    target: &Target<'_>,
    headers: &HeaderMap,
    body: &[u8],
    call: u64,
) -> Result<Answer, InvalidRequest> {
    let Ok(Value::Object(mut request)) = serde_json::from_slice::<Value>(body) else {
        return Ok(invalid_argument(
            "Invalid JSON payload received. The request body must be a JSON object.",
        ));
    };
    if request.contains_key("model") {
        return Ok(invalid_argument(
            "Invalid JSON payload received. Unknown name \"model\": the model is named by the \
             request URL, not the body.",
        ));
    }
    match request.remove("anthropic_version") {
        Some(Value::String(version)) if VERTEX_ANTHROPIC_VERSIONS.contains(&version.as_str()) => {}
        Some(other) => {
            return Ok(invalid_argument(&format!(
                "anthropic_version: Input should be '{}', got {other}",
                VERTEX_ANTHROPIC_VERSIONS.join("' or '")
            )));
        }
        None => return Ok(invalid_argument("anthropic_version: Field required")),
    }
    if target.method == "streamRawPredict" && request.get("stream") != Some(&Value::Bool(true)) {
        return Ok(invalid_argument(
            "streamRawPredict requires \"stream\": true in the request body.",
        ));
    }
    request.insert("model".to_owned(), Value::String(target.model.to_owned()));
    let mut headers = headers.clone();
    if !headers.contains_key("anthropic-version") {
        headers.insert(
            "anthropic-version",
            HeaderValue::from_static(MESSAGES_API_VERSION),
        );
    }
    let body = Value::Object(request).to_string();
    anthropic::messages(&headers, body.as_bytes(), call)
}

/// A Messages validation error on Claude's paths is Anthropic's, passed through; Gemini's is
/// Google's.
pub(super) fn error(publisher: Publisher, status: StatusCode, message: &str) -> Response {
    match publisher {
        Publisher::Anthropic => anthropic::error(status, anthropic::error_type(status), message),
        Publisher::Google => gemini::error(status, message),
    }
}

#[cfg(test)]
#[path = "vertex_tests.rs"]
mod tests;
