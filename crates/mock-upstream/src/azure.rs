//! Azure OpenAI's surface: the same answers as the OpenAI one, reached by Azure's paths, behind
//! Azure's door, dressed in Azure's content-filter annotations.
//!
//! Two path shapes reach a deployment. The v1 one (`/openai/v1/{chat/completions, completions,
//! embeddings, responses}`) names the deployment in the body's `model`, as OpenAI names a model.
//! The versioned one (`/openai/deployments/{deployment}/{chat/completions, completions,
//! embeddings}?api-version=...` and `/openai/responses?api-version=...`) routes by the path,
//! ignores the body's `model`, and without `api-version` is no route at all (Azure's 404).
//!
//! The door checks a credential before anything is billed: an `api-key` header with an accepted
//! key, or `Authorization: Bearer` with a token the mock's own Entra endpoint issued (`entra.rs`)
//! and that has not expired. A bearer that is anything else, an API key above all, is refused: a
//! gateway must never send a key that way. Requests refused at the door (401, or 404 for a
//! missing `api-version`) are not calls: they are kept apart, for a test to read what was sent.
//!
//! Answers name the model snapshot the deployment runs ([`AZURE_CHAT_MODEL`],
//! [`AZURE_EMBEDDING_MODEL`]), as Azure does, not the deployment. Embedding vectors are computed
//! from the deployment's name, so a deployment named like an OpenAI model embeds as that model.
//! The content-filter annotations and the two content-filter triggers live in `filters.rs`.

mod filters;
#[cfg(test)]
mod tests;

use std::sync::Mutex;

use axum::Json;
use axum::extract::Request;
use axum::http::header::{AUTHORIZATION, RETRY_AFTER};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::openai::{self, Answer, InvalidRequest};
use super::{FailureMode, RecordedRequest, Shared, lock};

pub use filters::{CONTENT_FILTER_400_TRIGGER, CONTENT_FILTER_FINISH_TRIGGER};

/// The model snapshot Azure chat, completions and Responses answers name.
pub const AZURE_CHAT_MODEL: &str = "gpt-4o-2024-11-20";
/// The model Azure embeddings answers name.
pub const AZURE_EMBEDDING_MODEL: &str = "text-embedding-3-small";

/// The largest body a refused request is read to (it is recorded, never answered from).
const MAX_REFUSED_BODY_BYTES: usize = 1024 * 1024;

/// How long a 429 tells the client to wait when the injected failure names no `retry_after`.
const DEFAULT_RATE_LIMIT_RESET: std::time::Duration = std::time::Duration::from_secs(1);

pub(super) const INVALID_KEY: &str = "Access denied due to invalid subscription key or wrong API endpoint. \
     Make sure to provide a valid key for an active subscription and use a correct regional API \
     endpoint for your resource.";
pub(super) const INVALID_TOKEN: &str = "Unauthorized. Access token is missing, invalid, audience is \
     incorrect (https://cognitiveservices.azure.com), or have expired.";

/// Which Azure OpenAI operation a call is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Operation {
    ChatCompletions,
    Completions,
    Embeddings,
    Responses,
}

impl Operation {
    /// The operation's name in Azure's rate-limit messages.
    fn name(self) -> &'static str {
        match self {
            Self::ChatCompletions => "ChatCompletions_Create",
            Self::Completions => "Completions_Create",
            Self::Embeddings => "Embeddings_Create",
            Self::Responses => "Responses_Create",
        }
    }
}

/// Which of the two path shapes a route has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shape {
    /// `/openai/v1/...`: the deployment is the body's `model`.
    V1,
    /// `/openai/deployments/{deployment}/...` and `/openai/responses`: `api-version` required.
    Versioned,
}

/// The door's state: which keys open it, and who was turned away.
pub(super) struct Door {
    configured: Vec<String>,
    keys: Mutex<Vec<String>>,
    refused: Mutex<Vec<RecordedRequest>>,
}

impl Door {
    pub(super) fn new(keys: Vec<String>) -> Self {
        Self {
            keys: Mutex::new(keys.clone()),
            configured: keys,
            refused: Mutex::new(Vec::new()),
        }
    }

    pub(super) fn set_keys(&self, keys: Vec<String>) {
        *lock(&self.keys) = keys;
    }

    pub(super) fn refused(&self) -> Vec<RecordedRequest> {
        lock(&self.refused).clone()
    }

    pub(super) fn reset(&self) {
        self.set_keys(self.configured.clone());
        lock(&self.refused).clear();
    }

    /// An `api-key` opens the door if it is one of the keys, or any non-empty key when none
    /// are set.
    fn accepts_key(&self, key: &str) -> bool {
        let keys = lock(&self.keys);
        if keys.is_empty() {
            !key.is_empty()
        } else {
            keys.iter().any(|accepted| accepted == key)
        }
    }
}

impl Shared {
    /// Let an Azure request through the door, or answer it there: 404 for a versioned path
    /// without `api-version`, 401 without a credential that opens it. Refused requests are
    /// recorded apart from the calls.
    pub(super) async fn admit_azure(
        &self,
        request: Request,
        shape: Shape,
    ) -> Result<Request, Response> {
        let refusal = if shape == Shape::Versioned && api_version(request.uri().query()).is_none() {
            Some(azure_error(
                StatusCode::NOT_FOUND,
                "404",
                "Resource not found",
            ))
        } else {
            self.credential_refusal(&request)
        };
        let Some(refusal) = refusal else {
            return Ok(request);
        };
        let (parts, body) = request.into_parts();
        let body = axum::body::to_bytes(body, MAX_REFUSED_BODY_BYTES)
            .await
            .unwrap_or_default();
        lock(&self.azure.refused).push(RecordedRequest::of(&parts, body));
        Err(refusal)
    }

    /// Why the request's credential does not open the door, if it does not. An `api-key`
    /// header is judged first, as Azure does; then a bearer token.
    fn credential_refusal(&self, request: &Request) -> Option<Response> {
        let headers = request.headers();
        if let Some(key) = headers.get("api-key") {
            let key = key.to_str().unwrap_or_default();
            return (!self.azure.accepts_key(key))
                .then(|| azure_error(StatusCode::UNAUTHORIZED, "401", INVALID_KEY));
        }
        let Some(authorization) = headers.get(AUTHORIZATION) else {
            return Some(azure_error(StatusCode::UNAUTHORIZED, "401", INVALID_KEY));
        };
        let token = authorization
            .to_str()
            .ok()
            .and_then(|value| value.strip_prefix("Bearer "))
            .unwrap_or_default();
        (!self.entra.accepts(token.trim()))
            .then(|| azure_error(StatusCode::UNAUTHORIZED, "401", INVALID_TOKEN))
    }
}

/// The `api-version` query parameter, if the query has a non-empty one.
fn api_version(query: Option<&str>) -> Option<&str> {
    query?
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(name, _)| *name == "api-version")
        .map(|(_, value)| value)
        .filter(|value| !value.is_empty())
}

/// The deployment a versioned path names (`/openai/deployments/{deployment}/...`).
fn deployment_in(path: &str) -> Option<&str> {
    path.strip_prefix("/openai/deployments/")?
        .split('/')
        .next()
        .filter(|deployment| !deployment.is_empty())
}

/// The answer to an Azure call that passed the door: the OpenAI answer to the same request,
/// for the deployment's model snapshot, with Azure's annotations; or Azure's content-filter
/// verdict when the prompt asks for one.
pub(super) fn answer(
    operation: Operation,
    path: &str,
    body: &[u8],
    call: u64,
) -> Result<Answer, InvalidRequest> {
    let mut request = openai::parse_object(body)?;
    let deployment = match deployment_in(path) {
        Some(deployment) => deployment.to_owned(),
        None => openai::model(&request)?,
    };
    let verdict = filters::Verdict::of(operation, &request);
    if verdict == filters::Verdict::Blocked {
        return Ok(filters::prompt_blocked());
    }
    let model = match operation {
        Operation::Embeddings => deployment,
        _ => AZURE_CHAT_MODEL.to_owned(),
    };
    request.insert("model".to_owned(), Value::String(model));
    let prompt_chars = filters::prompt_chars(&request);
    let body = Value::Object(request).to_string();
    let body = body.as_bytes();
    let filtered = verdict == filters::Verdict::FinishFiltered;
    Ok(match operation {
        Operation::ChatCompletions => filters::annotate(
            openai::chat_completions(body, call)?,
            filters::Kind::Chat,
            filtered,
            prompt_chars,
        ),
        Operation::Completions => filters::annotate(
            openai::completions(body, call)?,
            filters::Kind::Completion,
            filtered,
            prompt_chars,
        ),
        Operation::Embeddings => match openai::embeddings(body)? {
            Answer::Json(mut answer) => {
                answer["model"] = json!(AZURE_EMBEDDING_MODEL);
                Answer::Json(answer)
            }
            other => other,
        },
        Operation::Responses => super::responses::responses(body, call)?,
    })
}

/// An error in Azure's own shape, `{"error":{"code","message"}}`, the code a string.
pub(super) fn azure_error(status: StatusCode, code: &str, message: &str) -> Response {
    let body = json!({"error": {"code": code, "message": message}});
    (status, Json(body)).into_response()
}

/// An injected failure on an Azure path, as Azure words it: a 429 names the operation and the
/// API version, says when to retry, and carries the rate-limit headers Azure sends.
pub(super) fn failure(
    failure: &FailureMode,
    status: StatusCode,
    operation: Operation,
    query: Option<&str>,
) -> Response {
    let code = failure
        .code
        .clone()
        .unwrap_or_else(|| status.as_u16().to_string());
    let wait = failure.retry_after.unwrap_or(DEFAULT_RATE_LIMIT_RESET);
    let wait_secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    let message = if status == StatusCode::TOO_MANY_REQUESTS {
        format!(
            "Requests to the {} Operation under Azure OpenAI API version {} have exceeded token \
             rate limit of your current OpenAI S0 pricing tier. Please retry after {wait_secs} \
             seconds. Please go here: https://aka.ms/oai/quotaincrease if you would like to \
             further increase the default rate limit.",
            operation.name(),
            api_version(query).unwrap_or("v1"),
        )
    } else {
        format!("The mock provider injected a failure ({status}).")
    };
    let mut response = azure_error(status, &code, &message);
    let headers = response.headers_mut();
    if let Some(retry_after) = failure.retry_after {
        let millis = retry_after.as_nanos().div_ceil(1_000_000);
        headers.insert(RETRY_AFTER, HeaderValue::from(wait_secs));
        if let Ok(millis) = HeaderValue::try_from(millis.to_string()) {
            headers.insert(HeaderName::from_static("retry-after-ms"), millis);
        }
    }
    if status == StatusCode::TOO_MANY_REQUESTS {
        headers.insert(
            HeaderName::from_static("x-ratelimit-remaining-requests"),
            HeaderValue::from_static("0"),
        );
        if let Ok(reset) = HeaderValue::try_from(reset_duration(wait)) {
            headers.insert(HeaderName::from_static("x-ratelimit-reset-requests"), reset);
        }
    }
    response
}

/// A duration as the `x-ratelimit-reset-*` headers write one: `250ms`, `2s`, `1.5s`.
fn reset_duration(wait: std::time::Duration) -> String {
    let millis = wait.as_millis();
    if millis < 1000 {
        format!("{}ms", millis.max(1))
    } else if millis % 1000 == 0 {
        format!("{}s", millis / 1000)
    } else {
        let seconds = format!("{:.3}", wait.as_secs_f64());
        format!("{}s", seconds.trim_end_matches('0'))
    }
}
