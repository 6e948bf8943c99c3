//! The HTTP surface: routes and thin handlers. Handlers extract, call one
//! domain function, and return; they never touch the cache or Redis directly.

mod admin;
mod chat;
mod dashboard;
mod health;
pub mod metrics;
pub mod pipeline;
mod proxy;
mod stats;

use std::sync::Arc;

use axum::{
    Router,
    extract::{DefaultBodyLimit, rejection::BytesRejection},
    routing::{any, get, post},
};
use bytes::Bytes;
use tower::Layer as _;

use crate::{error::GatewayError, state::AppState};

/// The whole API: the router inside the request pipeline, which takes every
/// request first (and serves the deduplicated endpoints' `POST`s itself).
pub fn router(state: Arc<AppState>) -> pipeline::Pipeline<Router> {
    let body_limit = state.config.limits.max_body_bytes;
    let routes = Router::new()
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/completions", post(chat::completions))
        .route("/v1/embeddings", post(chat::embeddings))
        .route("/v1/messages", post(chat::messages))
        // `GET`/`DELETE /v1/responses/{id}`, `.../input_items` and `.../cancel`
        // are stateful: they are proxied below, under the pass-through policy.
        .route("/v1/responses", post(chat::responses))
        .route("/v1/{*rest}", any(proxy::passthrough))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        // The reports and the admin API: behind an admin key when any is set.
        .merge(admin::protect(
            Router::new()
                .route("/metrics", get(metrics::metrics))
                .route("/stats", get(stats::stats))
                .route("/", get(dashboard::dashboard))
                .route("/dashboard", get(dashboard::dashboard)),
            admin::AdminKeys::new(&state.config.auth.admin_key_hashes),
        ))
        .fallback(proxy::unknown_path)
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state.clone());
    // Outermost, before routing: every response, errors and fallbacks
    // included, is counted and gets the request id; admission runs inside it.
    pipeline::PipelineLayer::new(state).layer(routes)
}

/// A routed request's body (read by axum under `DefaultBodyLimit`), or the
/// error for a body that is too large or unreadable, naming the real limit.
/// (The pipeline's own reader, `pipeline::read_body`, reads the deduplicated
/// endpoints' bodies.)
fn routed_body(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Bytes, GatewayError> {
    body.map_err(|rejection| match GatewayError::from(rejection) {
        GatewayError::BodyTooLarge { .. } => GatewayError::BodyTooLarge { limit },
        other => other,
    })
}
