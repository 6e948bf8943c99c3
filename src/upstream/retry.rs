//! The one retry door: exponential backoff with full jitter (backon), bounded by
//! attempts and a total deadline, honouring `Retry-After` / `retry-after-ms`.

use std::{future::Future, time::Duration};

use axum::http::{HeaderMap, StatusCode};
use backon::{ExponentialBuilder, Retryable};
use rand::Rng;
use tokio::time::Instant;

use crate::{
    config::{Api, RetryConfig},
    error::GatewayError,
};

/// One failed attempt, classified.
#[derive(Debug)]
pub struct AttemptError {
    pub error: GatewayError,
    pub retryable: bool,
    /// The provider's own wait hint, which wins over the backoff.
    pub retry_after: Option<Duration>,
    /// How long the provider says the account is spent for (a 429's rate
    /// limit reset): how long a pool's member cools.
    pub cooldown: Option<Duration>,
}

impl AttemptError {
    pub fn fatal(error: GatewayError) -> Self {
        Self {
            error,
            retryable: false,
            retry_after: None,
            cooldown: None,
        }
    }

    pub fn retryable(error: GatewayError) -> Self {
        Self {
            error,
            retryable: true,
            retry_after: None,
            cooldown: None,
        }
    }

    /// Retryable when `retryable` says so.
    pub fn when(retryable: bool, error: GatewayError) -> Self {
        Self {
            error,
            retryable,
            retry_after: None,
            cooldown: None,
        }
    }
}

/// Whether an upstream status may be retried, given the upstream's API and
/// the answer's headers and body. OpenAI: 429 and the 5xx
/// overload/unavailability statuses. Anthropic, as its own SDK decides: 408,
/// 409, 429 and every 5xx (529 `overloaded_error` included), or any status
/// its `x-should-retry: true` marks. Never an exhausted quota (retrying cannot
/// help) or an answer whose provider says `x-should-retry: false`.
pub fn is_retryable_status(api: Api, status: StatusCode, headers: &HeaderMap, body: &[u8]) -> bool {
    let should_retry = headers
        .get("x-should-retry")
        .map(|value| value.as_bytes().trim_ascii().to_ascii_lowercase());
    if should_retry.as_deref() == Some(b"false") {
        return false;
    }
    let retryable = match api {
        Api::OpenAi => matches!(status.as_u16(), 429 | 500 | 502 | 503 | 504),
        // What Google's SDKs retry.
        Api::Gemini => matches!(status.as_u16(), 408 | 429 | 500 | 502 | 503 | 504),
        Api::Anthropic => {
            should_retry.as_deref() == Some(b"true")
                || matches!(status.as_u16(), 408 | 409 | 429)
                || status.is_server_error()
        }
    };
    if !retryable {
        return false;
    }
    if status == StatusCode::TOO_MANY_REQUESTS
        && error_code(body).as_deref() == Some("insufficient_quota")
    {
        return false;
    }
    true
}

fn error_code(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let error = value.get("error")?;
    error
        .get("code")
        .or_else(|| error.get("type"))
        .and_then(|code| code.as_str())
        .map(str::to_owned)
}

/// The longest wait a provider's hint can ask for (`routing`'s bound on
/// every provider's word).
pub const LONGEST_RETRY_AFTER: Duration = crate::routing::LONGEST_PROVIDER_WAIT;

/// `retry-after-ms` (OpenAI's, precise) or `Retry-After` in seconds or as an
/// HTTP date, at most [`LONGEST_RETRY_AFTER`]: the one reader of those
/// headers, `routing::retry_after`, which a pool's cooldowns read too.
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    crate::routing::retry_after(headers, std::time::SystemTime::now())
}

/// Gemini's wait: the `retryDelay` of a `google.rpc.RetryInfo` among an
/// error body's `error.details` (`routing::gemini_retry_delay`).
pub fn retry_info_delay(body: &[u8]) -> Option<Duration> {
    crate::routing::gemini_retry_delay(body)
}

tokio::task_local! {
    /// The attempt cap [`at_most`] sets for the calls made within it.
    static ATTEMPT_CAP: usize;
}

/// Runs `call` with each upstream call inside it making at most `cap`
/// attempts (`None`: `retry.max_attempts`). A flight whose key failed moments
/// ago makes one (`coalesce::FailureMemory`); the cap travels with the
/// flight's future, so no call signature between the flight and the retry
/// loop has to carry it.
///
/// Not an `async fn`: one of those would hold `call` twice over (as it was
/// given and as it runs), and a flight's call is kilobytes that every miss
/// moves into its box. Without a cap of its own it keeps the one it runs
/// under, if any.
pub fn at_most<F: Future>(cap: Option<usize>, call: F) -> impl Future<Output = F::Output> {
    let cap = cap
        .or_else(|| ATTEMPT_CAP.try_with(|cap| *cap).ok())
        .unwrap_or(usize::MAX);
    ATTEMPT_CAP.scope(cap, call)
}

/// The attempts a call may make here: `retry.max_attempts`, or less under [`at_most`].
pub fn max_attempts(config: &RetryConfig) -> usize {
    let cap = ATTEMPT_CAP.try_with(|cap| *cap).unwrap_or(usize::MAX);
    config.max_attempts.min(cap).max(1)
}

/// Runs `attempt` until it succeeds, fails for good, runs out of attempts, or
/// a retry would start past the deadline. The returned count is the attempts
/// made.
pub async fn with_retries<T, F, Fut>(
    config: &RetryConfig,
    mut attempt: F,
) -> (Result<T, GatewayError>, usize)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, AttemptError>>,
{
    let deadline = Instant::now() + config.deadline;
    let backoff = ExponentialBuilder::new()
        .with_min_delay(config.base_delay)
        .with_max_delay(config.max_delay)
        .with_factor(2.0)
        .with_max_times(max_attempts(config).saturating_sub(1));
    let mut attempts = 0usize;
    let run = (|| {
        attempts += 1;
        attempt()
    })
    .retry(backoff)
    .sleep(tokio::time::sleep)
    .when(|err: &AttemptError| err.retryable)
    .adjust(|err: &AttemptError, backoff: Option<Duration>| {
        // `None` from the backoff means attempts are used up: stop, whatever the hint.
        let delay = match (backoff, err.retry_after) {
            (None, _) => return None,
            (Some(_), Some(hint)) => hint,
            // Full jitter: anywhere in [0, backoff], so retries spread out.
            (Some(ceiling), None) => ceiling.mul_f64(rand::rng().random_range(0.0..=1.0)),
        };
        // A wait that would end past the deadline cannot lead to a useful attempt.
        (Instant::now() + delay < deadline).then_some(delay)
    })
    .notify(|err: &AttemptError, delay: Duration| {
        tracing::info!(error = %err.error, ?delay, "retrying upstream");
    });
    // The deadline decides whether a retry may start (`adjust` above); an
    // attempt under way runs to its own bound (`request_timeout`): a call a
    // reasoning model takes minutes over is never cut by the retry budget.
    let result = run.await.map_err(|err| err.error);
    (result, attempts)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::http::HeaderValue;
    use proptest::prelude::*;

    use super::*;

    fn config(max_attempts: usize) -> RetryConfig {
        RetryConfig {
            max_attempts,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(2),
            deadline: Duration::from_secs(60),
            ..RetryConfig::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn stops_at_max_attempts() {
        let calls = AtomicUsize::new(0);
        let (result, attempts) = with_retries(&config(4), || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>(AttemptError::retryable(GatewayError::WaitTimedOut))
        })
        .await;
        assert!(result.is_err());
        assert_eq!(attempts, 4);
        assert_eq!(calls.load(Ordering::SeqCst), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cap_bounds_the_attempts_of_the_calls_within_it() {
        let calls = AtomicUsize::new(0);
        let failing = || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>(AttemptError::retryable(GatewayError::WaitTimedOut))
        };
        let (_, capped) = at_most(Some(1), with_retries(&config(4), failing)).await;
        let (_, uncapped) = at_most(None, with_retries(&config(4), failing)).await;
        assert_eq!((capped, uncapped), (1, 4));
        assert_eq!(calls.load(Ordering::SeqCst), 5);
        // A cap never raises the configured attempts.
        let (_, attempts) = at_most(Some(9), with_retries(&config(2), failing)).await;
        assert_eq!(attempts, 2);
        // Without a cap of its own, a call keeps the one it runs under.
        let (_, nested) = at_most(Some(2), async {
            at_most(None, with_retries(&config(4), failing)).await
        })
        .await;
        assert_eq!(nested, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn fatal_errors_are_not_retried() {
        let (result, attempts) = with_retries(&config(4), || async {
            Err::<(), _>(AttemptError::fatal(GatewayError::WaitTimedOut))
        })
        .await;
        assert!(result.is_err());
        assert_eq!(attempts, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_wins_over_backoff() {
        let start = Instant::now();
        let calls = AtomicUsize::new(0);
        let (result, attempts) = with_retries(&config(3), || async {
            if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                Err(AttemptError {
                    error: GatewayError::WaitTimedOut,
                    retryable: true,
                    retry_after: Some(Duration::from_secs(7)),
                    cooldown: None,
                })
            } else {
                Ok(())
            }
        })
        .await;
        assert!(result.is_ok());
        assert_eq!(attempts, 2);
        assert_eq!(start.elapsed(), Duration::from_secs(7));
    }

    /// The deadline bounds retries, not an attempt under way: a 150 s answer
    /// under a 60 s deadline is waited for, and a retry after it is not started.
    #[tokio::test(start_paused = true)]
    async fn an_attempt_under_way_is_never_cut_by_the_deadline() {
        let start = Instant::now();
        let (result, attempts) = with_retries(&config(3), || async {
            tokio::time::sleep(Duration::from_secs(150)).await;
            Ok::<_, AttemptError>("thought it through")
        })
        .await;
        assert_eq!(result.unwrap(), "thought it through");
        assert_eq!((attempts, start.elapsed()), (1, Duration::from_secs(150)));
        let calls = AtomicUsize::new(0);
        let (result, attempts) = with_retries(&config(3), || async {
            calls.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_secs(70)).await;
            Err::<(), _>(AttemptError::retryable(GatewayError::WaitTimedOut))
        })
        .await;
        assert!(result.is_err());
        assert_eq!(attempts, 1, "no retry starts past the deadline");
    }

    #[tokio::test(start_paused = true)]
    async fn a_hint_past_the_deadline_gives_up_at_once() {
        let start = Instant::now();
        let mut short = config(3);
        short.deadline = Duration::from_secs(5);
        let (result, attempts) = with_retries(&short, || async {
            Err::<(), _>(AttemptError {
                error: GatewayError::WaitTimedOut,
                retryable: true,
                retry_after: Some(Duration::from_secs(30)),
                cooldown: None,
            })
        })
        .await;
        assert!(result.is_err());
        assert_eq!(attempts, 1);
        // Far below the 30 s Retry-After it refused to wait for.
        assert!(start.elapsed() < Duration::from_secs(10));
    }

    fn status(code: u16) -> StatusCode {
        StatusCode::from_u16(code).unwrap()
    }

    #[test]
    fn classifies_statuses() {
        let none = HeaderMap::new();
        let openai = |code, headers: &HeaderMap, body: &[u8]| {
            is_retryable_status(Api::OpenAi, status(code), headers, body)
        };
        assert!(openai(503, &none, b""));
        assert!(openai(429, &none, b"{}"));
        assert!(!openai(400, &none, b""));
        assert!(!openai(408, &none, b""));
        let quota = br#"{"error":{"message":"quota","type":"insufficient_quota","code":"insufficient_quota"}}"#;
        assert!(!openai(429, &none, quota));
        let mut no = HeaderMap::new();
        no.insert("x-should-retry", HeaderValue::from_static("false"));
        assert!(!openai(503, &no, b""));
    }

    #[test]
    fn anthropic_retries_what_its_sdk_retries() {
        let none = HeaderMap::new();
        let anthropic = |code, headers: &HeaderMap| {
            is_retryable_status(Api::Anthropic, status(code), headers, b"{}")
        };
        for code in [408, 409, 429, 500, 502, 503, 504, 529] {
            assert!(anthropic(code, &none), "{code}");
        }
        for code in [400, 401, 403, 404, 413] {
            assert!(!anthropic(code, &none), "{code}");
        }
        let mut yes = HeaderMap::new();
        yes.insert("x-should-retry", HeaderValue::from_static("true"));
        assert!(anthropic(400, &yes), "the provider's word wins");
        let mut no = HeaderMap::new();
        no.insert("x-should-retry", HeaderValue::from_static("False"));
        assert!(!anthropic(529, &no));
    }

    #[test]
    fn parses_retry_after_forms() {
        let mut headers = HeaderMap::new();
        headers.insert("retry-after", HeaderValue::from_static("2"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(2)));
        headers.insert("retry-after-ms", HeaderValue::from_static("1500"));
        assert_eq!(retry_after(&headers), Some(Duration::from_millis(1500)));
        let mut dated = HeaderMap::new();
        dated.insert(
            "retry-after",
            HeaderValue::from_static("Sun, 06 Nov 1994 08:49:37 GMT"),
        );
        assert_eq!(
            retry_after(&dated),
            Some(Duration::ZERO),
            "a past date means now"
        );
        let mut junk = HeaderMap::new();
        junk.insert("retry-after", HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&junk), None);
        // Whatever a provider sends is bounded, never a panic.
        for (name, value) in [
            ("retry-after", "1e20"),
            ("retry-after-ms", "1e23"),
            ("retry-after", "Fri, 31 Dec 9999 23:59:59 GMT"),
        ] {
            let mut huge = HeaderMap::new();
            huge.insert(name, HeaderValue::from_static(value));
            assert_eq!(
                retry_after(&huge),
                Some(LONGEST_RETRY_AFTER),
                "{name}: {value}"
            );
        }
        for value in ["NaN", "inf", "-1"] {
            let mut odd = HeaderMap::new();
            odd.insert("retry-after", HeaderValue::from_static(value));
            assert_eq!(retry_after(&odd), None, "{value}");
        }
    }

    proptest! {
        // Total time spent waiting never exceeds the deadline, and attempts never exceed the cap.
        #[test]
        fn retries_respect_their_bounds(max_attempts in 1usize..8, base_ms in 1u64..500, hint_ms in proptest::option::of(0u64..3000)) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
            let cfg = RetryConfig { max_attempts, base_delay: Duration::from_millis(base_ms), max_delay: Duration::from_millis(base_ms * 8), deadline: Duration::from_secs(10), ..RetryConfig::default() };
            let (attempts, elapsed) = runtime.block_on(async {
                let start = Instant::now();
                let (_, attempts) = with_retries(&cfg, || async {
                    Err::<(), _>(AttemptError { error: GatewayError::WaitTimedOut, retryable: true, retry_after: hint_ms.map(Duration::from_millis), cooldown: None })
                }).await;
                (attempts, start.elapsed())
            });
            prop_assert!(attempts >= 1 && attempts <= max_attempts);
            prop_assert!(elapsed <= Duration::from_secs(10));
        }
    }
}
