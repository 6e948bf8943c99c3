//! Every other `/v1/*` path (`GET /v1/models`, files, ...) is proxied through
//! unchanged: no dedup, no cache, the caller's own response.

use std::sync::Arc;

use axum::{
    body::Body,
    extract::{Path, RawQuery, State, rejection::BytesRejection},
    http::{HeaderMap, HeaderName, Method, Uri, header},
    response::{IntoResponse, Response},
};
use bytes::Bytes;

use super::read_body;
use crate::{error::GatewayError, request::KEYED_HEADERS, state::AppState, upstream::Outbound};

/// Request headers a proxied call carries; the rest (cookies, hop-by-hop,
/// gateway-internal) stay here.
const PROXIED_REQUEST_HEADERS: &[&str] = &["accept", "content-type"];

/// Response headers that never cross a proxy (RFC 9110 hop-by-hop) or are set by the server.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
];

pub async fn passthrough(
    State(app): State<Arc<AppState>>,
    method: Method,
    Path(rest): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, GatewayError> {
    let body = read_body(body, app.config.limits.max_body_bytes)?;
    // Route by the body's model when it names one, else to the first upstream.
    let model = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("model").and_then(|m| m.as_str()).map(str::to_owned));
    let upstream = match &model {
        Some(model) => app
            .routes
            .route(model)
            .ok_or_else(|| GatewayError::NoRoute {
                model: model.clone(),
            })?,
        None => 0,
    };
    let forwarded = PROXIED_REQUEST_HEADERS
        .iter()
        .map(|name| HeaderName::from_static(name))
        .chain(KEYED_HEADERS)
        .filter_map(|name| {
            let value = headers.get(&name)?.clone();
            Some((name, value))
        })
        .collect();
    let outbound = Outbound {
        upstream,
        method,
        path: format!("/{rest}"),
        query,
        headers: forwarded,
        authorization: headers.get(header::AUTHORIZATION).cloned(),
        body,
    };
    // A provider error comes back as `GatewayError::Upstream`, relayed with its status and body.
    let upstream = app.upstream.call_streaming(&outbound).await?;
    let status = upstream.status();
    let mut response_headers = HeaderMap::new();
    for (name, value) in upstream.headers() {
        // corral's own headers are corral's to set: a provider cannot forge them.
        let internal = name.as_str().starts_with("x-corral-");
        if !HOP_BY_HOP.contains(&name.as_str()) && name != header::SET_COOKIE && !internal {
            response_headers.append(name.clone(), value.clone());
        }
    }
    let mut response = (status, Body::from_stream(upstream.bytes_stream())).into_response();
    response.headers_mut().extend(response_headers);
    Ok(response)
}

pub async fn unknown_path(uri: Uri) -> GatewayError {
    GatewayError::UnknownPath {
        path: uri.path().to_owned(),
    }
}
