//! The owner lock of a flight across instances: taken with a lease (`SET PX`
//! unless held), kept alive while the upstream call runs, released only by
//! its holder (compare-and-delete). The scripts are built once.

use std::{
    future::Future,
    sync::{Arc, LazyLock},
};

use futures::StreamExt as _;
use rand::Rng;
use redis::{AsyncCommands, Script};
use tokio::time::Instant;

use super::{Cluster, Unavailable};
use crate::fingerprint::CacheKey;

/// Takes the lock unless held; returns the holder's token when held.
const TRY_LOCK: &str = r"
local current = redis.call('GET', KEYS[1])
if current then return current end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
";
/// Deletes the lock only if we still hold it: never another owner's lease.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";
/// Extends the lease only if we still hold it.
const EXTEND: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
";

/// [`TRY_LOCK`], hashed once (the idempotency binding takes a key the same way).
pub(super) static TRY_LOCK_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(TRY_LOCK));
static RELEASE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE));
static EXTEND_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(EXTEND));

/// A held owner lock.
#[derive(Debug, Clone)]
pub struct Lease {
    pub key: CacheKey,
    pub token: String,
}

pub enum LockAttempt {
    Acquired(Lease),
    /// Another owner holds it, with this token.
    Held(String),
}

impl Cluster {
    pub fn new_token(&self) -> String {
        format!("{}-{:032x}", self.instance, rand::rng().random::<u128>())
    }

    pub async fn try_lock(&self, key: &CacheKey) -> Result<LockAttempt, Unavailable> {
        let token = self.new_token();
        let name = self.keys.lock(key);
        let ttl = self.config.lock_ttl.as_millis() as u64;
        let arg = token.clone();
        let holder: Option<String> = self
            .run("lock", |mut conn| async move {
                TRY_LOCK_SCRIPT
                    .key(name)
                    .arg(arg)
                    .arg(ttl)
                    .invoke_async(&mut conn)
                    .await
            })
            .await?;
        Ok(match holder {
            None => LockAttempt::Acquired(Lease {
                key: key.clone(),
                token,
            }),
            Some(holder) => LockAttempt::Held(holder),
        })
    }

    /// The current holder's token, if any.
    pub async fn lock_holder(&self, key: &CacheKey) -> Result<Option<String>, Unavailable> {
        let name = self.keys.lock(key);
        self.run(
            "lock holder",
            |mut conn| async move { conn.get(name).await },
        )
        .await
    }

    /// Extends the lease; false when it is no longer ours.
    pub async fn extend(&self, lease: &Lease) -> Result<bool, Unavailable> {
        let name = self.keys.lock(&lease.key);
        let token = lease.token.clone();
        let ttl = self.config.lock_ttl.as_millis() as u64;
        let extended: i64 = self
            .run("extend lock", |mut conn| async move {
                EXTEND_SCRIPT
                    .key(name)
                    .arg(token)
                    .arg(ttl)
                    .invoke_async(&mut conn)
                    .await
            })
            .await?;
        Ok(extended == 1)
    }

    /// Releases the lease; false when it was no longer ours (left intact).
    pub async fn release(&self, lease: &Lease) -> Result<bool, Unavailable> {
        let name = self.keys.lock(&lease.key);
        let token = lease.token.clone();
        let released: i64 = self
            .run("release lock", |mut conn| async move {
                RELEASE_SCRIPT
                    .key(name)
                    .arg(token)
                    .invoke_async(&mut conn)
                    .await
            })
            .await?;
        Ok(released == 1)
    }

    /// Keeps the lease alive while `work` runs: extends every third of the
    /// lock TTL, so a slow provider never lets a second owner in.
    pub async fn holding<T>(&self, lease: &Lease, work: impl Future<Output = T>) -> T {
        let period = self.config.lock_ttl / 3;
        let keep_alive = async {
            let mut ticks = tokio::time::interval_at(Instant::now() + period, period);
            loop {
                ticks.tick().await;
                if let Ok(false) = self.extend(lease).await {
                    tracing::warn!("lost the owner lease while the upstream call ran");
                    // Nothing left to extend; the work itself goes on.
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::select! {
            output = work => output,
            never = keep_alive => never,
        }
    }

    /// As [`holding`](Self::holding), for the many leases of a batch flight
    /// (one per item): every third of the lock TTL, each lease still ours is
    /// extended, a few at a time.
    pub async fn holding_all<T>(
        self: &Arc<Self>,
        leases: &[Lease],
        work: impl Future<Output = T>,
    ) -> T {
        if leases.is_empty() {
            return work.await;
        }
        let period = self.config.lock_ttl / 3;
        let leases: Vec<Lease> = leases.to_vec();
        let keep_alive = async {
            let mut ticks = tokio::time::interval_at(Instant::now() + period, period);
            let mut held: Vec<Lease> = leases;
            loop {
                ticks.tick().await;
                let extended: Vec<(Lease, Result<bool, Unavailable>)> =
                    futures::stream::iter(std::mem::take(&mut held))
                        .map(|lease| {
                            let cluster = self.clone();
                            async move {
                                let extended = cluster.extend(&lease).await;
                                (lease, extended)
                            }
                        })
                        .buffer_unordered(32)
                        .collect()
                        .await;
                for (lease, result) in extended {
                    if let Ok(false) = result {
                        tracing::warn!("lost an item's owner lease while the upstream call ran");
                    } else {
                        held.push(lease);
                    }
                }
            }
        };
        tokio::select! {
            output = work => output,
            never = keep_alive => never,
        }
    }
}
