//! One pooled reqwest client (rustls) for every provider. Each attempt is
//! bounded by the upstream's timeouts; `retry` decides whether to try again.

use std::{
    borrow::Cow,
    sync::Arc,
    time::{Duration, Instant},
};

use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use bytes::{Bytes, BytesMut};

use tokio_util::sync::CancellationToken;

use super::{
    first_event::{FirstEvent, read_first_event},
    pool::{Pool, Target},
    retry::{self, AttemptError},
    transport::SendError,
    walk::Counted,
};
use crate::{
    breaker::BreakerState,
    clock::{Clock, SystemClock, retry_after_secs},
    config::{Api, Config, RetryConfig},
    error::GatewayError,
    metrics::{Metrics, ModelLabel},
    provider::Call,
    routing,
    sse::Format,
    traces,
};

#[derive(Debug)]
pub struct Upstream {
    /// One pool per configured upstream, indexed like `config.upstreams`.
    pub(super) pools: Vec<Pool>,
    /// Cancelled when the shutdown drain times out: running calls end at once.
    pub(super) cut: CancellationToken,
    pub(super) retry: RetryConfig,
    max_response_bytes: usize,
    /// Every billable call is counted here, once per call (not per attempt or waiter).
    pub(super) metrics: Metrics,
}

/// A request to send to a provider.
#[derive(Debug, Clone)]
pub struct Outbound {
    /// Index into `config.upstreams`.
    pub upstream: usize,
    pub method: Method,
    /// Below the base URL, e.g. `/chat/completions`.
    /// Below the upstream's base URL; the deduplicated endpoints' paths are static.
    pub path: Cow<'static, str>,
    pub query: Option<String>,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The caller's credential as an `Authorization` value (`auth::forwarded_credential`),
    /// used only when the upstream has no key of its own, in the form its API expects.
    pub authorization: Option<HeaderValue>,
    /// The request's affinity key (`routing::affinity`): which member of a
    /// pool it goes to first. `None`: by weight alone.
    pub affinity: Option<u64>,
    /// The member the request must go to and no other: the account that
    /// made the state it names (a stored response, a file). Cooling or
    /// failing, the caller gets its error, never another account's answer.
    pub pin: Option<Arc<str>>,
    /// The public model the request is routed by, which an account may
    /// call by another name (`deployments`); `None` for a pass-through call.
    pub model: Option<Arc<str>>,
    pub body: Bytes,
}

/// A successful response read to its end.
#[derive(Debug)]
pub struct Buffered {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub attempts: usize,
    pub elapsed: Duration,
    /// The pool member that answered (`x-corral-member`).
    pub member: Option<Arc<str>>,
}

/// What one attempt awaits, and for how long.
#[derive(Debug, Clone, Copy)]
enum Wait {
    /// The whole exchange, head and body: a buffered call.
    Whole(Duration),
    /// The response head only: a streamed call, whose body is bounded by
    /// its reader (`body::bounded`, the stream relay).
    Head(Duration),
}

/// Which of a member's bounds a streamed call's head waits under.
#[derive(Debug, Clone, Copy)]
enum HeadWait {
    /// A read's: `first_byte_timeout`.
    FirstByte,
    /// A deduplicated stream's: as long as its first event may take.
    FirstEvent,
    /// A pass-through job's, which answers when done: `request_timeout`.
    WholeJob,
}

/// How a streamed call's head is awaited and judged.
#[derive(Clone, Copy)]
struct StreamHead<'a> {
    wait: HeadWait,
    /// Whether a retryable status is retried at all.
    retry_statuses: bool,
    counted: Counted,
    /// A deduplicated stream's: its first event is read inside the attempt.
    first_event: Option<FirstEventCheck<'a>>,
}

/// A deduplicated stream's first event, read inside each attempt: one that
/// is the provider's failure (`overloaded_error`, `response.failed`, an
/// error chunk) reached no caller, so it fails the attempt like the status
/// it names, and a retryable one is retried or failed over
/// (`first_event.rs`).
#[derive(Clone, Copy)]
pub struct FirstEventCheck<'a> {
    /// The stream's API format, which says which event fails it.
    pub format: Format,
    /// Called at each member's 2xx head, before its first event is read:
    /// the flight shows its live log then (its callers get their response
    /// head and keep-alives while a model thinks); it may be called again
    /// when a failed first event moves the call on.
    pub on_head: &'a (dyn Fn() + Sync),
}

impl Upstream {
    pub fn new(config: &Config, metrics: Metrics) -> anyhow::Result<Self> {
        Self::guarded(
            config,
            metrics,
            Arc::new(SystemClock),
            CancellationToken::new(),
        )
    }

    /// As `new`, with the clock the upstream rate caps run on and the token
    /// that cuts every running call (shutdown).
    pub fn guarded(
        config: &Config,
        metrics: Metrics,
        clock: Arc<dyn Clock>,
        cut: CancellationToken,
    ) -> anyhow::Result<Self> {
        let pools = config
            .upstreams
            .iter()
            .map(|upstream| Pool::new(upstream, config, clock.clone()))
            .collect::<anyhow::Result<_>>()?;
        Ok(Self {
            cut,
            pools,
            retry: config.retry.clone(),
            max_response_bytes: config.limits.max_response_bytes,
            metrics,
        })
    }

    pub fn name(&self, upstream: usize) -> &str {
        &self.pools[upstream].name
    }

    /// Whether `upstream` is a pool of several members (accounts), whose
    /// state a call must follow to the member that made it (`pins.rs`).
    pub fn is_pool(&self, upstream: usize) -> bool {
        self.pools[upstream].is_shared()
    }

    /// Refuses (401) a caller's credential that would be forwarded to
    /// `upstream` and has the form of another provider's key: a credential
    /// goes only to the provider it belongs to. An upstream with a key of its
    /// own forwards no caller's credential, so nothing is refused there (a
    /// gateway key, which `auth.keys` never lets reach an upstream without
    /// one, included). Asked before a request is sent anywhere, and again by
    /// every attempt (the last word).
    pub fn check_credential(
        &self,
        upstream: usize,
        authorization: Option<&HeaderValue>,
    ) -> Result<(), GatewayError> {
        self.pools[upstream]
            .members
            .iter()
            .try_for_each(|target| target.check_credential(authorization))
    }

    /// The API `upstream` speaks.
    pub fn api(&self, upstream: usize) -> Api {
        self.pools[upstream].api
    }

    /// `upstream`'s `request_timeout`: the bound on one attempt, a streamed
    /// body included (from the request to its last byte); of a pool, its
    /// longest member's.
    pub fn request_timeout(&self, upstream: usize) -> Duration {
        self.pools[upstream]
            .members
            .iter()
            .map(|target| target.request_timeout)
            .max()
            .unwrap_or_default()
    }

    /// Every member of every pool of several, and whether it is cooling now
    /// (`corral_member_cooling`, read at scrape time).
    pub fn member_cooling(&self) -> impl Iterator<Item = (&str, &Arc<str>, bool)> {
        self.pools
            .iter()
            .filter(|pool| pool.is_shared())
            .flat_map(|pool| {
                pool.members
                    .iter()
                    .enumerate()
                    .map(move |(member, target)| {
                        (pool.name.as_str(), &target.member, pool.is_cooling(member))
                    })
            })
    }

    /// The state of `upstream`'s circuit: of a pool, its best member's (a
    /// pool is open only when every member is).
    pub fn circuit(&self, upstream: usize) -> BreakerState {
        let states = self.pools[upstream]
            .members
            .iter()
            .map(|target| target.guard.breaker.state());
        let mut best = BreakerState::Open;
        for state in states {
            match state {
                BreakerState::Closed => return BreakerState::Closed,
                BreakerState::HalfOpen => best = BreakerState::HalfOpen,
                BreakerState::Open => {}
            }
        }
        best
    }

    /// Sends with retries and reads the whole body. Only a 2xx is `Ok`; the
    /// provider's final error comes back as `GatewayError::Upstream`. The call
    /// is counted under `model`.
    pub async fn call_buffered(
        &self,
        outbound: &Outbound,
        model: &ModelLabel,
    ) -> Result<Buffered, GatewayError> {
        let started = Instant::now();
        let pool = &self.pools[outbound.upstream];
        let (result, attempts, member) = self.buffered_attempts(outbound).await;
        let elapsed = started.elapsed();
        tracing::debug!(upstream = %pool.name, member = member.as_deref().unwrap_or("-"), attempts, ?elapsed, ok = result.is_ok(), "upstream call");
        let status = match &result {
            Ok((status, _, _)) => status.as_str(),
            Err(err) => outcome_label(err),
        };
        self.metrics.upstream_call(
            &pool.name,
            member.as_deref(),
            model,
            status,
            attempts,
            elapsed,
        );
        let (status, headers, body) = result.map_err(|err| name_timeout(err, &pool.name))?;
        Ok(Buffered {
            status,
            headers,
            body,
            attempts,
            elapsed,
            member,
        })
    }

    /// As `call_buffered`, for a call that is not billable (a model list):
    /// guarded and retried alike, not counted.
    pub async fn call_unbilled(&self, outbound: &Outbound) -> Result<Buffered, GatewayError> {
        let started = Instant::now();
        let pool = &self.pools[outbound.upstream];
        let (result, attempts, member) = self.buffered_attempts(outbound).await;
        let (status, headers, body) = result.map_err(|err| name_timeout(err, &pool.name))?;
        Ok(Buffered {
            status,
            headers,
            body,
            attempts,
            elapsed: started.elapsed(),
            member,
        })
    }

    async fn buffered_attempts(
        &self,
        outbound: &Outbound,
    ) -> (
        Result<(StatusCode, HeaderMap, Bytes), GatewayError>,
        usize,
        Option<Arc<str>>,
    ) {
        self.protected(outbound, Counted::Failures, |target| async move {
            // The whole exchange, body included, within `request_timeout`.
            let deadline = tokio::time::Instant::now() + target.request_timeout;
            let mut response = self
                .send_once(outbound, target, Wait::Whole(target.request_timeout))
                .await?;
            let status = response.status();
            // Taken, not cloned: reading the body needs none of them.
            let headers = std::mem::take(response.headers_mut());
            // From here the body has begun to arrive: a failure is not retried.
            let body = tokio::time::timeout_at(deadline, self.read_body(target, response))
                .await
                .unwrap_or_else(|_| {
                    Err(GatewayError::UpstreamTimeout {
                        upstream: target.name.clone(),
                    })
                })
                .map_err(AttemptError::fatal)?;
            if status.is_success() {
                return Ok((status, headers, body));
            }
            Err(status_error(target.api, status, &headers, body))
        })
        .await
    }

    /// As `call_streaming`, for a billable call: counted under `model` (its
    /// duration is the time to the response headers). With the response, the
    /// pool member that answered (`None`: a call that made no attempt).
    pub async fn call_streaming_billed(
        &self,
        outbound: &Outbound,
        model: &ModelLabel,
    ) -> Result<(reqwest::Response, Option<Arc<str>>), GatewayError> {
        self.streaming_billed(outbound, model, None).await
    }

    /// As `call_streaming_billed`, for a deduplicated stream whose first
    /// event is read inside each attempt ([`FirstEventCheck`]): a stream the
    /// provider failed before its first event is a failed attempt.
    pub async fn call_event_stream(
        &self,
        outbound: &Outbound,
        model: &ModelLabel,
        first_event: FirstEventCheck<'_>,
    ) -> Result<(reqwest::Response, Option<Arc<str>>), GatewayError> {
        self.streaming_billed(outbound, model, Some(first_event))
            .await
    }

    async fn streaming_billed(
        &self,
        outbound: &Outbound,
        model: &ModelLabel,
        first_event: Option<FirstEventCheck<'_>>,
    ) -> Result<(reqwest::Response, Option<Arc<str>>), GatewayError> {
        let started = Instant::now();
        let head = StreamHead {
            wait: HeadWait::FirstEvent,
            retry_statuses: true,
            counted: Counted::Failures,
            first_event,
        };
        let (result, attempts, member) = self.streaming_attempts(outbound, head).await;
        let code = result.as_ref().map(reqwest::Response::status);
        let status = match &code {
            Ok(code) => code.as_str(),
            Err(err) => outcome_label(err),
        };
        let pool = &self.pools[outbound.upstream];
        self.metrics.upstream_call(
            &pool.name,
            member.as_deref(),
            model,
            status,
            attempts,
            started.elapsed(),
        );
        result
            .map(|response| (response, member))
            .map_err(|err| name_timeout(err, &pool.name))
    }

    /// Sends a pass-through request until a 2xx response's headers arrive,
    /// and returns it for the caller to stream. Nothing is retried once the
    /// body is relayed, and an error status only for a request that cannot
    /// create or bill anything twice (`GET`, `HEAD`, a token count): a slow
    /// image generation that ends in a 500 may have been made, and billed, all
    /// the same.
    ///
    /// A job (an image, a transcription: any `POST`) answers only when it is
    /// done: its head may take the whole `request_timeout`, and a job that
    /// outlasts even that is the caller's slow job, not a sick provider, so
    /// it opens no breaker that every tenant shares. A read (`GET`, `HEAD`)
    /// has its head within `first_byte_timeout`, like a stream's. With the
    /// response, the pool member that answered.
    pub async fn call_streaming(
        &self,
        outbound: &Outbound,
    ) -> Result<(reqwest::Response, Option<Arc<str>>), GatewayError> {
        let read = is_safe(&outbound.method);
        let head = StreamHead {
            wait: if read {
                HeadWait::FirstByte
            } else {
                HeadWait::WholeJob
            },
            retry_statuses: read || FREE_TO_RESEND.contains(&outbound.path.as_ref()),
            counted: if read {
                Counted::Failures
            } else {
                Counted::FailuresButSlowness
            },
            first_event: None,
        };
        let (result, _attempts, member) = self.streaming_attempts(outbound, head).await;
        let pool = &self.pools[outbound.upstream];
        result
            .map(|response| (response, member))
            .map_err(|err| name_timeout(err, &pool.name))
    }

    async fn streaming_attempts(
        &self,
        outbound: &Outbound,
        head: StreamHead<'_>,
    ) -> (
        Result<reqwest::Response, GatewayError>,
        usize,
        Option<Arc<str>>,
    ) {
        let retry_statuses = head.retry_statuses;
        self.protected(outbound, head.counted, |target| async move {
            let wait = match head.wait {
                HeadWait::FirstByte => target.first_byte_timeout,
                HeadWait::FirstEvent => target.stream_head_timeout,
                HeadWait::WholeJob => target.request_timeout,
            };
            let sent_at = tokio::time::Instant::now();
            let response = self.send_once(outbound, target, Wait::Head(wait)).await?;
            let status = response.status();
            if status.is_success() {
                let Some(first_event) = head.first_event else {
                    return Ok(response);
                };
                (first_event.on_head)();
                let read = read_first_event(
                    response,
                    first_event.format,
                    self.max_response_bytes,
                    sent_at + wait,
                )
                .await;
                return match read {
                    FirstEvent::Relay(response) => Ok(response),
                    // As a head that never came: the provider may be computing
                    // it, so it moves on only when it may be sent twice.
                    FirstEvent::Silent => Err(AttemptError::when(
                        self.retry.resend_sent_requests,
                        GatewayError::UpstreamTimeout {
                            upstream: target.name.clone(),
                        },
                    )),
                    FirstEvent::Failed {
                        status,
                        body,
                        response,
                    } => {
                        let mut headers = HeaderMap::new();
                        headers.insert(
                            header::CONTENT_TYPE,
                            HeaderValue::from_static("application/json"),
                        );
                        let failed = status_error(target.api, status, &headers, body);
                        // Not retried (the request's own fault): relayed as
                        // it came, the provider's error event to every reader.
                        if failed.retryable {
                            Err(failed)
                        } else {
                            Ok(response)
                        }
                    }
                };
            }
            let headers = response.headers().clone();
            let body = self
                .read_body(target, response)
                .await
                .map_err(AttemptError::fatal)?;
            let mut refused = status_error(target.api, status, &headers, body);
            refused.retryable &= retry_statuses;
            Err(refused)
        })
        .await
    }

    /// Sends the request once to `target`, awaiting what `wait` says: the
    /// whole exchange (a buffered call), or the response head (a streamed
    /// call, whose body has bounds of its own).
    async fn send_once(
        &self,
        outbound: &Outbound,
        target: &Target,
        wait: Wait,
    ) -> Result<reqwest::Response, AttemptError> {
        target
            .check_credential(outbound.authorization.as_ref())
            .map_err(AttemptError::fatal)?;
        // An account that fetches its tokens (Entra ID) has one for every
        // attempt; a token endpoint that fails is this member failing.
        let token = match target.adapter.token() {
            Some(tokens) => Some(tokens.bearer().await.map_err(|err| {
                AttemptError::when(
                    true,
                    GatewayError::UpstreamUnreachable {
                        upstream: target.name.clone(),
                        reason: format!("its access token: {err}"),
                    },
                )
            })?),
            None => None,
        };
        let prepared = target
            .adapter
            .prepare(
                &Call {
                    method: &outbound.method,
                    path: &outbound.path,
                    query: outbound.query.as_deref(),
                    model: outbound.model.as_deref(),
                    headers: &outbound.headers,
                    authorization: outbound.authorization.as_ref(),
                    body: &outbound.body,
                },
                token.as_ref(),
            )
            .map_err(AttemptError::fatal)?;
        let headers = outbound
            .headers
            .iter()
            .filter(|(name, _)| target.adapter.forwards(name))
            .chain(&prepared.headers);
        // Exactly one Content-Type: the caller's (a multipart boundary, say)
        // or the adapter's when either has one, else JSON, what every
        // deduplicated body is.
        let json = (!headers
            .clone()
            .any(|(name, _)| name == header::CONTENT_TYPE))
        .then(|| {
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )
        });
        let mut trace_headers = HeaderMap::new();
        if traces::active() {
            traces::inject(&mut trace_headers);
        }
        let headers = json
            .into_iter()
            .chain(headers.map(|(name, value)| (name.clone(), value.clone())))
            .chain(
                trace_headers
                    .into_iter()
                    .filter_map(|(name, value)| Some((name?, value))),
            );
        let body =
            (!prepared.body.is_empty() || outbound.method == Method::POST).then_some(prepared.body);
        // A buffered call's head comes with its whole answer (a reasoning
        // model's, after minutes): only its total bounds it (its body too,
        // `read_body`'s caller).
        let (head_timeout, whole) = match wait {
            Wait::Whole(total) => (total, Some(total)),
            Wait::Head(total) => (total, None),
        };
        // Past the connection, the provider may have the request and be
        // computing it (and billing it): it is sent again only when that
        // cannot cost twice.
        let resend = self.retry.resend_sent_requests || is_safe(&outbound.method);
        let send =
            target
                .transport
                .send(outbound.method.clone(), prepared.url, headers, body, whole);
        let response = match tokio::time::timeout(head_timeout, send).await {
            Ok(response) => response,
            Err(_) => {
                let timeout = GatewayError::UpstreamTimeout {
                    upstream: target.name.clone(),
                };
                return Err(AttemptError::when(resend, timeout));
            }
        };
        let response = response.map_err(|err| classify_send_error(err, &target.name, resend))?;
        traces::record_upstream_status(response.status());
        Ok(target.adapter.answer(response))
    }

    async fn read_body(
        &self,
        target: &Target,
        mut response: reqwest::Response,
    ) -> Result<Bytes, GatewayError> {
        let mut body = BytesMut::new();
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    if body.len() + chunk.len() > self.max_response_bytes {
                        return Err(GatewayError::UpstreamInvalid {
                            upstream: target.name.clone(),
                            reason: format!(
                                "response larger than {} bytes",
                                self.max_response_bytes
                            ),
                        });
                    }
                    body.extend_from_slice(&chunk);
                }
                Ok(None) => return Ok(body.freeze()),
                Err(err) if err.is_timeout() => {
                    return Err(GatewayError::UpstreamTimeout {
                        upstream: target.name.clone(),
                    });
                }
                Err(err) => {
                    return Err(GatewayError::UpstreamUnreachable {
                        upstream: target.name.clone(),
                        reason: format!(
                            "response body broke off: {}",
                            error_chain(&err.without_url())
                        ),
                    });
                }
            }
        }
    }
}

/// A connect error is worth another attempt (nothing reached the provider);
/// a timeout or a connection lost after that, only when `resend` says the
/// request may be sent twice.
fn classify_send_error(err: SendError, upstream: &str, resend: bool) -> AttemptError {
    // Without its URL: a query may carry a credential (`?key=`), and the
    // reason reaches the log and the caller.
    let err = err.without_url();
    let retryable = err.is_connect() || resend;
    if err.is_timeout() && !err.is_connect() {
        AttemptError::when(
            retryable,
            GatewayError::UpstreamTimeout {
                upstream: upstream.to_owned(),
            },
        )
    } else {
        AttemptError::when(
            retryable,
            GatewayError::UpstreamUnreachable {
                upstream: upstream.to_owned(),
                reason: error_chain(&err),
            },
        )
    }
}

/// Pass-through `POST`s that create and bill nothing (a token count, a
/// moderation check): an error status is retried like a `GET`'s.
const FREE_TO_RESEND: &[&str] = &["/messages/count_tokens", "/moderations"];

/// A method whose request can be sent twice without creating or billing
/// anything twice.
fn is_safe(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

pub(crate) fn status_error(
    api: Api,
    status: StatusCode,
    headers: &HeaderMap,
    body: Bytes,
) -> AttemptError {
    let retryable = retry::is_retryable_status(api, status, headers, &body);
    let mut retry_after = retry::retry_after(headers);
    let mut retry_after_header = headers.get(header::RETRY_AFTER).cloned();
    // Google says its wait in the body (`RetryInfo`), not in `Retry-After`:
    // read there, it goes where `Retry-After` goes (the retry loop, the
    // failure memory, the caller's `Retry-After`, in whole seconds).
    if api == Api::Gemini
        && retry_after.is_none()
        && let Some(delay) = retry::retry_info_delay(&body)
    {
        retry_after = Some(delay);
        retry_after_header = Some(HeaderValue::from(retry_after_secs(delay).as_secs()));
    }
    // How long the account is spent for, in the provider's own words (its
    // rate-limit resets, `RetryInfo`): what a pool's member cools for.
    let cooldown = routing::cooldown_from(
        status.as_u16(),
        headers,
        &body,
        Duration::ZERO,
        std::time::SystemTime::now(),
    )
    .filter(|wait| !wait.is_zero());
    AttemptError {
        retryable,
        retry_after,
        cooldown,
        error: GatewayError::Upstream {
            status,
            content_type: headers.get(header::CONTENT_TYPE).cloned(),
            retry_after: retry_after_header,
            body,
        },
    }
}

/// The `status` label of a call that ended in `err`: the provider's status,
/// or what went wrong when there was none.
pub(super) fn outcome_label(err: &GatewayError) -> &str {
    match err {
        GatewayError::Upstream { status, .. } => status.as_str(),
        GatewayError::UpstreamTimeout { .. } => "timeout",
        GatewayError::UpstreamUnreachable { .. } => "unreachable",
        GatewayError::UpstreamInvalid { .. } => "invalid",
        _ => "error",
    }
}

/// The retry deadline reports a generic timeout; give it the upstream's name.
fn name_timeout(err: GatewayError, upstream: &str) -> GatewayError {
    match err {
        GatewayError::UpstreamTimeout { .. } => GatewayError::UpstreamTimeout {
            upstream: upstream.to_owned(),
        },
        other => other,
    }
}

/// reqwest's top-level message hides the cause ("error sending request").
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A Gemini error body whose `RetryInfo` asks for `delay`.
    pub(crate) fn retry_info(delay: &str) -> Bytes {
        Bytes::from(
            serde_json::json!({"error": {"code": 429, "message": "quota",
            "status": "RESOURCE_EXHAUSTED", "details": [
                {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "QUOTA"},
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay},
            ]}})
            .to_string(),
        )
    }

    /// Issue 37 W2: Google says a 429's wait in the body (`RetryInfo`), not
    /// in `Retry-After`; the retry loop waits it, and it bounds like the
    /// header.
    #[tokio::test(start_paused = true)]
    async fn a_gemini_retry_info_is_the_providers_wait() {
        let none = HeaderMap::new();
        let too_many = StatusCode::TOO_MANY_REQUESTS;
        let attempt = status_error(Api::Gemini, too_many, &none, retry_info("1.5s"));
        assert!(attempt.retryable);
        assert_eq!(attempt.retry_after, Some(Duration::from_millis(1500)));
        assert_eq!(
            attempt.error.provider_retry_after(Duration::from_secs(60)),
            Some(Duration::from_secs(2)),
            "the caller's Retry-After, in whole seconds"
        );
        let config = RetryConfig {
            max_attempts: 2,
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(20),
            deadline: Duration::from_secs(60),
            ..RetryConfig::default()
        };
        let calls = AtomicUsize::new(0);
        let start = tokio::time::Instant::now();
        let (result, attempts) = retry::with_retries(&config, || async {
            if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                Err(status_error(
                    Api::Gemini,
                    too_many,
                    &none,
                    retry_info("1.5s"),
                ))
            } else {
                Ok(())
            }
        })
        .await;
        assert!(result.is_ok());
        assert_eq!(attempts, 2);
        assert_eq!(start.elapsed(), Duration::from_millis(1500));
        // `Retry-After` wins; another API's body is not read; a wait is bounded.
        let mut header = HeaderMap::new();
        header.insert(header::RETRY_AFTER, HeaderValue::from_static("4"));
        let attempt = status_error(Api::Gemini, too_many, &header, retry_info("1.5s"));
        assert_eq!(attempt.retry_after, Some(Duration::from_secs(4)));
        let attempt = status_error(Api::OpenAi, too_many, &none, retry_info("1.5s"));
        assert_eq!(attempt.retry_after, None);
        let attempt = status_error(Api::Gemini, too_many, &none, retry_info("1e300s"));
        assert_eq!(attempt.retry_after, Some(retry::LONGEST_RETRY_AFTER));
        for junk in ["soon", "-1s", "NaNs", "3"] {
            let attempt = status_error(Api::Gemini, too_many, &none, retry_info(junk));
            assert_eq!(attempt.retry_after, None, "{junk}");
        }
    }

    /// reqwest's message names the URL, query and all; a query may carry a
    /// credential (`?key=`), and the reason reaches logs and callers.
    #[tokio::test]
    async fn a_send_error_names_no_url() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let err = reqwest::Client::new()
            .get(format!("http://127.0.0.1:{port}/v1/models?key=AIza-SECRET"))
            .send()
            .await
            .unwrap_err();
        assert!(
            error_chain(&err).contains("AIza-SECRET"),
            "reqwest's own message names the URL"
        );
        let attempt = classify_send_error(SendError::Proxied(err), "mock", false);
        let text = attempt.error.to_string();
        assert!(attempt.retryable, "a connect error is retried");
        assert!(!text.contains("AIza-SECRET"), "{text}");

        // The direct transport: a connect error, retried, naming no URL.
        let err = super::super::transport::Transport::direct(Duration::from_secs(5))
            .unwrap()
            .get(&format!(
                "http://127.0.0.1:{port}/v1/models?key=AIza-SECRET"
            ))
            .await
            .unwrap_err();
        assert!(err.is_connect(), "{err:?}");
        let attempt = classify_send_error(err, "mock", false);
        let text = attempt.error.to_string();
        assert!(attempt.retryable, "a connect error is retried");
        assert!(text.contains("Connection refused"), "{text}");
        assert!(!text.contains("AIza-SECRET"), "{text}");
    }
}
