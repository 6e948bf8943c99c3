//! A small circuit breaker with hysteresis: it opens after N consecutive
//! failures, stays open for a cool-down (callers skip the dependency entirely),
//! then lets one probe through (half-open); the probe's success closes it.

use std::{
    sync::{
        Mutex,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use tokio::{sync::watch, time::Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

#[derive(Debug)]
pub struct Breaker {
    threshold: u32,
    cool_down: Duration,
    consecutive_failures: AtomicU32,
    /// When open: the instant the cool-down ends. When half-open: whether the probe is out.
    inner: Mutex<Inner>,
    state: watch::Sender<BreakerState>,
}

#[derive(Debug)]
struct Inner {
    open_until: Option<Instant>,
    probe_out: bool,
}

impl Breaker {
    pub fn new(threshold: u32, cool_down: Duration) -> Self {
        Self {
            threshold: threshold.max(1),
            cool_down,
            consecutive_failures: AtomicU32::new(0),
            inner: Mutex::new(Inner {
                open_until: None,
                probe_out: false,
            }),
            state: watch::Sender::new(BreakerState::Closed),
        }
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a call may go through now. While half-open, only one caller
    /// (the probe) gets `true` until it reports back.
    pub fn allow(&self) -> bool {
        if *self.state.borrow() == BreakerState::Closed {
            return true;
        }
        let mut inner = self.inner();
        match inner.open_until {
            Some(until) if Instant::now() < until => false,
            _ => {
                if inner.probe_out {
                    return false;
                }
                inner.probe_out = true;
                self.state.send_replace(BreakerState::HalfOpen);
                true
            }
        }
    }

    pub fn record_success(&self) {
        self.consecutive_failures.store(0, Ordering::Relaxed);
        if *self.state.borrow() != BreakerState::Closed {
            let mut inner = self.inner();
            inner.open_until = None;
            inner.probe_out = false;
            self.state.send_replace(BreakerState::Closed);
        }
    }

    /// Returns true when this failure opened the breaker.
    pub fn record_failure(&self) -> bool {
        let failures = self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        let state = *self.state.borrow();
        if state == BreakerState::HalfOpen
            || (state == BreakerState::Closed && failures >= self.threshold)
        {
            let mut inner = self.inner();
            inner.open_until = Some(Instant::now() + self.cool_down);
            inner.probe_out = false;
            self.state.send_replace(BreakerState::Open);
            return state == BreakerState::Closed;
        }
        false
    }

    pub fn state(&self) -> BreakerState {
        *self.state.borrow()
    }

    /// Observes state changes (readiness reporting, tests awaiting recovery).
    pub fn watch(&self) -> watch::Receiver<BreakerState> {
        self.state.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn opens_after_threshold_probes_after_cool_down_and_closes_on_success() {
        let breaker = Breaker::new(3, Duration::from_secs(1));
        assert!(breaker.allow());
        assert!(!breaker.record_failure());
        assert!(!breaker.record_failure());
        assert!(breaker.record_failure(), "third failure opens");
        assert!(!breaker.allow(), "open: calls skip the dependency");
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert!(
            breaker.allow(),
            "after the cool-down one probe goes through"
        );
        assert!(!breaker.allow(), "only one probe at a time");
        breaker.record_success();
        assert_eq!(breaker.state(), BreakerState::Closed);
        assert!(breaker.allow());
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_probe_reopens() {
        let breaker = Breaker::new(1, Duration::from_secs(1));
        breaker.record_failure();
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert!(breaker.allow());
        breaker.record_failure();
        assert_eq!(breaker.state(), BreakerState::Open);
        assert!(!breaker.allow());
    }

    #[test]
    fn successes_reset_the_count() {
        let breaker = Breaker::new(2, Duration::from_secs(1));
        breaker.record_failure();
        breaker.record_success();
        assert!(!breaker.record_failure(), "not consecutive");
        assert_eq!(breaker.state(), BreakerState::Closed);
    }
}
