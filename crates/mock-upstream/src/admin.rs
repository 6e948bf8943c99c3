//! The `/__mock/*` control routes: the [`MockProvider`](super::MockProvider) knobs over HTTP, for
//! the `mock-upstream` binary, where demos and load-test scripts have no Rust handle.
//!
//! Admin calls are never counted, recorded or held. Bodies are strict JSON (unknown fields are
//! rejected) so that a typo in a script fails loudly instead of silently doing nothing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::http::openai_error;
use super::{EntraClient, FailureMode, Scripted, Shared};

/// How long `GET /__mock/calls?wait_for=N` waits when no `timeout_ms` is given.
const DEFAULT_WAIT: Duration = Duration::from_secs(30);

pub(super) fn router() -> Router<Arc<Shared>> {
    Router::new()
        .route("/__mock/calls", get(calls))
        .route("/__mock/reset", post(reset))
        .route("/__mock/hold", post(hold))
        .route("/__mock/release", post(release))
        .route("/__mock/failure", post(failure))
        .route("/__mock/latency", post(latency))
        .route("/__mock/script", post(script))
        .route("/__mock/truncate", post(truncate))
        .route("/__mock/stream_padding", post(stream_padding))
        .route(
            "/__mock/stream_ends",
            get(stream_ends).post(hold_stream_ends),
        )
        .route("/__mock/azure_keys", post(azure_keys))
        .route("/__mock/entra_client", post(entra_client))
        .route("/__mock/token_lifetimes", post(token_lifetimes))
        .route("/__mock/tokens", get(tokens))
}

#[derive(Debug, Deserialize)]
struct CallsQuery {
    wait_for: Option<u64>,
    timeout_ms: Option<u64>,
}

/// `GET /__mock/calls[?wait_for=N&timeout_ms=M]`: the counters (calls, by path, embeddings
/// inputs embedded), after waiting (woken by
/// arrivals, not polling) until at least N calls arrived or M ms passed. `reached` tells which.
async fn calls(State(shared): State<Arc<Shared>>, Query(query): Query<CallsQuery>) -> Response {
    let reached = match query.wait_for {
        Some(n) => {
            let timeout = query.timeout_ms.map_or(DEFAULT_WAIT, Duration::from_millis);
            shared.wait_for_calls(n, timeout).await
        }
        None => true,
    };
    let by_path: BTreeMap<String, u64> = shared.by_path();
    Json(json!({
        "calls": shared.calls(),
        "by_path": by_path,
        "embedded_inputs": shared.embedded_inputs(),
        "reached": reached,
    }))
    .into_response()
}

async fn reset(State(shared): State<Arc<Shared>>) -> StatusCode {
    shared.reset();
    StatusCode::NO_CONTENT
}

async fn hold(State(shared): State<Arc<Shared>>) -> StatusCode {
    shared.set_hold(true);
    StatusCode::NO_CONTENT
}

async fn release(State(shared): State<Arc<Shared>>) -> StatusCode {
    shared.set_hold(false);
    StatusCode::NO_CONTENT
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FailureBody {
    status: u16,
    /// Defaults to 1.0, every call.
    fraction: Option<f64>,
    retry_after_ms: Option<u64>,
    code: Option<String>,
}

/// `POST /__mock/failure` with `{status, fraction?, retry_after_ms?, code?}`, or `null` (or an
/// empty body) to stop failing.
async fn failure(
    State(shared): State<Arc<Shared>>,
    body: Bytes,
) -> Result<StatusCode, BadAdminRequest> {
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        parse::<Option<FailureBody>>(&body)?
    };
    let failure = match body {
        None => None,
        Some(body) => {
            let fraction = body.fraction.unwrap_or(1.0);
            if StatusCode::from_u16(body.status).is_err() {
                return Err(BadAdminRequest(
                    "'status' must be an HTTP status code.".into(),
                ));
            }
            if !(0.0..=1.0).contains(&fraction) {
                return Err(BadAdminRequest(
                    "'fraction' must be between 0 and 1.".into(),
                ));
            }
            Some(FailureMode {
                status: body.status,
                fraction,
                retry_after: body.retry_after_ms.map(Duration::from_millis),
                code: body.code,
            })
        }
    };
    shared.set_failure(failure);
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LatencyBody {
    ms: u64,
}

/// `POST /__mock/latency` with `{ms}`.
async fn latency(
    State(shared): State<Arc<Shared>>,
    body: Bytes,
) -> Result<StatusCode, BadAdminRequest> {
    let body: LatencyBody = parse(&body)?;
    shared.set_latency(Duration::from_millis(body.ms));
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptBody {
    status: u16,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    /// A string is sent as is; any other JSON value is sent serialized.
    body: Value,
}

/// `POST /__mock/script` with `{status, headers?: {name: value}, body}`: queue a canned response.
async fn script(
    State(shared): State<Arc<Shared>>,
    body: Bytes,
) -> Result<StatusCode, BadAdminRequest> {
    let script: ScriptBody = parse(&body)?;
    let body = match script.body {
        Value::String(text) => text,
        other => other.to_string(),
    };
    shared.push_script(Scripted {
        status: script.status,
        headers: script.headers.into_iter().collect(),
        body,
    });
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TruncateBody {
    on: bool,
}

/// `POST /__mock/truncate` with `{on}`: cut SSE streams after their first content chunk.
async fn truncate(
    State(shared): State<Arc<Shared>>,
    body: Bytes,
) -> Result<StatusCode, BadAdminRequest> {
    let body: TruncateBody = parse(&body)?;
    shared.set_truncate_streams(body.on);
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PaddingBody {
    bytes: usize,
}

/// `POST /__mock/stream_padding` with `{bytes}`: pad streamed chat and Gemini answers to at least
/// that many body bytes (0: no padding).
async fn stream_padding(
    State(shared): State<Arc<Shared>>,
    body: Bytes,
) -> Result<StatusCode, BadAdminRequest> {
    let body: PaddingBody = parse(&body)?;
    shared.stream_padding.store(body.bytes, Ordering::Relaxed);
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamEndsBody {
    held: bool,
}

/// `POST /__mock/stream_ends` with `{held}`: hold every stream before its final event, or
/// release the held ones.
async fn hold_stream_ends(
    State(shared): State<Arc<Shared>>,
    body: Bytes,
) -> Result<StatusCode, BadAdminRequest> {
    let body: StreamEndsBody = parse(&body)?;
    shared.set_stream_ends_held(body.held);
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
struct StreamEndsQuery {
    wait_for: Option<usize>,
    timeout_ms: Option<u64>,
}

/// `GET /__mock/stream_ends[?wait_for=N&timeout_ms=M]`: `{held, waiting, waiting_bytes}`, the
/// streams waiting at their end and the bytes they sent, after waiting (woken by arrivals)
/// until at least N wait or M ms passed; `reached` tells which.
async fn stream_ends(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<StreamEndsQuery>,
) -> Response {
    let reached = match query.wait_for {
        Some(n) => {
            let timeout = query.timeout_ms.map_or(DEFAULT_WAIT, Duration::from_millis);
            shared.wait_for_streams_at_end(n, timeout).await
        }
        None => true,
    };
    let at_end = shared.streams_at_end();
    Json(json!({
        "held": shared.stream_ends.borrow().held,
        "waiting": at_end.streams,
        "waiting_bytes": at_end.bytes,
        "reached": reached,
    }))
    .into_response()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AzureKeysBody {
    keys: Vec<String>,
}

/// `POST /__mock/azure_keys` with `{keys}`: the keys Azure routes accept (empty: any non-empty).
async fn azure_keys(
    State(shared): State<Arc<Shared>>,
    body: Bytes,
) -> Result<StatusCode, BadAdminRequest> {
    let body: AzureKeysBody = parse(&body)?;
    shared.azure.set_keys(body.keys);
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EntraClientBody {
    client_id: String,
    client_secret: String,
}

/// `POST /__mock/entra_client` with `{client_id, client_secret}`: the only client Entra's token
/// endpoint issues tokens to from now on.
async fn entra_client(
    State(shared): State<Arc<Shared>>,
    body: Bytes,
) -> Result<StatusCode, BadAdminRequest> {
    let body: EntraClientBody = parse(&body)?;
    shared
        .entra
        .set_client(Some(EntraClient::new(body.client_id, body.client_secret)));
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenLifetimesBody {
    ms: Vec<u64>,
}

/// `POST /__mock/token_lifetimes` with `{ms: [...]}`: the lifetimes of the next tokens, in
/// order; tokens beyond them live an hour.
async fn token_lifetimes(
    State(shared): State<Arc<Shared>>,
    body: Bytes,
) -> Result<StatusCode, BadAdminRequest> {
    let body: TokenLifetimesBody = parse(&body)?;
    shared
        .entra
        .set_lifetimes(body.ms.into_iter().map(Duration::from_millis).collect());
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /__mock/tokens[?wait_for=N&timeout_ms=M]`: `{token_requests, reached}`, after waiting
/// (woken by arrivals) until at least N token requests arrived or M ms passed.
async fn tokens(State(shared): State<Arc<Shared>>, Query(query): Query<CallsQuery>) -> Response {
    let reached = match query.wait_for {
        Some(n) => {
            let timeout = query.timeout_ms.map_or(DEFAULT_WAIT, Duration::from_millis);
            shared
                .entra
                .wait_for_requests(n, timeout, &shared.stopping)
                .await
        }
        None => true,
    };
    Json(json!({"token_requests": shared.entra.requests(), "reached": reached})).into_response()
}

/// An admin body that does not say what it should; answered 400 in OpenAI's error shape.
#[derive(Debug)]
struct BadAdminRequest(String);

impl IntoResponse for BadAdminRequest {
    fn into_response(self) -> Response {
        openai_error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            &self.0,
            None,
        )
    }
}

fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, BadAdminRequest> {
    serde_json::from_slice(body).map_err(|error| BadAdminRequest(format!("Invalid body: {error}.")))
}
