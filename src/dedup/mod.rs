//! The deduplicated endpoints' one domain function: parse and fingerprint the
//! request, hand it to the coalescer with a loader that calls upstream, and
//! turn what comes back into the caller's response and status headers.
//!
//! `loaders.rs` holds the upstream calls a flight makes, `respond.rs` the
//! caller's response built from a shared answer.

mod loaders;
mod respond;

use std::{borrow::Cow, sync::Arc, time::Duration};

use axum::{
    body::Body,
    http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header},
    response::{IntoResponse, Response},
};
use bytes::Bytes;
use futures::StreamExt;
use serde_json::Value;
use tracing::Instrument;

use crate::{
    cache_status::CacheStatus,
    coalesce::{Answer, Lookup, Served},
    config::CacheScope,
    embeddings,
    error::GatewayError,
    fingerprint::{CacheKey, Endpoint},
    memo::{Derived, RequestBytes},
    metrics::{Attribution, Metrics},
    request::DedupRequest,
    retry_window::Retained,
    sse::{self, Format, StreamLog},
    state::AppState,
    tenant::TenantScope,
    upstream::{Outbound, body},
    usage::Usage,
    wire::{self, Echo, Wire},
};

use loaders::{parsing_loader, stream_loader, upstream_loader};
pub use respond::{
    CACHE_HEADER, CACHE_HEADER_NAME, FINGERPRINT_HEADER, FINGERPRINT_HEADER_NAME,
    REQUEST_ID_HEADER, REQUEST_ID_HEADER_NAME,
};
use respond::{
    age_value, budget_left, header_value, own_echo, response_from, set_status_headers,
    shared_response, write_status_headers,
};

/// Who sent the request, as the pipeline admitted it.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The request id the response echoes (`x-request-id`).
    pub request_id: HeaderValue,
    /// The caller's own tenant (its credential's scope), whatever the cache shares.
    pub tenant: TenantScope,
}

impl Caller {
    /// The span a request's logs nest in. Made only when the request does
    /// more than read the cache: a hit logs nothing but its access line,
    /// which carries the same fields, and making the span was a tenth of a
    /// hit's CPU (BENCHMARKS.md).
    fn span(&self, endpoint: Endpoint) -> tracing::Span {
        tracing::info_span!(
            "request",
            request_id = %self.request_id.to_str().unwrap_or_default(),
            method = %"POST",
            path = %format_args!("/v1{}", endpoint.path()),
        )
    }
}

pub async fn serve(
    app: Arc<AppState>,
    endpoint: Endpoint,
    caller: Caller,
    headers: HeaderMap,
    query: Option<String>,
    body: Bytes,
) -> Result<Response, GatewayError> {
    let seen = RequestBytes::of(endpoint, &caller.tenant, &headers, query.as_deref(), &body);
    let raw = RawRequest {
        endpoint,
        headers,
        query,
        body,
    };
    if let Some(derived) = seen.as_ref().and_then(|seen| app.memo.get(seen)) {
        return Ok(serve_derived(app, &derived, &caller, raw).await);
    }
    let span = caller.span(endpoint);
    // Boxed: inline, its states (streams, embeddings, the retry window) would
    // make every request's future that large, hits included.
    Box::pin(serve_parsed(app, raw, seen))
        .instrument(span)
        .await
}

/// A request as it came, kept for the upstream call of a request the memo
/// answered: parsed only if that call runs.
#[derive(Debug)]
struct RawRequest {
    endpoint: Endpoint,
    headers: HeaderMap,
    query: Option<String>,
    body: Bytes,
}

impl RawRequest {
    fn parse(&self, app: &AppState) -> Result<DedupRequest, GatewayError> {
        DedupRequest::parse(
            self.endpoint,
            &self.headers,
            self.query.as_deref(),
            self.body.clone(),
            &app.routes,
            &app.upstream_keys,
            app.request_rules(),
        )
    }
}

/// A request seen before (`memo.rs`): the cache's answer when it has one,
/// else the flight, whose upstream call parses the request when it runs.
/// What it answers and counts is what `serve_parsed` would.
async fn serve_derived(
    app: Arc<AppState>,
    derived: &Derived,
    caller: &Caller,
    raw: RawRequest,
) -> Response {
    let bill = &derived.bill;
    if app.traces.is_some() {
        crate::traces::record_request(&derived.model, &app.upstream_names[derived.upstream]);
    }
    let key = app.purges.key(
        derived.key.clone(),
        &derived.key.fingerprint,
        &derived.model,
        &bill.tenant,
    );
    let looked_up = if derived.policy.read {
        app.coalescer.lookup(&key, derived.policy).await
    } else {
        Lookup::Absent
    };
    let served = match looked_up {
        Lookup::Fresh(served) => Ok(served),
        Lookup::Refresh(served) => {
            let age = served.age.unwrap_or_default();
            let loader = parsing_loader(app.clone(), raw, bill.clone(), key.clone());
            app.coalescer.refresh_in_background(key, loader, age);
            Ok(served)
        }
        Lookup::Absent => {
            let loader = parsing_loader(app.clone(), raw, bill.clone(), key.clone());
            // Boxed, as `serve_parsed`: a hit's future does not carry a flight's states.
            Box::pin(app.coalescer.fly(key, derived.policy, loader, None))
                .instrument(caller.span(derived.endpoint))
                .await
                .map(|answer| match answer {
                    Answer::Complete(served) => served,
                    Answer::Live { .. } => unreachable!("no live log without a stream format"),
                })
        }
    };
    complete_response(
        &app,
        served,
        bill,
        derived.policy.revalidate,
        &derived.fingerprint_header,
        wire::of(derived.endpoint),
        Some(derived),
        derived.echo.as_deref(),
    )
}

/// What goes upstream, moved out of the request, not copied: nothing reads it
/// again, and a cache hit should not pay for the copies.
fn outbound_of(request: &mut DedupRequest) -> Outbound {
    Outbound {
        upstream: request.upstream,
        method: Method::POST,
        path: Cow::Borrowed(request.endpoint.path()),
        query: request.query.take(),
        headers: std::mem::take(&mut request.forward_headers),
        authorization: request.authorization.take(),
        body: request.raw_body.clone(),
    }
}

/// A request not in the memo: parsed, then served; remembered when the memo
/// can answer its repeats.
async fn serve_parsed(
    app: Arc<AppState>,
    raw: RawRequest,
    seen: Option<RequestBytes>,
) -> Result<Response, GatewayError> {
    let mut request = raw.parse(&app)?;
    let RawRequest {
        endpoint, headers, ..
    } = raw;
    let fingerprint = request.fingerprint;
    let bill = attribution(&app, &request, &headers);
    if let Some(seen) = seen
        && let Some(derived) = Derived::of(&request, &bill)
    {
        app.memo.insert(seen, derived);
    }
    if app.traces.is_some() {
        crate::traces::record_request(&request.model, &app.upstream_names[request.upstream]);
    }
    let outbound = outbound_of(&mut request);

    if request.policy.bypass {
        let mut response = async {
            if request.stream {
                stream_through(&app, &outbound, &bill, request.wire.stream_format()).await
            } else {
                app.may_call_upstream(&bill).await?;
                let buffered = app.upstream.call_buffered(&outbound, &bill.model).await?;
                let shared = shared_response(buffered.status, &buffered.headers, buffered.body);
                app.billed(&bill, shared.usage);
                if app.traces.is_some() {
                    crate::traces::record_answer(shared.usage, &shared.body);
                }
                Ok(response_from(&shared))
            }
        }
        .await?;
        set_status_headers(
            response.headers_mut(),
            &request,
            CacheStatus::Bypass,
            false,
            None,
        );
        response
            .headers_mut()
            .extend(budget_left(&app, &bill, CacheStatus::Bypass));
        return Ok(response);
    }
    if endpoint == Endpoint::Embeddings {
        let traced = app.traces.is_some();
        let answer = embeddings::serve(app, &request, outbound, bill).await;
        let mut response = match answer {
            Ok(answer) => {
                if traced {
                    crate::traces::record_answer(Usage::from_body(&answer.body), &answer.body);
                }
                let mut response = (StatusCode::OK, Body::from(answer.body)).into_response();
                let headers = response.headers_mut();
                headers.insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                set_status_headers(headers, &request, answer.status, answer.stored, None);
                headers.insert(
                    HeaderName::from_static(embeddings::ITEMS_HEADER),
                    header_value(&answer.items),
                );
                response
            }
            Err(error) => error.shared_response_as(request.wire.error_shape()),
        };
        response
            .headers_mut()
            .insert(FINGERPRINT_HEADER_NAME, header_value(&fingerprint.hex()));
        return Ok(response);
    }
    // The key the answer lives under: the fingerprint, re-keyed by purges.
    let key = app.purges.key(
        CacheKey {
            scope: request.scope.clone(),
            fingerprint,
        },
        &fingerprint,
        &request.model,
        &bill.tenant,
    );
    // A client's retry receives the answer its earlier attempt paid for.
    let retained = match &app.retry_window {
        Some(window) => {
            window
                .recall_for(
                    &request.retry,
                    request.policy,
                    &fingerprint,
                    own_retry_key(&app, &request, &key).as_ref().unwrap_or(&key),
                )
                .await?
        }
        None => None,
    };
    if request.stream {
        return serve_stream(app, request, outbound, key, bill, retained).await;
    }
    if let Some(retained) = retained {
        tracing::debug!(fingerprint = %fingerprint.short_hex(), "served a retry from the retry window");
        app.metrics
            .served(&bill, CacheStatus::Retry, retained.response.usage);
        let mut response = response_from(&retained.response);
        own_echo(&mut response, request.echo.as_deref(), &retained.response);
        let age = retained.age(app.clock.now_ms());
        set_status_headers(
            response.headers_mut(),
            &request,
            CacheStatus::Retry,
            true,
            Some(age),
        );
        return Ok(response);
    }

    let retained_under = own_retry_key(&app, &request, &key);
    let loader = upstream_loader(
        app.clone(),
        outbound,
        request.wire,
        bill.clone(),
        retained_under,
    );
    let served = app
        .coalescer
        .get_or_fetch(key, request.policy, loader)
        .await;
    let failed = served
        .as_ref()
        .map_or(true, |served| !served.response.status.is_success());
    release_key_of_failed(&app, &request, failed).await;
    Ok(complete_response(
        &app,
        served,
        &bill,
        request.policy.revalidate,
        &header_value(&fingerprint.hex()),
        request.wire,
        None,
        request.echo.as_deref(),
    ))
}

/// A complete (not streamed) answer, or the error, as the caller's response.
/// A HIT of a request the memo knows clones the headers built for its answer.
#[allow(clippy::too_many_arguments)]
fn complete_response(
    app: &AppState,
    served: Result<Served, Arc<GatewayError>>,
    bill: &Attribution,
    revalidate: bool,
    fingerprint: &HeaderValue,
    wire: &dyn Wire,
    derived: Option<&Derived>,
    echo: Option<&Echo>,
) -> Response {
    match served {
        Ok(Served {
            response: shared,
            status,
            stored,
            age,
        }) => {
            tracing::debug!(cache = status.as_str(), "served");
            app.metrics.served(bill, status, shared.usage);
            if app.traces.is_some() {
                crate::traces::record_answer(shared.usage, &shared.body);
            }
            let built = || {
                let mut response = response_from(&shared);
                let headers = response.headers_mut();
                write_status_headers(headers, fingerprint, revalidate, status, stored, None);
                response
            };
            let mut response = match derived {
                Some(derived) if status == CacheStatus::Hit => {
                    // Built with `Age` and the request id in place (the
                    // pipeline writes the caller's over it): a clone has room
                    // for exactly its entries, and adding one would grow it.
                    let headers = derived.hit_headers(&shared, || {
                        let mut headers = built().into_parts().0.headers;
                        headers.insert(header::AGE, age_value(Duration::ZERO));
                        headers.insert(REQUEST_ID_HEADER_NAME, HeaderValue::from_static("-"));
                        headers
                    });
                    let mut response = Response::new(Body::from(shared.body.clone()));
                    *response.status_mut() = shared.status;
                    *response.headers_mut() = headers;
                    if age.is_none() {
                        response.headers_mut().remove(header::AGE);
                    }
                    response
                }
                _ => built(),
            };
            if let Some(age) = age {
                response.headers_mut().insert(header::AGE, age_value(age));
            }
            own_echo(&mut response, echo, &shared);
            response
                .headers_mut()
                .extend(budget_left(app, bill, status));
            response
        }
        Err(error) => {
            let mut response = error.shared_response_as(wire.error_shape());
            response
                .headers_mut()
                .insert(FINGERPRINT_HEADER_NAME, fingerprint.clone());
            response
        }
    }
}

/// Whom the request's answer is billed to (metrics and `/stats` attribution).
fn attribution(app: &AppState, request: &DedupRequest, headers: &HeaderMap) -> Attribution {
    // With per-tenant caching the request's scope is the caller's own; with a
    // global cache it is not, and the label derives the caller's.
    let own_scope = (app.config.cache.scope == CacheScope::Tenant).then_some(&request.scope);
    Attribution {
        model: app.metrics.model(&request.model),
        tenant: app.auth.tenant_label(headers, own_scope),
        upstream: app.upstream_names[request.upstream].as_str().into(),
        endpoint: request.endpoint.label(),
    }
}

/// A streaming caller's answer: the flight's live log when the flight streams,
/// else the complete (or cached) answer replayed as a valid SSE sequence. Every
/// caller of one flight reads the same events, byte for byte; a retry answered
/// from the retry window reads the events its first attempt's stream had.
async fn serve_stream(
    app: Arc<AppState>,
    request: DedupRequest,
    mut outbound: Outbound,
    key: CacheKey,
    bill: Attribution,
    retained: Option<Arc<Retained>>,
) -> Result<Response, GatewayError> {
    let wire = request.wire;
    let format = wire.stream_format();
    // The upstream request always streams, and always reports usage (so cost
    // can be accounted); callers who did not ask for it do not see it.
    let upstream_request = wire.stream_request(&request.body);
    let caller_usage = upstream_request.caller_usage;
    outbound.body = upstream_request.body;
    // A follower of a live stream: its saving is counted once it has been served.
    let mut live_saving = None;
    let retained_events = retained.as_ref().map(|retained| retained.events.clone());
    let answer = match retained {
        Some(retained) => Ok(Answer::Complete(Served {
            response: retained.response.clone(),
            status: CacheStatus::Retry,
            stored: true,
            age: Some(retained.age(app.clock.now_ms())),
        })),
        None => {
            let retained_under = own_retry_key(&app, &request, &key);
            let loader = stream_loader(app.clone(), outbound, wire, bill.clone(), retained_under);
            app.coalescer
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
                release_key_of_failed(&app, &request, true).await;
                let mut response = response_from(&served.response);
                set_status_headers(response.headers_mut(), &request, served.status, false, None);
                return Ok(response);
            }
            let invalid = |reason: String| GatewayError::UpstreamInvalid {
                upstream: app.upstream_names[request.upstream].clone(),
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
            app.metrics
                .served(&bill, served.status, served.response.usage);
            (
                log.reader(caller_usage),
                served.status,
                served.stored,
                served.age,
            )
        }
        Err(error) => {
            release_key_of_failed(&app, &request, true).await;
            let mut response = error.shared_response_as(wire.error_shape());
            response.headers_mut().insert(
                FINGERPRINT_HEADER_NAME,
                header_value(&request.fingerprint.hex()),
            );
            return Ok(response);
        }
    };
    tracing::debug!(cache = status.as_str(), fingerprint = %request.fingerprint.short_hex(), "served");
    // Each caller reads its own label fields in the lifecycle events.
    let echo = request.echo.clone();
    // Before `bill` goes to the saving counted at the stream's end.
    let budget = budget_left(&app, &bill, status);
    let events = sse::with_keepalive(reader.into_stream(), app.config.coalesce.keepalive_interval)
        .map(move |event| {
            event.map(|event| match &echo {
                Some(echo) => echo.event(&event).unwrap_or(event),
                None => event,
            })
        })
        .chain(count_live_saving(app.metrics.clone(), live_saving, bill));
    let mut response = (StatusCode::OK, Body::from_stream(events)).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    set_status_headers(headers, &request, status, stored, age);
    headers.extend(budget);
    Ok(response)
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

/// Where the retry window keeps a request's answer for its client's retries,
/// when that is not the cache key: under a cache every tenant shares
/// (`cache.scope: global`), the caller's own key, so another tenant's retry
/// never receives this tenant's sample.
fn own_retry_key(app: &AppState, request: &DedupRequest, key: &CacheKey) -> Option<CacheKey> {
    (app.config.cache.scope == CacheScope::Global).then(|| CacheKey {
        scope: request.own_scope.clone(),
        fingerprint: key.fingerprint.within(&request.own_scope),
    })
}

/// A request that failed frees its `Idempotency-Key`: the client may correct
/// its body (after a provider's 400, say) and send it under the same key.
async fn release_key_of_failed(app: &AppState, request: &DedupRequest, failed: bool) {
    if let (true, Some(window), Some(key)) =
        (failed, &app.retry_window, &request.retry.idempotency_key)
    {
        window.release(key, &request.fingerprint).await;
    }
}

/// Relays a live SSE stream (not coalesced). Retries happen only before the
/// response headers arrive. The stream is not parsed, so its usage is unknown.
async fn stream_through(
    app: &AppState,
    outbound: &Outbound,
    bill: &Attribution,
    format: Format,
) -> Result<Response, GatewayError> {
    let started = tokio::time::Instant::now();
    app.may_call_upstream(bill).await?;
    let upstream = app
        .upstream
        .call_streaming_billed(outbound, &bill.model)
        .await?;
    app.billed(bill, None);
    let status = upstream.status();
    let content_type = upstream
        .headers()
        .get(header::CONTENT_TYPE)
        .cloned()
        .unwrap_or_else(|| HeaderValue::from_static("text/event-stream"));
    // Bounded like every upstream body; a stream that stalls or overruns ends
    // with an error event in the API's shape and a clean end, as a coalesced one would.
    let total = app
        .upstream
        .request_timeout(outbound.upstream)
        .saturating_sub(started.elapsed());
    let stall = app.config.coalesce.stream_stall_timeout;
    let cut = app.cut_upstream.clone();
    let body = body::bounded(upstream, stall, total, cut).scan(false, |ended, chunk| {
        let item = match chunk {
            _ if *ended => None,
            Ok(bytes) => Some(Ok::<_, std::convert::Infallible>(bytes)),
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
