//! The fleet's budget spend in Redis: one hash per window (`budget.rs` owns
//! what the fields mean), each kept an hour past its window's end.
//!
//! One Lua script per flush: it marks the batch id applied (`SET NX`, a day)
//! and only if the mark is new adds every line (`HINCRBY`, `PEXPIRE`), then
//! returns every field of the windows asked for. A batch whose reply was lost
//! is resent with its id, and the mark makes the second send add nothing.

use std::{
    sync::{Arc, LazyLock},
    time::Duration,
};

use async_trait::async_trait;
use redis::Script;

use super::Cluster;
use crate::budget::{BudgetBatch, BudgetStore, BudgetsUnavailable};

/// KEYS: the batch mark. ARGV: mark ms, window key prefix, line count, then
/// (window id, keep ms, field, delta) per line, then the window ids to read.
const APPLY_BATCH: &str = r"
local prefix, n = ARGV[2], tonumber(ARGV[3])
if redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) then
  for i = 0, n - 1 do
    local at = 4 + i * 4
    local key = prefix .. ARGV[at]
    redis.call('HINCRBY', key, ARGV[at + 2], ARGV[at + 3])
    redis.call('PEXPIRE', key, ARGV[at + 1])
  end
end
local windows = {}
for i = 4 + n * 4, #ARGV do
  windows[#windows + 1] = redis.call('HGETALL', prefix .. ARGV[i])
end
return windows
";

static APPLY_BATCH_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(APPLY_BATCH));

/// How long a batch id is remembered: far beyond any resend.
const MARK_TTL: Duration = Duration::from_secs(24 * 3600);

/// The budget keys share the hash tag `{budget}`: one slot in Redis Cluster,
/// so one script can touch them all.
pub fn budget_key_prefix(prefix: &str) -> String {
    format!("{prefix}:v1:{{budget}}:")
}

/// [`BudgetStore`] on the cluster's Redis, under its deadline and breaker.
#[derive(Debug)]
pub struct RedisBudgets {
    cluster: Arc<Cluster>,
}

impl RedisBudgets {
    pub fn new(cluster: Arc<Cluster>) -> Self {
        Self { cluster }
    }
}

#[async_trait]
impl BudgetStore for RedisBudgets {
    async fn apply(
        &self,
        batch: &BudgetBatch,
        read: &[String],
    ) -> Result<Vec<(String, Vec<(String, i64)>)>, BudgetsUnavailable> {
        let prefix = budget_key_prefix(&self.cluster.config.key_prefix);
        let mut script = APPLY_BATCH_SCRIPT.prepare_invoke();
        script
            .key(format!("{prefix}batch:{}", batch.id))
            .arg(MARK_TTL.as_millis() as u64)
            .arg(&prefix)
            .arg(batch.lines.len());
        for line in &batch.lines {
            script
                .arg(&line.window_id)
                .arg(line.keep_ms)
                .arg(&line.field)
                .arg(line.delta);
        }
        for window in read {
            script.arg(window);
        }
        let windows: Vec<Vec<(String, i64)>> = self
            .cluster
            .run("budget flush", |mut conn| async move {
                script.invoke_async(&mut conn).await
            })
            .await
            .map_err(|_| BudgetsUnavailable)?;
        Ok(read.iter().cloned().zip(windows).collect())
    }
}
