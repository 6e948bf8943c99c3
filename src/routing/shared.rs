//! Cooldowns shared by a fleet: where a quota bucket's deadline, learned by
//! the instance that met the provider's 429, is written for the others to
//! read. Only the interface lives here (`cluster/cooldown.rs` keeps it in
//! Redis); the upstream client publishes and polls through it, and without
//! one a cooldown stays on the instance that learned it.
//!
//! A bucket is named across instances by its pool and its name in the pool
//! (`quota:<quota>`, or `member:<member>` for a member with a bucket of its
//! own), never by an index that another instance's config could order
//! differently; a deadline is wall-clock milliseconds since the Unix epoch,
//! the only time two instances share.

use std::fmt;

use async_trait::async_trait;

/// The shared store could not be used (down, slow, or its breaker open): the
/// cooldowns stay local until it is back.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the shared cooldowns are unavailable")]
pub struct CooldownsUnavailable;

/// One bucket's shared deadline, as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedCooldown {
    /// The bucket's name in its pool.
    pub bucket: String,
    /// Wall-clock milliseconds since the Unix epoch.
    pub until_ms: u64,
}

/// Where every instance's cooldowns meet.
#[async_trait]
pub trait CooldownStore: Send + Sync + fmt::Debug {
    /// Records that `pool`'s `bucket` cools until `until_ms` (keeping a later
    /// deadline already there); `now_ms` is the writer's wall clock, so a
    /// record outlives its latest deadline and no longer.
    async fn publish(
        &self,
        pool: &str,
        bucket: &str,
        until_ms: u64,
        now_ms: u64,
    ) -> Result<(), CooldownsUnavailable>;

    /// Every bucket's deadline of each of `pools`, in their order (one read
    /// for all of them).
    async fn load(&self, pools: &[&str]) -> Result<Vec<Vec<SharedCooldown>>, CooldownsUnavailable>;
}
