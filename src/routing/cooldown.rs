//! Cooldowns: a quota bucket the provider said to leave alone gets no request
//! until its time is up, then exactly one probe.
//!
//! One atomic word per bucket holds the whole state, so the read path (is it
//! cooling?) is one load and a compare, with no lock: `0` is healthy; else
//! the low bits are the deadline (milliseconds since the `Cooldowns` were
//! made, plus one so a deadline is never `0`) and the top bit says a probe is
//! out. Members naming one quota bucket share its word: keys of one
//! organisation share its limit, so they cool down together.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::time::Instant;

use crate::clock::Clock;

/// The top bit of a bucket's word: one caller is probing it.
const PROBING: u64 = 1 << 63;

/// The longest cooldown kept: an answer's own hint is bounded before it gets
/// here, and nothing larger can overflow the word's deadline.
pub const LONGEST_COOLDOWN: Duration = Duration::from_secs(3600);

/// Each quota bucket's cooldown.
#[derive(Debug)]
pub struct Cooldowns {
    clock: Arc<dyn Clock>,
    origin: Instant,
    buckets: Box<[AtomicU64]>,
}

/// Whether a caller may send to a bucket now.
#[derive(Debug)]
#[must_use = "a probe that is dropped unreported leaves the bucket to the next caller"]
pub enum Admission<'a> {
    /// Healthy: send.
    Free,
    /// The cooldown is over and this caller is its one probe: send, then report.
    Probe(Probe<'a>),
    /// Cooling, or another caller is probing: try the next member.
    Cooling,
}

impl Cooldowns {
    /// `buckets` healthy buckets, timed by `clock`'s monotonic half.
    pub fn new(buckets: usize, clock: Arc<dyn Clock>) -> Self {
        let origin = clock.instant();
        Self {
            clock,
            origin,
            buckets: (0..buckets).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Now, in the words' unit: milliseconds since `origin`, plus one.
    pub(crate) fn now(&self) -> u64 {
        let elapsed = self.clock.instant().saturating_duration_since(self.origin);
        (elapsed.as_millis() as u64).saturating_add(1) & !PROBING
    }

    /// Cools `bucket` for `wait` (at most [`LONGEST_COOLDOWN`]) from now,
    /// keeping a later deadline it already has, and a probe that is out.
    /// An unknown bucket is ignored.
    pub fn cool(&self, bucket: usize, wait: Duration) {
        let Some(word) = self.buckets.get(bucket) else {
            return;
        };
        let until = self.now() + bounded_ms(wait);
        // An update that cannot fail: fetch_update only retries on a race.
        let _ = word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |state| {
            Some((state & PROBING) | (state & !PROBING).max(until))
        });
    }

    /// Whether `bucket` must not be sent to now: its deadline is ahead, or
    /// its probe is out. Past its deadline with no probe out it is not
    /// cooling: the next caller to [`admit`](Self::admit) it is its probe.
    pub fn is_cooling(&self, bucket: usize) -> bool {
        self.is_cooling_at(bucket, self.now())
    }

    pub(crate) fn is_cooling_at(&self, bucket: usize, now: u64) -> bool {
        let Some(word) = self.buckets.get(bucket) else {
            return false;
        };
        let state = word.load(Ordering::Acquire);
        state != 0 && (state & PROBING != 0 || state > now)
    }

    /// Asks to send to `bucket`: free, this caller's probe, or cooling.
    pub fn admit(&self, bucket: usize) -> Admission<'_> {
        let Some(word) = self.buckets.get(bucket) else {
            return Admission::Free;
        };
        let now = self.now();
        let mut state = word.load(Ordering::Acquire);
        loop {
            if state == 0 {
                return Admission::Free;
            }
            if state & PROBING != 0 || state > now {
                return Admission::Cooling;
            }
            // Over: the one caller whose exchange lands is the probe. A loss
            // to a racing `cool` or probe is looked at again; each retry means
            // another caller made progress, so this ends.
            match word.compare_exchange_weak(
                state,
                state | PROBING,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    return Admission::Probe(Probe {
                        word,
                        cooldowns: self,
                        reported: false,
                    });
                }
                Err(seen) => state = seen,
            }
        }
    }
}

/// The one call sent to a bucket whose cooldown is over. Report how it went;
/// dropped unreported (the caller gave up, its task was cancelled), it hands
/// the probe to the next caller, so a bucket never stays out for want of one.
#[derive(Debug)]
pub struct Probe<'a> {
    word: &'a AtomicU64,
    cooldowns: &'a Cooldowns,
    reported: bool,
}

impl Probe<'_> {
    /// The member answered: the bucket is healthy again, unless another call
    /// cooled it while the probe was out (then its later deadline stands).
    pub fn success(mut self) {
        self.reported = true;
        let now = self.cooldowns.now();
        let _ = self
            .word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |state| {
                let deadline = state & !PROBING;
                Some(if deadline > now { deadline } else { 0 })
            });
    }

    /// The member is still limited: cool the bucket again for `wait`.
    pub fn failure(mut self, wait: Duration) {
        self.reported = true;
        let until = self.cooldowns.now() + bounded_ms(wait);
        let _ = self
            .word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |state| {
                Some((state & !PROBING).max(until))
            });
    }
}

impl Drop for Probe<'_> {
    fn drop(&mut self) {
        if !self.reported {
            self.word.fetch_and(!PROBING, Ordering::AcqRel);
        }
    }
}

fn bounded_ms(wait: Duration) -> u64 {
    wait.min(LONGEST_COOLDOWN).as_millis() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn cooldowns(buckets: usize) -> (Arc<ManualClock>, Cooldowns) {
        let clock = Arc::new(ManualClock::new(1_700_000_000_000));
        (clock.clone(), Cooldowns::new(buckets, clock))
    }

    fn is_free(admission: Admission<'_>) -> bool {
        matches!(admission, Admission::Free)
    }

    #[test]
    fn a_cooling_bucket_gets_nothing_until_its_time_is_up() {
        let (clock, cooldowns) = cooldowns(2);
        cooldowns.cool(0, Duration::from_secs(5));
        assert!(cooldowns.is_cooling(0));
        assert!(!cooldowns.is_cooling(1), "a bucket cools alone");
        assert!(matches!(cooldowns.admit(0), Admission::Cooling));
        assert!(is_free(cooldowns.admit(1)));
        clock.advance(Duration::from_millis(4999));
        assert!(cooldowns.is_cooling(0));
        clock.advance(Duration::from_millis(1));
        assert!(!cooldowns.is_cooling(0), "over: its next caller may probe");
    }

    #[test]
    fn a_cooldown_keeps_the_later_deadline() {
        let (clock, cooldowns) = cooldowns(1);
        cooldowns.cool(0, Duration::from_secs(10));
        cooldowns.cool(0, Duration::from_secs(1));
        clock.advance(Duration::from_secs(5));
        assert!(
            cooldowns.is_cooling(0),
            "the shorter wait did not shorten it"
        );
        cooldowns.cool(0, Duration::from_secs(20));
        clock.advance(Duration::from_secs(10));
        assert!(cooldowns.is_cooling(0), "the longer one lengthened it");
    }

    #[test]
    fn when_the_time_is_up_exactly_one_caller_probes() {
        let (clock, cooldowns) = cooldowns(1);
        cooldowns.cool(0, Duration::from_secs(1));
        clock.advance(Duration::from_secs(1));
        let probe = match cooldowns.admit(0) {
            Admission::Probe(probe) => probe,
            other => panic!("the first caller after the deadline probes, got {other:?}"),
        };
        for _ in 0..3 {
            assert!(
                matches!(cooldowns.admit(0), Admission::Cooling),
                "the rest wait for it"
            );
        }
        assert!(cooldowns.is_cooling(0));
        probe.success();
        assert!(!cooldowns.is_cooling(0));
        assert!(
            is_free(cooldowns.admit(0)),
            "a good probe clears the bucket"
        );
    }

    #[test]
    fn a_failed_probe_cools_the_bucket_again() {
        let (clock, cooldowns) = cooldowns(1);
        cooldowns.cool(0, Duration::from_secs(1));
        clock.advance(Duration::from_secs(2));
        let Admission::Probe(probe) = cooldowns.admit(0) else {
            panic!("a probe");
        };
        probe.failure(Duration::from_secs(30));
        clock.advance(Duration::from_secs(29));
        assert!(matches!(cooldowns.admit(0), Admission::Cooling));
        clock.advance(Duration::from_secs(1));
        assert!(
            matches!(cooldowns.admit(0), Admission::Probe(_)),
            "then one probe again"
        );
    }

    #[test]
    fn a_probe_dropped_unreported_hands_over_to_the_next_caller() {
        let (clock, cooldowns) = cooldowns(1);
        cooldowns.cool(0, Duration::ZERO);
        clock.advance(Duration::from_millis(1));
        let Admission::Probe(probe) = cooldowns.admit(0) else {
            panic!("a probe");
        };
        drop(probe);
        assert!(matches!(cooldowns.admit(0), Admission::Probe(_)));
    }

    #[test]
    fn a_cooldown_set_while_the_probe_was_out_outlives_its_success() {
        let (clock, cooldowns) = cooldowns(1);
        cooldowns.cool(0, Duration::from_secs(1));
        clock.advance(Duration::from_secs(1));
        let Admission::Probe(probe) = cooldowns.admit(0) else {
            panic!("a probe");
        };
        // Another member of the bucket was told to wait meanwhile.
        cooldowns.cool(0, Duration::from_secs(60));
        probe.success();
        assert!(cooldowns.is_cooling(0));
        clock.advance(Duration::from_secs(60));
        assert!(matches!(cooldowns.admit(0), Admission::Probe(_)));
    }

    #[test]
    fn garbage_waits_and_buckets_are_bounded() {
        let (clock, cooldowns) = cooldowns(1);
        cooldowns.cool(0, Duration::MAX);
        cooldowns.cool(7, Duration::from_secs(1));
        assert!(!cooldowns.is_cooling(7) && is_free(cooldowns.admit(7)));
        clock.advance(LONGEST_COOLDOWN);
        assert!(!cooldowns.is_cooling(0), "no wait is longer than an hour");
    }

    #[test]
    fn many_threads_racing_past_a_deadline_make_one_probe() {
        let (clock, cooldowns) = cooldowns(1);
        cooldowns.cool(0, Duration::from_secs(1));
        clock.advance(Duration::from_secs(1));
        let cooldowns = &cooldowns;
        let barrier = std::sync::Barrier::new(8);
        let probes = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    scope.spawn(|| {
                        barrier.wait();
                        match cooldowns.admit(0) {
                            // Kept unreported until every thread has asked.
                            Admission::Probe(probe) => {
                                std::mem::forget(probe);
                                1
                            }
                            _ => 0,
                        }
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum::<u32>()
        });
        assert_eq!(probes, 1);
    }
}
