//! Cooldowns shared across a fleet (issue 38): a 429 one instance meets
//! cools that member on every instance within about a poll, so the fleet
//! does not each meet it.
//!
//! A pool of several publishes each cooldown it learns (`Pool::cool`) into a
//! bounded queue, without waiting: the request path never waits on Redis. One
//! background task per instance ([`CooldownSharing::run`]) writes them to the
//! store and, every [`COOLDOWN_POLL_INTERVAL`] (jittered, so a fleet does not
//! poll in step), reads every shared pool's deadlines back in one round trip
//! and applies those still ahead to this instance's cooldowns (never
//! shortening one). The store fails open: while it is unavailable, a
//! publication is dropped and a poll skipped, and cooldowns stay local.

use std::{sync::Arc, time::Duration};

use rand::Rng as _;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::client::Upstream;
use crate::routing::CooldownStore;

/// How often an instance reads the fleet's cooldowns: a 429 met elsewhere
/// keeps this instance off the member within this (plus a round trip).
pub const COOLDOWN_POLL_INTERVAL: Duration = Duration::from_millis(500);

/// Publications waiting for the store; past that, one is dropped (the next
/// 429 publishes again) rather than a caller waiting.
const QUEUE: usize = 64;

/// A cooldown one pool learned, for the fleet.
#[derive(Debug)]
pub(super) struct Cooled {
    pub(super) bucket: usize,
    /// Wall-clock milliseconds since the Unix epoch.
    pub(super) until_ms: u64,
}

/// A pool's way into the publishing queue.
#[derive(Debug, Clone)]
pub(super) struct Publisher {
    pool: usize,
    queue: mpsc::Sender<(usize, Cooled)>,
}

impl Publisher {
    /// Queues `cooled` without waiting (dropped when the queue is full).
    pub(super) fn publish(&self, cooled: Cooled) {
        if self.queue.try_send((self.pool, cooled)).is_err() {
            tracing::debug!("the shared cooldowns' queue is full; one publication dropped");
        }
    }
}

/// The background half of the sharing: see the module documentation.
#[derive(Debug)]
pub struct CooldownSharing {
    store: Arc<dyn CooldownStore>,
    published: mpsc::Receiver<(usize, Cooled)>,
    interval: Duration,
}

impl Upstream {
    /// Makes every pool of several publish its cooldowns to `store`; the
    /// sharing returned, run, writes them and polls the fleet's. `None` when
    /// no pool has several members (nothing to share, nothing to poll).
    pub fn share_cooldowns(&mut self, store: Arc<dyn CooldownStore>) -> Option<CooldownSharing> {
        if !self.pools.iter().any(|pool| pool.is_shared()) {
            return None;
        }
        let (queue, published) = mpsc::channel(QUEUE);
        for (index, pool) in self.pools.iter_mut().enumerate() {
            if pool.is_shared() {
                pool.publish_to(Publisher {
                    pool: index,
                    queue: queue.clone(),
                });
            }
        }
        Some(CooldownSharing {
            store,
            published,
            interval: COOLDOWN_POLL_INTERVAL,
        })
    }

    /// Reads every shared pool's cooldowns and applies them here.
    async fn poll_shared_cooldowns(&self, store: &dyn CooldownStore, shared: &[usize]) {
        let names: Vec<&str> = shared
            .iter()
            .map(|&pool| self.pools[pool].name.as_str())
            .collect();
        // Unavailable: this poll is skipped; cooldowns stay as this instance knows them.
        let Ok(tables) = store.load(&names).await else {
            return;
        };
        for (&pool, cooldowns) in shared.iter().zip(&tables) {
            self.pools[pool].apply_shared(cooldowns);
        }
    }

    /// Writes one learned cooldown to the store.
    async fn publish_cooldown(&self, store: &dyn CooldownStore, pool: usize, cooled: &Cooled) {
        let Some(pool) = self.pools.get(pool) else {
            return;
        };
        let Some(bucket) = pool.bucket_name(cooled.bucket) else {
            return;
        };
        let now_ms = pool.now_ms();
        if store
            .publish(&pool.name, bucket, cooled.until_ms, now_ms)
            .await
            .is_err()
        {
            tracing::debug!(pool = %pool.name, bucket, "a cooldown could not be shared; it holds on this instance");
        }
    }
}

impl CooldownSharing {
    /// Polls every `interval` instead (tests).
    pub fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Publishes what `upstream`'s pools learn and polls the fleet's, until `stop`.
    pub async fn run(mut self, upstream: Arc<Upstream>, stop: CancellationToken) {
        let shared: Vec<usize> = (0..upstream.pools.len())
            .filter(|&pool| upstream.pools[pool].is_shared())
            .collect();
        let next_poll = tokio::time::sleep(jittered(self.interval));
        tokio::pin!(next_poll);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                Some((pool, cooled)) = self.published.recv() => {
                    upstream.publish_cooldown(&*self.store, pool, &cooled).await;
                }
                () = &mut next_poll => {
                    upstream.poll_shared_cooldowns(&*self.store, &shared).await;
                    next_poll
                        .as_mut()
                        .reset(tokio::time::Instant::now() + jittered(self.interval));
                }
            }
        }
    }
}

/// `interval`, give or take a fifth.
fn jittered(interval: Duration) -> Duration {
    interval.mul_f64(rand::rng().random_range(0.8..1.2))
}
