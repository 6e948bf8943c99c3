//! Pins in Redis (`pins.rs` owns what they mean): one key per pin,
//! `{prefix}:v1:{tenant}:pin:{hash}` (the hash of its pool and id, never
//! the id in clear) holding the member's name, sealed like every value when
//! `redis.encryption_key_env` is set, and expiring with the pin.

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use redis::AsyncCommands;

use super::Cluster;
use crate::pins::{MAX_MEMBER_BYTES, PinStore, PinsUnavailable};

/// The Redis key of a pin.
pub fn pin_key(prefix: &str, tenant: &str, hash: &str) -> String {
    format!("{prefix}:v1:{tenant}:pin:{{{hash}}}")
}

/// [`PinStore`] on the cluster's Redis, under its deadline and breaker.
#[derive(Debug)]
pub struct RedisPins {
    cluster: Arc<Cluster>,
}

impl RedisPins {
    pub fn new(cluster: Arc<Cluster>) -> Self {
        Self { cluster }
    }
}

#[async_trait]
impl PinStore for RedisPins {
    async fn record(
        &self,
        tenant: &str,
        hash: &str,
        member: &str,
        ttl: Duration,
    ) -> Result<(), PinsUnavailable> {
        let key = pin_key(&self.cluster.config.key_prefix, tenant, hash);
        let value = self.cluster.seal(&key, member.as_bytes().to_vec());
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        self.cluster
            .run("pin", |mut conn| async move {
                conn.pset_ex::<_, _, ()>(key, value, ttl_ms).await
            })
            .await
            .map_err(|_| PinsUnavailable)
    }

    async fn member(&self, tenant: &str, hash: &str) -> Result<Option<String>, PinsUnavailable> {
        let key = pin_key(&self.cluster.config.key_prefix, tenant, hash);
        let read = key.clone();
        let bytes: Option<Vec<u8>> = self
            .cluster
            .run("pin read", |mut conn| async move { conn.get(read).await })
            .await
            .map_err(|_| PinsUnavailable)?;
        Ok(bytes
            .filter(|bytes| bytes.len() <= MAX_MEMBER_BYTES + 64)
            .and_then(|bytes| self.cluster.open(&key, bytes))
            .and_then(|plain| String::from_utf8(plain).ok()))
    }
}
