//! The deduplicated endpoints' one domain function: parse and fingerprint the
//! request, hand it to the coalescer with a loader that calls upstream, and
//! turn what comes back into the caller's response and status headers.

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
    cache::{StoredResponse, Usage},
    coalesce::{Answer, CacheStatus, FlightCall, Loaded, Loader, Lookup, Served, StreamPublisher},
    config::CacheScope,
    embeddings,
    error::GatewayError,
    fingerprint::{CacheKey, Endpoint, Sent},
    memo::{Derived, RequestBytes},
    metrics::{Attribution, Metrics},
    request::DedupRequest,
    retry_window::Retained,
    sse::{self, Format, StreamLog},
    state::AppState,
    tenant::TenantScope,
    upstream::{Outbound, body, retry},
    wire::{self, Echo, Wire},
};

/// Upstream response headers that may be shared with every caller of a
/// response. Everything else (`set-cookie`, `x-ratelimit-*`, request ids,
/// `openai-organization`) belongs to the one call that produced it.
const SHARED_RESPONSE_HEADERS: &[&str] = &["content-type", "openai-model", "openai-version"];

pub const FINGERPRINT_HEADER: &str = "x-corral-fingerprint";
pub const CACHE_HEADER: &str = "x-corral-cache";
pub const FINGERPRINT_HEADER_NAME: HeaderName = HeaderName::from_static(FINGERPRINT_HEADER);
pub const CACHE_HEADER_NAME: HeaderName = HeaderName::from_static(CACHE_HEADER);
/// Written on every response by the request pipeline (`api::pipeline`); named
/// here because a HIT's prebuilt headers hold its place.
pub const REQUEST_ID_HEADER: &str = "x-request-id";
pub const REQUEST_ID_HEADER_NAME: HeaderName = HeaderName::from_static(REQUEST_ID_HEADER);
/// RFC 9211.
const CACHE_STATUS_HEADER_NAME: HeaderName = HeaderName::from_static("cache-status");

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

/// The upstream call of a flight started by a request served from the memo:
/// the request is parsed (as it was when first seen, so it parses again)
/// when the call runs, not by every caller that reads the cache.
fn parsing_loader(app: Arc<AppState>, raw: RawRequest, bill: Attribution, key: CacheKey) -> Loader {
    let sends = Sent::of(false, &raw.body);
    let raw = Arc::new(raw);
    let bill = Arc::new(bill);
    Loader::new(sends, move |call: FlightCall| {
        let app = app.clone();
        let raw = raw.clone();
        let bill = bill.clone();
        let key = key.clone();
        Box::pin(async move {
            let mut request = raw.parse(&app)?;
            let outbound = outbound_of(&mut request);
            let retained_under = own_retry_key(&app, &request, &key);
            retry::at_most(
                call.max_attempts,
                call_upstream(&app, &outbound, request.wire, &bill, retained_under),
            )
            .await
        })
    })
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
                let buffered = app.upstream.call_buffered(&outbound, &bill.model).await?;
                let shared = shared_response(buffered.status, &buffered.headers, buffered.body);
                app.metrics.upstream_usage(&bill, shared.usage);
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
            Err(error) => error.to_response_as(request.wire.error_shape()),
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
        }
        Err(error) => {
            let mut response = error.to_response_as(wire.error_shape());
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
            let mut response = error.to_response_as(wire.error_shape());
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
    let events = reader
        .into_stream()
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
    Ok(response)
}

/// The streamed upstream call of a flight: publishes the live log as soon as
/// the stream begins, relays every event into it, and ends with the assembled
/// non-stream answer (what the cache stores, and what non-stream callers of
/// the same flight receive). Retries happen only before the first event.
fn stream_loader(
    app: Arc<AppState>,
    outbound: Outbound,
    wire: &'static dyn Wire,
    bill: Attribution,
    retained_under: Option<CacheKey>,
) -> Loader {
    let sends = Sent::of(true, &outbound.body);
    let outbound = Arc::new(outbound);
    Loader::new(sends, move |call: FlightCall| {
        let FlightCall {
            publisher,
            max_attempts,
        } = call;
        let app = app.clone();
        let outbound = outbound.clone();
        let bill = bill.clone();
        let retained_under = retained_under.clone();
        let load = async move {
            let started = std::time::Instant::now();
            let upstream = app.upstream.name(outbound.upstream).to_owned();
            let response = app
                .upstream
                .call_streaming_billed(&outbound, &bill.model)
                .await?;
            let (log, writer) =
                StreamLog::with_limits(wire.stream_format(), app.stream_log_limits());
            publisher.publish(log.clone());
            let stall = app.config.coalesce.stream_stall_timeout;
            // `request_timeout` bounds the whole flight, headers and every event:
            // past it, every reader gets an error event, the flight ends (its
            // Redis lock with it) and nothing is cached.
            let total = app
                .upstream
                .request_timeout(outbound.upstream)
                .saturating_sub(started.elapsed());
            let relay = sse::relay_response(response, writer, stall, total);
            let cancel_when_abandoned = app.config.coalesce.cancel_when_abandoned;
            let abandon = async {
                if cancel_when_abandoned {
                    abandoned(&log, &publisher).await;
                } else {
                    std::future::pending::<()>().await;
                }
            };
            let summary = tokio::select! {
                summary = relay => summary,
                // Shutdown past the drain timeout: every reader gets an error event
                // and a clean end; the flight ends, so its Redis lock is released.
                // (The error event goes in before `select!` drops the relay, whose
                // writer would otherwise end the log as merely abandoned.)
                () = async {
                    app.cut_upstream.cancelled().await;
                    log.interrupt(log.error_event(
                        "the gateway is shutting down; the stream was cut",
                    ));
                } => {
                    app.metrics.upstream_usage(&bill, None);
                    return Err(GatewayError::ShuttingDown);
                }
                // Every reader left and nobody waits for the complete answer: stop the spend.
                () = abandon => {
                    // Paid for, up to where it stopped; how much is unknown.
                    app.metrics.upstream_usage(&bill, None);
                    return Err(GatewayError::UpstreamInvalid {
                        upstream,
                        reason: "stream cancelled: every caller left".to_owned(),
                    });
                }
            };
            // The stream was paid for whether or not it completed.
            // Its usage, from every event (Anthropic reports input and output apart).
            let usage = wire
                .stream_format()
                .stream_usage(&summary.events)
                .or(summary.usage);
            app.metrics.upstream_usage(&bill, usage);
            if !summary.completed() {
                // Readers already received the error event; waiters get this error.
                return Err(GatewayError::UpstreamInvalid {
                    upstream,
                    reason: format!("the stream broke: {:?}", summary.outcome),
                });
            }
            let assembled =
                wire.assemble(&summary.events)
                    .map_err(|err| GatewayError::UpstreamInvalid {
                        upstream: upstream.clone(),
                        reason: format!("the stream does not assemble: {err}"),
                    })?;
            let body = Bytes::from(assembled.to_string());
            Ok(Loaded {
                cacheable: wire.is_complete(&body),
                response: StoredResponse {
                    status: StatusCode::OK,
                    headers: vec![(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json"),
                    )],
                    usage: wire.usage(&body).or(usage),
                    body,
                },
                compute_time: started.elapsed(),
                events: summary.events,
                retained_under,
            })
        };
        // A flight's error reaches every follower (through Redis too) in its API's shape.
        Box::pin(async move {
            retry::at_most(max_attempts, load)
                .await
                .map_err(|error: GatewayError| error.in_shape(wire.error_shape()))
        })
    })
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

/// Resolves when every stream reader has gone and no caller waits for the
/// complete answer.
async fn abandoned(log: &StreamLog, publisher: &StreamPublisher) {
    log.abandoned().await;
    if publisher.waiters() > 0 {
        // Non-stream callers still wait for the answer: let it finish.
        std::future::pending::<()>().await;
    }
}

/// The upstream call a flight runs; it owns everything it needs, so it can run
/// detached from the connection of the caller that started it. Its tokens and
/// cost are counted here, once per call, whoever waits on it.
fn upstream_loader(
    app: Arc<AppState>,
    outbound: Outbound,
    wire: &'static dyn Wire,
    bill: Attribution,
    retained_under: Option<CacheKey>,
) -> Loader {
    let sends = Sent::of(false, &outbound.body);
    let bill = Arc::new(bill);
    let outbound = Arc::new(outbound);
    Loader::new(sends, move |call: FlightCall| {
        let app = app.clone();
        let outbound = outbound.clone();
        let bill = bill.clone();
        let retained_under = retained_under.clone();
        Box::pin(async move {
            retry::at_most(
                call.max_attempts,
                call_upstream(&app, &outbound, wire, &bill, retained_under),
            )
            .await
        })
    })
}

/// One buffered upstream call, counted once whoever waits on it.
async fn call_upstream(
    app: &AppState,
    outbound: &Outbound,
    wire: &'static dyn Wire,
    bill: &Attribution,
    retained_under: Option<CacheKey>,
) -> Result<Loaded, GatewayError> {
    let buffered = app
        .upstream
        .call_buffered(outbound, &bill.model)
        .await
        .map_err(|error| error.in_shape(wire.error_shape()))?;
    let cacheable = wire.is_complete(&buffered.body);
    let response = shared_response(buffered.status, &buffered.headers, buffered.body);
    app.metrics.upstream_usage(bill, response.usage);
    Ok(Loaded {
        response,
        cacheable,
        compute_time: buffered.elapsed,
        events: Vec::new(),
        retained_under,
    })
}

fn shared_response(status: StatusCode, headers: &HeaderMap, body: Bytes) -> StoredResponse {
    let headers = SHARED_RESPONSE_HEADERS
        .iter()
        .filter_map(|name| {
            // A copy, not a clone: a parsed header value is a slice of the whole
            // buffer the response head was read into (kilobytes), and a cached
            // entry holding the slice would pin that buffer for its lifetime.
            let value = headers.get(*name)?;
            let owned = HeaderValue::from_bytes(value.as_bytes()).unwrap_or_else(|_| value.clone());
            Some((HeaderName::from_static(name), owned))
        })
        .collect();
    StoredResponse {
        status,
        headers,
        usage: Usage::from_body(&body),
        body,
    }
}

/// The response headers a served answer ends up with at most: the shared
/// ones, the four status headers, the request id, `content-length`.
const RESPONSE_HEADERS_CAPACITY: usize = 12;

fn response_from(shared: &StoredResponse) -> Response {
    let mut response = Response::new(Body::from(shared.body.clone()));
    *response.status_mut() = shared.status;
    let headers = response.headers_mut();
    headers.reserve(RESPONSE_HEADERS_CAPACITY);
    for (name, value) in &shared.headers {
        headers.insert(name.clone(), value.clone());
    }
    response
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

/// The caller's own label fields in an answer another caller's values may
/// fill (`wire::Echo`); the body is replaced only where they differ.
fn own_echo(response: &mut Response, echo: Option<&Echo>, shared: &StoredResponse) {
    if let Some(own) = echo.and_then(|echo| echo.answer(&shared.body)) {
        *response.body_mut() = Body::from(own);
    }
}

/// `x-corral-cache`, RFC 9211 `Cache-Status`, `Age` and the fingerprint.
fn set_status_headers(
    headers: &mut HeaderMap,
    request: &DedupRequest,
    status: CacheStatus,
    stored: bool,
    age: Option<Duration>,
) {
    write_status_headers(
        headers,
        &header_value(&request.fingerprint.hex()),
        request.policy.revalidate,
        status,
        stored,
        age,
    );
}

fn write_status_headers(
    headers: &mut HeaderMap,
    fingerprint: &HeaderValue,
    revalidate: bool,
    status: CacheStatus,
    stored: bool,
    age: Option<Duration>,
) {
    headers.insert(FINGERPRINT_HEADER_NAME, fingerprint.clone());
    headers.insert(CACHE_HEADER_NAME, HeaderValue::from_static(status.as_str()));
    let cache_status = match (status, stored) {
        (CacheStatus::Hit, _) => "corral; hit",
        (CacheStatus::Stale, _) => "corral; hit; fwd=stale",
        (CacheStatus::Miss, true) if revalidate => "corral; fwd=request; stored",
        (CacheStatus::Miss, false) if revalidate => "corral; fwd=request",
        (CacheStatus::Miss, true) => "corral; fwd=miss; stored",
        (CacheStatus::Miss, false) => "corral; fwd=miss",
        (CacheStatus::Coalesced, true) => "corral; fwd=miss; collapsed; stored",
        (CacheStatus::Coalesced, false) => "corral; fwd=miss; collapsed",
        (CacheStatus::Bypass, _) => "corral; fwd=bypass",
        (CacheStatus::Retry, _) => "corral; hit; detail=retry",
    };
    headers.insert(
        CACHE_STATUS_HEADER_NAME,
        HeaderValue::from_static(cache_status),
    );
    if let Some(age) = age {
        headers.insert(header::AGE, age_value(age));
    }
}

/// Ages below this many seconds are made once and shared: every HIT carries
/// one, and a `HeaderValue` made from a number is an allocation of its own.
const SHARED_AGE_VALUES: u64 = 3_600;

/// The `Age` header's value for `age`, in whole seconds.
fn age_value(age: Duration) -> HeaderValue {
    static SHARED: std::sync::OnceLock<Vec<HeaderValue>> = std::sync::OnceLock::new();
    let seconds = age.as_secs();
    if seconds >= SHARED_AGE_VALUES {
        return HeaderValue::from(seconds);
    }
    let shared = SHARED.get_or_init(|| {
        // One string of every number, each value a static slice of it:
        // cloning a value then counts no reference.
        let mut text = String::new();
        let mut ends = Vec::with_capacity(SHARED_AGE_VALUES as usize);
        for n in 0..SHARED_AGE_VALUES {
            text.push_str(itoa::Buffer::new().format(n));
            ends.push(text.len());
        }
        let text: &'static str = Box::leak(text.into_boxed_str());
        let mut start = 0;
        ends.into_iter()
            .map(|end| {
                let value = HeaderValue::from_static(&text[start..end]);
                start = end;
                value
            })
            .collect()
    });
    shared[seconds as usize].clone()
}

fn header_value(text: &str) -> HeaderValue {
    HeaderValue::from_str(text).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
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
    let upstream = app
        .upstream
        .call_streaming_billed(outbound, &bill.model)
        .await?;
    app.metrics.upstream_usage(bill, None);
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

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn an_age_reads_as_its_whole_seconds_shared_or_not() {
        for (age, text) in [
            (Duration::ZERO, "0"),
            (Duration::from_millis(1_999), "1"),
            (Duration::from_secs(59), "59"),
            (Duration::from_secs(SHARED_AGE_VALUES - 1), "3599"),
            (Duration::from_secs(SHARED_AGE_VALUES), "3600"),
            (Duration::from_secs(86_400), "86400"),
        ] {
            assert_eq!(age_value(age), text, "{age:?}");
        }
    }
}
