//! The response cache: what an [`Entry`] holds, and the [`CacheStore`] trait the
//! in-memory store (and the Redis store beside it) implement.

pub mod codec;
mod freshness;
mod memory;

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use bytes::Bytes;

pub use freshness::{Freshness, TtlPolicy, should_refresh_early};
pub use memory::{ENTRY_OVERHEAD_BYTES, MemoryStore, entry_weight};

use crate::fingerprint::CacheKey;
use crate::usage::Usage;

/// A complete upstream response, shared by every caller it answers: the body is
/// reference-counted bytes, never copied per caller.
#[derive(Debug, Clone)]
pub struct StoredResponse {
    pub status: StatusCode,
    /// Only allowlisted upstream headers (content type and the like).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: Bytes,
    /// The provider's token accounting, read once when the response arrived
    /// (`None` when it sent none: counted as unknown, never invented).
    pub usage: Option<Usage>,
}

/// A stored response with its timeline, in the clock's milliseconds.
#[derive(Debug, Clone)]
pub struct Entry {
    pub response: Arc<StoredResponse>,
    pub stored_at_ms: u64,
    /// Fresh until here.
    pub soft_expires_at_ms: u64,
    /// Stale but servable until here; a miss after.
    pub hard_expires_at_ms: u64,
    /// How long the upstream took to compute it (XFetch's delta).
    pub compute_time: Duration,
}

impl Entry {
    pub fn age(&self, now_ms: u64) -> Duration {
        Duration::from_millis(now_ms.saturating_sub(self.stored_at_ms))
    }
}

/// Where entries live. Implementations must be cheap to call concurrently and
/// must never block the runtime.
#[async_trait]
pub trait CacheStore: Send + Sync + std::fmt::Debug {
    async fn get(&self, key: &CacheKey) -> Option<Arc<Entry>>;
    async fn put(&self, key: &CacheKey, entry: Arc<Entry>);
    /// Entries and weighed bytes of the in-process store, where there is one.
    async fn usage(&self) -> Option<CacheUsage>;
}

/// What the in-process cache holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheUsage {
    pub entries: u64,
    /// Weighed as `cache.max_bytes` counts them ([`entry_weight`]).
    pub bytes: u64,
}
