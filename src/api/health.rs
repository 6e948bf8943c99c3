//! `GET /healthz` (the process is alive) and `GET /readyz` (it can serve).

use std::sync::Arc;

use axum::{Json, extract::State};
use serde_json::{Value, json};

use crate::state::AppState;

pub async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

pub async fn readyz(State(app): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({
        "status": "ready",
        "cache": "memory",
        "in_flight": app.coalescer.flights().in_flight(),
    }))
}
