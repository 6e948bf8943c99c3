//! Time behind a trait, so tests move it by hand instead of sleeping.
//!
//! Two kinds of time, on purpose:
//! - [`Clock::now_ms`], wall-clock milliseconds since the Unix epoch, for cache freshness:
//!   entries carry absolute times so they mean the same on every instance.
//! - [`Clock::instant`], monotonic, for anything that measures an interval (breaker
//!   cool-downs, rate limiters, the retry budget's window): a wall-clock step (NTP, a VM
//!   resumed) must never open a circuit, refill a limiter or empty a budget.
//!
//! [`SystemClock`] reads tokio's clock for the monotonic half, so unit tests pause and
//! advance it (`start_paused`); [`ManualClock`] moves both halves only when told to.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Whole seconds to wait, rounded up, at least one: what `Retry-After` can
/// say of a wait (a rate limit's, a budget window's).
pub fn retry_after_secs(wait: Duration) -> Duration {
    Duration::from_secs(wait.as_secs() + u64::from(wait.subsec_nanos() > 0))
        .max(Duration::from_secs(1))
}

/// Runs `tick` every `interval` until `stop`: the first at once, and a tick
/// that runs late delays the next rather than bunching them (the background
/// flushes of the ledger and the budgets).
pub async fn every<F, Fut>(interval: Duration, stop: CancellationToken, mut tick: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = ticks.tick() => tick().await,
        }
    }
}

pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Milliseconds since the Unix epoch (wall clock).
    fn now_ms(&self) -> u64;

    /// A monotonic instant: never goes backwards, ignores wall-clock steps.
    fn instant(&self) -> Instant;
}

#[derive(Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or_default()
    }

    fn instant(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told to: both its wall-clock and its monotonic
/// time advance together, by [`advance`](Self::advance) and by nothing else.
#[derive(Debug)]
pub struct ManualClock {
    wall_ms: AtomicU64,
    origin: Instant,
    advanced_ms: AtomicU64,
}

impl ManualClock {
    pub fn new(start_ms: u64) -> Self {
        Self {
            wall_ms: AtomicU64::new(start_ms),
            origin: Instant::now(),
            advanced_ms: AtomicU64::new(0),
        }
    }

    pub fn advance(&self, by: Duration) {
        let ms = by.as_millis() as u64;
        self.wall_ms.fetch_add(ms, Ordering::SeqCst);
        self.advanced_ms.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.wall_ms.load(Ordering::SeqCst)
    }

    fn instant(&self) -> Instant {
        self.origin + Duration::from_millis(self.advanced_ms.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        for (wait, said) in [(0, 1), (1, 1), (1000, 1), (2100, 3), (3000, 3)] {
            assert_eq!(
                retry_after_secs(Duration::from_millis(wait)),
                Duration::from_secs(said),
                "{wait} ms"
            );
        }
    }
}
