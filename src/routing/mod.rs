//! Pools of equivalent accounts (issue 38): which member a call tries, in
//! which order, and which members the provider told to wait.
//!
//! Pure decisions over plain vocabulary: member specs, an affinity key, a
//! provider's status, headers and body in; an order and a cooldown out. It
//! knows no config, upstream client, flight or metric; the upstream client
//! builds a [`Pool`] per pooled upstream and walks its [`Pool::order`].
//! A cache hit never gets here: only a call that goes upstream picks.
//!
//! - `pick.rs`: [`order`], weighted rendezvous hashing over priority tiers.
//! - `affinity.rs`: [`affinity_key`], what keeps a conversation on one member.
//! - `cooldown.rs`: [`Cooldowns`], per quota bucket, and the one probe after.
//! - `provider_wait.rs`: [`cooldown_from`], the wait the provider's answer names.
//! - `pool.rs`: [`Pool`], members mapped to quota buckets, the two together.
//! - `shared.rs`: [`CooldownStore`], where a fleet's instances share cooldowns.

mod affinity;
mod cooldown;
mod pick;
mod pool;
mod provider_wait;
mod shared;

pub use affinity::affinity_key;
pub use cooldown::{Admission, Cooldowns, LONGEST_COOLDOWN, Probe};
pub use pick::{AffinityKey, MemberId, MemberSpec, order};
pub use pool::Pool;
pub use provider_wait::{LONGEST_PROVIDER_WAIT, cooldown_from, gemini_retry_delay, retry_after};
pub use shared::{CooldownStore, CooldownsUnavailable, SharedCooldown};
