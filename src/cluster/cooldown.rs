//! The fleet's shared cooldowns in Redis (`routing/shared.rs` says what they
//! mean): one hash per pool, `{prefix}:v1:{cooldowns}:{pool}`, of quota
//! bucket -> deadline (wall-clock ms). The instance that met the 429 writes
//! it with one script that keeps the later deadline, drops the buckets whose
//! time is up and keeps the hash as long as its latest deadline (plus a
//! second); every instance reads all its pools' hashes in one pipelined round
//! trip per poll. Names and deadlines only: nothing secret is written.

use std::{sync::Arc, sync::LazyLock};

use async_trait::async_trait;
use redis::Script;

use super::Cluster;
use crate::routing::{CooldownStore, CooldownsUnavailable, SharedCooldown};

/// KEYS: the pool's hash. ARGV: bucket, deadline ms, the writer's now ms.
const PUBLISH: &str = r"
local now = tonumber(ARGV[3])
local known = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0') or 0
if tonumber(ARGV[2]) > known then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
local fields = redis.call('HGETALL', KEYS[1])
local latest = 0
for i = 1, #fields, 2 do
  local deadline = tonumber(fields[i + 1]) or 0
  if deadline <= now then
    redis.call('HDEL', KEYS[1], fields[i])
  elseif deadline > latest then
    latest = deadline
  end
end
if latest > now then redis.call('PEXPIRE', KEYS[1], latest - now + 1000) end
return 1
";

static PUBLISH_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(PUBLISH));

/// A pool's hash. Every pool's shares the hash tag `{cooldowns}`: one slot,
/// so one pipeline reads them all on a Redis Cluster too.
pub fn cooldown_key(prefix: &str, pool: &str) -> String {
    format!("{prefix}:v1:{{cooldowns}}:{pool}")
}

/// [`CooldownStore`] on the cluster's Redis, under its deadline and breaker.
#[derive(Debug)]
pub struct RedisCooldowns {
    cluster: Arc<Cluster>,
}

impl RedisCooldowns {
    pub fn new(cluster: Arc<Cluster>) -> Self {
        Self { cluster }
    }
}

#[async_trait]
impl CooldownStore for RedisCooldowns {
    async fn publish(
        &self,
        pool: &str,
        bucket: &str,
        until_ms: u64,
        now_ms: u64,
    ) -> Result<(), CooldownsUnavailable> {
        let mut script = PUBLISH_SCRIPT.prepare_invoke();
        script
            .key(cooldown_key(&self.cluster.config.key_prefix, pool))
            .arg(bucket)
            .arg(until_ms)
            .arg(now_ms);
        self.cluster
            .run("cooldown", |mut conn| async move {
                script.invoke_async::<i64>(&mut conn).await
            })
            .await
            .map(|_| ())
            .map_err(|_| CooldownsUnavailable)
    }

    async fn load(&self, pools: &[&str]) -> Result<Vec<Vec<SharedCooldown>>, CooldownsUnavailable> {
        if pools.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for pool in pools {
            pipe.hgetall(cooldown_key(&self.cluster.config.key_prefix, pool));
        }
        let tables: Vec<Vec<(String, String)>> = self
            .cluster
            .run("cooldowns", |mut conn| async move {
                pipe.query_async(&mut conn).await
            })
            .await
            .map_err(|_| CooldownsUnavailable)?;
        Ok(tables
            .into_iter()
            .map(|fields| {
                fields
                    .into_iter()
                    // A value that is not a deadline (another version's) is skipped.
                    .filter_map(|(bucket, until)| {
                        Some(SharedCooldown {
                            until_ms: until.parse().ok()?,
                            bucket,
                        })
                    })
                    .collect()
            })
            .collect())
    }
}
