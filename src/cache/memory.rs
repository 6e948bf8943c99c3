//! The in-process store: a moka cache bounded in bytes (a weigher counts each
//! entry's body, headers and a fixed overhead), so memory stays under
//! `cache.max_bytes` whatever the answers weigh. Entries are evicted at their
//! hard expiry; freshness itself is judged by `Freshness` against the
//! gateway's clock.

use std::{sync::Arc, time::Duration, time::Instant};

use async_trait::async_trait;
use moka::{Expiry, future::Cache};

use super::{CacheStore, CacheUsage, Entry};
use crate::fingerprint::{CacheKey, Fingerprint};

/// Bytes counted per entry beyond its body and headers: the `Entry`, the
/// `StoredResponse`, the key and moka's own bookkeeping for it.
pub const ENTRY_OVERHEAD_BYTES: u64 = 512;

/// What an entry weighs against `cache.max_bytes`.
pub fn entry_weight(entry: &Entry) -> u64 {
    let headers: usize = entry
        .response
        .headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    (entry.response.body.len() + headers) as u64 + ENTRY_OVERHEAD_BYTES
}

#[derive(Debug, Clone)]
pub struct MemoryStore {
    cache: Cache<Fingerprint, Arc<Entry>>,
}

/// Evicts an entry once its hard TTL has passed (or `max_ttl`, for an L1 copy).
struct HardExpiry {
    max_ttl: Option<Duration>,
}

impl Expiry<Fingerprint, Arc<Entry>> for HardExpiry {
    fn expire_after_create(
        &self,
        _key: &Fingerprint,
        entry: &Arc<Entry>,
        _created_at: Instant,
    ) -> Option<Duration> {
        let hard =
            Duration::from_millis(entry.hard_expires_at_ms.saturating_sub(entry.stored_at_ms));
        Some(self.max_ttl.map_or(hard, |cap| hard.min(cap)))
    }

    fn expire_after_update(
        &self,
        key: &Fingerprint,
        entry: &Arc<Entry>,
        updated_at: Instant,
        _duration_until_expiry: Option<Duration>,
    ) -> Option<Duration> {
        self.expire_after_create(key, entry, updated_at)
    }
}

impl MemoryStore {
    /// Bounded by `max_bytes` of [`entry_weight`].
    pub fn new(max_bytes: u64) -> Self {
        Self::with_max_ttl(max_bytes, None)
    }

    /// As `new`, evicting every entry after `max_ttl` at the latest.
    pub fn with_max_ttl(max_bytes: u64, max_ttl: Option<Duration>) -> Self {
        let cache = Cache::builder()
            .expire_after(HardExpiry { max_ttl })
            .weigher(|_key, entry: &Arc<Entry>| {
                u32::try_from(entry_weight(entry)).unwrap_or(u32::MAX)
            })
            .max_capacity(max_bytes)
            .build();
        Self { cache }
    }
}

#[async_trait]
impl CacheStore for MemoryStore {
    // Keyed by fingerprint alone: it already covers the scope.
    async fn get(&self, key: &CacheKey) -> Option<Arc<Entry>> {
        self.cache.get(&key.fingerprint).await
    }

    async fn put(&self, key: &CacheKey, entry: Arc<Entry>) {
        self.cache.insert(key.fingerprint, entry).await;
    }

    async fn usage(&self) -> Option<CacheUsage> {
        // Moka applies evictions in batches; settle them so the numbers are current.
        self.cache.run_pending_tasks().await;
        Some(CacheUsage {
            entries: self.cache.entry_count(),
            bytes: self.cache.weighted_size(),
        })
    }
}
