//! Calls to the providers: routing by model, one pooled HTTP client, the
//! retry policy around it, and each upstream's breaker, budget and caps.

pub mod body;
pub mod breaker;
mod client;
mod first_event;
mod pool;
pub mod retry;
mod route;

#[cfg(test)]
pub(crate) use client::status_error;
pub use client::{Buffered, DEFAULT_ANTHROPIC_VERSION, FirstEventCheck, Outbound, Upstream};
pub use route::Routes;
