//! `corral-bench`: the load tool and the benchmark suite (issue 7).
//!
//! The library half lives here so the CI smoke test can drive the same code
//! the binary runs: [`load::run`] takes a [`load::Scenario`] and returns a
//! [`report::LoadReport`] (counts, HDR latency percentiles, upstream calls and
//! dedup ratio from the mock's counter and corral's `/metrics`).
//! [`suite::run`] starts the mock, corral, a baseline server and, when a
//! scenario needs one, a private redis-server, runs every scenario and writes
//! a markdown and JSON report.
//!
//! Module map: `workload` (the prompt corpus and request mixes), `http` (one
//! persistent HTTP/1.1 connection per virtual client, timed), `load` (the
//! closed- and open-loop drivers), `probe` (the mock's counter and a
//! Prometheus scrape), `report` (summaries, the table), `process` (child
//! services started on port 0 and awaited on their ready line), `suite`.

pub mod http;
pub mod load;
pub mod probe;
pub mod process;
pub mod report;
pub mod suite;
pub mod workload;
pub mod wrk;

pub use load::{Scenario, Stop, run};
pub use report::LoadReport;
pub use workload::Mix;
