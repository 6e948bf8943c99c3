//! Two levels: a short-lived in-process L1 in front of the shared Redis L2.
//! A fresh L1 entry answers at once; anything else consults L2, which may hold
//! a newer answer another instance stored (or refreshed).

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;

use super::Cluster;
use crate::{
    cache::{CacheStore, CacheUsage, Entry, Freshness, MemoryStore},
    clock::Clock,
    fingerprint::CacheKey,
};

#[derive(Debug)]
pub struct TieredStore {
    l1: MemoryStore,
    l2: Arc<Cluster>,
    clock: Arc<dyn Clock>,
}

impl TieredStore {
    pub fn new(max_bytes: u64, l1_ttl: Duration, l2: Arc<Cluster>, clock: Arc<dyn Clock>) -> Self {
        Self {
            l1: MemoryStore::with_max_ttl(max_bytes, Some(l1_ttl)),
            l2,
            clock,
        }
    }
}

#[async_trait]
impl CacheStore for TieredStore {
    async fn get(&self, key: &CacheKey) -> Option<Arc<Entry>> {
        let local = self.l1.get(key).await;
        let now = self.clock.now_ms();
        if let Some(entry) = &local
            && Freshness::of(entry, now, None) == Freshness::Fresh
        {
            return local;
        }
        // Redis down: the local copy, stale or not, is what there is.
        let Ok(Some(remote)) = self.l2.get_entry(key).await else {
            return local;
        };
        if let Some(local) = &local
            && local.stored_at_ms >= remote.stored_at_ms
        {
            return Some(local.clone());
        }
        // Callers that shared one Redis read (`Cluster::get_entry`) hold the
        // same entry: the first of them copies it into L1, the others see it there.
        let copied = self
            .l1
            .get(key)
            .await
            .is_some_and(|held| Arc::ptr_eq(&held, &remote));
        if !copied {
            self.l1.put(key, remote.clone()).await;
        }
        Some(remote)
    }

    async fn put(&self, key: &CacheKey, entry: Arc<Entry>) {
        self.l1.put(key, entry.clone()).await;
        // A failed write (Redis down or full) is counted by the cluster and
        // skipped: the answer still reaches every caller.
        let _ = self.l2.put_entry(key, &entry, self.clock.now_ms()).await;
    }

    async fn usage(&self) -> Option<CacheUsage> {
        self.l1.usage().await
    }
}
