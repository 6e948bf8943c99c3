//! Protection of one upstream from corral itself: a circuit breaker, a retry
//! budget, a concurrency cap and a request-rate cap, applied to every attempt
//! (first or retry) the client makes. Only real upstream attempts pass through
//! here: coalesced followers and cache hits never spend any of it.
//!
//! - **Breaker**: `breaker_failures` consecutive failed attempts (5xx,
//!   connect errors, timeouts, bodies that break off; never a caller's 4xx,
//!   see [`is_upstream_failure`]) open it for
//!   `breaker_cool_down`; meanwhile attempts fail fast with 503 +
//!   `Retry-After` (and the coalescer keeps serving any stored entry, STALE).
//!   Then exactly one probe goes through (half-open): success closes it,
//!   failure reopens it. A probe that never reports (its task was cancelled)
//!   frees its slot for the next caller, so the breaker cannot stick half-open.
//! - **Retry budget**: over a sliding 10 s window, retries may be at most
//!   `retry.budget_ratio` x first attempts plus `retry.budget_min_per_sec` x
//!   10; beyond it, a failed attempt is final. A sick provider sees at most
//!   `1 + ratio` times the traffic, not `max_attempts` times.
//!
//! The breaker is the crate's one [`Breaker`]. Everything here runs on the
//! app's [`Clock`]'s monotonic time, so a wall-clock step never opens a
//! circuit, refills a cap or empties the budget, and tests move it by hand.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::{
    sync::{OwnedSemaphorePermit, Semaphore},
    time::Instant,
};

use crate::breaker::{Breaker, Permit};
use crate::{
    clock::{Clock, retry_after_secs},
    config::Member,
    error::GatewayError,
    limits::Rate,
};

/// The retry budget's window.
const BUDGET_WINDOW: Duration = Duration::from_secs(10);

/// Retries allowed in proportion to first attempts, over a sliding window.
#[derive(Debug)]
pub struct RetryBudget {
    ratio: f64,
    reserve: f64,
    /// One bucket per second: (second, first attempts, retries).
    buckets: Mutex<VecDeque<(u64, u64, u64)>>,
    clock: Arc<dyn Clock>,
    /// Seconds are counted from here (monotonic).
    origin: Instant,
}

impl RetryBudget {
    pub fn new(ratio: f64, min_per_sec: f64, clock: Arc<dyn Clock>) -> Self {
        Self {
            ratio,
            reserve: min_per_sec * BUDGET_WINDOW.as_secs_f64(),
            buckets: Mutex::new(VecDeque::new()),
            origin: clock.instant(),
            clock,
        }
    }

    fn with_current<T>(&self, f: impl FnOnce(&mut VecDeque<(u64, u64, u64)>) -> T) -> T {
        let second = self
            .clock
            .instant()
            .saturating_duration_since(self.origin)
            .as_secs();
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        while buckets
            .front()
            .is_some_and(|(s, _, _)| *s + BUDGET_WINDOW.as_secs() <= second)
        {
            buckets.pop_front();
        }
        if buckets.back().is_none_or(|(s, _, _)| *s != second) {
            buckets.push_back((second, 0, 0));
        }
        f(&mut buckets)
    }

    pub fn record_first(&self) {
        self.with_current(|buckets| {
            if let Some(bucket) = buckets.back_mut() {
                bucket.1 += 1;
            }
        });
    }

    /// Withdraws one retry, if the budget has one.
    pub fn try_retry(&self) -> bool {
        self.with_current(|buckets| {
            let (firsts, retries) = buckets
                .iter()
                .fold((0u64, 0u64), |(f, r), (_, bf, br)| (f + bf, r + br));
            let allowed = self.reserve + self.ratio * firsts as f64;
            if (retries as f64) + 1.0 > allowed {
                return false;
            }
            if let Some(bucket) = buckets.back_mut() {
                bucket.2 += 1;
            }
            true
        })
    }
}

/// Everything that stands between corral and one upstream.
#[derive(Debug)]
pub struct UpstreamGuard {
    pub breaker: Breaker,
    concurrency: Option<Arc<Semaphore>>,
    rate: Option<Rate>,
    name: String,
}

impl UpstreamGuard {
    /// The guard of one member (`name`: what its errors say), with the
    /// member's own bounds.
    pub fn new(name: &str, member: &Member, clock: Arc<dyn Clock>) -> Self {
        Self {
            breaker: Breaker::new(
                member.breaker_failures,
                member.breaker_cool_down,
                clock.clone(),
            ),
            concurrency: member.max_concurrency.map(|n| Arc::new(Semaphore::new(n))),
            rate: member.rate.as_ref().map(|rate| Rate::new(rate, clock)),
            name: name.to_owned(),
        }
    }

    /// Fails fast when the circuit is open or the upstream's rate is spent.
    pub fn admit(&self) -> Result<Permit<'_>, GatewayError> {
        let permit = self
            .breaker
            .admit()
            .map_err(|wait| GatewayError::CircuitOpen {
                upstream: self.name.clone(),
                retry_after: retry_after_secs(wait),
            })?;
        if let Some(rate) = &self.rate
            && let Err(wait) = rate.check()
        {
            // Not the upstream's fault: no verdict; a probe's slot goes to the next caller.
            permit.release();
            return Err(GatewayError::RateLimited {
                retry_after: retry_after_secs(wait),
                reason: "the upstream's request rate",
            });
        }
        Ok(permit)
    }

    /// Waits for a place among the upstream's concurrent calls (bounded by
    /// the caller's retry deadline).
    pub async fn acquire(&self) -> Option<OwnedSemaphorePermit> {
        match &self.concurrency {
            None => None,
            Some(places) => places.clone().acquire_owned().await.ok(),
        }
    }
}

/// Whether an attempt's error says the provider itself is sick: a 5xx, a
/// timeout, a connection that failed or broke off. Only these count against
/// the breaker, which every tenant shares. A 4xx is about the caller's own
/// request or key (401, 403, 404, the 429 of its own quota) and a response
/// too large is about what the caller asked for: counting them would let one
/// tenant open the circuit for all.
pub fn is_upstream_failure(error: &GatewayError) -> bool {
    match error {
        GatewayError::Upstream { status, .. } => status.is_server_error(),
        GatewayError::UpstreamUnreachable { .. } | GatewayError::UpstreamTimeout { .. } => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn clock() -> Arc<ManualClock> {
        Arc::new(ManualClock::new(1_700_000_000_000))
    }

    #[test]
    fn only_provider_sickness_counts_against_the_breaker() {
        let upstream = |status: u16| GatewayError::Upstream {
            status: axum::http::StatusCode::from_u16(status).unwrap(),
            content_type: None,
            retry_after: None,
            body: Default::default(),
        };
        for sick in [500, 502, 503, 504] {
            assert!(is_upstream_failure(&upstream(sick)), "{sick}");
        }
        for callers_own in [400, 401, 403, 404, 409, 422, 429] {
            assert!(
                !is_upstream_failure(&upstream(callers_own)),
                "{callers_own}"
            );
        }
        let name = || "openai".to_owned();
        assert!(is_upstream_failure(&GatewayError::UpstreamTimeout {
            upstream: name()
        }));
        assert!(is_upstream_failure(&GatewayError::UpstreamUnreachable {
            upstream: name(),
            reason: "connection refused".into()
        }));
        assert!(!is_upstream_failure(&GatewayError::UpstreamInvalid {
            upstream: name(),
            reason: "response larger than 10 bytes".into()
        }));
    }

    #[test]
    fn the_budget_allows_retries_in_proportion_to_first_attempts() {
        let clock = clock();
        let budget = RetryBudget::new(0.2, 0.0, clock.clone());
        assert!(!budget.try_retry(), "no first attempts, no retries");
        for _ in 0..10 {
            budget.record_first();
        }
        assert!(budget.try_retry());
        assert!(budget.try_retry());
        assert!(!budget.try_retry(), "20% of 10");
        clock.advance(BUDGET_WINDOW);
        assert!(!budget.try_retry(), "old first attempts left the window");
        let reserved = RetryBudget::new(0.0, 1.0, clock);
        for _ in 0..10 {
            assert!(reserved.try_retry());
        }
        assert!(!reserved.try_retry(), "1/s over 10 s");
    }

    proptest::proptest! {
        // Whatever the mix of first attempts and retry requests, granted
        // retries never exceed ratio x first attempts (no reserve).
        #[test]
        fn granted_retries_stay_within_the_ratio(steps in proptest::collection::vec(proptest::bool::ANY, 1..400), ratio in 0.0f64..1.0) {
            let budget = RetryBudget::new(ratio, 0.0, clock());
            let (mut firsts, mut granted) = (0u64, 0u64);
            for first in steps {
                if first {
                    budget.record_first();
                    firsts += 1;
                } else if budget.try_retry() {
                    granted += 1;
                }
            }
            proptest::prop_assert!(granted as f64 <= ratio * firsts as f64 + 1e-9);
        }
    }
}
