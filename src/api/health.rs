//! `GET /healthz` (the process is alive) and `GET /readyz` (it can serve).

use std::sync::Arc;

use axum::{Json, extract::State};
use serde_json::{Value, json};

use crate::state::AppState;

pub async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// Always ready: corral serves without Redis. The body says whether it runs
/// degraded (Redis unavailable: local singleflight and L1 only).
pub async fn readyz(State(app): State<Arc<AppState>>) -> Json<Value> {
    let redis = app.cluster.as_ref().map(|cluster| {
        json!({
            "status": cluster.status(),
            "subscribed": *cluster.subscribed().borrow(),
            "errors": cluster.errors(),
            "rejected_values": cluster.rejected_values(),
        })
    });
    let degraded = app.cluster.as_ref().is_some_and(|c| c.status() != "up");
    Json(json!({
        "status": if degraded { "degraded" } else { "ready" },
        "cache": if app.cluster.is_some() { "redis" } else { "memory" },
        "redis": redis,
        "in_flight": app.coalescer.flights().in_flight(),
        "waiters": *app.coalescer.flights().waiters().borrow(),
    }))
}
