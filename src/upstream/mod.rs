//! Calls to the providers: routing by model, one pooled HTTP client, the
//! retry policy around it, and each upstream's breaker, budget and caps.

pub mod body;
pub mod breaker;
mod client;
mod first_event;
mod pool;
pub mod retry;
mod route;
mod shared_cooldowns;
mod transport;
mod walk;

pub use crate::provider::DEFAULT_ANTHROPIC_VERSION;
#[cfg(test)]
pub(crate) use client::status_error;
pub use client::{Buffered, FirstEventCheck, Outbound, Upstream};
pub use route::Routes;
pub use shared_cooldowns::{COOLDOWN_POLL_INTERVAL, CooldownSharing};
