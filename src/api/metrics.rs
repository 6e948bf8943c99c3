//! `GET /metrics` (Prometheus text format). The request counters it exports
//! are written by the request pipeline (`pipeline.rs`).

use std::sync::Arc;

use axum::{
    extract::State,
    http::header,
    response::{IntoResponse, Response},
};

use crate::{
    metrics::{self, Live},
    state::AppState,
};

pub async fn metrics(State(app): State<Arc<AppState>>) -> Response {
    refresh_live(&app).await;
    (
        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        app.metrics().encode(),
    )
        .into_response()
}

/// Copies what the scrape reads from the running gateway into the gauges.
pub(super) async fn refresh_live(app: &AppState) {
    let flights = app.dedup().coalescer().flights();
    let cache = app.cache().usage().await;
    app.metrics().set_live(Live {
        in_flight: flights.in_flight(),
        waiters: *flights.waiters().borrow(),
        cache,
    });
    app.metrics().set_cooling(app.upstream().member_cooling());
    if app.budgets().is_active() {
        app.metrics().set_budgets(&app.budgets().rule_uses());
    }
}
