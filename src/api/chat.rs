//! `POST /v1/chat/completions`, `/v1/completions`, `/v1/embeddings`,
//! `/v1/responses`, `/v1/messages`: the deduplicated, cached endpoints. A
//! refusal is answered in the endpoint's API's error shape.

use std::sync::Arc;

use axum::{
    extract::{FromRequest, Request, State},
    response::Response,
};
use bytes::Bytes;

use super::read_body;
use crate::{dedup, error::GatewayError, fingerprint::Endpoint, state::AppState, wire};

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

/// Serves `endpoint`; an error is answered in its API's shape.
async fn serve(app: Arc<AppState>, endpoint: Endpoint, request: Request) -> Response {
    read_and_serve(app, endpoint, request)
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
    let body = Bytes::from_request(Request::from_parts(parts, body), &()).await;
    let body = read_body(body, app.config.limits.max_body_bytes)?;
    dedup::serve(app, endpoint, headers, query, body).await
}
