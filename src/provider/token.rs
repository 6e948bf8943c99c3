//! A provider's access token, one per account: requested once, reused while
//! fresh, refreshed ahead of its expiry by a single request that every caller
//! of that moment shares.
//!
//! The cache knows nothing of how a token is obtained: a [`Grant`] (Entra ID's
//! client credentials, a service account's JWT bearer) issues one, and
//! [`TokenCache`] decides when to ask. Time is tokio's monotonic clock, so the
//! schedule ignores wall-clock steps and paused tests move it by hand.

use std::{
    fmt,
    panic::AssertUnwindSafe,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use futures::{
    FutureExt,
    future::{BoxFuture, Shared},
};
use http::{HeaderValue, StatusCode};
use tokio::time::Instant;

use crate::config::Secret;

/// The shortest lifetime a token is taken to have: a zero, negative or tiny
/// `expires_in` then costs one request a second, never a request per call.
pub const MIN_LIFETIME: Duration = Duration::from_secs(1);

/// The longest lifetime believed: an absurd `expires_in` cannot keep a revoked
/// token in use for longer than a day, nor overflow an `Instant`.
pub const MAX_LIFETIME: Duration = Duration::from_secs(24 * 60 * 60);

/// How early a token is refreshed at most: five minutes ahead of its expiry,
/// as Azure's own SDKs do, so a slow token endpoint never leaves us without one.
pub const MAX_REFRESH_MARGIN: Duration = Duration::from_secs(5 * 60);

/// How long one request for a token may take before its callers get
/// [`TokenError::Timeout`].
pub const DEFAULT_GRANT_TIMEOUT: Duration = Duration::from_secs(10);

/// After a failed request, how long until the next may start: a broken token
/// endpoint sees one request per interval, not one per caller.
pub const RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// What a grant returns: the token and how long the provider says it lives.
#[derive(Debug)]
pub struct Issued {
    pub token: Secret<String>,
    pub lifetime: Duration,
}

/// A way to obtain an access token from a provider's token endpoint.
#[async_trait::async_trait]
pub trait Grant: Send + Sync + fmt::Debug {
    async fn issue(&self) -> Result<Issued, TokenError>;
}

/// Why no token could be had. `Clone`, because every caller waiting on one
/// request gets its outcome; no variant carries a secret or a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the token endpoint did not answer in time")]
    Timeout,
    #[error("the token endpoint refused the request ({status}): {reason}")]
    Refused { status: StatusCode, reason: String },
    #[error("the token endpoint could not be reached: {0}")]
    Unreachable(String),
    #[error("the token endpoint's answer is larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("the token endpoint's answer is not a usable token: {0}")]
    Malformed(String),
    #[error("the token request ended without an answer")]
    Abandoned,
}

/// Hands out one account's bearer token, requesting a new one only when the
/// one held is due for refresh (and then once, for all callers).
pub struct TokenCache {
    inner: Arc<Inner>,
}

struct Inner {
    grant: Box<dyn Grant>,
    timeout: Duration,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    held: Option<Held>,
    /// The one request in flight, shared by every caller that must wait for it.
    refreshing: Option<Refresh>,
    /// The last request's failure: served to callers with no valid token until
    /// [`RETRY_INTERVAL`] has passed since it.
    failed: Option<(Instant, TokenError)>,
}

type Refresh = Shared<BoxFuture<'static, Result<HeaderValue, TokenError>>>;

struct Held {
    authorization: HeaderValue,
    refresh_at: Instant,
    expires_at: Instant,
}

impl Held {
    /// Dates a token from when it was *requested*: the provider's clock started
    /// no earlier, so the token is never taken to live longer than it does.
    fn new(issued: Issued, requested_at: Instant) -> Result<Self, TokenError> {
        if issued.token.expose().is_empty() {
            return Err(TokenError::Malformed("the token is empty".into()));
        }
        let mut authorization = HeaderValue::try_from(format!("Bearer {}", issued.token.expose()))
            .map_err(|_| TokenError::Malformed("the token is not a valid header value".into()))?;
        authorization.set_sensitive(true);
        let lifetime = issued.lifetime.clamp(MIN_LIFETIME, MAX_LIFETIME);
        let expires_at = requested_at + lifetime;
        Ok(Self {
            authorization,
            refresh_at: expires_at - refresh_margin(lifetime),
            expires_at,
        })
    }
}

/// How long before its expiry a token of `lifetime` is refreshed: a quarter of
/// its life, at most [`MAX_REFRESH_MARGIN`]; a one-hour Entra token is used for
/// 55 minutes, a one-second test token for 750 ms.
pub fn refresh_margin(lifetime: Duration) -> Duration {
    (lifetime / 4).min(MAX_REFRESH_MARGIN)
}

impl TokenCache {
    /// A cache whose token requests may take [`DEFAULT_GRANT_TIMEOUT`].
    pub fn new(grant: Box<dyn Grant>) -> Self {
        Self::with_timeout(grant, DEFAULT_GRANT_TIMEOUT)
    }

    /// A cache whose token requests may take `timeout` each.
    pub fn with_timeout(grant: Box<dyn Grant>, timeout: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                grant,
                timeout,
                state: Mutex::default(),
            }),
        }
    }

    /// An `Authorization` value `Bearer <token>` (marked sensitive) for a request now.
    ///
    /// A fresh token is returned at once. Past its refresh time, the first
    /// caller starts one request in the background and every caller keeps the
    /// still-valid token; only with no valid token does a caller wait, and then
    /// for the request in flight (or the one it starts), bounded by the grant's
    /// timeout.
    pub async fn bearer(&self) -> Result<HeaderValue, TokenError> {
        let now = Instant::now();
        let refresh = {
            let mut state = self.inner.lock();
            if let Some(held) = &state.held
                && now < held.expires_at
            {
                let authorization = held.authorization.clone();
                if now >= held.refresh_at {
                    // Its outcome lands in the state; a failure is retried
                    // by a later caller, while this token stays valid.
                    let _background = self.inner.refresh_unless_pending(&mut state, now);
                }
                return Ok(authorization);
            }
            self.inner.refresh_unless_pending(&mut state, now)?
        };
        refresh.await
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The request in flight, or a new one; the last failure while its
    /// [`RETRY_INTERVAL`] has yet to pass.
    fn refresh_unless_pending(
        self: &Arc<Self>,
        state: &mut State,
        now: Instant,
    ) -> Result<Refresh, TokenError> {
        if let Some(refresh) = &state.refreshing {
            return Ok(refresh.clone());
        }
        if let Some((failed_at, error)) = &state.failed
            && now < *failed_at + RETRY_INTERVAL
        {
            return Err(error.clone());
        }
        // Spawned rather than driven by the caller that started it: a caller
        // that gives up (a client hanging up) must not strand the callers
        // sharing the request, nor a background refresh nobody awaits.
        let inner = Arc::clone(self);
        let task = tokio::spawn(async move {
            let requested_at = Instant::now();
            let issue = tokio::time::timeout(inner.timeout, inner.grant.issue());
            let outcome = match AssertUnwindSafe(issue).catch_unwind().await {
                Ok(Ok(Ok(issued))) => Held::new(issued, requested_at),
                Ok(Ok(Err(error))) => Err(error),
                Ok(Err(_elapsed)) => Err(TokenError::Timeout),
                Err(_panic) => Err(TokenError::Abandoned),
            };
            inner.settle(outcome)
        });
        let refresh = task
            .map(|joined| joined.unwrap_or(Err(TokenError::Abandoned)))
            .boxed()
            .shared();
        state.refreshing = Some(refresh.clone());
        Ok(refresh)
    }

    /// Records a request's outcome before any waiter sees it, so the next
    /// caller finds the new token (or the failure) in place.
    fn settle(&self, outcome: Result<Held, TokenError>) -> Result<HeaderValue, TokenError> {
        let mut state = self.lock();
        state.refreshing = None;
        match outcome {
            Ok(held) => {
                let authorization = held.authorization.clone();
                state.held = Some(held);
                state.failed = None;
                Ok(authorization)
            }
            Err(error) => {
                tracing::warn!(grant = ?self.grant, %error, "could not obtain a provider token");
                state.failed = Some((Instant::now(), error.clone()));
                Err(error)
            }
        }
    }
}

impl fmt::Debug for TokenCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.inner.lock();
        f.debug_struct("TokenCache")
            .field("grant", &self.inner.grant)
            .field(
                "expires_at",
                &state.held.as_ref().map(|held| held.expires_at),
            )
            .field("refreshing", &state.refreshing.is_some())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use tokio::sync::watch;

    use super::*;

    /// A grant that counts its requests, answers `token-<n>` for the n-th, and
    /// can be told to hold its answers (until opened), fail, or panic.
    #[derive(Debug)]
    struct FakeGrant {
        calls: watch::Sender<usize>,
        open: watch::Sender<bool>,
        lifetime: Mutex<Duration>,
        fail: AtomicBool,
        panic: AtomicBool,
    }

    impl FakeGrant {
        fn new(lifetime: Duration) -> Arc<Self> {
            Arc::new(Self {
                calls: watch::Sender::new(0),
                open: watch::Sender::new(true),
                lifetime: Mutex::new(lifetime),
                fail: AtomicBool::new(false),
                panic: AtomicBool::new(false),
            })
        }

        fn calls(&self) -> usize {
            *self.calls.borrow()
        }

        /// Waits (bounded) until `n` requests have started.
        async fn started(&self, n: usize) {
            let mut calls = self.calls.subscribe();
            tokio::time::timeout(Duration::from_secs(60), calls.wait_for(|c| *c >= n))
                .await
                .expect("the grant was asked in time")
                .expect("the grant lives");
        }

        fn hold(&self) {
            self.open.send_replace(false);
        }

        fn release(&self) {
            self.open.send_replace(true);
        }
    }

    #[async_trait::async_trait]
    impl Grant for Arc<FakeGrant> {
        async fn issue(&self) -> Result<Issued, TokenError> {
            let mut n = 0;
            self.calls.send_modify(|calls| {
                *calls += 1;
                n = *calls;
            });
            let mut open = self.open.subscribe();
            open.wait_for(|open| *open).await.expect("the grant lives");
            if self.panic.load(Ordering::SeqCst) {
                panic!("the grant broke");
            }
            if self.fail.load(Ordering::SeqCst) {
                return Err(refused());
            }
            Ok(Issued {
                token: Secret::new(format!("token-{n}")),
                lifetime: *self.lifetime.lock().unwrap(),
            })
        }
    }

    fn refused() -> TokenError {
        TokenError::Refused {
            status: StatusCode::UNAUTHORIZED,
            reason: "invalid_client".into(),
        }
    }

    fn cache(grant: &Arc<FakeGrant>) -> Arc<TokenCache> {
        Arc::new(TokenCache::new(Box::new(Arc::clone(grant))))
    }

    fn bearer(n: usize) -> HeaderValue {
        HeaderValue::try_from(format!("Bearer token-{n}")).unwrap()
    }

    /// Yields until `cache` hands out token `n` (a background refresh landed),
    /// at most a bounded number of times.
    async fn until_serves(cache: &TokenCache, n: usize) {
        for _ in 0..1000 {
            if cache.bearer().await.ok() == Some(bearer(n)) {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("token-{n} never served");
    }

    #[tokio::test(start_paused = true)]
    async fn a_fresh_token_is_requested_once_for_any_number_of_calls() {
        let grant = FakeGrant::new(Duration::from_secs(3600));
        let cache = cache(&grant);
        for _ in 0..100 {
            let authorization = cache.bearer().await.unwrap();
            assert_eq!(authorization, bearer(1));
            assert!(authorization.is_sensitive());
        }
        tokio::time::advance(
            Duration::from_secs(3600) - MAX_REFRESH_MARGIN - Duration::from_millis(1),
        )
        .await;
        assert_eq!(cache.bearer().await.unwrap(), bearer(1));
        assert_eq!(grant.calls(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn first_callers_together_wait_for_one_request() {
        let grant = FakeGrant::new(Duration::from_secs(60));
        grant.hold();
        let cache = cache(&grant);
        let callers: Vec<_> = (0..50)
            .map(|_| {
                let cache = Arc::clone(&cache);
                tokio::spawn(async move { cache.bearer().await })
            })
            .collect();
        grant.started(1).await;
        grant.release();
        for caller in callers {
            assert_eq!(caller.await.unwrap().unwrap(), bearer(1));
        }
        assert_eq!(grant.calls(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn near_expiry_one_caller_refreshes_while_all_keep_the_valid_token() {
        // 100 s of life: refreshed from 75 s on (a quarter of it ahead).
        let grant = FakeGrant::new(Duration::from_secs(100));
        let cache = cache(&grant);
        assert_eq!(cache.bearer().await.unwrap(), bearer(1));
        tokio::time::advance(Duration::from_secs(74)).await;
        assert_eq!(cache.bearer().await.unwrap(), bearer(1));
        assert_eq!(grant.calls(), 1, "not refreshed before its margin");

        tokio::time::advance(Duration::from_secs(2)).await;
        grant.hold();
        let callers: Vec<_> = (0..50)
            .map(|_| {
                let cache = Arc::clone(&cache);
                tokio::spawn(async move { cache.bearer().await })
            })
            .collect();
        // The refresh is held, yet nobody waits for it.
        for caller in callers {
            assert_eq!(caller.await.unwrap().unwrap(), bearer(1));
        }
        assert_eq!(grant.calls(), 2, "one refresh for fifty callers");

        grant.release();
        until_serves(&cache, 2).await;
        assert_eq!(grant.calls(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn at_expiry_concurrent_callers_wait_for_one_request() {
        let grant = FakeGrant::new(Duration::from_secs(10));
        let cache = cache(&grant);
        assert_eq!(cache.bearer().await.unwrap(), bearer(1));
        tokio::time::advance(Duration::from_secs(10)).await;
        grant.hold();
        let callers: Vec<_> = (0..50)
            .map(|_| {
                let cache = Arc::clone(&cache);
                tokio::spawn(async move { cache.bearer().await })
            })
            .collect();
        grant.started(2).await;
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(
            callers.iter().all(|caller| !caller.is_finished()),
            "an expired token is not handed out"
        );
        grant.release();
        for caller in callers {
            assert_eq!(caller.await.unwrap().unwrap(), bearer(2));
        }
        assert_eq!(grant.calls(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_reaches_its_waiters_and_is_retried_once_per_interval() {
        let grant = FakeGrant::new(Duration::from_secs(60));
        grant.fail.store(true, Ordering::SeqCst);
        grant.hold();
        let cache = cache(&grant);
        let callers: Vec<_> = (0..20)
            .map(|_| {
                let cache = Arc::clone(&cache);
                tokio::spawn(async move { cache.bearer().await })
            })
            .collect();
        grant.started(1).await;
        grant.release();
        for caller in callers {
            assert_eq!(caller.await.unwrap(), Err(refused()));
        }
        assert_eq!(grant.calls(), 1, "waiters share the failed request");

        // Within the interval: the same failure, no new request.
        grant.fail.store(false, Ordering::SeqCst);
        tokio::time::advance(RETRY_INTERVAL - Duration::from_millis(1)).await;
        for _ in 0..20 {
            assert_eq!(cache.bearer().await, Err(refused()));
        }
        assert_eq!(grant.calls(), 1);

        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(cache.bearer().await.unwrap(), bearer(2));
        assert_eq!(grant.calls(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_refresh_keeps_the_valid_token_and_retries_after_the_interval() {
        let grant = FakeGrant::new(Duration::from_secs(100));
        let cache = cache(&grant);
        assert_eq!(cache.bearer().await.unwrap(), bearer(1));
        grant.fail.store(true, Ordering::SeqCst);
        tokio::time::advance(Duration::from_secs(80)).await;
        assert_eq!(cache.bearer().await.unwrap(), bearer(1));
        grant.started(2).await;
        for _ in 0..50 {
            assert_eq!(cache.bearer().await.unwrap(), bearer(1));
            tokio::task::yield_now().await;
        }
        assert_eq!(grant.calls(), 2, "no second refresh within the interval");

        grant.fail.store(false, Ordering::SeqCst);
        tokio::time::advance(RETRY_INTERVAL).await;
        assert_eq!(cache.bearer().await.unwrap(), bearer(1));
        until_serves(&cache, 3).await;
        assert_eq!(grant.calls(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_grant_that_never_answers_times_out() {
        let grant = FakeGrant::new(Duration::from_secs(60));
        grant.hold();
        let cache = cache(&grant);
        let started = Instant::now();
        assert_eq!(cache.bearer().await, Err(TokenError::Timeout));
        assert_eq!(started.elapsed(), DEFAULT_GRANT_TIMEOUT);

        let short = TokenCache::with_timeout(Box::new(Arc::clone(&grant)), Duration::from_secs(2));
        let started = Instant::now();
        assert_eq!(short.bearer().await, Err(TokenError::Timeout));
        assert_eq!(started.elapsed(), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_grant_is_an_error_and_not_a_stuck_request() {
        let grant = FakeGrant::new(Duration::from_secs(60));
        grant.panic.store(true, Ordering::SeqCst);
        let cache = cache(&grant);
        assert_eq!(cache.bearer().await, Err(TokenError::Abandoned));
        grant.panic.store(false, Ordering::SeqCst);
        tokio::time::advance(RETRY_INTERVAL).await;
        assert_eq!(cache.bearer().await.unwrap(), bearer(2));
    }

    #[tokio::test(start_paused = true)]
    async fn lifetimes_are_bounded_at_both_ends() {
        // No life at all: a token for a second, not a request per call.
        let grant = FakeGrant::new(Duration::ZERO);
        let brief = cache(&grant);
        for _ in 0..10 {
            assert_eq!(brief.bearer().await.unwrap(), bearer(1));
        }
        assert_eq!(grant.calls(), 1);
        tokio::time::advance(MIN_LIFETIME).await;
        assert_eq!(brief.bearer().await.unwrap(), bearer(2));

        // An absurd life: believed for a day, no overflow.
        let grant = FakeGrant::new(Duration::MAX);
        let endless = cache(&grant);
        assert_eq!(endless.bearer().await.unwrap(), bearer(1));
        tokio::time::advance(MAX_LIFETIME - MAX_REFRESH_MARGIN - Duration::from_secs(1)).await;
        assert_eq!(endless.bearer().await.unwrap(), bearer(1));
        assert_eq!(grant.calls(), 1);
        *grant.lifetime.lock().unwrap() = Duration::from_secs(3600);
        tokio::time::advance(MAX_REFRESH_MARGIN + Duration::from_secs(1)).await;
        assert_eq!(
            endless.bearer().await.unwrap(),
            bearer(2),
            "expired after a day"
        );
    }

    #[test]
    fn the_refresh_margin_is_a_quarter_of_the_life_and_at_most_five_minutes() {
        assert_eq!(
            refresh_margin(Duration::from_secs(3599)),
            MAX_REFRESH_MARGIN
        );
        assert_eq!(
            refresh_margin(Duration::from_secs(100)),
            Duration::from_secs(25)
        );
        assert_eq!(refresh_margin(MIN_LIFETIME), Duration::from_millis(250));
    }

    #[tokio::test(start_paused = true)]
    async fn a_token_is_never_printed() {
        let grant = FakeGrant::new(Duration::from_secs(60));
        let cache = cache(&grant);
        let authorization = cache.bearer().await.unwrap();
        let printed = format!(
            "{cache:?} {authorization:?} {:?}",
            Issued {
                token: Secret::new("token-1".into()),
                lifetime: Duration::from_secs(1)
            }
        );
        assert!(!printed.contains("token-1"), "{printed}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_token_that_is_no_header_value_is_malformed() {
        #[derive(Debug)]
        struct Newline;
        #[async_trait::async_trait]
        impl Grant for Newline {
            async fn issue(&self) -> Result<Issued, TokenError> {
                Ok(Issued {
                    token: Secret::new("secret\r\nX-Injected: 1".into()),
                    lifetime: Duration::from_secs(60),
                })
            }
        }
        let cache = TokenCache::new(Box::new(Newline));
        let error = cache.bearer().await.unwrap_err();
        assert!(matches!(error, TokenError::Malformed(_)));
        assert!(!error.to_string().contains("secret"), "{error}");
    }
}
