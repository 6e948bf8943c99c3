//! The HTTP surface. One way in: [`pipeline::Pipeline`] takes every request
//! first and serves every `/v1/*` request itself, after admission read its
//! body (once, bounded): a deduplicated endpoint's `POST` goes to the
//! `dedup::Dedup` service, any other `/v1/*` path to the pass-through
//! (`proxy.rs`). The router behind it holds the rest: the probes, the
//! reports and the admin API. Handlers extract, call one domain function,
//! and return; they never touch the cache or Redis directly.

mod admin;
mod dashboard;
mod health;
pub mod metrics;
pub mod pipeline;
mod proxy;
mod stats;

use std::sync::Arc;

use axum::{Router, routing::get};
use tower::Layer as _;

use crate::state::AppState;

/// The whole API: the pipeline, and inside it the router for what is not
/// under `/v1/`.
pub fn router(state: Arc<AppState>) -> pipeline::Pipeline<Router> {
    let routes = Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        // Bedrock's control plane, which Claude Code's Bedrock mode asks
        // before its first call (`ListInferenceProfiles`, without the
        // caller's headers): corral has no profiles of its own to list.
        .route("/inference-profiles", get(no_inference_profiles))
        // The reports and the admin API: behind an admin key when any is set.
        .merge(admin::protect(
            Router::new()
                .route("/metrics", get(metrics::metrics))
                .route("/stats", get(stats::stats))
                .route("/", get(dashboard::dashboard))
                .route("/dashboard", get(dashboard::dashboard)),
            admin::AdminKeys::new(&state.config().auth.admin_key_hashes),
        ))
        .fallback(proxy::unknown_path)
        .with_state(state.clone());
    // Outermost, before routing: every response, errors and fallbacks
    // included, is counted and gets the request id; admission runs inside it.
    pipeline::PipelineLayer::new(state).layer(routes)
}

/// Bedrock's `ListInferenceProfiles`, answered with none: the model ids a
/// pool's `deployments` name are what corral serves, whatever profile.
async fn no_inference_profiles() -> axum::Json<serde_json::Value> {
    axum::Json(serde_json::json!({"inferenceProfileSummaries": []}))
}
