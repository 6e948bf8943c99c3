//! The one integration test binary: corral and the mock provider on loopback
//! port 0, real HTTP, no sleeps for synchronisation.

mod fingerprint_props;
mod harness;
mod prompts_golden;
mod redis_server;

mod abandoned;
mod agents;
mod announce;
mod anthropic;
mod anthropic_sdk;
mod bad_input;
mod budgets;
mod cluster;
mod cost;
mod dashboard;
mod deadlines;
mod dedup;
mod deploy;
mod edges;
mod embeddings;
mod fuzz_corpora;
mod label_fields;
mod logs;
mod long_calls;
mod memo;
mod metrics;
mod module_graph;
mod operate;
mod own_controls;
mod owners_bytes;
mod places;
mod pricing;
mod protection;
mod provider_rules;
mod responses;
mod retry;
mod retry_window;
mod sdk;
mod shutdown;
mod slowloris;
mod streaming;
mod swr;
mod traces;
mod upstream_identity;
mod workspace;
