//! corral: an OpenAI-compatible gateway that turns N identical LLM requests
//! into one upstream call. See ARCHITECTURE.md for the request's path.

pub mod api;
pub mod auth;
pub mod breaker;
pub mod budget;
pub mod cache;
pub mod cache_status;
pub mod clock;
pub mod cluster;
pub mod coalesce;
pub mod config;
pub mod crypto;
pub mod dedup;
pub mod error;
pub mod fingerprint;
pub mod held_body;
pub mod ledger;
pub mod limits;
pub mod memo;
pub mod metrics;
pub mod passthrough;
pub mod pins;
pub mod pricing;
pub mod provider;
pub mod purge;
pub mod request;
pub mod retry_window;
pub mod routing;
pub mod server;
pub mod sse;
pub mod state;
pub mod telemetry;
pub mod tenant;
pub mod traces;
pub mod upstream;
pub mod usage;
pub mod validate;
pub mod wire;

pub use config::Config;
pub use server::serve;
pub use state::AppState;
