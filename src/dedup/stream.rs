//! A streamed answer. Every caller of one flight reads the same events,
//! byte for byte: the flight's live log while it streams, else the complete
//! (or cached) answer replayed as a valid SSE sequence; a retry answered from
//! the retry window reads the events its first attempt's stream had.

use std::sync::Arc;

use axum::{
    body::Body,
    http::{HeaderValue, StatusCode, header},
    response::IntoResponse,
};
use bytes::Bytes;
use futures::StreamExt;
use serde_json::Value;

use super::{
    Answered, Dedup,
    fallback::Fallbacks,
    loaders::stream_loader,
    respond::{
        FINGERPRINT_HEADER_NAME, budget_left, header_value, response_from, set_status_headers,
    },
};
use crate::{
    cache_status::CacheStatus,
    coalesce::{Answer, Served},
    error::GatewayError,
    metrics::{Attribution, Metrics},
    request::DedupRequest,
    sse::{self, Framing, StreamLog},
    upstream::Outbound,
};

pub(super) async fn serve(
    dedup: &Arc<Dedup>,
    request: DedupRequest,
    mut outbound: Outbound,
    bill: Attribution,
    fallbacks: Option<Arc<Fallbacks>>,
) -> Result<Answered, GatewayError> {
    let (key, retained) = dedup.key_and_retained(&request, &bill).await?;
    let fingerprint = request.fingerprint;
    let wire = request.wire;
    let format = wire.stream_format();
    // The upstream request always streams, and always reports usage (so cost
    // can be accounted); callers who did not ask for it do not see it.
    let upstream_request = wire.stream_request(&request.body);
    let caller_usage = upstream_request.caller_usage;
    outbound.body = upstream_request.body;
    // The log holds events, whatever framing its callers read it in.
    super::add_stream_query(&mut outbound.query, wire);
    // A follower of a live stream: its saving is counted once it has been served.
    let mut live_saving = None;
    let retained_events = retained.as_ref().map(|retained| retained.events.clone());
    let answer = match retained {
        Some(retained) => Ok(Answer::Complete(Served {
            response: retained.response.clone(),
            status: CacheStatus::Retry,
            stored: true,
            age: Some(retained.age(dedup.clock.now_ms())),
        })),
        None => {
            let retained_under = dedup.own_retry_key(&request, &key);
            let owners = dedup.pin_owners(&request);
            let loader = stream_loader(
                dedup.clone(),
                outbound,
                wire,
                bill.clone(),
                retained_under,
                owners,
                fallbacks,
            );
            dedup
                .coalescer
                .answer(key, request.policy, loader, Some(format))
                .await
        }
    };
    let (reader, status, stored, age) = match answer {
        Ok(Answer::Live { log, status }) => {
            if status == CacheStatus::Coalesced {
                live_saving = Some(log.clone());
            }
            (log.reader(caller_usage), status, false, None)
        }
        Ok(Answer::Complete(served)) => {
            if !served.response.status.is_success() {
                dedup.release_key_of_failed(&request, true).await;
                let mut response = response_from(&served.response);
                set_status_headers(response.headers_mut(), &request, served.status, false, None);
                return Ok(Answered::new(response, Some(served.status), fingerprint));
            }
            let invalid = |reason: String| GatewayError::UpstreamInvalid {
                upstream: dedup.upstream_names[request.upstream].clone(),
                reason,
            };
            let events = match retained_events {
                // The first attempt streamed: its own events, byte for byte.
                Some(events) if !events.is_empty() => events,
                _ => {
                    let value: Value = serde_json::from_slice(&served.response.body)
                        .map_err(|err| invalid(format!("answer is not JSON: {err}")))?;
                    wire.synthesize(&value)
                        .map_err(|err| invalid(err.to_string()))?
                }
            };
            let log = StreamLog::replay(format, events);
            dedup
                .metrics
                .served(&bill, served.status, served.response.usage);
            (
                log.reader(caller_usage),
                served.status,
                served.stored,
                served.age,
            )
        }
        Err(error) => {
            dedup.release_key_of_failed(&request, true).await;
            let mut response = error.shared_response_as(request.shape);
            response
                .headers_mut()
                .insert(FINGERPRINT_HEADER_NAME, header_value(&fingerprint.hex()));
            return Ok(Answered::new(response, None, fingerprint));
        }
    };
    tracing::debug!(cache = status.as_str(), fingerprint = %request.fingerprint.short_hex(), "served");
    // Each caller reads its own label fields in the lifecycle events.
    let echo = request.echo.clone();
    // Before `bill` goes to the saving counted at the stream's end.
    let budget = budget_left(dedup, &bill, status);
    let events = sse::with_keepalive(
        reader.into_stream(),
        dedup.coalesce.keepalive_interval,
        format.keepalive(),
    )
    .map(move |event| {
        event.map(|event| match &echo {
            Some(echo) => echo.event(&event).unwrap_or(event),
            None => event,
        })
    })
    .chain(count_live_saving(dedup.metrics.clone(), live_saving, bill));
    let body = match request.framing {
        Framing::Events => Body::from_stream(events),
        Framing::JsonArray => Body::from_stream(sse::as_json_array(events)),
        Framing::AwsEventStream => Body::from_stream(sse::as_aws_event_stream(events)),
    };
    let mut response = (StatusCode::OK, body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(request.framing.content_type()),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    set_status_headers(headers, &request, status, stored, age);
    headers.extend(budget);
    Ok(Answered::new(response, Some(status), fingerprint))
}

/// The end of a live follower's body: a caller that joined a live stream was
/// served without its own upstream call, and its saving (the stream's usage)
/// is known once the stream has completed. Counted after its last event and
/// before its body ends, so a client that read the whole stream sees it
/// counted; a broken stream, or a caller that left early, saved nothing.
fn count_live_saving(
    metrics: Metrics,
    log: Option<StreamLog>,
    bill: Attribution,
) -> impl futures::Stream<Item = Result<Bytes, std::convert::Infallible>> {
    futures::stream::once(async move {
        if let Some(log) = log
            && log.end() == Some(sse::LogEnd::Done)
        {
            let usage = log.format().stream_usage(&log.events());
            metrics.served(&bill, CacheStatus::Coalesced, usage);
        }
    })
    .filter_map(|()| async { None })
}
