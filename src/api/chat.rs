//! `POST /v1/chat/completions`, `/v1/completions`, `/v1/embeddings`: the
//! deduplicated, cached endpoints.

use std::sync::Arc;

use axum::{
    extract::{RawQuery, State, rejection::BytesRejection},
    http::HeaderMap,
    response::Response,
};
use bytes::Bytes;

use super::read_body;
use crate::{dedup, error::GatewayError, fingerprint::Endpoint, state::AppState};

pub async fn chat_completions(
    State(app): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, GatewayError> {
    let body = read_body(body, app.config.limits.max_body_bytes)?;
    dedup::serve(app, Endpoint::ChatCompletions, headers, query, body).await
}

pub async fn completions(
    State(app): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, GatewayError> {
    let body = read_body(body, app.config.limits.max_body_bytes)?;
    dedup::serve(app, Endpoint::Completions, headers, query, body).await
}

pub async fn embeddings(
    State(app): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, GatewayError> {
    let body = read_body(body, app.config.limits.max_body_bytes)?;
    dedup::serve(app, Endpoint::Embeddings, headers, query, body).await
}
