//! The in-process store: a moka cache bounded in bytes (a weigher counts each
//! entry's body, headers and a fixed overhead), so memory stays under
//! `cache.max_bytes` whatever the answers weigh. Entries are evicted at their
//! hard expiry; freshness itself is judged by `Freshness` against the
//! gateway's clock.

use std::{sync::Arc, time::Duration, time::Instant};

use async_trait::async_trait;
use moka::{Expiry, sync::Cache};

use super::{CacheStore, CacheUsage, Entry};
use crate::fingerprint::{CacheKey, Fingerprint};

/// Bytes counted per entry beyond its body and headers: moka's bookkeeping for
/// it (its entry and entry info, the hash table's bucket, the access-order
/// node, the timer-wheel node of its expiry, the key's own `Arc`), the `Entry`
/// and `StoredResponse` in their `Arc`s, and the body's shared handle.
///
/// Measured, not guessed: a distinct-key flood of small answers at the shipped
/// 256 MiB held 263k entries weighed at ~1.0 KiB each and reached 415 MiB of
/// RSS, ~1.5 KiB per entry (BENCHMARKS.md, "Memory that follows the bytes
/// held"); with this overhead an entry weighs what it costs, so
/// `cache.max_bytes` bounds the memory the cache really takes.
pub const ENTRY_OVERHEAD_BYTES: u64 = 768;

/// Bytes counted per stored header beyond its name and value text: its slot
/// in the headers list (name and value handles) and its value's allocation.
pub const HEADER_OVERHEAD_BYTES: u64 = 96;

/// What an entry weighs against `cache.max_bytes`: its body as the allocator
/// rounds it, its headers, and [`ENTRY_OVERHEAD_BYTES`].
pub fn entry_weight(entry: &Entry) -> u64 {
    let headers: u64 = entry
        .response
        .headers
        .iter()
        .map(|(name, value)| (name.as_str().len() + value.len()) as u64 + HEADER_OVERHEAD_BYTES)
        .sum();
    allocated(entry.response.body.len() as u64) + headers + ENTRY_OVERHEAD_BYTES
}

/// `bytes` rounded up to the allocation that holds them: size classes four to
/// a doubling, 16 bytes apart at the least (jemalloc's, and close to what any
/// modern allocator does); a body is one allocation of its own.
fn allocated(bytes: u64) -> u64 {
    if bytes <= 16 {
        return 16;
    }
    let power = 63 - (bytes - 1).leading_zeros();
    let spacing = (1_u64 << power.saturating_sub(2)).max(16);
    bytes.div_ceil(spacing) * spacing
}

#[derive(Debug, Clone)]
pub struct MemoryStore {
    /// Hashed with foldhash, not SipHash: a key is a SHA-256 already, and
    /// every hit hashes one.
    cache: Cache<Fingerprint, Arc<Entry>, foldhash::fast::RandomState>,
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
            .build_with_hasher(foldhash::fast::RandomState::default());
        Self { cache }
    }
}

#[async_trait]
impl CacheStore for MemoryStore {
    // Keyed by fingerprint alone: it already covers the scope.
    async fn get(&self, key: &CacheKey) -> Option<Arc<Entry>> {
        self.cache.get(&key.fingerprint)
    }

    async fn put(&self, key: &CacheKey, entry: Arc<Entry>) {
        self.cache.insert(key.fingerprint, entry);
    }

    async fn usage(&self) -> Option<CacheUsage> {
        // Moka applies evictions in batches; settle them so the numbers are current.
        self.cache.run_pending_tasks();
        Some(CacheUsage {
            entries: self.cache.entry_count(),
            bytes: self.cache.weighted_size(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::StoredResponse;
    use crate::{
        fingerprint::{Endpoint, KeyInput},
        tenant::TenantScope,
    };
    use axum::http::StatusCode;
    use bytes::Bytes;

    fn key(n: u64) -> CacheKey {
        let scope = TenantScope::global();
        let body = n.to_le_bytes();
        CacheKey {
            fingerprint: Fingerprint::of(&KeyInput {
                endpoint: Endpoint::ChatCompletions,
                upstream: "u",
                scope: &scope,
                headers: &[],
                query: &[],
                body: &body,
            }),
            scope,
        }
    }

    fn entry(body_bytes: usize) -> Arc<Entry> {
        Arc::new(Entry {
            response: Arc::new(StoredResponse {
                status: StatusCode::OK,
                headers: Vec::new(),
                body: Bytes::from(vec![b'x'; body_bytes]),
                usage: None,
            }),
            stored_at_ms: 0,
            soft_expires_at_ms: 60_000,
            hard_expires_at_ms: 3_600_000,
            compute_time: Duration::ZERO,
        })
    }

    #[tokio::test]
    async fn a_flood_of_distinct_keys_stays_within_the_byte_bound() {
        let max_bytes = 4 * 1024 * 1024;
        let store = MemoryStore::new(max_bytes);
        let body_bytes = 16 * 1024;
        let keys = 30_000;
        for n in 0..keys {
            store.put(&key(n), entry(body_bytes)).await;
            if n % 5_000 == 4_999 {
                let usage = store.usage().await.unwrap();
                assert!(usage.bytes <= max_bytes, "{usage:?}");
            }
        }
        let usage = store.usage().await.unwrap();
        let weight = entry_weight(&entry(body_bytes));
        assert_eq!(
            weight,
            16 * 1024 + ENTRY_OVERHEAD_BYTES,
            "16 KiB is a size class"
        );
        assert!(usage.bytes <= max_bytes, "{usage:?}");
        assert!(usage.entries <= max_bytes / weight, "{usage:?}");
        assert!(usage.bytes > max_bytes / 2, "the bound is used, {usage:?}");
        assert_eq!(usage.bytes, usage.entries * weight);
        println!(
            "{keys} keys x {body_bytes} B inserted; held {} entries, {} bytes",
            usage.entries, usage.bytes
        );
    }

    #[test]
    fn an_entry_weighs_its_body_as_allocated_its_headers_and_its_bookkeeping() {
        for (bytes, class) in [
            (0, 16),
            (1, 16),
            (16, 16),
            (17, 32),
            (100, 112),
            (129, 160),
            (500, 512),
            (513, 640),
            (4096, 4096),
            (4097, 5120),
        ] {
            assert_eq!(allocated(bytes), class, "{bytes} bytes");
        }
        let mut small = Entry::clone(&entry(500));
        let response = StoredResponse {
            status: StatusCode::OK,
            headers: vec![(
                axum::http::header::CONTENT_TYPE,
                axum::http::HeaderValue::from_static("application/json"),
            )],
            body: small.response.body.clone(),
            usage: None,
        };
        small.response = Arc::new(response);
        // 512 for the body, "content-type" + "application/json" + 96, then 768:
        // a small answer costs about three times its body.
        assert_eq!(entry_weight(&small), 512 + (12 + 16 + 96) + 768);
    }
}
