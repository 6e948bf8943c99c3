//! The mock's HTTP layer: the router, the path every billable call takes (record, hold, latency,
//! script or failure or answer) and the headers every response carries; a streamed answer is
//! delivered by `delivery.rs`. Azure's routes pass Azure's door (`azure.rs`), Bedrock's pass
//! AWS's (`bedrock.rs`) and Vertex AI's pass Vertex's (`vertex.rs`) before they take that path;
//! Entra's and Google's token endpoints (`entra.rs`, `google_token.rs`) are not billable.

use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::header::{CONTENT_TYPE, RETRY_AFTER, SET_COOKIE};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use bytes::Bytes;
use serde_json::json;

use super::admin;
use super::anthropic;
use super::azure::{self, Operation, Shape};
use super::bedrock;
use super::delivery::{self, Delivery};
use super::entra;
use super::gemini;
use super::google_token;
use super::openai::{self, Answer, InvalidRequest};
use super::vertex::{self, Publisher};
use super::{FailureMode, RecordedRequest, Scripted, Shared};

/// Largest request body read; generous because load tests send long prompts.
const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// The full router of a mock provider.
pub(super) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/responses", post(responses))
        .route(
            "/v1/responses/{id}",
            get(stored_response).fallback(not_found),
        )
        .route("/v1/files", post(create_file).fallback(not_found))
        .route("/v1/files/{id}", get(read_file).fallback(not_found))
        .route("/v1/audio/transcriptions", post(transcriptions))
        .route("/v1/images/generations", post(image_generations))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model).post(gemini_v1_call))
        .route("/v1/messages", post(messages))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .route("/v1beta/models", get(gemini_models))
        .route("/v1beta/models/{target}", post(gemini_call))
        .route(
            "/openai/v1/chat/completions",
            post(azure_v1_chat_completions),
        )
        .route("/openai/v1/completions", post(azure_v1_completions))
        .route("/openai/v1/embeddings", post(azure_v1_embeddings))
        .route("/openai/v1/responses", post(azure_v1_responses))
        .route(
            "/openai/deployments/{deployment}/chat/completions",
            post(azure_chat_completions),
        )
        .route(
            "/openai/deployments/{deployment}/completions",
            post(azure_completions),
        )
        .route(
            "/openai/deployments/{deployment}/embeddings",
            post(azure_embeddings),
        )
        .route("/openai/responses", post(azure_responses))
        .route("/openai/{*rest}", any(azure_not_found))
        .route("/v1/projects/{*target}", post(vertex_call))
        .route("/v1beta1/projects/{*target}", post(vertex_call))
        .route("/model/{model_id}/invoke", post(bedrock_invoke))
        .route(
            "/model/{model_id}/invoke-with-response-stream",
            post(bedrock_invoke_stream),
        )
        .merge(bedrock::router())
        .merge(entra::router())
        .merge(google_token::router())
        .merge(admin::router())
        .fallback(not_found)
        .layer(middleware::from_fn(provider_headers))
        .layer(middleware::from_fn_with_state(
            shared.clone(),
            note_received,
        ))
        .with_state(shared)
}

/// Which billable endpoint a call hit.
#[derive(Debug, Clone, Copy)]
enum Endpoint {
    ChatCompletions,
    Completions,
    Embeddings,
    AudioTranscriptions,
    ImageGenerations,
    Responses,
    Messages,
    CountTokens,
    /// Gemini's `models/{model}:{method}`.
    Gemini,
    /// An Azure OpenAI operation, past Azure's door.
    Azure(Operation),
    /// A Vertex AI model method, past Vertex's door.
    Vertex(Publisher),
    /// A Bedrock Runtime operation, past Bedrock's door.
    Bedrock(bedrock::Operation),
}

impl Endpoint {
    /// Whether the endpoint is Anthropic's: its errors take Anthropic's shape.
    fn is_anthropic(self) -> bool {
        matches!(self, Self::Messages | Self::CountTokens)
    }

    /// An error in this endpoint's API's shape; `code` is OpenAI's only.
    fn error(self, status: StatusCode, kind: &str, message: &str, code: Option<&str>) -> Response {
        if self.is_anthropic() {
            anthropic::error(status, kind, message)
        } else if let Self::Gemini = self {
            gemini::error(status, message)
        } else if let Self::Vertex(publisher) = self {
            vertex::error(publisher, status, message)
        } else if let Self::Bedrock(_) = self {
            bedrock::error(status, message)
        } else {
            openai_error(status, kind, message, code)
        }
    }
}

/// The call number of a billable response, for the headers added by [`provider_headers`].
#[derive(Debug, Clone, Copy)]
struct CallNumber(u64);

async fn chat_completions(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    billable(&shared, Endpoint::ChatCompletions, request).await
}

async fn completions(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    billable(&shared, Endpoint::Completions, request).await
}

async fn embeddings(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    billable(&shared, Endpoint::Embeddings, request).await
}

async fn responses(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    billable(&shared, Endpoint::Responses, request).await
}

async fn transcriptions(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    billable(&shared, Endpoint::AudioTranscriptions, request).await
}

async fn image_generations(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    billable(&shared, Endpoint::ImageGenerations, request).await
}

async fn messages(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    billable(&shared, Endpoint::Messages, request).await
}

async fn count_tokens(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    billable(&shared, Endpoint::CountTokens, request).await
}

async fn gemini_call(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    billable(&shared, Endpoint::Gemini, request).await
}

async fn azure_v1_chat_completions(
    State(shared): State<Arc<Shared>>,
    request: Request,
) -> Response {
    azure_call(&shared, Operation::ChatCompletions, Shape::V1, request).await
}

async fn azure_v1_completions(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    azure_call(&shared, Operation::Completions, Shape::V1, request).await
}

async fn azure_v1_embeddings(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    azure_call(&shared, Operation::Embeddings, Shape::V1, request).await
}

async fn azure_v1_responses(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    azure_call(&shared, Operation::Responses, Shape::V1, request).await
}

async fn azure_chat_completions(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    azure_call(
        &shared,
        Operation::ChatCompletions,
        Shape::Versioned,
        request,
    )
    .await
}

async fn azure_completions(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    azure_call(&shared, Operation::Completions, Shape::Versioned, request).await
}

async fn azure_embeddings(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    azure_call(&shared, Operation::Embeddings, Shape::Versioned, request).await
}

async fn azure_responses(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    azure_call(&shared, Operation::Responses, Shape::Versioned, request).await
}

/// An Azure call: through Azure's door, then billed like any other.
async fn azure_call(
    shared: &Arc<Shared>,
    operation: Operation,
    shape: Shape,
    request: Request,
) -> Response {
    match shared.admit_azure(request, shape).await {
        Ok(request) => billable(shared, Endpoint::Azure(operation), request).await,
        Err(refusal) => refusal,
    }
}

/// A Vertex AI call: through Vertex's door, then billed like any other.
async fn vertex_call(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    match shared.admit_vertex(request.uri().path(), request.headers()) {
        Ok(publisher) => billable(&shared, Endpoint::Vertex(publisher), request).await,
        Err(refusal) => refusal.response(request.uri().path()),
    }
}

async fn bedrock_invoke(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    bedrock_call(&shared, bedrock::Operation::Invoke, request).await
}

async fn bedrock_invoke_stream(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    bedrock_call(&shared, bedrock::Operation::InvokeStream, request).await
}

/// A Bedrock call: through Bedrock's door (AWS credentials), then billed like any other.
async fn bedrock_call(
    shared: &Arc<Shared>,
    operation: bedrock::Operation,
    request: Request,
) -> Response {
    match shared.admit_bedrock(request).await {
        Ok(request) => {
            let answer = billable(shared, Endpoint::Bedrock(operation), request).await;
            bedrock::with_stream_headers(answer)
        }
        Err(refusal) => refusal,
    }
}

/// Any other path under `/openai/`: Azure's 404.
async fn azure_not_found() -> Response {
    azure::azure_error(StatusCode::NOT_FOUND, "404", "Resource not found")
}

/// `POST /v1/models/{target}`: Gemini's `models/{model}:{method}` as the 3.x SDKs send it; any
/// other POST there is no route of either API (`GET` stays OpenAI's model lookup).
async fn gemini_v1_call(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    if gemini::is_method_path(request.uri().path()) {
        billable(&shared, Endpoint::Gemini, request).await
    } else {
        not_found(request).await
    }
}

async fn gemini_models() -> Response {
    Json(gemini::models()).into_response()
}

async fn models(State(shared): State<Arc<Shared>>) -> Response {
    Json(openai::models(shared.settings.models.as_deref())).into_response()
}

/// `GET /v1/models/{id}`: one model of the list, or OpenAI's 404 for one it does not serve.
async fn model(State(shared): State<Arc<Shared>>, Path(id): Path<String>) -> Response {
    match openai::listed_model(shared.settings.models.as_deref(), &id) {
        Some(model) => Json(model).into_response(),
        None => openai_error(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            &format!("The model `{id}` does not exist or you do not have access to it."),
            Some("model_not_found"),
        ),
    }
}

/// Notes every request line but the admin calls, before routing: a request for a path the
/// mock does not know is evidence too (of one that should never have left the gateway).
async fn note_received(
    State(shared): State<Arc<Shared>>,
    request: Request,
    next: Next,
) -> Response {
    let uri = request.uri();
    if !uri.path().starts_with("/__mock/") {
        let target = uri.path_and_query().map_or("/", |target| target.as_str());
        let line = format!("{} {target}", request.method());
        super::lock(&shared.received).push(line);
    }
    next.run(request).await
}

async fn not_found(request: Request) -> Response {
    openai_error(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        &format!(
            "Unknown request URL: {} {}.",
            request.method(),
            request.uri().path()
        ),
        None,
    )
}

/// The life of a billable call.
///
/// It is counted and recorded first, so that a test waiting for the call sees it even while it
/// is held. A script wins over failure injection, which wins over the computed answer; failure is
/// rolled after the hold, so a test can hold calls, switch failure on and release them into it.
async fn billable(shared: &Arc<Shared>, endpoint: Endpoint, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, MAX_BODY_BYTES).await;
    let recorded = RecordedRequest::of(
        &parts,
        body.as_ref().map_or_else(|_| Bytes::new(), Bytes::clone),
    );
    let arrival = shared.arrive(recorded);
    tracing::debug!(call = arrival.call, ?endpoint, "mock provider call");

    if let Some(generation) = arrival.held_in {
        shared.wait_out_hold(generation).await;
    }
    let latency = shared.latency();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }

    let mut response = if let Some(script) = arrival.script {
        scripted_response(script)
    } else if let Some(failure) = shared.failure().filter(rolls_failure) {
        failure_response(&failure, endpoint, parts.uri.query())
    } else {
        match body {
            Err(error) => endpoint.error(
                StatusCode::PAYLOAD_TOO_LARGE,
                if endpoint.is_anthropic() {
                    "request_too_large"
                } else {
                    "invalid_request_error"
                },
                &format!("Could not read the request body: {error}."),
                None,
            ),
            Ok(body) => {
                let answer = match endpoint {
                    Endpoint::ChatCompletions => openai::chat_completions(&body, arrival.call),
                    Endpoint::Completions => openai::completions(&body, arrival.call),
                    Endpoint::Embeddings => openai::embeddings(&body),
                    Endpoint::AudioTranscriptions => Ok(openai::transcription(&body)),
                    Endpoint::ImageGenerations => openai::image_generation(&body),
                    Endpoint::Responses => super::responses::responses(&body, arrival.call),
                    Endpoint::Messages => anthropic::messages(&parts.headers, &body, arrival.call),
                    Endpoint::CountTokens => anthropic::count_tokens(&parts.headers, &body),
                    Endpoint::Gemini => {
                        gemini::call(parts.uri.path(), parts.uri.query(), &body, arrival.call)
                    }
                    Endpoint::Azure(operation) => {
                        azure::answer(operation, parts.uri.path(), &body, arrival.call)
                    }
                    Endpoint::Vertex(_) => vertex::answer(
                        parts.uri.path(),
                        parts.uri.query(),
                        &parts.headers,
                        &body,
                        arrival.call,
                    ),
                    Endpoint::Bedrock(operation) => {
                        bedrock::answer(operation, parts.uri.path(), &body, arrival.call)
                    }
                };
                match (endpoint, &answer) {
                    (
                        Endpoint::Embeddings | Endpoint::Azure(Operation::Embeddings),
                        Ok(Answer::Json(_)),
                    ) => {
                        shared.embedded(openai::embedding_inputs(&body));
                    }
                    (Endpoint::Gemini, Ok(_)) => {
                        shared.embedded(gemini::embedded_texts(parts.uri.path(), &body));
                    }
                    _ => {}
                }
                match answer {
                    Ok(Answer::Json(value)) => Json(value).into_response(),
                    Ok(Answer::Blocked { status, body }) => match endpoint {
                        Endpoint::Bedrock(_) => bedrock::blocked(status, body),
                        _ => (status, Json(body)).into_response(),
                    },
                    Ok(Answer::Stream(events)) => delivery::sse_response(
                        Arc::clone(shared),
                        events,
                        Delivery {
                            first: shared.settings.stream_first_event_delay,
                            delay: shared.settings.stream_chunk_delay,
                            truncate: shared.truncate_streams(),
                            pad_to: shared.stream_padding(),
                        },
                    ),
                    Err(InvalidRequest(message)) => endpoint.error(
                        StatusCode::BAD_REQUEST,
                        "invalid_request_error",
                        &message,
                        None,
                    ),
                }
            }
        }
    };
    response.extensions_mut().insert(CallNumber(arrival.call));
    response
}

/// Whether this call is one of the `fraction` that fail.
fn rolls_failure(failure: &FailureMode) -> bool {
    // `random_bool` would panic outside [0, 1]; comparing handles any fraction, NaN included.
    rand::random::<f64>() < failure.fraction
}

/// A canned response, byte for byte; headers that cannot be sent are logged and skipped.
fn scripted_response(script: Scripted) -> Response {
    let mut response = Response::new(Body::from(script.body));
    *response.status_mut() = status_or_500(script.status);
    let headers = response.headers_mut();
    for (name, value) in &script.headers {
        match (
            HeaderName::try_from(name.as_str()),
            HeaderValue::try_from(value.as_str()),
        ) {
            (Ok(name), Ok(value)) => {
                headers.append(name, value);
            }
            _ => tracing::warn!(
                name,
                value,
                "mock provider: skipping invalid scripted header"
            ),
        }
    }
    if !headers.contains_key(CONTENT_TYPE) {
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    response
}

/// An injected failure, shaped like the provider's own errors. Anthropic sends
/// `retry-after` in seconds only; OpenAI adds the precise `retry-after-ms`; Gemini's is
/// `gemini::failure`'s.
fn failure_response(failure: &FailureMode, endpoint: Endpoint, query: Option<&str>) -> Response {
    let status = status_or_500(failure.status);
    if let Endpoint::Gemini | Endpoint::Vertex(_) = endpoint {
        return gemini::failure(failure, status);
    }
    if let Endpoint::Azure(operation) = endpoint {
        return azure::failure(failure, status, operation, query);
    }
    if let Endpoint::Bedrock(_) = endpoint {
        return bedrock::failure(failure, status);
    }
    if endpoint.is_anthropic() {
        let message = match status.as_u16() {
            529 => "Overloaded".to_owned(),
            _ => format!("The mock provider injected a failure ({status})."),
        };
        let mut response = anthropic::error(status, anthropic::error_type(status), &message);
        if let Some(retry_after) = failure.retry_after {
            let seconds = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(seconds));
        }
        return response;
    }
    let kind = match (status.as_u16(), failure.code.as_deref()) {
        (429, Some("insufficient_quota")) => "insufficient_quota",
        (429, _) => "rate_limit_error",
        (401, _) => "authentication_error",
        (403, _) => "permission_error",
        (404, _) => "not_found_error",
        (400..=499, _) => "invalid_request_error",
        (500..=599, _) => "server_error",
        _ => "api_error",
    };
    let mut response = openai_error(
        status,
        kind,
        &format!("The mock provider injected a failure ({status})."),
        failure.code.as_deref(),
    );
    if let Some(retry_after) = failure.retry_after {
        let seconds = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
        let millis = retry_after.as_nanos().div_ceil(1_000_000);
        let headers = response.headers_mut();
        headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
        if let Ok(millis) = HeaderValue::try_from(millis.to_string()) {
            headers.insert(HeaderName::from_static("retry-after-ms"), millis);
        }
    }
    response
}

fn status_or_500(status: u16) -> StatusCode {
    StatusCode::from_u16(status).unwrap_or_else(|_| {
        tracing::warn!(status, "mock provider: invalid status, answering 500");
        StatusCode::INTERNAL_SERVER_ERROR
    })
}

/// An error body in OpenAI's shape.
pub(super) fn openai_error(
    status: StatusCode,
    kind: &str,
    message: &str,
    code: Option<&str>,
) -> Response {
    let body = json!({
        "error": {"message": message, "type": kind, "param": null, "code": code},
    });
    (status, Json(body)).into_response()
}

impl RecordedRequest {
    /// A request as it reached the mock, its body already read.
    pub(super) fn of(parts: &axum::http::request::Parts, body: Bytes) -> Self {
        Self {
            path: parts.uri.path().to_owned(),
            query: parts.uri.query().map(str::to_owned),
            headers: parts
                .headers
                .iter()
                .map(|(name, value)| {
                    (
                        name.as_str().to_owned(),
                        String::from_utf8_lossy(value.as_bytes()).into_owned(),
                    )
                })
                .collect(),
            body,
            at: Instant::now(),
        }
    }
}

/// Add the headers a real provider sends on every response.
///
/// `set-cookie` and `x-ratelimit-remaining-requests` are per caller, and `openai-organization`
/// names the account the key belongs to, so a gateway that shares one response (or one key)
/// among many callers must strip them; the mock sends them so tests can check it does.
/// Billable responses are numbered by their call; others carry 0. Headers a script already set
/// are left alone.
async fn provider_headers(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let mut response = next.run(request).await;
    let call = response
        .extensions()
        .get::<CallNumber>()
        .map_or(0, |call| call.0);
    let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let headers = response.headers_mut();
    set_default(headers, "x-request-id", format!("req_mock_{call}"));
    set_default(headers, "openai-processing-ms", elapsed_ms.to_string());
    set_default(headers, "x-ratelimit-remaining-requests", "999".to_owned());
    set_default(headers, "openai-organization", "org-mock".to_owned());
    if !headers.contains_key(SET_COOKIE) {
        if let Ok(value) = HeaderValue::try_from(format!("mock_session={call}")) {
            headers.insert(SET_COOKIE, value);
        }
    }
    response
}

fn set_default(headers: &mut HeaderMap, name: &'static str, value: String) {
    let name = HeaderName::from_static(name);
    if !headers.contains_key(&name) {
        if let Ok(value) = HeaderValue::try_from(value) {
            headers.insert(name, value);
        }
    }
}

/// Ids of the files the mocks made, unique in the process (two mocks never
/// make one id, as two provider accounts never do).
static NEXT_FILE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// `GET /v1/responses/{id}`: the stored response, as a provider keeps it. The mock keeps no
/// store: an id of the form it makes (`resp_mock_...`) reads as a completed response (which
/// mock was asked is the evidence), any other is OpenAI's 404.
async fn stored_response(Path(id): Path<String>, request: Request) -> Response {
    if !id.starts_with("resp_mock_") {
        return not_found(request).await;
    }
    Json(json!({"id": id, "object": "response", "status": "completed", "output": []}))
        .into_response()
}

/// `POST /v1/files`: a file object with an id no other mock makes (the upload is not kept).
async fn create_file() -> Response {
    let n = NEXT_FILE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Json(json!({
        "id": format!("file-mock{n}"), "object": "file", "bytes": 0, "created_at": 0,
        "filename": "upload.jsonl", "purpose": "batch", "status": "processed",
    }))
    .into_response()
}

/// `GET /v1/files/{id}`: the file object (any id reads as one).
async fn read_file(Path(id): Path<String>) -> Response {
    Json(json!({"id": id, "object": "file", "bytes": 0, "created_at": 0, "filename": "upload.jsonl", "purpose": "batch"}))
        .into_response()
}
