//! The one circuit breaker, for Redis (`cluster/`) and for every upstream
//! (`upstream/breaker.rs`): `threshold` consecutive failures open it; while
//! open, callers skip the dependency; once the cool-down has passed, exactly
//! one caller is let through as the probe (half-open), and the probe's verdict
//! closes or reopens it.
//!
//! Every call goes through [`Breaker::admit`], which hands out a [`Permit`].
//! The permit is drop-safe: a probe whose future is cancelled (its client
//! left, a `select!` chose another branch, a task was aborted) gives its slot
//! back on drop, so the breaker can never stay half-open waiting for a verdict
//! that will not come. A dropped probe tells nothing about the dependency, so
//! it does not count as a failure: the circuit goes back to open with its
//! cool-down already over, and the next caller probes at once.
//!
//! Time is the [`Clock`]'s monotonic half: a wall-clock step never opens or
//! closes a circuit, and tests move through a cool-down by pausing tokio's
//! clock ([`SystemClock`](crate::clock::SystemClock)) or by hand
//! ([`ManualClock`](crate::clock::ManualClock)).

use std::{
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use tokio::{sync::watch, time::Instant};

use crate::clock::Clock;

/// What the breaker lets through, as observers see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    /// Calls skip the dependency (after the cool-down, the next caller probes).
    Open,
    /// One probe is out; everyone else still skips the dependency.
    HalfOpen,
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen,
}

impl Phase {
    fn state(self) -> BreakerState {
        match self {
            Phase::Closed { .. } => BreakerState::Closed,
            Phase::Open { .. } => BreakerState::Open,
            Phase::HalfOpen => BreakerState::HalfOpen,
        }
    }
}

#[derive(Debug)]
pub struct Breaker {
    threshold: u32,
    cool_down: Duration,
    phase: Mutex<Phase>,
    /// The state as of the last transition, for readiness and for tests that await recovery.
    state: watch::Sender<BreakerState>,
    clock: Arc<dyn Clock>,
}

/// Permission for one call. Report how it went with [`success`](Self::success)
/// or [`failure`](Self::failure); [`release`](Self::release) (or a drop) gives
/// it back without a verdict.
#[must_use = "a permit reports how the call went"]
#[derive(Debug)]
pub struct Permit<'a> {
    breaker: &'a Breaker,
    probe: bool,
    settled: bool,
}

impl Permit<'_> {
    /// Whether this call is the half-open probe.
    pub fn is_probe(&self) -> bool {
        self.probe
    }

    /// The dependency answered: the circuit closes and the failure count resets.
    pub fn success(mut self) {
        self.settled = true;
        self.breaker
            .transition(|_| Some(Phase::Closed { failures: 0 }));
    }

    /// The dependency failed. Returns whether this failure opened the circuit
    /// (from closed; a failed probe reopens it and returns `false`).
    pub fn failure(mut self) -> bool {
        self.settled = true;
        let probe = self.probe;
        let cool_down = self.breaker.cool_down;
        let threshold = self.breaker.threshold;
        let mut opened = false;
        self.breaker.transition(|phase| match phase {
            Phase::Closed { failures } => {
                let failures = failures.saturating_add(1);
                if failures >= threshold {
                    opened = true;
                    Some(Phase::Open {
                        until: self.breaker.clock.instant() + cool_down,
                    })
                } else {
                    Some(Phase::Closed { failures })
                }
            }
            Phase::HalfOpen if probe => Some(Phase::Open {
                until: self.breaker.clock.instant() + cool_down,
            }),
            // Late reports of calls admitted before the circuit opened change nothing.
            Phase::HalfOpen | Phase::Open { .. } => None,
        });
        opened
    }

    /// Gives the permit back without a verdict (the call never reached the
    /// dependency, or was cancelled): a probe's slot goes to the next caller.
    pub fn release(mut self) {
        self.settled = true;
        self.give_back();
    }

    fn give_back(&self) {
        if self.probe {
            let now = self.breaker.clock.instant();
            self.breaker.transition(|phase| match phase {
                Phase::HalfOpen => Some(Phase::Open { until: now }),
                _ => None,
            });
        }
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if !self.settled {
            self.give_back();
        }
    }
}

impl Breaker {
    pub fn new(threshold: u32, cool_down: Duration, clock: Arc<dyn Clock>) -> Self {
        Self {
            threshold: threshold.max(1),
            cool_down,
            phase: Mutex::new(Phase::Closed { failures: 0 }),
            state: watch::Sender::new(BreakerState::Closed),
            clock,
        }
    }

    fn phase(&self) -> MutexGuard<'_, Phase> {
        // Every write leaves a valid phase, so a panic elsewhere leaves it usable.
        self.phase.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies `next` to the phase under the lock; publishes the state when it changed.
    fn transition(&self, next: impl FnOnce(Phase) -> Option<Phase>) {
        let mut phase = self.phase();
        if let Some(new) = next(*phase) {
            *phase = new;
            self.state.send_if_modified(|state| {
                let changed = *state != new.state();
                *state = new.state();
                changed
            });
        }
    }

    /// A permit for one call, or how long until the circuit lets a probe through.
    pub fn admit(&self) -> Result<Permit<'_>, Duration> {
        let mut wait = Duration::ZERO;
        let mut probe = false;
        self.transition(|phase| match phase {
            Phase::Closed { .. } => None,
            Phase::Open { until } => {
                let now = self.clock.instant();
                if now < until {
                    wait = until - now;
                    None
                } else {
                    probe = true;
                    Some(Phase::HalfOpen)
                }
            }
            Phase::HalfOpen => {
                wait = self.cool_down;
                None
            }
        });
        if !wait.is_zero() {
            return Err(wait);
        }
        Ok(Permit {
            breaker: self,
            probe,
            settled: false,
        })
    }

    pub fn state(&self) -> BreakerState {
        self.phase().state()
    }

    /// Observes state changes (readiness reporting, tests awaiting recovery).
    pub fn watch(&self) -> watch::Receiver<BreakerState> {
        self.state.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;

    fn breaker(threshold: u32, cool_down: Duration) -> Breaker {
        Breaker::new(threshold, cool_down, Arc::new(SystemClock))
    }

    #[tokio::test(start_paused = true)]
    async fn opens_after_consecutive_failures_then_one_probe_decides() {
        let breaker = breaker(3, Duration::from_secs(10));
        assert!(!breaker.admit().unwrap().failure());
        assert!(!breaker.admit().unwrap().failure());
        assert!(
            breaker.admit().unwrap().failure(),
            "the third failure opens"
        );
        assert_eq!(breaker.state(), BreakerState::Open);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(breaker.admit().unwrap_err(), Duration::from_secs(9));
        tokio::time::advance(Duration::from_secs(9)).await;
        let probe = breaker.admit().expect("the probe goes through");
        assert!(probe.is_probe());
        assert_eq!(breaker.state(), BreakerState::HalfOpen);
        assert!(breaker.admit().is_err(), "one probe at a time");
        assert!(
            !probe.failure(),
            "a failed probe reopens, it does not 'open'"
        );
        assert_eq!(breaker.state(), BreakerState::Open);
        tokio::time::advance(Duration::from_secs(10)).await;
        breaker.admit().unwrap().success();
        assert_eq!(breaker.state(), BreakerState::Closed);
        assert!(!breaker.admit().unwrap().is_probe());
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_half_open_probe_does_not_leave_the_breaker_half_open() {
        let breaker = Arc::new(breaker(1, Duration::from_secs(5)));
        assert!(breaker.admit().unwrap().failure());
        tokio::time::advance(Duration::from_secs(5)).await;
        // The probe's call hangs; its future is cancelled by a timeout (the
        // caller gave up), so it never reports.
        let hung = {
            let breaker = breaker.clone();
            async move {
                let permit = breaker.admit().expect("the probe");
                assert!(permit.is_probe());
                std::future::pending::<()>().await;
                permit.success();
            }
        };
        let mut state = breaker.watch();
        let cancelled = tokio::time::timeout(Duration::from_secs(1), hung).await;
        assert!(cancelled.is_err(), "the probe was cancelled");
        assert_ne!(breaker.state(), BreakerState::HalfOpen);
        assert_ne!(*state.borrow_and_update(), BreakerState::HalfOpen);
        // Its slot is free at once: the next caller is the probe, no cool-down.
        let next = breaker.admit().expect("the next caller probes");
        assert!(next.is_probe());
        next.success();
        assert_eq!(breaker.state(), BreakerState::Closed);
        assert_eq!(*state.borrow_and_update(), BreakerState::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn an_aborted_probe_task_frees_the_slot_too() {
        let breaker = Arc::new(breaker(1, Duration::from_secs(1)));
        assert!(breaker.admit().unwrap().failure());
        tokio::time::advance(Duration::from_secs(1)).await;
        let (admitted, admitted_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn({
            let breaker = breaker.clone();
            async move {
                let _permit = breaker.admit().expect("the probe");
                let _ = admitted.send(());
                std::future::pending::<()>().await;
            }
        });
        admitted_rx.await.unwrap();
        assert_eq!(breaker.state(), BreakerState::HalfOpen);
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
        assert!(breaker.admit().expect("free slot").is_probe());
    }

    #[tokio::test(start_paused = true)]
    async fn successes_reset_the_count_and_plain_drops_are_neutral() {
        let breaker = breaker(2, Duration::from_secs(1));
        assert!(!breaker.admit().unwrap().failure());
        breaker.admit().unwrap().success();
        assert!(!breaker.admit().unwrap().failure(), "not consecutive");
        drop(breaker.admit().unwrap());
        breaker.admit().unwrap().release();
        assert_eq!(breaker.state(), BreakerState::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn a_manual_clock_moves_through_the_cool_down_by_hand() {
        let clock = Arc::new(crate::clock::ManualClock::new(1_700_000_000_000));
        let breaker = Breaker::new(1, Duration::from_secs(30), clock.clone());
        assert!(breaker.admit().unwrap().failure());
        clock.advance(Duration::from_secs(1));
        assert_eq!(breaker.admit().unwrap_err(), Duration::from_secs(29));
        clock.advance(Duration::from_secs(29));
        assert!(breaker.admit().unwrap().is_probe());
    }
}
