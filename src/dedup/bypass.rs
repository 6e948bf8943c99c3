//! `no-store` (or a request the cache may not share): the caller's own
//! upstream call, its answer relayed and never stored or shared. A stream is
//! relayed as it comes, bounded like every upstream body, and read as it
//! passes (`sse::StreamTap`), so the call is billed like any other: once,
//! when the stream ends, breaks, or its caller leaves.

use std::{convert::Infallible, sync::Arc};

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
    sse::{self, CallerUsage, Framing, StreamTap, TapEnd},
    upstream::Outbound,
    upstream::body,
    usage::{Estimated, Usage, text_bytes},
};

pub(super) async fn serve(
    dedup: &Arc<Dedup>,
    request: &DedupRequest,
    outbound: Outbound,
    bill: &Attribution,
) -> Result<Answered, GatewayError> {
    let mut response = if request.stream {
        stream_through(dedup, request, outbound, bill).await?
    } else {
        dedup.may_call_upstream(bill).await?;
        let request_bytes = outbound.body.len();
        let buffered = dedup.upstream.call_buffered(&outbound, &bill.model).await?;
        if buffered.status.is_success() {
            let owners = dedup.pin_owners(request);
            dedup
                .pin_answer(owners.as_ref(), buffered.member.as_deref(), &buffered.body)
                .await;
        }
        let shared = shared_response(
            request.wire,
            buffered.status,
            &buffered.headers,
            buffered.body,
        );
        // An answer without usage is billed what its size says.
        dedup.billed_or_estimated(
            &bill.answered_by(buffered.member),
            shared.usage,
            || Usage::estimate(request_bytes, answer_text_bytes(&shared.body)),
            Estimated::Unreported,
        );
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

/// The bytes of generated text in a non-stream answer.
pub(super) fn answer_text_bytes(body: &[u8]) -> usize {
    serde_json::from_slice::<serde_json::Value>(body).map_or(0, |answer| text_bytes(&answer))
}

/// Relays a live SSE stream (not coalesced). Retries happen only before the
/// response headers arrive. As a coalesced stream's, the upstream request asks
/// for usage (chat's `include_usage`); a caller who did not ask receives the
/// events without it, in corral's framing, and any other the provider's bytes
/// as they came. A Gemini caller of the JSON-array framing receives the
/// events framed as that array, as a coalesced one does.
async fn stream_through(
    dedup: &Arc<Dedup>,
    request: &DedupRequest,
    mut outbound: Outbound,
    bill: &Attribution,
) -> Result<Response, GatewayError> {
    let started = tokio::time::Instant::now();
    let format = request.wire.stream_format();
    super::add_stream_query(&mut outbound.query, request.wire);
    let upstream_request = request.wire.stream_request(&request.body);
    let caller_usage = upstream_request.caller_usage;
    if caller_usage == CallerUsage::NotAsked {
        outbound.body = upstream_request.body;
    }
    // Framed for the caller (Gemini's array, AWS's frames): the tap hands
    // on whole events.
    let reframed = request.framing != Framing::Events;
    let rewrite = reframed || caller_usage == CallerUsage::NotAsked;
    dedup.may_call_upstream(bill).await?;
    let (upstream, member) = dedup
        .upstream
        .call_streaming_billed(&outbound, &bill.model)
        .await?;
    let status = upstream.status();
    let content_type = match (rewrite, upstream.headers().get(header::CONTENT_TYPE)) {
        (false, Some(content_type)) => content_type.clone(),
        _ => HeaderValue::from_static(request.framing.content_type()),
    };
    let billing = StreamBilling {
        dedup: dedup.clone(),
        bill: bill.answered_by(member),
        request_bytes: outbound.body.len(),
        tap: StreamTap::new(format, caller_usage, rewrite, dedup.stream_limits.max_bytes),
        billed: false,
    };
    // Bounded like every upstream body; a stream that stalls or overruns ends
    // with an error event in the API's shape and a clean end, as a coalesced one would.
    let total = dedup
        .upstream
        .request_timeout(outbound.upstream)
        .saturating_sub(started.elapsed());
    let stall = dedup.coalesce.stream_stall_timeout;
    let cut = dedup.cut_upstream.clone();
    let chunks = Box::pin(body::bounded(upstream, stall, total, cut));
    let pieces = futures::stream::unfold(Some((chunks, billing)), move |state| async move {
        let (mut chunks, mut billing) = state?;
        loop {
            match chunks.next().await {
                Some(Ok(chunk)) => {
                    let pieces = billing.tap.pass(chunk);
                    if !pieces.is_empty() {
                        return Some((pieces, Some((chunks, billing))));
                    }
                }
                Some(Err(error)) => {
                    tracing::warn!(%error, "a no-store stream broke");
                    billing.settle(Estimated::Broken);
                    return Some((vec![format.error_event(&error.to_string(), 0)], None));
                }
                None => {
                    // Billed before the body ends, so a caller that read it all
                    // finds the spend counted.
                    billing.tap.ended();
                    let last = billing.tap.broken_end();
                    billing.settle(Estimated::Broken);
                    return last.map(|event| (vec![event], None));
                }
            }
        }
    })
    .flat_map(|pieces| futures::stream::iter(pieces.into_iter().map(Ok::<Bytes, Infallible>)));
    let body = match request.framing {
        Framing::Events => Body::from_stream(pieces),
        Framing::JsonArray => Body::from_stream(sse::as_json_array(pieces)),
        Framing::AwsEventStream => Body::from_stream(sse::as_aws_event_stream(pieces)),
    };
    let mut response = (status, body).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, content_type);
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(response)
}

/// A `no-store` stream's bill, paid once: when the stream ends or breaks, or,
/// when its caller leaves first, as the body is dropped.
struct StreamBilling {
    dedup: Arc<Dedup>,
    bill: Attribution,
    /// The upstream request's size, for an estimate of its input.
    request_bytes: usize,
    tap: StreamTap,
    billed: bool,
}

impl StreamBilling {
    /// Bills the stream: its reported usage (with at least the output relayed,
    /// where it did not complete), else an estimate for `unfinished` (or, for
    /// a stream that completed without usage, as unreported).
    fn settle(&mut self, unfinished: Estimated) {
        if std::mem::replace(&mut self.billed, true) {
            return;
        }
        let text = self.tap.text_bytes();
        let completed = self.tap.end() == TapEnd::Completed;
        let relayed = Usage::estimate(0, text).completion_tokens;
        let usage = match completed {
            true => self.tap.usage(),
            false => self
                .tap
                .usage()
                .map(|usage| usage.with_output_at_least(relayed)),
        };
        let reason = if completed {
            Estimated::Unreported
        } else {
            unfinished
        };
        let request_bytes = self.request_bytes;
        self.dedup.billed_or_estimated(
            &self.bill,
            usage,
            || Usage::estimate(request_bytes, text),
            reason,
        );
    }
}

impl Drop for StreamBilling {
    fn drop(&mut self) {
        // The caller left before the end (a disconnect drops the body).
        self.settle(Estimated::Abandoned);
    }
}
