//! The deduplicated endpoints' one domain function: parse and fingerprint the
//! request, hand it to the coalescer with a loader that calls upstream, and
//! turn what comes back into the caller's response and status headers.

use std::{sync::Arc, time::Duration};

use axum::{
    body::Body,
    http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header},
    response::{IntoResponse, Response},
};
use bytes::Bytes;
use serde_json::Value;
use tracing::Instrument;

use crate::{
    cache::{StoredResponse, Usage},
    coalesce::{CacheStatus, Loaded, Loader, Served},
    error::GatewayError,
    fingerprint::{CacheKey, Endpoint},
    request::DedupRequest,
    state::AppState,
    upstream::Outbound,
};

/// Upstream response headers that may be shared with every caller of a
/// response. Everything else (`set-cookie`, `x-ratelimit-*`, request ids,
/// `openai-organization`) belongs to the one call that produced it.
const SHARED_RESPONSE_HEADERS: &[&str] = &["content-type", "openai-model", "openai-version"];

pub const FINGERPRINT_HEADER: &str = "x-corral-fingerprint";
pub const CACHE_HEADER: &str = "x-corral-cache";

pub async fn serve(
    app: Arc<AppState>,
    endpoint: Endpoint,
    headers: HeaderMap,
    query: Option<String>,
    body: Bytes,
) -> Result<Response, GatewayError> {
    let request = DedupRequest::parse(
        endpoint,
        &headers,
        query.as_deref(),
        body,
        &app.routes,
        &app.upstream_names,
        &app.config.cache,
    )?;
    let fingerprint = request.fingerprint;
    let span = tracing::info_span!(
        "dedup",
        endpoint = endpoint.label(),
        fingerprint = %&fingerprint.hex()[..12],
        upstream = %app.upstream_names[request.upstream],
        cache = tracing::field::Empty,
    );
    let outbound = Outbound {
        upstream: request.upstream,
        method: Method::POST,
        path: endpoint.path().to_owned(),
        query: request.query.clone(),
        headers: request.forward_headers.clone(),
        authorization: request.authorization.clone(),
        body: request.raw_body.clone(),
    };

    if request.stream || request.policy.bypass {
        span.record("cache", CacheStatus::Bypass.as_str());
        let mut response = async {
            if request.stream {
                stream_through(&app, &outbound).await
            } else {
                let buffered = app.upstream.call_buffered(&outbound).await?;
                let shared = shared_response(buffered.status, &buffered.headers, buffered.body);
                Ok(response_from(&shared))
            }
        }
        .instrument(span.clone())
        .await?;
        set_status_headers(
            response.headers_mut(),
            &request,
            CacheStatus::Bypass,
            false,
            None,
        );
        return Ok(response);
    }

    let loader = upstream_loader(app.clone(), outbound, endpoint);
    let served = app
        .coalescer
        .get_or_fetch(
            CacheKey {
                scope: request.scope.clone(),
                fingerprint,
            },
            request.policy,
            loader,
        )
        .instrument(span.clone())
        .await;
    match served {
        Ok(Served {
            response: shared,
            status,
            stored,
            age,
        }) => {
            span.record("cache", status.as_str());
            tracing::debug!(parent: &span, "served");
            let mut response = response_from(&shared);
            set_status_headers(response.headers_mut(), &request, status, stored, age);
            Ok(response)
        }
        Err(error) => {
            let mut response = error.to_response();
            response.headers_mut().insert(
                HeaderName::from_static(FINGERPRINT_HEADER),
                header_value(&fingerprint.hex()),
            );
            Ok(response)
        }
    }
}

/// The upstream call a flight runs; it owns everything it needs, so it can run
/// detached from the connection of the caller that started it.
fn upstream_loader(app: Arc<AppState>, outbound: Outbound, endpoint: Endpoint) -> Loader {
    let outbound = Arc::new(outbound);
    Arc::new(move || {
        let app = app.clone();
        let outbound = outbound.clone();
        Box::pin(async move {
            let buffered = app.upstream.call_buffered(&outbound).await?;
            let cacheable = is_complete(endpoint, &buffered.body);
            Ok(Loaded {
                response: shared_response(buffered.status, &buffered.headers, buffered.body),
                cacheable,
                compute_time: buffered.elapsed,
            })
        })
    })
}

/// A response is complete when it parses and every choice has a
/// `finish_reason` (embeddings: when it carries data). Only complete
/// responses are stored.
pub fn is_complete(endpoint: Endpoint, body: &[u8]) -> bool {
    let Ok(value) = serde_json::from_slice::<Value>(body) else {
        return false;
    };
    match endpoint {
        Endpoint::Embeddings => value
            .get("data")
            .and_then(Value::as_array)
            .is_some_and(|data| !data.is_empty()),
        Endpoint::ChatCompletions | Endpoint::Completions => value
            .get("choices")
            .and_then(Value::as_array)
            .is_some_and(|choices| {
                !choices.is_empty()
                    && choices.iter().all(|choice| {
                        choice
                            .get("finish_reason")
                            .is_some_and(|reason| !reason.is_null())
                    })
            }),
    }
}

fn shared_response(status: StatusCode, headers: &HeaderMap, body: Bytes) -> StoredResponse {
    let headers = SHARED_RESPONSE_HEADERS
        .iter()
        .filter_map(|name| {
            headers
                .get(*name)
                .map(|value| (HeaderName::from_static(name), value.clone()))
        })
        .collect();
    StoredResponse {
        status,
        headers,
        usage: Usage::from_body(&body),
        body,
    }
}

fn response_from(shared: &StoredResponse) -> Response {
    let mut response = (shared.status, Body::from(shared.body.clone())).into_response();
    for (name, value) in &shared.headers {
        response.headers_mut().insert(name.clone(), value.clone());
    }
    response
}

/// `x-corral-cache`, RFC 9211 `Cache-Status`, `Age` and the fingerprint.
fn set_status_headers(
    headers: &mut HeaderMap,
    request: &DedupRequest,
    status: CacheStatus,
    stored: bool,
    age: Option<Duration>,
) {
    headers.insert(
        HeaderName::from_static(FINGERPRINT_HEADER),
        header_value(&request.fingerprint.hex()),
    );
    headers.insert(
        HeaderName::from_static(CACHE_HEADER),
        HeaderValue::from_static(status.as_str()),
    );
    let stored = if stored { "; stored" } else { "" };
    let cache_status = match status {
        CacheStatus::Hit => "corral; hit".to_owned(),
        CacheStatus::Stale => "corral; hit; fwd=stale".to_owned(),
        CacheStatus::Miss if request.policy.revalidate => format!("corral; fwd=request{stored}"),
        CacheStatus::Miss => format!("corral; fwd=miss{stored}"),
        CacheStatus::Coalesced => format!("corral; fwd=miss; collapsed{stored}"),
        CacheStatus::Bypass => "corral; fwd=bypass".to_owned(),
    };
    headers.insert(
        HeaderName::from_static("cache-status"),
        header_value(&cache_status),
    );
    if let Some(age) = age {
        headers.insert(header::AGE, HeaderValue::from(age.as_secs()));
    }
}

fn header_value(text: &str) -> HeaderValue {
    HeaderValue::from_str(text).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
}

/// Relays a live SSE stream (not coalesced). Retries happen only before the
/// response headers arrive.
async fn stream_through(app: &AppState, outbound: &Outbound) -> Result<Response, GatewayError> {
    let upstream = app.upstream.call_streaming(outbound).await?;
    let status = upstream.status();
    let content_type = upstream
        .headers()
        .get(header::CONTENT_TYPE)
        .cloned()
        .unwrap_or_else(|| HeaderValue::from_static("text/event-stream"));
    let mut response = (status, Body::from_stream(upstream.bytes_stream())).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, content_type);
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completeness_needs_every_finish_reason() {
        let done = br#"{"choices":[{"index":0,"finish_reason":"stop"},{"index":1,"finish_reason":"length"}]}"#;
        let open =
            br#"{"choices":[{"index":0,"finish_reason":"stop"},{"index":1,"finish_reason":null}]}"#;
        assert!(is_complete(Endpoint::ChatCompletions, done));
        assert!(!is_complete(Endpoint::ChatCompletions, open));
        assert!(!is_complete(
            Endpoint::ChatCompletions,
            br#"{"choices":[{"finish_reason":"st"#
        ));
        assert!(!is_complete(
            Endpoint::ChatCompletions,
            br#"{"choices":[]}"#
        ));
        assert!(is_complete(
            Endpoint::Embeddings,
            br#"{"data":[{"embedding":[0.1]}]}"#
        ));
        assert!(!is_complete(Endpoint::Embeddings, br#"{"data":[]}"#));
    }

    #[test]
    fn only_allowlisted_headers_are_shared() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.insert("set-cookie", HeaderValue::from_static("s=1"));
        headers.insert(
            "x-ratelimit-remaining-requests",
            HeaderValue::from_static("9"),
        );
        headers.insert("openai-organization", HeaderValue::from_static("org-x"));
        let shared = shared_response(StatusCode::OK, &headers, Bytes::new());
        let names: Vec<&str> = shared.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["content-type"]);
    }
}
