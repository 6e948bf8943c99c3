//! The one integration test binary: corral and the mock provider on loopback
//! port 0, real HTTP, no sleeps for synchronisation.

mod fingerprint_props;
mod harness;
mod prompts_golden;
mod redis_server;

mod bad_input;
mod cluster;
mod dashboard;
mod dedup;
mod logs;
mod metrics;
mod retry;
mod sdk;
mod streaming;
mod swr;
