//! `GET /metrics` (Prometheus text format), and the layer every request passes
//! through: a request id (the caller's `x-request-id` when it is sane, else a
//! new one, echoed on every response), a `request` span that the request's
//! logs (and the upstream call it starts) nest in, the request counters and
//! latency histogram, and one summary log line.

use std::{sync::Arc, time::Instant};

use axum::{
    extract::{Request, State},
    http::{HeaderName, HeaderValue, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use tracing::Instrument;

use crate::{
    dedup::{CACHE_HEADER, FINGERPRINT_HEADER},
    fingerprint::Endpoint,
    metrics::{self, Live},
    state::AppState,
};

pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// Longest caller-chosen request id kept; longer ones are replaced.
const MAX_REQUEST_ID_LEN: usize = 128;

/// Characters of the fingerprint a log line shows: enough to find a request's
/// siblings, too few to matter as a key.
const FINGERPRINT_PREFIX: usize = 12;

pub async fn metrics(State(app): State<Arc<AppState>>) -> Response {
    refresh_live(&app);
    (
        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        app.metrics.encode(),
    )
        .into_response()
}

/// Copies what the scrape reads from the running gateway into the gauges.
pub(super) fn refresh_live(app: &AppState) {
    let flights = app.coalescer.flights();
    app.metrics.set_live(Live {
        in_flight: flights.in_flight(),
        waiters: *flights.waiters().borrow(),
        cache_entries: app.cache.entry_count(),
    });
}

/// The caller's request id when it is visible ASCII of at most 128 characters
/// (it goes into logs and a response header verbatim), else a fresh random one.
fn request_id(request: &Request) -> HeaderValue {
    request
        .headers()
        .get(REQUEST_ID_HEADER)
        .filter(|id| {
            let bytes = id.as_bytes();
            !bytes.is_empty()
                && bytes.len() <= MAX_REQUEST_ID_LEN
                && bytes.iter().all(|b| b.is_ascii_graphic())
        })
        .cloned()
        .unwrap_or_else(|| {
            let mut id = [0u8; 32];
            hex::encode_to_slice(rand::random::<u128>().to_be_bytes(), &mut id)
                .expect("32 hex digits for 16 bytes");
            HeaderValue::from_bytes(&id).expect("hex is a valid header value")
        })
}

fn endpoint_of(path: &str) -> Option<Endpoint> {
    [
        Endpoint::ChatCompletions,
        Endpoint::Completions,
        Endpoint::Embeddings,
    ]
    .into_iter()
    .find(|endpoint| path.strip_prefix("/v1") == Some(endpoint.path()))
}

pub async fn track(State(app): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let id = request_id(&request);
    let endpoint = endpoint_of(request.uri().path());
    // The path only: a query string may carry anything. The request's cache
    // status and fingerprint are on its summary line, and a flight's logs
    // carry its fingerprint: one span is all the hit path pays for.
    let span = tracing::info_span!(
        "request",
        request_id = %id.to_str().unwrap_or_default(),
        method = %request.method(),
        path = %request.uri().path(),
    );
    let mut response = next.run(request).instrument(span.clone()).await;
    let elapsed = started.elapsed();
    let headers = response.headers();
    let cache = headers
        .get(CACHE_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("ERROR")
        .to_owned();
    if let Some(endpoint) = endpoint {
        app.metrics.request(endpoint.label(), &cache, elapsed);
    }
    if app.config.log.requests {
        let fingerprint = headers
            .get(FINGERPRINT_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(|hex| &hex[..hex.len().min(FINGERPRINT_PREFIX)])
            .unwrap_or("-");
        let cache = if endpoint.is_some() {
            cache.as_str()
        } else {
            "-"
        };
        span.in_scope(|| {
            tracing::info!(
                status = response.status().as_u16(),
                cache,
                fingerprint,
                latency_ms = elapsed.as_secs_f64() * 1000.0,
                "request"
            );
        });
    }
    response
        .headers_mut()
        .insert(HeaderName::from_static(REQUEST_ID_HEADER), id);
    response
}

#[cfg(test)]
mod tests {
    use axum::body::Body;

    use super::*;

    fn with_id(id: &[u8]) -> Request {
        Request::builder()
            .header(REQUEST_ID_HEADER, HeaderValue::from_bytes(id).unwrap())
            .body(Body::empty())
            .unwrap()
    }

    #[test]
    fn sane_request_ids_are_kept_and_others_replaced() {
        assert_eq!(request_id(&with_id(b"req-42_A.b")), "req-42_A.b");
        let longest = "x".repeat(MAX_REQUEST_ID_LEN);
        assert_eq!(request_id(&with_id(longest.as_bytes())), longest.as_str());
        for bad in [
            "x".repeat(MAX_REQUEST_ID_LEN + 1).into_bytes(),
            b"has space".to_vec(),
            b"tab\there".to_vec(),
            "caf\u{e9}".as_bytes().to_vec(),
        ] {
            let id = request_id(&with_id(&bad));
            assert_eq!(id.len(), 32, "{bad:?} -> {id:?}");
            assert!(id.to_str().unwrap().bytes().all(|b| b.is_ascii_hexdigit()));
        }
        let absent = Request::builder().body(Body::empty()).unwrap();
        assert_ne!(request_id(&absent), request_id(&absent), "fresh each time");
    }

    #[test]
    fn only_the_deduplicated_paths_are_endpoints() {
        assert_eq!(
            endpoint_of("/v1/chat/completions"),
            Some(Endpoint::ChatCompletions)
        );
        assert_eq!(endpoint_of("/v1/completions"), Some(Endpoint::Completions));
        assert_eq!(endpoint_of("/v1/embeddings"), Some(Endpoint::Embeddings));
        assert_eq!(endpoint_of("/v1/models"), None);
        assert_eq!(endpoint_of("/chat/completions"), None);
        assert_eq!(endpoint_of("/metrics"), None);
    }
}
