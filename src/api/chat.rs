//! `POST /v1/chat/completions`, `/v1/completions`, `/v1/embeddings`,
//! `/v1/responses`: the deduplicated, cached endpoints.

use std::sync::Arc;

use axum::{
    extract::{FromRequest, Request, State},
    response::Response,
};
use bytes::Bytes;

use super::read_body;
use crate::{dedup, error::GatewayError, fingerprint::Endpoint, state::AppState};

pub async fn chat_completions(
    State(app): State<Arc<AppState>>,
    request: Request,
) -> Result<Response, GatewayError> {
    serve(app, Endpoint::ChatCompletions, request).await
}

pub async fn completions(
    State(app): State<Arc<AppState>>,
    request: Request,
) -> Result<Response, GatewayError> {
    serve(app, Endpoint::Completions, request).await
}

pub async fn embeddings(
    State(app): State<Arc<AppState>>,
    request: Request,
) -> Result<Response, GatewayError> {
    serve(app, Endpoint::Embeddings, request).await
}

pub async fn responses(
    State(app): State<Arc<AppState>>,
    request: Request,
) -> Result<Response, GatewayError> {
    serve(app, Endpoint::Responses, request).await
}

/// Takes the headers out of the request by value (an extractor would copy
/// them, once per request), then reads the body as the `Bytes` extractor does.
async fn serve(
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
