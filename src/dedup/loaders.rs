//! The upstream calls a flight makes: buffered, streamed (publishing the
//! live log as the stream begins), and parsed on demand for a request the
//! memo answered. Each says what it sends (`Loader::sends`) and honours the
//! flight's attempt cap (`FlightCall::max_attempts`). A call its pool could
//! not answer before its first byte goes on to the pool's fallbacks
//! (`fallback.rs`), whose answer is stored under their key.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use axum::http::{HeaderValue, StatusCode, header};
use bytes::Bytes;
use futures::FutureExt as _;

use super::{
    Dedup, RawRequest,
    bypass::answer_text_bytes,
    fallback::{Fallbacks, pool_could_not_answer},
    outbound_of,
    pinning::PinOwners,
    respond::{MEMBER_HEADER, shared_response_with},
};
use crate::{
    cache::StoredResponse,
    coalesce::{FlightCall, Loaded, Loader, StreamPublisher},
    error::GatewayError,
    fingerprint::{CacheKey, Sent},
    metrics::Attribution,
    sse::{self, Format, StreamLog},
    upstream::{FirstEventCheck, Outbound, retry},
    usage::{Estimated, Usage, text_bytes},
    wire::Wire,
};

/// The upstream call of a flight started by a request served from the memo:
/// the request is parsed (as it was when first seen, so it parses again)
/// when the call runs, not by every caller that reads the cache.
pub(super) fn parsing_loader(
    dedup: Arc<Dedup>,
    raw: RawRequest,
    bill: Attribution,
    key: CacheKey,
) -> Loader {
    let sends = Sent::of(false, &raw.body);
    let raw = Arc::new(raw);
    let bill = Arc::new(bill);
    Loader::new(sends, move |call: FlightCall| {
        let dedup = dedup.clone();
        let raw = raw.clone();
        let tenant = bill.tenant.clone();
        let bill = billed_to(&bill, call.background);
        let key = key.clone();
        Box::pin(async move {
            let mut request = raw.parse(&dedup)?;
            let fallbacks = Fallbacks::of(&dedup, request.upstream, &raw, &tenant);
            let mut outbound = outbound_of(&mut request);
            outbound.pin = dedup.pin_of(&request).await;
            let retained_under = dedup.own_retry_key(&request, &key);
            let owners = dedup.pin_owners(&request);
            retry::at_most(
                call.max_attempts,
                call_upstream(
                    &dedup,
                    &outbound,
                    request.wire,
                    &bill,
                    retained_under,
                    owners.as_ref(),
                    fallbacks.as_deref(),
                ),
            )
            .await
        })
    })
}

/// The streamed upstream call of a flight: publishes the live log as soon as
/// the stream begins, relays every event into it, and ends with the assembled
/// non-stream answer (what the cache stores, and what non-stream callers of
/// the same flight receive). Retries happen only before the first event.
pub(super) fn stream_loader(
    dedup: Arc<Dedup>,
    outbound: Outbound,
    wire: &'static dyn Wire,
    bill: Attribution,
    retained_under: Option<CacheKey>,
    owners: Option<PinOwners>,
    fallbacks: Option<Arc<Fallbacks>>,
) -> Loader {
    let sends = Sent::of(true, &outbound.body);
    let outbound = Arc::new(outbound);
    let bill = Arc::new(bill);
    Loader::new(sends, move |call: FlightCall| {
        let FlightCall {
            publisher,
            max_attempts,
            background,
        } = call;
        let dedup = dedup.clone();
        let outbound = outbound.clone();
        let bill = billed_to(&bill, background);
        let retained_under = retained_under.clone();
        let owners = owners.clone();
        let fallbacks = fallbacks.clone();
        let load = async move {
            let started = std::time::Instant::now();
            dedup.may_call_upstream(&bill).await?;
            let (log, writer) =
                StreamLog::with_limits(wire.stream_format(), dedup.stream_limits.clone());
            // The live log is shown at the first 2xx head (its callers get
            // their head and keep-alives while the model thinks); its first
            // event is read inside the attempt, so a stream the provider
            // failed before it is retried or failed over, for every caller.
            let published = AtomicBool::new(false);
            let on_head = || {
                if !published.swap(true, Ordering::AcqRel) {
                    publisher.publish(log.clone());
                }
            };
            let first_event = FirstEventCheck {
                format: wire.stream_format(),
                on_head: &on_head,
            };
            // Before any event is relayed, a call its pool could not answer
            // goes on to the fallbacks: what follows is the answering one's.
            // Boxed: the attempts' future is kilobytes, and held inline it would
            // be moved with the flight's whole future into its box.
            let called = match Box::pin(dedup.upstream.call_event_stream(
                &outbound,
                &bill.model,
                first_event,
            ))
            .await
            {
                Ok((response, member)) => Ok((response, member, outbound, bill, None)),
                Err(error) => match fallbacks.as_deref() {
                    // Boxed: a rare path whose future, held inline, would make
                    // every stream's flight several kilobytes larger to move.
                    Some(fallbacks) if pool_could_not_answer(&error) => {
                        Box::pin(stream_fallback(
                            &dedup,
                            fallbacks,
                            outbound.upstream,
                            &bill,
                            wire,
                            first_event,
                            error,
                        ))
                        .await
                    }
                    _ => Err(error),
                },
            };
            let (response, member, outbound, bill, stored_under) = match called {
                Ok(called) => called,
                Err(error) => {
                    // Readers of a log shown at a head get the error as its end.
                    writer.fail_with(&error.to_string());
                    return Err(error);
                }
            };
            // Its spend is the member's that answered.
            let bill = Arc::new(bill.answered_by(member.clone()));
            let retained_under = retained_under.filter(|_| stored_under.is_none());
            let upstream = dedup.upstream.name(outbound.upstream).to_owned();
            let silence = dedup.stream_silence();
            // `request_timeout` bounds the whole flight, headers and every event:
            // past it, every reader gets an error event, the flight ends (its
            // Redis lock with it) and nothing is cached.
            let total = dedup
                .upstream
                .request_timeout(outbound.upstream)
                .saturating_sub(started.elapsed());
            let relay = sse::relay_response(response, writer, silence, total);
            let cancel_when_abandoned = dedup.coalesce.cancel_when_abandoned;
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
                    dedup.cut_upstream.cancelled().await;
                    log.interrupt(log.error_event(
                        "the gateway is shutting down; the stream was cut",
                    ));
                } => {
                    bill_unfinished(&dedup, &bill, &outbound, wire.stream_format(), &log.events(), Estimated::Abandoned);
                    return Err(GatewayError::ShuttingDown);
                }
                // Every reader left and nobody waits for the complete answer: stop the spend.
                () = abandon => {
                    // Paid for, up to where it stopped: what it reported, else an estimate.
                    bill_unfinished(&dedup, &bill, &outbound, wire.stream_format(), &log.events(), Estimated::Abandoned);
                    // Local to this instance: recorded for no one elsewhere.
                    return Err(GatewayError::StreamAbandoned);
                }
            };
            // The stream was paid for whether or not it completed.
            if !summary.completed() {
                bill_unfinished(
                    &dedup,
                    &bill,
                    &outbound,
                    wire.stream_format(),
                    &summary.events,
                    Estimated::Broken,
                );
                // Readers already received the error event; waiters get this error.
                return Err(GatewayError::UpstreamInvalid {
                    upstream,
                    reason: format!("the stream broke: {:?}", summary.outcome),
                });
            }
            // Its usage, from every event (Anthropic reports input and output apart).
            let usage = wire
                .stream_format()
                .stream_usage(&summary.events)
                .or(summary.usage);
            dedup.billed_or_estimated(
                &bill,
                usage,
                || Usage::estimate(outbound.body.len(), events_text_bytes(&summary.events)),
                Estimated::Unreported,
            );
            let assembled =
                wire.assemble(&summary.events)
                    .map_err(|err| GatewayError::UpstreamInvalid {
                        upstream: upstream.clone(),
                        reason: format!("the stream does not assemble: {err}"),
                    })?;
            let body = Bytes::from(assembled.to_string());
            dedup
                .pin_answer(owners.as_ref(), member.as_deref(), &body)
                .await;
            let facts = wire.answer_facts(&body);
            Ok(Loaded {
                cacheable: facts.complete,
                response: StoredResponse {
                    status: StatusCode::OK,
                    headers: vec![(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json"),
                    )],
                    usage: facts.usage.or(usage),
                    body,
                },
                compute_time: started.elapsed(),
                events: summary.events,
                retained_under,
                stored_under,
            })
        };
        // A flight's error reaches every follower (through Redis too) in its API's shape.
        // A combinator, not an `async` block: one of those would hold `load`
        // twice over (as captured and as it runs), and it is kilobytes.
        Box::pin(retry::at_most(max_attempts, load).map(move |loaded| {
            loaded.map_err(|error: GatewayError| error.in_shape(wire.error_shape()))
        }))
    })
}

/// The streamed call of a flight whose pool could not start it (`error`),
/// sent on to each of the pool's fallbacks in turn until one starts: its
/// response, what it sent, its bill, and the key its answer is stored
/// under. None starting: the last failure.
async fn stream_fallback(
    dedup: &Dedup,
    fallbacks: &Fallbacks,
    from: usize,
    bill: &Attribution,
    wire: &'static dyn Wire,
    first_event: FirstEventCheck<'_>,
    mut error: GatewayError,
) -> Result<
    (
        reqwest::Response,
        Option<Arc<str>>,
        Arc<Outbound>,
        Arc<Attribution>,
        Option<CacheKey>,
    ),
    GatewayError,
> {
    for mut target in fallbacks.targets(dedup, bill, from) {
        // As `stream::serve` sends the primary's: always streamed, with usage.
        target.outbound.body = wire.stream_request(&target.request.body).body;
        super::add_stream_query(&mut target.outbound.query, wire);
        dedup.may_call_upstream(&target.bill).await?;
        match dedup
            .upstream
            .call_event_stream(&target.outbound, &target.bill.model, first_event)
            .await
        {
            Ok((response, member)) => {
                return Ok((
                    response,
                    member,
                    Arc::new(target.outbound),
                    Arc::new(target.bill),
                    Some(target.key),
                ));
            }
            Err(next) if pool_could_not_answer(&next) => error = next,
            Err(next) => return Err(next),
        }
    }
    Err(error)
}

/// Bills a streamed call that did not complete (`reason`): the usage its
/// `events` reported, with at least the output they relayed, else an estimate
/// from the request's size and that output.
fn bill_unfinished(
    dedup: &Dedup,
    bill: &Attribution,
    outbound: &Outbound,
    format: Format,
    events: &[Bytes],
    reason: Estimated,
) {
    let text = events_text_bytes(events);
    let relayed = Usage::estimate(0, text).completion_tokens;
    let reported = format
        .stream_usage(events)
        .map(|usage| usage.with_output_at_least(relayed));
    dedup.billed_or_estimated(
        bill,
        reported,
        || Usage::estimate(outbound.body.len(), text),
        reason,
    );
}

/// The bytes of generated text a stream's events relayed.
fn events_text_bytes(events: &[Bytes]) -> usize {
    events
        .iter()
        .filter_map(|event| match sse::event_json(event) {
            Some(json) => serde_json::from_slice(json).ok(),
            None => sse::named_event_value(event),
        })
        .map(|value| text_bytes(&value))
        .sum()
}

/// How often an abandoned stream's owner asks whether callers on other
/// instances still read its mirror (their heartbeat lives two seconds).
const REMOTE_READERS_POLL: std::time::Duration = std::time::Duration::from_millis(500);

/// Resolves when every stream reader has gone, here and on other instances
/// (the mirror's own reader is none), and no caller waits for the complete
/// answer.
pub(super) async fn abandoned(log: &StreamLog, publisher: &StreamPublisher) {
    log.abandoned().await;
    if publisher.waiters() > 0 {
        // Non-stream callers still wait for the answer: let it finish.
        std::future::pending::<()>().await;
    }
    while publisher.remote_readers().await {
        tokio::time::sleep(REMOTE_READERS_POLL).await;
    }
}

/// The upstream call a flight runs; it owns everything it needs, so it can run
/// detached from the connection of the caller that started it. Its tokens and
/// cost are counted here, once per call, whoever waits on it.
pub(super) fn upstream_loader(
    dedup: Arc<Dedup>,
    outbound: Outbound,
    wire: &'static dyn Wire,
    bill: Attribution,
    retained_under: Option<CacheKey>,
    owners: Option<PinOwners>,
    fallbacks: Option<Arc<Fallbacks>>,
) -> Loader {
    let sends = Sent::of(false, &outbound.body);
    let bill = Arc::new(bill);
    let outbound = Arc::new(outbound);
    Loader::new(sends, move |call: FlightCall| {
        let dedup = dedup.clone();
        let outbound = outbound.clone();
        let bill = billed_to(&bill, call.background);
        let retained_under = retained_under.clone();
        let owners = owners.clone();
        let fallbacks = fallbacks.clone();
        Box::pin(async move {
            retry::at_most(
                call.max_attempts,
                call_upstream(
                    &dedup,
                    &outbound,
                    wire,
                    &bill,
                    retained_under,
                    owners.as_ref(),
                    fallbacks.as_deref(),
                ),
            )
            .await
        })
    })
}

/// Whom a flight's call is billed to: the caller who started the flight, or
/// the gateway itself for a background refresh (`FlightCall::background`),
/// which spends no tenant's budget and still counts to the account caps.
pub(super) fn billed_to(bill: &Arc<Attribution>, background: bool) -> Arc<Attribution> {
    if background {
        Arc::new(bill.gateways_own())
    } else {
        bill.clone()
    }
}

/// One buffered upstream call, counted once whoever waits on it; one its
/// pool could not answer goes on to each of `fallbacks` in turn, and the
/// first that answers is stored under its own key.
pub(super) async fn call_upstream(
    dedup: &Dedup,
    outbound: &Outbound,
    wire: &'static dyn Wire,
    bill: &Attribution,
    retained_under: Option<CacheKey>,
    owners: Option<&PinOwners>,
    fallbacks: Option<&Fallbacks>,
) -> Result<Loaded, GatewayError> {
    let mut error = match call_pool(dedup, outbound, wire, bill, retained_under, owners).await {
        Err(error) if fallbacks.is_some() && pool_could_not_answer(&error) => error,
        answered => return answered,
    };
    for target in fallbacks
        .into_iter()
        .flat_map(|fallbacks| fallbacks.targets(dedup, bill, outbound.upstream))
    {
        // Pins are the primary pool's: a fallback's answer names no state of it.
        match call_pool(dedup, &target.outbound, wire, &target.bill, None, None).await {
            Ok(loaded) => {
                return Ok(Loaded {
                    stored_under: Some(target.key),
                    ..loaded
                });
            }
            Err(next) if pool_could_not_answer(&next) => error = next,
            Err(next) => return Err(next),
        }
    }
    Err(error)
}

/// One buffered call to one pool; the state its answer creates is pinned to
/// the member that made it (`owners`).
async fn call_pool(
    dedup: &Dedup,
    outbound: &Outbound,
    wire: &'static dyn Wire,
    bill: &Attribution,
    retained_under: Option<CacheKey>,
    owners: Option<&PinOwners>,
) -> Result<Loaded, GatewayError> {
    dedup
        .may_call_upstream(bill)
        .await
        .map_err(|error| error.in_shape(wire.error_shape()))?;
    // Boxed where it starts: the call is kilobytes of state, and every
    // future that awaits this one (the fallback walk, the attempt cap, the
    // loader's box, the flight) would otherwise move all of it.
    let buffered = Box::pin(dedup.upstream.call_buffered(outbound, &bill.model))
        .await
        .map_err(|error| error.in_shape(wire.error_shape()))?;
    let facts = wire.answer_facts(&buffered.body);
    let cacheable = facts.complete;
    if buffered.status.is_success() {
        dedup
            .pin_answer(owners, buffered.member.as_deref(), &buffered.body)
            .await;
    }
    let mut response = shared_response_with(
        buffered.status,
        &buffered.headers,
        buffered.body,
        facts.usage,
    );
    // The pool member that answered, for the caller to see (never a provider's
    // own `x-corral-*`: `shared_response` keeps only allowlisted headers).
    if let Some(member) = buffered.member.as_deref()
        && let Ok(value) = HeaderValue::from_str(member)
    {
        response.headers.push((MEMBER_HEADER, value));
    }
    // An answer without usage is billed what its size says.
    dedup.billed_or_estimated(
        &bill.answered_by(buffered.member.clone()),
        response.usage,
        || Usage::estimate(outbound.body.len(), answer_text_bytes(&response.body)),
        Estimated::Unreported,
    );
    Ok(Loaded {
        response,
        cacheable,
        compute_time: buffered.elapsed,
        events: Vec::new(),
        retained_under,
        stored_under: None,
    })
}
