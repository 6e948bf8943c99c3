//! One pooled reqwest client (rustls) for every provider. Each attempt is
//! bounded by the upstream's timeouts; `retry` decides whether to try again.

use std::{
    borrow::Cow,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use bytes::{Bytes, BytesMut};

use opentelemetry::context::FutureExt as _;
use tokio_util::sync::CancellationToken;

use super::{
    breaker::{UpstreamGuard, is_upstream_failure},
    retry::{self, AttemptError},
};
use crate::{
    auth::{API_KEY_HEADER, GEMINI_KEY_HEADER, Provider, bearer_token},
    breaker::BreakerState,
    clock::{Clock, SystemClock, retry_after_secs},
    config::{Api, Config, RetryConfig, Secret},
    error::GatewayError,
    metrics::{Metrics, ModelLabel},
    traces,
};

/// A provider as the client needs it.
#[derive(Debug)]
struct Target {
    name: String,
    /// How the provider is authenticated to and which errors it retries.
    api: Api,
    /// Every request URL extends its path (`confined_url`).
    base: reqwest::Url,
    /// Whose credentials it may be sent (`auth::Provider::of_upstream`).
    provider: Provider,
    api_key: Option<Secret<String>>,
    request_timeout: Duration,
    /// How long a read's response head may take (a pass-through `GET`).
    first_byte_timeout: Duration,
    /// How long a deduplicated stream's response head may take: as long as
    /// its first event may (`coalesce.first_event_timeout`), since some
    /// providers send the head only with the first token; at least
    /// `first_byte_timeout`, at most `request_timeout`.
    stream_head_timeout: Duration,
    /// Per upstream, so each has its own connect timeout.
    client: reqwest::Client,
    guard: UpstreamGuard,
}

#[derive(Debug)]
pub struct Upstream {
    targets: Vec<Target>,
    /// Cancelled when the shutdown drain times out: running calls end at once.
    cut: CancellationToken,
    retry: RetryConfig,
    max_response_bytes: usize,
    /// Every billable call is counted here, once per call (not per attempt or waiter).
    metrics: Metrics,
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

/// Which failed attempts are the provider's failure, counted against the
/// upstream's breaker that every tenant shares.
#[derive(Debug, Clone, Copy)]
enum Counted {
    /// Every provider failure ([`is_upstream_failure`]).
    Failures,
    /// As `Failures`, but not an attempt that ran out of time: a
    /// pass-through job (an image, a transcription) takes as long as its
    /// caller asked for, which says nothing of the provider's health.
    FailuresButSlowness,
}

impl Counted {
    fn is_failure(self, error: &GatewayError) -> bool {
        match self {
            Self::Failures => is_upstream_failure(error),
            Self::FailuresButSlowness => {
                !matches!(error, GatewayError::UpstreamTimeout { .. }) && is_upstream_failure(error)
            }
        }
    }
}

/// How a streamed call's head is awaited and judged.
#[derive(Debug, Clone, Copy)]
struct StreamHead {
    wait: Duration,
    /// Whether a retryable status is retried at all.
    retry_statuses: bool,
    counted: Counted,
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
        let targets = config
            .upstreams
            .iter()
            .map(|u| {
                let client = reqwest::Client::builder()
                    .use_rustls_tls()
                    // A redirect could lead a request (and the provider key)
                    // anywhere; the caller gets the 3xx as the provider sent it.
                    .redirect(reqwest::redirect::Policy::none())
                    .connect_timeout(u.connect_timeout)
                    .pool_idle_timeout(Duration::from_secs(90))
                    .pool_max_idle_per_host(256)
                    .tcp_nodelay(true)
                    .build()?;
                let base = reqwest::Url::parse(&u.base_url)?;
                Ok(Target {
                    name: u.name.clone(),
                    api: u.api,
                    provider: Provider::of_upstream(u.api, base.host_str()),
                    base,
                    api_key: u.api_key.clone(),
                    request_timeout: u.request_timeout,
                    first_byte_timeout: u.first_byte_timeout.min(u.request_timeout),
                    stream_head_timeout: u
                        .first_byte_timeout
                        .max(config.coalesce.first_event_timeout)
                        .min(u.request_timeout),
                    client,
                    guard: UpstreamGuard::new(u, &config.retry, clock.clone()),
                })
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Self {
            cut,
            targets,
            retry: config.retry.clone(),
            max_response_bytes: config.limits.max_response_bytes,
            metrics,
        })
    }

    pub fn name(&self, upstream: usize) -> &str {
        &self.targets[upstream].name
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
        let target = &self.targets[upstream];
        let Some(caller) = authorization.filter(|_| target.api_key.is_none()) else {
            return Ok(());
        };
        match Provider::of_key(bearer_token(caller.as_bytes())) {
            Some(owner) if owner != target.provider => Err(GatewayError::ForeignCredential {
                owner: owner.name(),
                upstream: target.name.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// The API `upstream` speaks.
    pub fn api(&self, upstream: usize) -> Api {
        self.targets[upstream].api
    }

    /// `upstream`'s `request_timeout`: the bound on one attempt, a streamed
    /// body included (from the request to its last byte).
    pub fn request_timeout(&self, upstream: usize) -> Duration {
        self.targets[upstream].request_timeout
    }

    /// The state of `upstream`'s circuit.
    pub fn circuit(&self, upstream: usize) -> BreakerState {
        self.targets[upstream].guard.breaker.state()
    }

    /// `retry::with_retries` behind the upstream's guard: every attempt passes
    /// the circuit breaker, the rate cap and the concurrency cap, and a retry
    /// happens only while the retry budget allows. The breaker counts calls,
    /// not attempts: a failed attempt's verdict waits until the call goes on
    /// (then it is released without one) or ends (then it is the call's
    /// failure), so one call of three failed attempts is one failure, and a
    /// call that failed once then answered is a success. The shutdown cut
    /// ends it at once.
    ///
    /// With traces, each attempt is a client span under the current span, and
    /// the request it sends carries that span's `traceparent`.
    async fn protected<T, F, Fut>(
        &self,
        outbound: &Outbound,
        counted: Counted,
        mut attempt: F,
    ) -> (Result<T, GatewayError>, usize)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, AttemptError>>,
    {
        let target = &self.targets[outbound.upstream];
        let guard = &target.guard;
        let max_attempts = retry::max_attempts(&self.retry);
        let made = AtomicUsize::new(0);
        // The last failed attempt's permit, its verdict not given yet.
        let failed: std::sync::Mutex<Option<crate::breaker::Permit<'_>>> =
            std::sync::Mutex::new(None);
        let take_failed = || failed.lock().unwrap_or_else(|p| p.into_inner()).take();
        let run = retry::with_retries(&self.retry, || {
            let n = made.fetch_add(1, Ordering::Relaxed) + 1;
            let call = attempt();
            let (failed, take_failed) = (&failed, &take_failed);
            async move {
                if n == 1 {
                    guard.budget.record_first();
                }
                // The call goes on: the earlier attempt's failure is not its verdict.
                if let Some(earlier) = take_failed() {
                    earlier.release();
                }
                let ticket = guard.admit().map_err(AttemptError::fatal)?;
                let _place = guard.acquire().await;
                // Only an attempt that goes out is a span (not one the
                // circuit or a cap refused).
                let traced =
                    traces::attempt_context(n, &outbound.method, &target.base, &target.name);
                let result = match &traced {
                    None => call.await,
                    Some(cx) => call.with_context(cx.clone()).await,
                };
                if let Some(cx) = &traced {
                    traces::end_attempt(
                        cx,
                        result.as_ref().err().map(|err| outcome_label(&err.error)),
                    );
                }
                match &result {
                    Err(err) if counted.is_failure(&err.error) => {
                        *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(ticket);
                    }
                    _ => ticket.success(),
                }
                result.map_err(|mut err| {
                    if err.retryable && n < max_attempts && !guard.budget.try_retry() {
                        tracing::info!(error = %err.error, "retry budget spent; not retrying");
                        err.retryable = false;
                    }
                    err
                })
            }
        });
        let outcome = tokio::select! {
            outcome = run => outcome,
            () = self.cut.cancelled() => (Err(GatewayError::ShuttingDown), made.load(Ordering::Relaxed)),
        };
        // The call ended on a failed attempt: that is the call's failure
        // (none when shutdown cut it: the provider was not at fault).
        if let Some(last) = take_failed() {
            match &outcome.0 {
                Err(GatewayError::ShuttingDown) => last.release(),
                _ => {
                    last.failure();
                }
            }
        }
        outcome
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
        let target = &self.targets[outbound.upstream];
        let (result, attempts) = self.buffered_attempts(outbound).await;
        let elapsed = started.elapsed();
        tracing::info!(upstream = %target.name, attempts, ?elapsed, ok = result.is_ok(), "upstream call");
        let status = match &result {
            Ok((status, _, _)) => status.as_str(),
            Err(err) => outcome_label(err),
        };
        self.metrics
            .upstream_call(&target.name, model, status, attempts, elapsed);
        let (status, headers, body) = result.map_err(|err| name_timeout(err, &target.name))?;
        Ok(Buffered {
            status,
            headers,
            body,
            attempts,
            elapsed,
        })
    }

    /// As `call_buffered`, for a call that is not billable (a model list):
    /// guarded and retried alike, not counted.
    pub async fn call_unbilled(&self, outbound: &Outbound) -> Result<Buffered, GatewayError> {
        let started = Instant::now();
        let target = &self.targets[outbound.upstream];
        let (result, attempts) = self.buffered_attempts(outbound).await;
        let (status, headers, body) = result.map_err(|err| name_timeout(err, &target.name))?;
        Ok(Buffered {
            status,
            headers,
            body,
            attempts,
            elapsed: started.elapsed(),
        })
    }

    async fn buffered_attempts(
        &self,
        outbound: &Outbound,
    ) -> (Result<(StatusCode, HeaderMap, Bytes), GatewayError>, usize) {
        let target = &self.targets[outbound.upstream];
        self.protected(outbound, Counted::Failures, || async {
            let response = self
                .send_once(outbound, Wait::Whole(target.request_timeout))
                .await?;
            let status = response.status();
            let headers = response.headers().clone();
            // From here the body has begun to arrive: a failure is not retried.
            let body = self
                .read_body(target, response)
                .await
                .map_err(AttemptError::fatal)?;
            if status.is_success() {
                return Ok((status, headers, body));
            }
            Err(status_error(target.api, status, &headers, body))
        })
        .await
    }

    /// As `call_streaming`, for a billable call: counted under `model` (its
    /// duration is the time to the response headers).
    pub async fn call_streaming_billed(
        &self,
        outbound: &Outbound,
        model: &ModelLabel,
    ) -> Result<reqwest::Response, GatewayError> {
        let started = Instant::now();
        let head = StreamHead {
            wait: self.targets[outbound.upstream].stream_head_timeout,
            retry_statuses: true,
            counted: Counted::Failures,
        };
        let (result, attempts) = self.streaming_attempts(outbound, head).await;
        let code = result.as_ref().map(reqwest::Response::status);
        let status = match &code {
            Ok(code) => code.as_str(),
            Err(err) => outcome_label(err),
        };
        let target = &self.targets[outbound.upstream];
        self.metrics
            .upstream_call(&target.name, model, status, attempts, started.elapsed());
        result.map_err(|err| name_timeout(err, &target.name))
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
    /// has its head within `first_byte_timeout`, like a stream's.
    pub async fn call_streaming(
        &self,
        outbound: &Outbound,
    ) -> Result<reqwest::Response, GatewayError> {
        let target = &self.targets[outbound.upstream];
        let read = is_safe(&outbound.method);
        let head = StreamHead {
            wait: if read {
                target.first_byte_timeout
            } else {
                target.request_timeout
            },
            retry_statuses: read || FREE_TO_RESEND.contains(&outbound.path.as_ref()),
            counted: if read {
                Counted::Failures
            } else {
                Counted::FailuresButSlowness
            },
        };
        let (result, _attempts) = self.streaming_attempts(outbound, head).await;
        result.map_err(|err| name_timeout(err, &target.name))
    }

    async fn streaming_attempts(
        &self,
        outbound: &Outbound,
        head: StreamHead,
    ) -> (Result<reqwest::Response, GatewayError>, usize) {
        let target = &self.targets[outbound.upstream];
        let retry_statuses = head.retry_statuses;
        self.protected(outbound, head.counted, || async {
            let response = self.send_once(outbound, Wait::Head(head.wait)).await?;
            let status = response.status();
            if status.is_success() {
                return Ok(response);
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

    /// Sends the request once, awaiting what `wait` says: the whole exchange
    /// (a buffered call), or the response head (a streamed call, whose body
    /// has bounds of its own).
    async fn send_once(
        &self,
        outbound: &Outbound,
        wait: Wait,
    ) -> Result<reqwest::Response, AttemptError> {
        let target = &self.targets[outbound.upstream];
        let url = confined_url(&target.base, &outbound.path, outbound.query.as_deref())
            .map_err(AttemptError::fatal)?;
        let mut request = target.client.request(outbound.method.clone(), url);
        // Exactly one Content-Type: the caller's (a multipart boundary, say)
        // when it sent one, else JSON, what every deduplicated body is.
        if !outbound
            .headers
            .iter()
            .any(|(name, _)| name == header::CONTENT_TYPE)
        {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        for (name, value) in &outbound.headers {
            request = request.header(name, value);
        }
        self.check_credential(outbound.upstream, outbound.authorization.as_ref())
            .map_err(AttemptError::fatal)?;
        request = authenticate(request, target.api, target.api_key.as_ref(), outbound)
            .map_err(AttemptError::fatal)?;
        if let Wait::Whole(timeout) = wait {
            request = request.timeout(timeout);
        }
        if traces::active() {
            let mut trace_headers = HeaderMap::new();
            traces::inject(&mut trace_headers);
            request = request.headers(trace_headers);
        }
        if !outbound.body.is_empty() || outbound.method == Method::POST {
            request = request.body(outbound.body.clone());
        }
        // Past the connection, the provider may have the request and be
        // computing it (and billing it): it is sent again only when that
        // cannot cost twice.
        let resend = self.retry.resend_sent_requests || is_safe(&outbound.method);
        // A buffered call's head comes with its whole answer (a reasoning
        // model's, after minutes): only its total bounds it (also set on the
        // request itself, for the body).
        let head_timeout = match wait {
            Wait::Whole(total) | Wait::Head(total) => total,
        };
        let response = match tokio::time::timeout(head_timeout, request.send()).await {
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
        Ok(response)
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

/// The API version an Anthropic request is sent with when its caller named
/// none (the version every current SDK sends).
pub const DEFAULT_ANTHROPIC_VERSION: &str = "2023-06-01";

const ANTHROPIC_VERSION: HeaderName = HeaderName::from_static("anthropic-version");

/// The prefix of Anthropic's OAuth access tokens (Claude subscriptions, as
/// Claude Code sends them): Anthropic accepts those only as a bearer token,
/// never as `x-api-key`.
const ANTHROPIC_OAUTH_TOKEN_PREFIX: &[u8] = b"sk-ant-oat";

/// Adds the credential in the form the target's API expects: corral's own
/// key when it has one, else the caller's. OpenAI: `Authorization` (the
/// caller's as it came, scheme included). Anthropic: `x-api-key` (the
/// caller's bearer token or `x-api-key`; an OAuth access token stays a bearer
/// token, the only form Anthropic takes it in), plus `anthropic-version` when
/// the caller sent none.
fn authenticate(
    mut request: reqwest::RequestBuilder,
    api: Api,
    own_key: Option<&Secret<String>>,
    outbound: &Outbound,
) -> Result<reqwest::RequestBuilder, GatewayError> {
    match api {
        Api::OpenAi => match (own_key, &outbound.authorization) {
            (Some(key), _) => request = request.bearer_auth(key.expose()),
            (None, Some(caller)) => request = request.header(header::AUTHORIZATION, caller),
            (None, None) => {}
        },
        Api::Anthropic => {
            let key = match (own_key, &outbound.authorization) {
                (Some(key), _) => Some(HeaderValue::from_str(key.expose())),
                (None, Some(caller)) => {
                    let token = bearer_token(caller.as_bytes());
                    if token.starts_with(ANTHROPIC_OAUTH_TOKEN_PREFIX) {
                        let mut bearer = caller.clone();
                        bearer.set_sensitive(true);
                        request = request.header(header::AUTHORIZATION, bearer);
                        None
                    } else {
                        Some(HeaderValue::from_bytes(token))
                    }
                }
                (None, None) => None,
            };
            if let Some(key) = key {
                let mut key = key.map_err(|_| {
                    GatewayError::invalid("the API key is not a valid header value")
                })?;
                key.set_sensitive(true);
                request = request.header(API_KEY_HEADER, key);
            }
            if !outbound
                .headers
                .iter()
                .any(|(name, _)| name == ANTHROPIC_VERSION)
            {
                request = request.header(ANTHROPIC_VERSION, DEFAULT_ANTHROPIC_VERSION);
            }
        }
        // The caller's Gemini key as it is; an OAuth token (`Bearer <token>`,
        // from `?access_token=`, `auth::gemini_key`) as `Authorization`.
        Api::Gemini => {
            let key = match (own_key, &outbound.authorization) {
                (Some(key), _) => Some(HeaderValue::from_str(key.expose()).map_err(|_| {
                    GatewayError::invalid("the API key is not a valid header value")
                })?),
                (None, Some(caller)) if caller.as_bytes().starts_with(b"Bearer ") => {
                    let mut bearer = caller.clone();
                    bearer.set_sensitive(true);
                    request = request.header(header::AUTHORIZATION, bearer);
                    None
                }
                (None, Some(caller)) => Some(caller.clone()),
                (None, None) => None,
            };
            if let Some(mut key) = key {
                key.set_sensitive(true);
                request = request.header(GEMINI_KEY_HEADER, key);
            }
        }
    }
    Ok(request)
}

/// The request URL: the base URL joined with the outbound path and query. It
/// must be a strict extension of the base URL's path on the same origin
/// (`passthrough::ProxyPath` already refused every way out; this is the last
/// word, for every caller of the client).
fn confined_url(
    base: &reqwest::Url,
    path: &str,
    query: Option<&str>,
) -> Result<reqwest::Url, GatewayError> {
    let base_path = base.path().trim_end_matches('/');
    let mut text = format!("{}{path}", base.as_str().trim_end_matches('/'));
    if let Some(query) = query {
        text.push('?');
        text.push_str(query);
    }
    let refused = || GatewayError::PathRefused {
        reason: "it leads outside the upstream's base_url",
    };
    let url = reqwest::Url::parse(&text).map_err(|_| refused())?;
    let inside = url.origin() == base.origin()
        && url
            .path()
            .strip_prefix(base_path)
            .is_some_and(|rest| rest.len() > 1 && rest.starts_with('/'));
    if inside { Ok(url) } else { Err(refused()) }
}

/// A connect error is worth another attempt (nothing reached the provider);
/// a timeout or a connection lost after that, only when `resend` says the
/// request may be sent twice.
fn classify_send_error(err: reqwest::Error, upstream: &str, resend: bool) -> AttemptError {
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
    AttemptError {
        retryable,
        retry_after,
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
fn outcome_label(err: &GatewayError) -> &str {
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
        let attempt = classify_send_error(err, "mock", false);
        let text = attempt.error.to_string();
        assert!(attempt.retryable, "a connect error is retried");
        assert!(!text.contains("AIza-SECRET"), "{text}");
    }

    #[test]
    fn urls_stay_below_the_base_path_on_its_origin() {
        let base = reqwest::Url::parse("https://api.example.com/v1/").unwrap();
        let url = confined_url(&base, "/files/f-1", Some("limit=2")).unwrap();
        assert_eq!(url.as_str(), "https://api.example.com/v1/files/f-1?limit=2");
        for path in [
            "/../admin",
            "/%2e%2e/admin",
            "/a/../../admin",
            "/",
            "",
            "@evil.com/x",
        ] {
            assert!(confined_url(&base, path, None).is_err(), "{path}");
        }
        let root = reqwest::Url::parse("http://127.0.0.1:9").unwrap();
        assert!(confined_url(&root, "/models", None).is_ok());
        assert!(
            confined_url(&root, "/../models", None).is_ok(),
            "the root is the root"
        );
    }

    fn sent_credentials(api: Api, own_key: Option<&str>, caller: Option<&str>) -> Vec<String> {
        let own_key = own_key.map(|key| Secret::new(key.to_owned()));
        let outbound = Outbound {
            upstream: 0,
            method: Method::POST,
            path: Cow::Borrowed("/messages"),
            query: None,
            headers: Vec::new(),
            authorization: caller.map(|value| HeaderValue::from_str(value).unwrap()),
            body: Bytes::new(),
        };
        let builder = reqwest::Client::new().post("http://127.0.0.1:9/v1/messages");
        let request = authenticate(builder, api, own_key.as_ref(), &outbound)
            .unwrap()
            .build()
            .unwrap();
        let mut sent: Vec<String> = ["authorization", "x-api-key"]
            .into_iter()
            .filter_map(|name| {
                let value = request.headers().get(name)?.to_str().unwrap();
                Some(format!("{name}: {value}"))
            })
            .collect();
        sent.sort();
        sent
    }

    #[test]
    fn each_api_gets_the_credential_in_its_own_form() {
        assert_eq!(
            sent_credentials(Api::OpenAi, None, Some("Bearer sk-caller")),
            ["authorization: Bearer sk-caller"]
        );
        assert_eq!(
            sent_credentials(Api::OpenAi, Some("sk-own"), Some("Bearer sk-caller")),
            ["authorization: Bearer sk-own"]
        );
        assert_eq!(
            sent_credentials(Api::Anthropic, None, Some("Bearer sk-ant-api03-caller")),
            ["x-api-key: sk-ant-api03-caller"]
        );
        assert_eq!(
            sent_credentials(Api::Anthropic, Some("sk-ant-own"), Some("Bearer sk-ant-x")),
            ["x-api-key: sk-ant-own"]
        );
        // An OAuth access token is refused by Anthropic as an x-api-key.
        assert_eq!(
            sent_credentials(Api::Anthropic, None, Some("Bearer sk-ant-oat01-caller")),
            ["authorization: Bearer sk-ant-oat01-caller"]
        );
        assert!(sent_credentials(Api::Anthropic, None, None).is_empty());
    }
}
