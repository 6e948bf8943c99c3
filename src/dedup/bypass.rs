//! `no-store` (or a request the cache may not share): the caller's own
//! upstream call, its answer relayed and never stored or shared. A stream is
//! relayed as it comes, bounded like every upstream body.

use axum::{
    body::Body,
    http::{HeaderValue, header},
    response::{IntoResponse, Response},
};
use bytes::Bytes;
use futures::StreamExt;

use super::{
    Answered, Dedup,
    respond::{budget_left, response_from, set_status_headers, shared_response},
};
use crate::{
    cache_status::CacheStatus,
    error::GatewayError,
    metrics::Attribution,
    request::DedupRequest,
    sse::{Format, Framing},
    upstream::Outbound,
    upstream::body,
};

pub(super) async fn serve(
    dedup: &Dedup,
    request: &DedupRequest,
    mut outbound: Outbound,
    bill: &Attribution,
) -> Result<Answered, GatewayError> {
    let mut response = if request.stream {
        // In the caller's own framing (Gemini's events, or its JSON array).
        if request.framing == Framing::Events {
            super::add_stream_query(&mut outbound.query, request.wire);
        }
        stream_through(dedup, &outbound, bill, request.wire.stream_format()).await?
    } else {
        dedup.may_call_upstream(bill).await?;
        let buffered = dedup.upstream.call_buffered(&outbound, &bill.model).await?;
        let shared = shared_response(
            request.wire,
            buffered.status,
            &buffered.headers,
            buffered.body,
        );
        dedup.billed(bill, shared.usage);
        if dedup.traced {
            crate::traces::record_answer(shared.usage, &shared.body);
        }
        response_from(&shared)
    };
    set_status_headers(
        response.headers_mut(),
        request,
        CacheStatus::Bypass,
        false,
        None,
    );
    response
        .headers_mut()
        .extend(budget_left(dedup, bill, CacheStatus::Bypass));
    Ok(Answered::new(
        response,
        Some(CacheStatus::Bypass),
        request.fingerprint,
    ))
}

/// Relays a live SSE stream (not coalesced). Retries happen only before the
/// response headers arrive. The stream is not parsed, so its usage is unknown.
async fn stream_through(
    dedup: &Dedup,
    outbound: &Outbound,
    bill: &Attribution,
    format: Format,
) -> Result<Response, GatewayError> {
    let started = tokio::time::Instant::now();
    dedup.may_call_upstream(bill).await?;
    let upstream = dedup
        .upstream
        .call_streaming_billed(outbound, &bill.model)
        .await?;
    dedup.billed(bill, None);
    let status = upstream.status();
    let content_type = upstream
        .headers()
        .get(header::CONTENT_TYPE)
        .cloned()
        .unwrap_or_else(|| HeaderValue::from_static("text/event-stream"));
    // Bounded like every upstream body; a stream that stalls or overruns ends
    // with an error event in the API's shape and a clean end, as a coalesced one would.
    let total = dedup
        .upstream
        .request_timeout(outbound.upstream)
        .saturating_sub(started.elapsed());
    let stall = dedup.coalesce.stream_stall_timeout;
    let cut = dedup.cut_upstream.clone();
    let body = body::bounded(upstream, stall, total, cut).scan(false, |ended, chunk| {
        let item = match chunk {
            _ if *ended => None,
            Ok(bytes) => Some(Ok::<Bytes, std::convert::Infallible>(bytes)),
            Err(error) => {
                tracing::warn!(%error, "a no-store stream broke");
                *ended = true;
                Some(Ok(format.error_event(&error.to_string(), 0)))
            }
        };
        futures::future::ready(item)
    });
    let mut response = (status, Body::from_stream(body)).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, content_type);
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(response)
}
