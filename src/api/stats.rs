//! `GET /stats`: the savings summary since start as JSON (what the page at
//! `GET /` draws), read from the same counters as `/metrics`.

use std::sync::Arc;

use axum::{Json, extract::State};

use super::metrics::refresh_live;
use crate::{metrics::Stats, state::AppState};

pub async fn stats(State(app): State<Arc<AppState>>) -> Json<Stats> {
    refresh_live(&app).await;
    let mut stats = app.metrics().stats();
    stats.budgets = app.budgets().uses();
    Json(stats)
}
