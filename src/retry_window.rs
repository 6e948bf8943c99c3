//! The retry window: the answer of every completed flight the cache did not
//! store (a sampled one, by default; a stored one answers retries from the
//! cache), kept for `retry.dedup_window` where only the client's own retries
//! can read it, so a retry of an attempt the client gave up on (an SDK timeout, a
//! dropped connection) receives the answer that attempt paid for instead of
//! paying again.
//!
//! A request may read the window when it says it repeats an earlier attempt:
//! `X-Stainless-Retry-Count` > 0, or an `Idempotency-Key` already bound to the
//! same fingerprint. A request without those marks never sees it: a
//! "regenerate" button still gets a fresh sample. An idempotency key is bound
//! to the fingerprint of the first request that carried it, for the window;
//! the same key with another request is refused (422).
//!
//! Answers live in an in-process moka cache bounded in bytes and time and,
//! with Redis, under `retry:{fp}` (answers) and `idem:{key hash}` (bindings),
//! both expiring with the window and sealed like every other value. The
//! window is read before the flight table: a retry of a flight that still
//! runs finds nothing here and joins the flight like any identical request.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use moka::future::Cache;

use crate::{
    cache::StoredResponse,
    clock::Clock,
    cluster::Cluster,
    config::RetryConfig,
    error::GatewayError,
    fingerprint::{CacheKey, Fingerprint, IdempotencyKey},
    request::{CachePolicy, RetryMarks},
};

/// Bytes counted per answer beyond its body and events: headers, map overhead.
const ANSWER_OVERHEAD_BYTES: u64 = 256;
/// Idempotency keys this process remembers at once (about 100 bytes each).
const MAX_LOCAL_BINDINGS: u64 = 100_000;

/// A completed answer, as a retry receives it.
#[derive(Debug)]
pub struct Retained {
    pub response: Arc<StoredResponse>,
    /// A streamed flight's SSE events as its callers received them (usage
    /// included; a reader filters per caller), replayed byte for byte to a
    /// streaming retry. Empty for a buffered flight.
    pub events: Vec<Bytes>,
    /// On the gateway's clock, for `Age`.
    pub stored_at_ms: u64,
}

impl Retained {
    fn weight(&self) -> u32 {
        let events: u64 = self.events.iter().map(|event| event.len() as u64).sum();
        let weight = self.response.body.len() as u64 + events + ANSWER_OVERHEAD_BYTES;
        u32::try_from(weight).unwrap_or(u32::MAX)
    }

    pub fn age(&self, now_ms: u64) -> Duration {
        Duration::from_millis(now_ms.saturating_sub(self.stored_at_ms))
    }
}

/// What an idempotency key says about a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Binding {
    /// First seen now: bound to this request's fingerprint.
    First,
    /// Seen before with this same request: a repeat.
    Repeat,
    /// Seen before with another request.
    Conflict,
}

#[derive(Debug)]
pub struct RetryWindow {
    window: Duration,
    answers: Cache<Fingerprint, Arc<Retained>>,
    bindings: Cache<IdempotencyKey, Fingerprint>,
    cluster: Option<Arc<Cluster>>,
    clock: Arc<dyn Clock>,
}

impl RetryWindow {
    /// `None` when `retry.dedup_window` is 0 (the window is off).
    pub fn new(
        config: &RetryConfig,
        cluster: Option<Arc<Cluster>>,
        clock: Arc<dyn Clock>,
    ) -> Option<Self> {
        if config.dedup_window.is_zero() {
            return None;
        }
        let answers = Cache::builder()
            .weigher(|_fingerprint, answer: &Arc<Retained>| answer.weight())
            .max_capacity(config.dedup_max_bytes)
            .time_to_live(config.dedup_window)
            .build();
        let bindings = Cache::builder()
            .max_capacity(MAX_LOCAL_BINDINGS)
            .time_to_live(config.dedup_window)
            .build();
        Some(Self {
            window: config.dedup_window,
            answers,
            bindings,
            cluster,
            clock,
        })
    }

    /// The kept answer for a request that says it is a retry, if there is
    /// one. Binds the request's idempotency key on first sight, and refuses
    /// a key already bound to another request (422). `policy.revalidate`
    /// (`Cache-Control: no-cache`) asks for no stored answer: none is read.
    ///
    /// The key is bound to the request's `fingerprint`, the answer read under
    /// `key` (the fingerprint re-keyed by purges): a retry after a purge is
    /// the same request, and finds no purged answer.
    pub async fn recall_for(
        &self,
        marks: &RetryMarks,
        policy: CachePolicy,
        fingerprint: &Fingerprint,
        key: &CacheKey,
    ) -> Result<Option<Arc<Retained>>, GatewayError> {
        let repeat = match &marks.idempotency_key {
            None => false,
            Some(idempotency_key) => match self.bind(idempotency_key, fingerprint).await {
                Binding::Conflict => return Err(GatewayError::IdempotencyKeyReused),
                Binding::Repeat => true,
                Binding::First => false,
            },
        };
        if !(repeat || marks.sdk_retry) || policy.revalidate {
            return Ok(None);
        }
        Ok(self.recall(key).await)
    }

    /// Keeps a completed answer for the window. Called by the flight before
    /// it publishes its outcome, so a retry that misses the flight finds it.
    pub async fn remember(
        &self,
        key: &CacheKey,
        response: Arc<StoredResponse>,
        events: Vec<Bytes>,
    ) {
        let answer = Arc::new(Retained {
            response,
            events,
            stored_at_ms: self.clock.now_ms(),
        });
        self.answers.insert(key.fingerprint, answer.clone()).await;
        if let Some(cluster) = &self.cluster {
            // Best effort: without Redis, retries on this instance still find it.
            let _ = cluster
                .put_retained(
                    key,
                    &answer.response,
                    &answer.events,
                    answer.stored_at_ms,
                    self.window,
                )
                .await;
        }
    }

    async fn recall(&self, key: &CacheKey) -> Option<Arc<Retained>> {
        if let Some(answer) = self.answers.get(&key.fingerprint).await {
            return Some(answer);
        }
        let cluster = self.cluster.as_ref()?;
        let (response, events, stored_at_ms) = cluster.get_retained(key).await.ok()??;
        let answer = Arc::new(Retained {
            response,
            events,
            stored_at_ms,
        });
        self.answers.insert(key.fingerprint, answer.clone()).await;
        Some(answer)
    }

    /// Redis decides when it answers (so two instances agree on who saw a key
    /// first); this process's memory when it does not.
    /// Unbinds an idempotency key from the request it was bound to, when
    /// that request failed: a client that corrects its body after a
    /// provider's 400 and sends it under the same key is a first attempt, not
    /// a reused key (422). A key bound to another request is left alone.
    pub async fn release(&self, key: &IdempotencyKey, fingerprint: &Fingerprint) {
        if self.bindings.get(key).await == Some(*fingerprint) {
            self.bindings.invalidate(key).await;
        }
        if let Some(cluster) = &self.cluster {
            // Best effort: a binding left in Redis expires with the window.
            let _ = cluster.release_idempotency_key(key, fingerprint).await;
        }
    }

    async fn bind(&self, key: &IdempotencyKey, fingerprint: &Fingerprint) -> Binding {
        if let Some(cluster) = &self.cluster
            && let Ok(bound) = cluster
                .bind_idempotency_key(key, fingerprint, self.window)
                .await
        {
            self.bindings
                .insert(key.clone(), bound.unwrap_or(*fingerprint))
                .await;
            return match bound {
                None => Binding::First,
                Some(bound) if bound == *fingerprint => Binding::Repeat,
                Some(_) => Binding::Conflict,
            };
        }
        let entry = self
            .bindings
            .entry(key.clone())
            .or_insert(*fingerprint)
            .await;
        if entry.is_fresh() {
            Binding::First
        } else if entry.into_value() == *fingerprint {
            Binding::Repeat
        } else {
            Binding::Conflict
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;

    use super::*;
    use crate::{clock::ManualClock, tenant::TenantScope};

    fn key(body: &[u8]) -> CacheKey {
        CacheKey::for_tests(TenantScope::from_stored("t1"), body)
    }

    fn window(max_bytes: u64) -> RetryWindow {
        let config = RetryConfig {
            dedup_max_bytes: max_bytes,
            ..RetryConfig::default()
        };
        RetryWindow::new(&config, None, Arc::new(ManualClock::new(1_000))).unwrap()
    }

    fn answer(bytes: usize) -> Arc<StoredResponse> {
        Arc::new(StoredResponse {
            status: StatusCode::OK,
            headers: Vec::new(),
            body: Bytes::from(vec![b'x'; bytes]),
            usage: None,
        })
    }

    fn marks(sdk_retry: bool, idempotency_key: Option<&str>) -> RetryMarks {
        RetryMarks {
            sdk_retry,
            idempotency_key: idempotency_key
                .map(|k| IdempotencyKey::of(TenantScope::from_stored("t1"), k.as_bytes())),
        }
    }

    impl RetryWindow {
        async fn recall_for_test(
            &self,
            marks: &RetryMarks,
            key: &CacheKey,
        ) -> Result<Option<Arc<Retained>>, GatewayError> {
            self.recall_for(marks, CACHE, &key.fingerprint, key).await
        }
    }

    const CACHE: CachePolicy = CachePolicy {
        read: false,
        write: false,
        max_age: None,
        bypass: false,
        revalidate: false,
        coalesce: true,
    };

    #[tokio::test]
    async fn only_marked_requests_read_it() {
        let window = window(1 << 20);
        let k = key(b"a");
        window.remember(&k, answer(10), Vec::new()).await;
        assert!(
            window
                .recall_for_test(&marks(false, None), &k)
                .await
                .unwrap()
                .is_none()
        );
        let retained = window
            .recall_for_test(&marks(true, None), &k)
            .await
            .unwrap();
        assert_eq!(retained.unwrap().response.body.len(), 10);
        assert!(
            window
                .recall_for_test(&marks(true, None), &key(b"b"))
                .await
                .unwrap()
                .is_none()
        );
        let no_cache = CachePolicy {
            revalidate: true,
            coalesce: true,
            ..CACHE
        };
        let skipped = window
            .recall_for(&marks(true, None), no_cache, &k.fingerprint, &k)
            .await;
        assert!(
            skipped.unwrap().is_none(),
            "no-cache asks for no stored answer"
        );
    }

    #[tokio::test]
    async fn an_idempotency_key_reads_from_its_second_sight_and_only_for_its_request() {
        let window = window(1 << 20);
        let (a, b) = (key(b"a"), key(b"b"));
        window.remember(&a, answer(10), Vec::new()).await;
        let first = window
            .recall_for_test(&marks(false, Some("K")), &a)
            .await
            .unwrap();
        assert!(first.is_none(), "a first sight is a first attempt");
        let repeat = window
            .recall_for_test(&marks(false, Some("K")), &a)
            .await
            .unwrap();
        assert!(repeat.is_some());
        assert!(matches!(
            window.recall_for_test(&marks(true, Some("K")), &b).await,
            Err(GatewayError::IdempotencyKeyReused)
        ));
    }

    #[tokio::test]
    async fn it_is_bounded_in_bytes() {
        let window = window(64 * 1024);
        for i in 0..64u32 {
            let k = key(&i.to_be_bytes());
            window.remember(&k, answer(4 * 1024), Vec::new()).await;
        }
        window.answers.run_pending_tasks().await;
        assert!(
            window.answers.weighted_size() <= 64 * 1024,
            "{} bytes kept",
            window.answers.weighted_size()
        );
        assert!(window.answers.entry_count() < 64);
    }

    #[test]
    fn a_window_of_zero_is_off() {
        let config = RetryConfig {
            dedup_window: Duration::ZERO,
            ..RetryConfig::default()
        };
        assert!(RetryWindow::new(&config, None, Arc::new(ManualClock::new(0))).is_none());
    }
}
