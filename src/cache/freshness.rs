//! Freshness rules: soft and hard TTL with jitter (stale-while-revalidate), and
//! XFetch's probabilistic early refresh.

use std::time::Duration;

use rand::Rng;

use super::Entry;

/// How an entry may answer a request right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// Within the soft TTL: serve it.
    Fresh,
    /// Past the soft TTL, within the hard TTL: serve it and refresh once in the background.
    Stale,
    /// Past the hard TTL, or older than the caller accepts: a miss.
    Unusable,
}

impl Freshness {
    pub fn of(entry: &Entry, now_ms: u64, max_age: Option<Duration>) -> Self {
        if now_ms >= entry.hard_expires_at_ms {
            return Self::Unusable;
        }
        if max_age.is_some_and(|max_age| entry.age(now_ms) > max_age) {
            return Self::Unusable;
        }
        if now_ms < entry.soft_expires_at_ms {
            Self::Fresh
        } else {
            Self::Stale
        }
    }
}

/// Soft and hard TTL with jitter.
#[derive(Debug, Clone, Copy)]
pub struct TtlPolicy {
    pub soft_ttl: Duration,
    pub hard_ttl: Duration,
    /// Each TTL is stretched by a random factor in `[1, 1 + jitter]`, so entries
    /// written in one burst do not all expire in the same instant (avalanche).
    pub jitter: f64,
}

impl TtlPolicy {
    /// `(soft_expires_at_ms, hard_expires_at_ms)` for an entry stored at `now_ms`.
    pub fn expiries(&self, now_ms: u64, rng: &mut impl Rng) -> (u64, u64) {
        let factor = if self.jitter > 0.0 {
            1.0 + rng.random_range(0.0..=self.jitter)
        } else {
            1.0
        };
        let stretch = |ttl: Duration| (ttl.as_millis() as f64 * factor) as u64;
        let soft = now_ms + stretch(self.soft_ttl);
        let hard = (now_ms + stretch(self.hard_ttl)).max(soft);
        (soft, hard)
    }
}

/// XFetch: refresh before the soft expiry with probability rising as it nears,
/// `now - delta * beta * ln(u) >= soft_expiry` for `u` uniform in (0, 1].
/// Slow-to-compute entries (large delta) start refreshing earlier, but never
/// in the first half of the entry's soft TTL: an early refresh is a billed
/// call for an answer that is still fresh, and a reasoning model's 150 s
/// answer would otherwise be refreshed by a tenth of the hits right after it
/// was stored.
pub fn should_refresh_early(entry: &Entry, now_ms: u64, beta: f64, u: f64) -> bool {
    if beta <= 0.0 || now_ms >= entry.soft_expires_at_ms {
        return false;
    }
    let half_life =
        entry.stored_at_ms + entry.soft_expires_at_ms.saturating_sub(entry.stored_at_ms) / 2;
    if now_ms < half_life {
        return false;
    }
    let delta_ms = entry.compute_time.as_secs_f64() * 1000.0;
    let u = u.clamp(f64::MIN_POSITIVE, 1.0);
    now_ms as f64 - delta_ms * beta * u.ln() >= entry.soft_expires_at_ms as f64
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use axum::http::StatusCode;
    use bytes::Bytes;
    use proptest::prelude::*;
    use rand::{SeedableRng, rngs::StdRng};

    use super::*;
    use crate::cache::StoredResponse;

    fn entry(stored: u64, soft: u64, hard: u64, compute_ms: u64) -> Entry {
        Entry {
            response: Arc::new(StoredResponse {
                status: StatusCode::OK,
                headers: vec![],
                body: Bytes::new(),
                usage: None,
            }),
            stored_at_ms: stored,
            soft_expires_at_ms: soft,
            hard_expires_at_ms: hard,
            compute_time: Duration::from_millis(compute_ms),
        }
    }

    #[test]
    fn timeline_fresh_stale_unusable() {
        let e = entry(1000, 2000, 5000, 10);
        assert_eq!(Freshness::of(&e, 1500, None), Freshness::Fresh);
        assert_eq!(Freshness::of(&e, 2000, None), Freshness::Stale);
        assert_eq!(Freshness::of(&e, 4999, None), Freshness::Stale);
        assert_eq!(Freshness::of(&e, 5000, None), Freshness::Unusable);
        assert_eq!(
            Freshness::of(&e, 1500, Some(Duration::from_millis(400))),
            Freshness::Unusable
        );
    }

    #[test]
    fn xfetch_never_refreshes_far_from_expiry_and_always_at_it() {
        let e = entry(0, 10_000, 20_000, 100);
        assert!(!should_refresh_early(&e, 0, 1.0, 0.5));
        assert!(should_refresh_early(&e, 9_990, 1.0, 0.01));
        assert!(
            !should_refresh_early(&e, 9_990, 0.0, 0.01),
            "beta 0 disables it"
        );
    }

    /// A deterministic answer that took 150 s, then 200 hits spread over the
    /// first half of its 5-minute soft TTL, each drawing its own `u`: none
    /// refreshes (which would be a billed call for a fresh answer). Past the
    /// half, the slow answer does refresh early, as XFetch means it to.
    #[test]
    fn a_slow_answer_is_never_refreshed_in_the_first_half_of_its_soft_ttl() {
        let e = entry(0, 300_000, 3_600_000, 150_000);
        let mut rng = StdRng::seed_from_u64(7);
        for hit in 0..200u64 {
            let now = hit * 150_000 / 200;
            let u = rng.random_range(f64::MIN_POSITIVE..=1.0);
            assert!(
                !should_refresh_early(&e, now, 1.0, u),
                "hit {hit} at {now} ms"
            );
        }
        let refreshed = (0..200u64)
            .filter(|hit| {
                let now = 150_000 + hit * 150_000 / 200;
                should_refresh_early(&e, now, 1.0, rng.random_range(f64::MIN_POSITIVE..=1.0))
            })
            .count();
        assert!(refreshed > 0, "the second half refreshes early");
    }

    proptest! {
        #[test]
        fn jittered_ttls_stay_in_bounds(seed: u64, now in 0u64..1 << 40, soft in 1u64..100_000, extra in 0u64..100_000, jitter in 0.0f64..0.99) {
            let policy = TtlPolicy { soft_ttl: Duration::from_millis(soft), hard_ttl: Duration::from_millis(soft + extra), jitter };
            let (s, h) = policy.expiries(now, &mut StdRng::seed_from_u64(seed));
            prop_assert!(s >= now + soft);
            prop_assert!(s as f64 <= now as f64 + soft as f64 * (1.0 + jitter) + 1.0);
            prop_assert!(h >= s);
            prop_assert!(h as f64 <= now as f64 + (soft + extra) as f64 * (1.0 + jitter) + 1.0);
        }
    }
}
