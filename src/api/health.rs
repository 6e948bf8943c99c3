//! `GET /healthz` (the process is alive) and `GET /readyz` (it should be sent
//! requests).
//!
//! `/readyz` answers 503 only while the instance drains (from the moment
//! shutdown begins, while running requests still complete): a load balancer
//! should stop sending, and nothing else makes corral unable to answer. An
//! open upstream circuit or Redis down leaves it 200 (`"status": "degraded"`,
//! with the detail): corral fails open without Redis, and with a circuit open
//! it still serves stored answers (fresh or STALE) and the other upstreams;
//! every instance shares the provider, so taking them all out of rotation
//! would turn a provider outage into a total one.

use std::sync::Arc;

use axum::{
    Json,
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};

use crate::{breaker::BreakerState, state::AppState};

pub async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

fn breaker_state(state: BreakerState) -> &'static str {
    match state {
        BreakerState::Closed => "closed",
        BreakerState::Open => "open",
        BreakerState::HalfOpen => "half-open",
    }
}

pub async fn readyz(State(app): State<Arc<AppState>>) -> Response {
    let draining = app.draining().is_cancelled();
    let upstreams: Vec<Value> = (0..app.config().upstreams.len())
        .map(|i| {
            json!({
                "name": app.upstream().name(i),
                "circuit": breaker_state(app.upstream().circuit(i)),
            })
        })
        .collect();
    let circuit_open = (0..app.config().upstreams.len())
        .any(|i| app.upstream().circuit(i) != BreakerState::Closed);
    let redis = match app.cluster() {
        None => json!({"state": "not_configured"}),
        Some(cluster) => json!({
            // `connected`: in use; `unavailable`: not connected yet, or its
            // breaker is open (requests go on with L1 and local flights).
            "state": if cluster.status() == "up" { "connected" } else { "unavailable" },
            "status": cluster.status(),
            "breaker": breaker_state(cluster.breaker().state()),
            "subscribed": *cluster.subscribed().borrow(),
            "errors": cluster.errors(),
            "rejected_values": cluster.rejected_values(),
        }),
    };
    let redis_down = app.cluster().is_some_and(|c| c.status() != "up");
    let status = if draining {
        "draining"
    } else if redis_down || circuit_open {
        "degraded"
    } else {
        "ready"
    };
    let code = if draining {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    let body = json!({
        "status": status,
        "ready": !draining,
        "draining": draining,
        "upstreams": upstreams,
        "cache": if app.cluster().is_some() { "redis" } else { "memory" },
        "redis": redis,
        "in_flight": app.dedup().coalescer().flights().in_flight(),
        "waiters": *app.dedup().coalescer().flights().waiters().borrow(),
    });
    (code, Json(body)).into_response()
}
