//! `POST /v1/chat/completions`, `/v1/completions`, `/v1/embeddings`,
//! `/v1/responses`, `/v1/messages`: the deduplicated, cached endpoints. A
//! refusal is answered in the endpoint's API's error shape.

use std::sync::Arc;

use axum::{
    extract::{FromRequest, Request, State},
    http::{HeaderValue, request::Parts},
    response::Response,
};
use bytes::Bytes;

use super::routed_body;
use crate::{
    dedup::{self, Caller},
    error::GatewayError,
    fingerprint::Endpoint,
    state::AppState,
    wire,
};

pub async fn chat_completions(State(app): State<Arc<AppState>>, request: Request) -> Response {
    serve(app, Endpoint::ChatCompletions, request).await
}

pub async fn completions(State(app): State<Arc<AppState>>, request: Request) -> Response {
    serve(app, Endpoint::Completions, request).await
}

pub async fn embeddings(State(app): State<Arc<AppState>>, request: Request) -> Response {
    serve(app, Endpoint::Embeddings, request).await
}

pub async fn responses(State(app): State<Arc<AppState>>, request: Request) -> Response {
    serve(app, Endpoint::Responses, request).await
}

pub async fn messages(State(app): State<Arc<AppState>>, request: Request) -> Response {
    serve(app, Endpoint::Messages, request).await
}

/// Serves `endpoint`; an error is answered in its API's shape. The
/// pipeline sends these endpoints' `POST`s to [`serve_admitted`] itself; this
/// is the router's way in, for a request that reached it without that.
async fn serve(app: Arc<AppState>, endpoint: Endpoint, request: Request) -> Response {
    read_and_serve(app, endpoint, request)
        .await
        .unwrap_or_else(|error| error.to_response_as(wire::of(endpoint).error_shape()))
}

/// An admitted request (the pipeline read its body): `dedup::serve`, with an
/// error answered in the endpoint's API's shape.
pub async fn serve_admitted(
    app: Arc<AppState>,
    endpoint: Endpoint,
    caller: Caller,
    parts: Parts,
    body: Bytes,
) -> Response {
    let query = parts.uri.query().map(str::to_owned);
    dedup::serve(app, endpoint, caller, parts.headers, query, body)
        .await
        .unwrap_or_else(|error| error.to_response_as(wire::of(endpoint).error_shape()))
}

/// Takes the headers out of the request by value (an extractor would copy
/// them, once per request), then reads the body as the `Bytes` extractor does.
async fn read_and_serve(
    app: Arc<AppState>,
    endpoint: Endpoint,
    request: Request,
) -> Result<Response, GatewayError> {
    let (mut parts, body) = request.into_parts();
    let headers = std::mem::take(&mut parts.headers);
    let query = parts.uri.query().map(str::to_owned);
    let caller = match parts.extensions.remove::<Caller>() {
        Some(caller) => caller,
        None => Caller {
            request_id: headers
                .get(crate::dedup::REQUEST_ID_HEADER)
                .cloned()
                .unwrap_or_else(|| HeaderValue::from_static("-")),
            tenant: app.auth.authenticate(&headers)?,
        },
    };
    let body = Bytes::from_request(Request::from_parts(parts, body), &()).await;
    let body = routed_body(body, app.config.limits.max_body_bytes)?;
    dedup::serve(app, endpoint, caller, headers, query, body).await
}
