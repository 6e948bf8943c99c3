//! Calls to the providers: routing by model, one pooled HTTP client, and the
//! retry policy around it.

mod client;
pub mod retry;
mod route;

pub use client::{Buffered, Outbound, Upstream};
pub use route::Routes;
