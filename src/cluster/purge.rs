//! The purge generation table in Redis (`purge.rs` owns what it means): one
//! hash of `scope field -> generation` plus its version, and a sorted set of
//! the fingerprint fields by expiry, so purges by fingerprint do not pile up
//! in the hash while other purges keep it alive.
//!
//! One script per purge: drop up to 100 expired fingerprint fields, set the
//! scope's generation and the version, refresh both keys' retention. Every
//! instance polls the version (one HGET) and reloads the hash (HGETALL) only
//! when it changed.

use std::{
    sync::{Arc, LazyLock},
    time::Duration,
};

use async_trait::async_trait;
use redis::{AsyncCommands, Script};

use super::Cluster;
use crate::purge::{PurgeScope, PurgeStore, PurgeUnavailable, VERSION_FIELD};

/// KEYS: table hash, fingerprint expiry set. ARGV: field, generation, now ms,
/// expiry ms of a fingerprint field ('' for other scopes), retention ms, the
/// version field.
const RECORD: &str = r"
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[3], 'LIMIT', 0, 100)
if #expired > 0 then
  redis.call('HDEL', KEYS[1], unpack(expired))
  redis.call('ZREM', KEYS[2], unpack(expired))
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2], ARGV[6], ARGV[2])
if ARGV[4] ~= '' then redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1]) end
redis.call('PEXPIRE', KEYS[1], ARGV[5])
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('PEXPIRE', KEYS[2], ARGV[5]) end
return 1
";

static RECORD_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RECORD));

/// The table's keys share the hash tag `{purge}`: one slot, one script.
pub fn purge_key(prefix: &str) -> String {
    format!("{prefix}:v1:{{purge}}")
}

/// [`PurgeStore`] on the cluster's Redis, under its deadline and breaker.
#[derive(Debug)]
pub struct RedisPurges {
    cluster: Arc<Cluster>,
}

impl RedisPurges {
    pub fn new(cluster: Arc<Cluster>) -> Self {
        Self { cluster }
    }

    fn table(&self) -> String {
        purge_key(&self.cluster.config.key_prefix)
    }
}

#[async_trait]
impl PurgeStore for RedisPurges {
    async fn record(
        &self,
        scope: &PurgeScope,
        generation: u64,
        now_ms: u64,
        retention: Duration,
    ) -> Result<(), PurgeUnavailable> {
        let table = self.table();
        let retention_ms = u64::try_from(retention.as_millis()).unwrap_or(u64::MAX);
        let expires = match scope {
            PurgeScope::Fingerprint(_) => now_ms.saturating_add(retention_ms).to_string(),
            _ => String::new(),
        };
        let mut script = RECORD_SCRIPT.prepare_invoke();
        script
            .key(&table)
            .key(format!("{table}:fps"))
            .arg(scope.field())
            .arg(generation.to_string())
            .arg(now_ms)
            .arg(expires)
            .arg(retention_ms.max(1))
            .arg(VERSION_FIELD);
        self.cluster
            .run("purge", |mut conn| async move {
                script.invoke_async::<i64>(&mut conn).await
            })
            .await
            .map(|_| ())
            .map_err(|_| PurgeUnavailable)
    }

    async fn version(&self) -> Result<Option<String>, PurgeUnavailable> {
        let table = self.table();
        self.cluster
            .run("purge version", |mut conn| async move {
                conn.hget(table, VERSION_FIELD).await
            })
            .await
            .map_err(|_| PurgeUnavailable)
    }

    async fn load(&self) -> Result<Vec<(String, String)>, PurgeUnavailable> {
        let table = self.table();
        self.cluster
            .run("purge table", |mut conn| async move {
                conn.hgetall(table).await
            })
            .await
            .map_err(|_| PurgeUnavailable)
    }
}
