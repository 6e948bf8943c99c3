//! The in-process store: a moka cache bounded by entries or bytes. Entries are
//! evicted at their hard expiry; freshness itself is judged by `Freshness`
//! against the gateway's clock.

use std::{sync::Arc, time::Duration, time::Instant};

use async_trait::async_trait;
use moka::{Expiry, future::Cache};

use super::{CacheStore, Entry};
use crate::fingerprint::{CacheKey, Fingerprint};

/// Bytes counted per entry beyond its body: headers, timeline, map overhead.
const ENTRY_OVERHEAD_BYTES: u64 = 256;

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
    /// Bounded by `max_bytes` (body sizes) when given, else by `max_entries`.
    pub fn new(max_entries: Option<u64>, max_bytes: Option<u64>) -> Self {
        Self::with_max_ttl(max_entries, max_bytes, None)
    }

    /// As `new`, evicting every entry after `max_ttl` at the latest.
    pub fn with_max_ttl(
        max_entries: Option<u64>,
        max_bytes: Option<u64>,
        max_ttl: Option<Duration>,
    ) -> Self {
        let builder = Cache::builder().expire_after(HardExpiry { max_ttl });
        let cache = match max_bytes {
            Some(max_bytes) => builder
                .weigher(|_key, entry: &Arc<Entry>| {
                    let weight = entry.response.body.len() as u64 + ENTRY_OVERHEAD_BYTES;
                    u32::try_from(weight).unwrap_or(u32::MAX)
                })
                .max_capacity(max_bytes)
                .build(),
            None => builder.max_capacity(max_entries.unwrap_or(10_000)).build(),
        };
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

    fn entry_count(&self) -> Option<u64> {
        Some(self.cache.entry_count())
    }
}
