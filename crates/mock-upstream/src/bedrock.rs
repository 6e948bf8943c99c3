//! Amazon Bedrock Runtime's surface for Anthropic models: `InvokeModel` (`POST
//! /model/{modelId}/invoke`) and `InvokeModelWithResponseStream` (`POST
//! /model/{modelId}/invoke-with-response-stream`), answered with the Messages content the
//! Anthropic surface gives (`anthropic.rs`), behind AWS's own door.
//!
//! The body is a Messages body as Bedrock takes it: no `model` (the path names it,
//! percent-encoded: `us.anthropic.claude-sonnet-4-5-20250929-v1%3A0`), no `stream` (the path
//! says that too), `"anthropic_version": "bedrock-2023-05-31"` (or the dated API version the
//! current `anthropic` SDK sends, [`BEDROCK_ANTHROPIC_VERSIONS`]) and betas as `anthropic_beta`
//! instead of headers. A body that breaks those rules is refused with a 400
//! `ValidationException` worded as Bedrock words it.
//!
//! The door checks the credential before anything is billed: a SigV4 signature (service
//! `bedrock`, the configured region) made with the mock's AWS credentials, checked by
//! `sigv4_check.rs`, or `Authorization: Bearer` with an accepted Bedrock API key. Refused
//! requests (403 with AWS's `x-amzn-ErrorType`) are no calls; they are kept apart, like
//! Azure's. Errors take Bedrock's shape, `{"message"}` plus `x-amzn-ErrorType`; a stream is
//! AWS event-stream frames (`eventstream.rs`).

mod eventstream;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use percent_encoding::percent_decode_str;
use serde_json::{Map, Value, json};

use super::openai::{Answer, InvalidRequest, SseEvents, message_text};
use super::sigv4_check::{self, Expected, SigV4Error};
use super::{FailureMode, MockProvider, RecordedRequest, Shared, lock};

/// The access key id the mock's AWS credentials have unless configured otherwise (AWS's own
/// documentation example: obviously no real key).
pub const BEDROCK_TEST_ACCESS_KEY_ID: &str = "AKIAIOSFODNN7EXAMPLE";
/// The secret access key that goes with [`BEDROCK_TEST_ACCESS_KEY_ID`].
pub const BEDROCK_TEST_SECRET_ACCESS_KEY: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
/// The Bedrock API key accepted as `Authorization: Bearer` unless configured otherwise (shaped
/// like Bedrock's long-term keys, `ABSK` and base64).
pub const BEDROCK_TEST_API_KEY: &str = "ABSKbW9jay11cHN0cmVhbTp0ZXN0LWJlZHJvY2sta2V5";
/// The region signatures must be scoped to unless configured otherwise.
pub const BEDROCK_DEFAULT_REGION: &str = "us-east-1";
/// The `anthropic_version` Bedrock documents for a body.
pub const BEDROCK_ANTHROPIC_VERSION: &str = "bedrock-2023-05-31";
/// Every `anthropic_version` Bedrock accepts: its own, and the API version the `anthropic` SDK's
/// `AnthropicBedrock` sends since its 2.0 (the SDK's `ANTHROPIC_API_VERSION`). Any other value,
/// Anthropic's older `2023-06-01` included, is a `ValidationException`.
pub const BEDROCK_ANTHROPIC_VERSIONS: [&str; 2] = [BEDROCK_ANTHROPIC_VERSION, "2026-10-21"];
/// In a user message of a streamed call: the stream sends its first chunks, then a
/// `throttlingException` frame, and ends.
pub const BEDROCK_THROTTLE_MIDSTREAM_TRIGGER: &str = "[[bedrock_throttle_midstream]]";
/// In a user message: the call is answered 429 `ModelNotReadyException`.
pub const BEDROCK_MODEL_NOT_READY_TRIGGER: &str = "[[bedrock_model_not_ready]]";

/// The service name signatures are scoped to.
const SERVICE: &str = "bedrock";
/// The largest request body the door reads (as the billable path does).
const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;
/// The header AWS names an error's type in.
const ERROR_TYPE: &str = "x-amzn-errortype";
/// Where a blocked answer's body carries its error type to [`blocked`], which moves it to the
/// header.
const BLOCKED_TYPE_FIELD: &str = "__type";

/// AWS credentials a SigV4 signature must be made with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwsCredentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    /// When set, requests must send it as `x-amz-security-token` (temporary credentials).
    pub session_token: Option<String>,
}

impl AwsCredentials {
    /// Long-term credentials, without a session token.
    pub fn new(access_key_id: impl Into<String>, secret_access_key: impl Into<String>) -> Self {
        Self {
            access_key_id: access_key_id.into(),
            secret_access_key: secret_access_key.into(),
            session_token: None,
        }
    }

    /// The same credentials as temporary ones, with their session token.
    pub fn with_session_token(mut self, session_token: impl Into<String>) -> Self {
        self.session_token = Some(session_token.into());
        self
    }
}

impl Default for AwsCredentials {
    /// [`BEDROCK_TEST_ACCESS_KEY_ID`] and [`BEDROCK_TEST_SECRET_ACCESS_KEY`], no session token.
    fn default() -> Self {
        Self::new(BEDROCK_TEST_ACCESS_KEY_ID, BEDROCK_TEST_SECRET_ACCESS_KEY)
    }
}

/// Who Bedrock's door lets in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BedrockSettings {
    /// The credentials SigV4 signatures are checked against.
    pub credentials: AwsCredentials,
    /// The region signatures must be scoped to.
    pub region: String,
    /// Bedrock API keys accepted as `Authorization: Bearer`; empty accepts none.
    pub api_keys: Vec<String>,
}

impl Default for BedrockSettings {
    /// The test credentials, [`BEDROCK_DEFAULT_REGION`], and [`BEDROCK_TEST_API_KEY`].
    fn default() -> Self {
        Self {
            credentials: AwsCredentials::default(),
            region: BEDROCK_DEFAULT_REGION.to_owned(),
            api_keys: vec![BEDROCK_TEST_API_KEY.to_owned()],
        }
    }
}

/// Which Bedrock Runtime operation a call is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Operation {
    /// `InvokeModel`: one JSON answer.
    Invoke,
    /// `InvokeModelWithResponseStream`: event-stream frames.
    InvokeStream,
}

/// The door's state: who it lets in, who it turned away, and how many signatures it checked.
pub(super) struct Door {
    configured: BedrockSettings,
    current: Mutex<BedrockSettings>,
    refused: Mutex<Vec<RecordedRequest>>,
    sigv4_verified: AtomicU64,
}

impl Door {
    pub(super) fn new(settings: BedrockSettings) -> Self {
        Self {
            current: Mutex::new(settings.clone()),
            configured: settings,
            refused: Mutex::new(Vec::new()),
            sigv4_verified: AtomicU64::new(0),
        }
    }

    pub(super) fn reset(&self) {
        *lock(&self.current) = self.configured.clone();
        lock(&self.refused).clear();
        self.sigv4_verified.store(0, Ordering::Relaxed);
    }

    /// Whether the request's credential opens the door: an accepted API key as a bearer, or a
    /// valid signature (counted in `sigv4_verified`).
    fn check(&self, parts: &Parts, body: &[u8]) -> Result<(), SigV4Error> {
        let settings = lock(&self.current).clone();
        let authorization = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|value| value.to_str().ok());
        if let Some(key) = authorization.and_then(|value| value.strip_prefix("Bearer ")) {
            let key = key.trim();
            return if settings.api_keys.iter().any(|accepted| accepted == key) {
                Ok(())
            } else {
                Err(SigV4Error::UnrecognizedClient)
            };
        }
        let expected = Expected {
            access_key_id: &settings.credentials.access_key_id,
            secret_access_key: &settings.credentials.secret_access_key,
            session_token: settings.credentials.session_token.as_deref(),
            region: &settings.region,
            service: SERVICE,
        };
        sigv4_check::verify(&expected, parts, body, SystemTime::now())?;
        self.sigv4_verified.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

impl Shared {
    /// Let a Bedrock request through the door, its body read (the signature covers it) and
    /// put back, or answer it there with AWS's 403. Refused requests are recorded apart.
    pub(super) async fn admit_bedrock(&self, request: Request) -> Result<Request, Response> {
        let (parts, body) = request.into_parts();
        let Ok(body) = axum::body::to_bytes(body, MAX_BODY_BYTES).await else {
            return Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "The request body is too large.",
            ));
        };
        match self.bedrock.check(&parts, &body) {
            Ok(()) => Ok(Request::from_parts(parts, Body::from(body))),
            Err(refusal) => {
                tracing::debug!(%refusal, "mock provider: Bedrock door refused a request");
                lock(&self.bedrock.refused).push(RecordedRequest::of(&parts, body));
                Err(typed_error(
                    StatusCode::FORBIDDEN,
                    refusal.error_type(),
                    &refusal.to_string(),
                ))
            }
        }
    }
}

impl MockProvider {
    /// The Bedrock Runtime endpoint of this mock, `http://127.0.0.1:PORT` (what boto3's
    /// `endpoint_url` and `AnthropicBedrock(base_url=...)` take).
    pub fn bedrock_endpoint(&self) -> String {
        format!("http://{}", self.inner.addr)
    }

    /// From now on, SigV4 signatures are checked against these credentials.
    pub fn set_aws_credentials(&self, credentials: AwsCredentials) {
        lock(&self.inner.shared.bedrock.current).credentials = credentials;
    }

    /// From now on, signatures must be scoped to `region`.
    pub fn set_aws_region(&self, region: impl Into<String>) {
        lock(&self.inner.shared.bedrock.current).region = region.into();
    }

    /// From now on, Bedrock accepts exactly these API keys as `Authorization: Bearer`; an empty
    /// list accepts none.
    pub fn set_bedrock_api_keys(&self, keys: Vec<String>) {
        lock(&self.inner.shared.bedrock.current).api_keys = keys;
    }

    /// Bedrock requests whose SigV4 signature was checked and found valid since start or the
    /// last reset: proof that a signature was really verified, not just present.
    pub fn sigv4_verified(&self) -> u64 {
        self.inner
            .shared
            .bedrock
            .sigv4_verified
            .load(Ordering::Relaxed)
    }

    /// Bedrock requests turned away at the door (403) since start or the last reset, in
    /// arrival order, bodies included. They are not calls: nothing was billed, held or scripted.
    pub fn bedrock_refused(&self) -> Vec<RecordedRequest> {
        lock(&self.inner.shared.bedrock.refused).clone()
    }
}

/// `GET /__mock/bedrock`: the door's counters, for the binary.
pub(super) fn router() -> Router<Arc<Shared>> {
    Router::new().route("/__mock/bedrock", get(door_counters))
}

async fn door_counters(State(shared): State<Arc<Shared>>) -> Response {
    Json(json!({
        "sigv4_verified": shared.bedrock.sigv4_verified.load(Ordering::Relaxed),
        "refused": lock(&shared.bedrock.refused).len(),
    }))
    .into_response()
}

/// The answer to a Bedrock call that passed the door: the Anthropic Messages answer to the
/// same request for the model the path names, as JSON or as event-stream frames.
pub(super) fn answer(
    operation: Operation,
    path: &str,
    body: &[u8],
    call: u64,
) -> Result<Answer, InvalidRequest> {
    let model = model_in(path)?;
    let mut request = parse_body(body)?;
    let betas = request.remove("anthropic_beta");
    request.remove("anthropic_version");
    if says(&request, BEDROCK_MODEL_NOT_READY_TRIGGER) {
        return Ok(Answer::Blocked {
            status: StatusCode::TOO_MANY_REQUESTS,
            body: json!({
                "message": "Model is not ready for inference. Wait and try your request again.",
                BLOCKED_TYPE_FIELD: "ModelNotReadyException",
            }),
        });
    }
    let throttled = says(&request, BEDROCK_THROTTLE_MIDSTREAM_TRIGGER);
    let stream = operation == Operation::InvokeStream;
    request.insert("model".to_owned(), Value::String(model));
    request.insert("stream".to_owned(), Value::Bool(stream));
    let headers = anthropic_headers(betas.as_ref())?;
    let body = Value::Object(request).to_string();
    match super::anthropic::messages(&headers, body.as_bytes(), call)? {
        Answer::Stream(events) => framed(events, throttled),
        other => Ok(other),
    }
}

/// The model id the path names, percent-decoded.
fn model_in(path: &str) -> Result<String, InvalidRequest> {
    let encoded = path
        .strip_prefix("/model/")
        .and_then(|rest| rest.rsplit_once('/'))
        .map(|(model, _operation)| model)
        .unwrap_or_default();
    match percent_decode_str(encoded).decode_utf8() {
        Ok(model) if !model.is_empty() => Ok(model.into_owned()),
        _ => Err(InvalidRequest::new(
            "The provided model identifier is invalid.",
        )),
    }
}

/// The body as a JSON object, checked against Bedrock's schema for Anthropic models.
fn parse_body(body: &[u8]) -> Result<Map<String, Value>, InvalidRequest> {
    let malformed = |detail: &str| {
        InvalidRequest::new(format!(
            "Malformed input request: {detail}, please reformat your input and try again."
        ))
    };
    let Ok(Value::Object(request)) = serde_json::from_slice::<Value>(body) else {
        return Err(malformed("#: expected type: JSONObject"));
    };
    for key in ["model", "stream"] {
        if request.contains_key(key) {
            return Err(malformed(&format!(
                "#: extraneous key [{key}] is not permitted"
            )));
        }
    }
    match request.get("anthropic_version") {
        None => Err(malformed("#: required key [anthropic_version] not found")),
        Some(Value::String(version)) if BEDROCK_ANTHROPIC_VERSIONS.contains(&version.as_str()) => {
            Ok(request)
        }
        Some(other) => Err(InvalidRequest::new(format!(
            "Invalid API version: {other}. Supported: {}.",
            BEDROCK_ANTHROPIC_VERSIONS.join(", ")
        ))),
    }
}

/// The headers the Messages answer expects: the version, and the body's betas as one
/// `anthropic-beta` list.
fn anthropic_headers(betas: Option<&Value>) -> Result<HeaderMap, InvalidRequest> {
    let mut headers = HeaderMap::new();
    headers.insert(
        "anthropic-version",
        HeaderValue::from_static(BEDROCK_ANTHROPIC_VERSION),
    );
    let betas: Vec<&str> = match betas {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list.iter().filter_map(Value::as_str).collect(),
        Some(_) => {
            return Err(InvalidRequest::new(
                "Malformed input request: #/anthropic_beta: expected type: JSONArray, please \
                 reformat your input and try again.",
            ));
        }
    };
    if !betas.is_empty() {
        let value = HeaderValue::try_from(betas.join(","))
            .map_err(|_| InvalidRequest::new("anthropic_beta: invalid beta name"))?;
        headers.insert("anthropic-beta", value);
    }
    Ok(headers)
}

/// Whether a user message of the request contains `trigger`.
fn says(request: &Map<String, Value>, trigger: &str) -> bool {
    request
        .get("messages")
        .and_then(Value::as_array)
        .is_some_and(|messages| {
            messages.iter().any(|message| {
                message.get("role").and_then(Value::as_str) == Some("user")
                    && message_text(message).contains(trigger)
            })
        })
}

/// The Messages SSE events as event-stream chunks; `message_stop` carries Bedrock's
/// invocation metrics. Throttled: the chunks up to the first content delta, then Bedrock's
/// `throttlingException`.
fn framed(events: SseEvents, throttled: bool) -> Result<Answer, InvalidRequest> {
    let broken = |error: eventstream::FrameError| {
        InvalidRequest::new(format!("The response could not be framed: {error}"))
    };
    let (mut input_tokens, mut output_tokens) = (0, 0);
    let mut frames = Vec::with_capacity(events.events.len() + 1);
    for event in &events.events {
        let Some(mut event) = sse_data(event) else {
            continue;
        };
        match event["type"].as_str() {
            Some("message_start") => {
                input_tokens = event["message"]["usage"]["input_tokens"]
                    .as_u64()
                    .unwrap_or(0);
            }
            Some("message_delta") => {
                output_tokens = event["usage"]["output_tokens"].as_u64().unwrap_or(0);
            }
            Some("message_stop") => {
                event["amazon-bedrock-invocationMetrics"] = json!({
                    "inputTokenCount": input_tokens,
                    "outputTokenCount": output_tokens,
                    "invocationLatency": 0,
                    "firstByteLatency": 0,
                });
            }
            _ => {}
        }
        frames.push(eventstream::chunk(event.to_string().as_bytes()).map_err(broken)?);
    }
    if throttled {
        frames.truncate(events.first_content + 1);
        frames.push(
            eventstream::exception(
                "throttlingException",
                "Too many requests, please wait before trying again.",
            )
            .map_err(broken)?,
        );
    }
    Ok(Answer::Stream(SseEvents {
        events: frames,
        content_type: eventstream::CONTENT_TYPE,
        first_content: events.first_content,
        padding: None,
    }))
}

/// The JSON of one `event: ...\ndata: {...}\n\n` frame.
fn sse_data(frame: &Bytes) -> Option<Value> {
    let text = std::str::from_utf8(frame).ok()?;
    let data = text.split_once("\ndata: ")?.1.trim_end();
    serde_json::from_str(data).ok()
}

/// A response stream names the content type of the chunks it carries in
/// `x-amzn-bedrock-content-type` (what boto3 reports as `contentType`); other answers pass as
/// they are.
pub(super) fn with_stream_headers(mut response: Response) -> Response {
    let streamed = response
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|value| value == eventstream::CONTENT_TYPE);
    if response.status().is_success() && streamed {
        response.headers_mut().insert(
            HeaderName::from_static("x-amzn-bedrock-content-type"),
            HeaderValue::from_static("application/json"),
        );
    }
    response
}

/// An error in Bedrock's shape, its type chosen by the status as Bedrock's are.
pub(super) fn error(status: StatusCode, message: &str) -> Response {
    typed_error(status, error_type(status), message)
}

/// A blocked answer (model not ready): the status and `{"message"}`, the type in the header.
pub(super) fn blocked(status: StatusCode, mut body: Value) -> Response {
    let kind = body
        .as_object_mut()
        .and_then(|body| body.remove(BLOCKED_TYPE_FIELD))
        .and_then(|kind| kind.as_str().map(str::to_owned))
        .unwrap_or_else(|| error_type(status).to_owned());
    let message = body["message"].as_str().unwrap_or_default();
    typed_error(status, &kind, message)
}

/// An injected failure on a Bedrock path: `FailureMode.code` names the type when set.
pub(super) fn failure(failure: &FailureMode, status: StatusCode) -> Response {
    let kind = failure
        .code
        .clone()
        .unwrap_or_else(|| error_type(status).to_owned());
    let message = match kind.as_str() {
        "ThrottlingException" => "Too many requests, please wait before trying again.",
        "ModelNotReadyException" => {
            "Model is not ready for inference. Wait and try your request again."
        }
        "ServiceUnavailableException" => "Bedrock is unable to process your request.",
        "InternalServerException" => "The server encountered an internal error.",
        "ModelTimeoutException" => "Model has timed out in processing the request.",
        _ => "The mock provider injected a failure.",
    };
    let mut response = typed_error(status, &kind, message);
    if let Some(retry_after) = failure.retry_after {
        let seconds = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

/// Bedrock's error type for a status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        403 => "AccessDeniedException",
        404 => "ResourceNotFoundException",
        408 => "ModelTimeoutException",
        424 => "ModelErrorException",
        429 => "ThrottlingException",
        503 => "ServiceUnavailableException",
        400..=499 => "ValidationException",
        _ => "InternalServerException",
    }
}

/// `{"message"}` with the type in `x-amzn-ErrorType`, as the AWS SDKs read it.
fn typed_error(status: StatusCode, kind: &str, message: &str) -> Response {
    let mut response = (status, Json(json!({"message": message}))).into_response();
    if let Ok(kind) = HeaderValue::try_from(kind) {
        response
            .headers_mut()
            .insert(HeaderName::from_static(ERROR_TYPE), kind);
    }
    response
}
