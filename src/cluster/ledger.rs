//! The cluster ledger in Redis: one hash of counters every instance adds its
//! batches into (`ledger.rs` owns what the counters mean).
//!
//! One Lua script per flush, so a batch is applied whole or not at all and the
//! totals read back include it: it marks the batch id applied (`SET NX`, a
//! day), and only if the mark is new adds every line (`HINCRBY`), folding a
//! tenant the ledger does not know into `other` once it holds
//! `ledger.max_tenants`; it then refreshes the keys' retention and returns
//! every field. A batch whose reply was lost is resent with its id, and the
//! mark makes the second send add nothing.

use async_trait::async_trait;
use redis::Script;

use super::Cluster;
use crate::ledger::{Batch, LedgerStore, LedgerUnavailable, OTHER};
use std::{
    sync::{Arc, LazyLock},
    time::Duration,
};

/// KEYS: ledger hash, tenant set, batch mark. ARGV: retention ms, mark ms,
/// max tenants, `other`, then (field, tenant or "", delta) per line.
const ADD_BATCH: &str = r"
if redis.call('SET', KEYS[3], '1', 'NX', 'PX', ARGV[2]) then
  local cap = tonumber(ARGV[3])
  for i = 5, #ARGV, 3 do
    local field, tenant = ARGV[i], ARGV[i + 1]
    if tenant ~= '' then
      if tenant ~= ARGV[4] and redis.call('SISMEMBER', KEYS[2], tenant) == 0 then
        if redis.call('SCARD', KEYS[2]) < cap then
          redis.call('SADD', KEYS[2], tenant)
        else
          tenant = ARGV[4]
        end
      end
      field = field .. tenant
    end
    redis.call('HINCRBY', KEYS[1], field, ARGV[i + 2])
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('PEXPIRE', KEYS[2], ARGV[1]) end
return redis.call('HGETALL', KEYS[1])
";

static ADD_BATCH_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(ADD_BATCH));

/// How long a batch id is remembered: far beyond any resend.
const MARK_TTL: Duration = Duration::from_secs(24 * 3600);

/// The ledger's keys share the hash tag `{ledger}`: one slot in Redis Cluster,
/// so one script can touch them all.
pub fn ledger_key(prefix: &str) -> String {
    format!("{prefix}:v1:{{ledger}}")
}

/// [`LedgerStore`] on the cluster's Redis, under its deadline and breaker.
#[derive(Debug)]
pub struct RedisLedger {
    cluster: Arc<Cluster>,
    retention: Duration,
    max_tenants: usize,
}

impl RedisLedger {
    pub fn new(cluster: Arc<Cluster>, retention: Duration, max_tenants: usize) -> Self {
        Self {
            cluster,
            retention,
            max_tenants,
        }
    }
}

#[async_trait]
impl LedgerStore for RedisLedger {
    async fn add(&self, batch: &Batch) -> Result<Vec<(String, i64)>, LedgerUnavailable> {
        let hash = ledger_key(&self.cluster.config.key_prefix);
        let mut script = ADD_BATCH_SCRIPT.prepare_invoke();
        script
            .key(&hash)
            .key(format!("{hash}:tenants"))
            .key(format!("{hash}:batch:{}", batch.id))
            .arg(self.retention.as_millis() as u64)
            .arg(MARK_TTL.as_millis() as u64)
            .arg(self.max_tenants)
            .arg(OTHER);
        for line in &batch.lines {
            script
                .arg(&line.field)
                .arg(line.tenant.as_deref().unwrap_or(""))
                .arg(line.delta);
        }
        self.cluster
            .run("ledger flush", |mut conn| async move {
                script.invoke_async(&mut conn).await
            })
            .await
            .map_err(|_| LedgerUnavailable)
    }
}
