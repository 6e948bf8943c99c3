//! Failures remembered by this instance, so one client call never multiplies.
//!
//! corral retries a provider `retry.max_attempts` times, then relays the error
//! with `x-should-retry: false`. Not every client obeys that header (the
//! Vercel AI SDK retries twice whatever it says), and each retry of an
//! uncoalesced repeat used to start a new flight with all its attempts: one
//! SDK call against an always-429 provider cost 9 attempts. So a flight that
//! ended in a transient provider failure (`GatewayError::is_transient_upstream_failure`)
//! is remembered under its key:
//!
//! - for the provider's `Retry-After` (at most [`MAX_QUIET`]), else
//!   `cache.error_ttl`, a repeat gets the same error at once, without a call;
//! - after that, until a call of that key succeeds (or [`FAILING_FOR`] passes
//!   without another failure), a repeat's flight makes one attempt, not
//!   `max_attempts`: the provider has just said what many attempts get.
//!
//! With Redis the cluster's flight record answers repeats on every instance
//! too (`cluster.rs`); this memory is the instance's own, and works without.
//! Keys are cache keys, which carry the tenant scope: one tenant's failure
//! never answers another's request. A failure is remembered with the bytes
//! that caused it (`Sent`), and answers only a repeat of those bytes.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use moka::sync::Cache;
use tokio::time::Instant;

use crate::{
    error::GatewayError,
    fingerprint::{Fingerprint, Sent},
};

/// The longest a remembered error answers repeats without a call, whatever
/// `Retry-After` says: the longest wait the provider SDKs honour themselves.
pub const MAX_QUIET: Duration = Duration::from_secs(60);

/// How long a key stays failing (one attempt per flight) after its last failure.
pub const FAILING_FOR: Duration = Duration::from_secs(600);

/// What the memory holds at most, in bytes (error bodies weighed in full).
const MAX_BYTES: u64 = 16 << 20;

/// One key's last transient failure.
#[derive(Debug)]
struct Failure {
    error: Arc<GatewayError>,
    /// The bytes that failed.
    sends: Sent,
    quiet_until: Instant,
}

/// What a new flight of a key should do, given its failures.
#[derive(Debug)]
pub enum Recall {
    /// It failed moments ago: answer with that error, make no call.
    Quiet(Arc<GatewayError>),
    /// It failed, and the quiet time is over: one attempt.
    Failing,
    /// No failure remembered: an ordinary call.
    Clear,
}

/// Transient failures by key (see the module doc).
#[derive(Debug)]
pub struct FailureMemory {
    /// foldhash, not SipHash: every miss reads and settles its key here.
    failures: Cache<Fingerprint, Arc<Failure>, foldhash::fast::RandomState>,
    /// How many failures the memory may hold: counted up before each is
    /// kept and down when moka lets it go (replaced, expired, evicted,
    /// invalidated), so it is never below the true count. At zero, the common
    /// case of a provider that answers, a flight neither looks its key up
    /// nor clears it: two moka operations a miss spared.
    held: Arc<AtomicUsize>,
    /// The quiet time of a failure whose provider sent no `Retry-After`.
    quiet: Duration,
}

impl FailureMemory {
    /// `quiet`: how long a failure without `Retry-After` answers repeats
    /// (`cache.error_ttl`; zero: repeats always call, once).
    pub fn new(quiet: Duration) -> Self {
        let held = Arc::new(AtomicUsize::new(0));
        let released = held.clone();
        Self {
            failures: Cache::builder()
                .max_capacity(MAX_BYTES)
                .weigher(|_, failure: &Arc<Failure>| {
                    let body = match &*failure.error {
                        GatewayError::Upstream { body, .. } => body.len(),
                        _ => 0,
                    };
                    u32::try_from(body + 256).unwrap_or(u32::MAX)
                })
                .time_to_live(FAILING_FOR)
                .eviction_listener(move |_, _, _| {
                    released.fetch_sub(1, Ordering::Relaxed);
                })
                .build_with_hasher(foldhash::fast::RandomState::default()),
            held,
            quiet,
        }
    }

    /// What a flight of `key` that sends `sends` should do.
    pub fn recall(&self, key: &Fingerprint, sends: Sent) -> Recall {
        // A flight of the key that failed ended before this one began (the
        // flight table orders them), so its count is seen here.
        if self.held.load(Ordering::Relaxed) == 0 {
            return Recall::Clear;
        }
        match self.failures.get(key) {
            None => Recall::Clear,
            Some(failure) if failure.sends != sends => Recall::Clear,
            Some(failure) if Instant::now() < failure.quiet_until => {
                Recall::Quiet(failure.error.clone())
            }
            Some(_) => Recall::Failing,
        }
    }

    /// Records how a flight's upstream call ended: a transient failure is
    /// remembered, anything else that came from the provider clears the key.
    /// A failure local to this instance (its circuit, its caps, shutdown)
    /// says nothing about the provider and changes nothing.
    pub fn settle<T>(&self, key: &Fingerprint, sends: Sent, result: &Result<T, Arc<GatewayError>>) {
        match result {
            Err(error) if error.is_transient_upstream_failure() => {
                let quiet = error.provider_retry_after(MAX_QUIET).unwrap_or(self.quiet);
                self.held.fetch_add(1, Ordering::Relaxed);
                self.failures.insert(
                    *key,
                    Arc::new(Failure {
                        error: error.clone(),
                        sends,
                        quiet_until: Instant::now() + quiet,
                    }),
                );
            }
            Err(error) if error.is_local_to_instance() => {}
            _ if self.held.load(Ordering::Relaxed) == 0 => {}
            _ => self.failures.invalidate(key),
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderValue, StatusCode};
    use bytes::Bytes;

    use super::*;

    fn sent() -> Sent {
        Sent::of(false, b"{}")
    }

    fn key(byte: u8) -> Fingerprint {
        Fingerprint::from_hex(&format!("{byte:02x}").repeat(32)).unwrap()
    }

    fn provider(status: u16, retry_after: Option<&'static str>) -> Arc<GatewayError> {
        Arc::new(GatewayError::Upstream {
            status: StatusCode::from_u16(status).unwrap(),
            content_type: None,
            retry_after: retry_after.map(HeaderValue::from_static),
            body: Bytes::from_static(b"{}"),
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_transient_failure_answers_for_its_retry_after_then_allows_one_attempt() {
        let memory = FailureMemory::new(Duration::from_secs(5));
        memory.settle::<()>(&key(1), sent(), &Err(provider(429, Some("2"))));
        assert!(matches!(memory.recall(&key(1), sent()), Recall::Quiet(_)));
        assert!(
            matches!(memory.recall(&key(2), sent()), Recall::Clear),
            "per key"
        );
        tokio::time::advance(Duration::from_millis(2001)).await;
        assert!(matches!(memory.recall(&key(1), sent()), Recall::Failing));
        // It fails again: quiet again; then a success clears it.
        memory.settle::<()>(&key(1), sent(), &Err(provider(503, None)));
        assert!(matches!(memory.recall(&key(1), sent()), Recall::Quiet(_)));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(matches!(memory.recall(&key(1), sent()), Recall::Failing));
        memory.settle(&key(1), sent(), &Ok(()));
        assert!(matches!(memory.recall(&key(1), sent()), Recall::Clear));
        // Remembered with its bytes: other bytes of the key are not answered by it.
        memory.settle::<()>(&key(1), sent(), &Err(provider(429, Some("9"))));
        let other = Sent::of(true, b"{}");
        assert!(matches!(memory.recall(&key(1), other), Recall::Clear));
        assert!(matches!(memory.recall(&key(1), sent()), Recall::Quiet(_)));
    }

    /// Issue 37 W2: a Gemini 429's `RetryInfo.retryDelay` is the provider's
    /// wait, as `Retry-After` is: repeats are answered for it, not for
    /// `cache.error_ttl`.
    #[tokio::test(start_paused = true)]
    async fn a_gemini_retry_info_quiets_a_key_for_its_delay() {
        let memory = FailureMemory::new(Duration::ZERO);
        let body = Bytes::from(
            r#"{"error":{"code":429,"message":"quota","status":"RESOURCE_EXHAUSTED",
                "details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo",
                "retryDelay":"3s"}]}}"#,
        );
        let attempt = crate::upstream::status_error(
            crate::config::Api::Gemini,
            StatusCode::TOO_MANY_REQUESTS,
            &axum::http::HeaderMap::new(),
            body,
        );
        memory.settle::<()>(&key(1), sent(), &Err(Arc::new(attempt.error)));
        assert!(matches!(memory.recall(&key(1), sent()), Recall::Quiet(_)));
        tokio::time::advance(Duration::from_millis(2999)).await;
        assert!(matches!(memory.recall(&key(1), sent()), Recall::Quiet(_)));
        tokio::time::advance(Duration::from_millis(2)).await;
        assert!(matches!(memory.recall(&key(1), sent()), Recall::Failing));
    }

    /// The count that spares a healthy provider's flights their lookups
    /// follows what moka keeps: a replaced failure counts once, a cleared one
    /// not at all, and what is left is still answered.
    #[tokio::test(start_paused = true)]
    async fn the_count_of_held_failures_follows_what_the_memory_keeps() {
        let memory = FailureMemory::new(Duration::from_secs(5));
        let held = |memory: &FailureMemory| {
            memory.failures.run_pending_tasks();
            memory.held.load(Ordering::Relaxed)
        };
        memory.settle(&key(1), sent(), &Ok(()));
        assert_eq!(held(&memory), 0, "a success keeps nothing");
        memory.settle::<()>(&key(1), sent(), &Err(provider(503, None)));
        memory.settle::<()>(&key(1), sent(), &Err(provider(503, None)));
        memory.settle::<()>(&key(2), sent(), &Err(provider(503, None)));
        assert_eq!(held(&memory), 2, "key 1 replaced, key 2 added");
        memory.settle(&key(1), sent(), &Ok(()));
        assert_eq!(held(&memory), 1);
        assert!(matches!(memory.recall(&key(1), sent()), Recall::Clear));
        assert!(matches!(memory.recall(&key(2), sent()), Recall::Quiet(_)));
        memory.settle(&key(2), sent(), &Ok(()));
        assert_eq!(held(&memory), 0);
        assert!(matches!(memory.recall(&key(2), sent()), Recall::Clear));
    }

    #[tokio::test(start_paused = true)]
    async fn only_transient_provider_failures_are_remembered_and_retry_after_is_bounded() {
        let memory = FailureMemory::new(Duration::ZERO);
        for refused in [
            provider(400, None),
            provider(401, None),
            provider(404, None),
        ] {
            memory.settle::<()>(&key(1), sent(), &Err(refused));
            assert!(matches!(memory.recall(&key(1), sent()), Recall::Clear));
        }
        let local = Arc::new(GatewayError::CircuitOpen {
            upstream: "u".into(),
            retry_after: Duration::from_secs(1),
        });
        memory.settle::<()>(&key(1), sent(), &Err(local));
        assert!(matches!(memory.recall(&key(1), sent()), Recall::Clear));
        // No Retry-After and no quiet time: the next flight calls, once.
        memory.settle::<()>(&key(1), sent(), &Err(provider(500, None)));
        assert!(matches!(memory.recall(&key(1), sent()), Recall::Failing));
        // A hostile Retry-After neither panics nor silences a key for long.
        memory.settle::<()>(&key(2), sent(), &Err(provider(429, Some("1e300"))));
        tokio::time::advance(MAX_QUIET).await;
        assert!(matches!(memory.recall(&key(2), sent()), Recall::Failing));
    }
}
