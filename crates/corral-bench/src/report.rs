//! A run's results: counts, HDR-histogram latency summaries, the upstream
//! calls and the dedup ratio, as JSON (serde) and as a small text table.

use std::{collections::BTreeMap, fmt::Write as _};

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use super::probe::MetricsDelta;

/// Latency percentiles of one histogram (recorded in microseconds), in ms.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub count: u64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Summary {
    /// `None` for an empty histogram.
    pub fn of(histogram: &Histogram<u64>) -> Option<Self> {
        if histogram.is_empty() {
            return None;
        }
        let ms = |us: u64| us as f64 / 1000.0;
        Some(Self {
            count: histogram.len(),
            mean_ms: histogram.mean() / 1000.0,
            p50_ms: ms(histogram.value_at_quantile(0.50)),
            p90_ms: ms(histogram.value_at_quantile(0.90)),
            p99_ms: ms(histogram.value_at_quantile(0.99)),
            max_ms: ms(histogram.max()),
        })
    }

    fn line(&self) -> String {
        format!(
            "p50 {}  p90 {}  p99 {}  max {}  (mean {})",
            fmt_ms(self.p50_ms),
            fmt_ms(self.p90_ms),
            fmt_ms(self.p99_ms),
            fmt_ms(self.max_ms),
            fmt_ms(self.mean_ms)
        )
    }
}

/// A new histogram for microsecond latencies (3 significant digits, grows as needed).
pub fn histogram() -> Histogram<u64> {
    Histogram::new(3).expect("3 significant digits is a valid precision")
}

/// The responses that carried one `x-corral-cache` value.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CacheBreakdown {
    pub count: u64,
    pub latency: Summary,
    /// Time to first byte (first token of a stream).
    pub first_byte: Summary,
}

/// What the measured server process used during the run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ServerUsage {
    pub pid: u32,
    /// User + system CPU time over the run (10 ms resolution).
    pub cpu_ms: f64,
    pub cpu_us_per_request: f64,
    /// Resident memory once every connection was open, before the first request.
    pub rss_before_bytes: u64,
    /// Highest resident memory sampled during the run.
    pub rss_peak_bytes: u64,
}

/// One run of a scenario against one set of targets.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LoadReport {
    pub name: String,
    pub targets: Vec<String>,
    pub mix: String,
    pub stream: bool,
    /// Connections (virtual clients).
    pub concurrency: usize,
    /// Fixed arrival rate, when the run was open-loop.
    pub rate_per_s: Option<f64>,
    /// Requests sent.
    pub requests: u64,
    pub ok: u64,
    pub errors: u64,
    pub errors_by_kind: BTreeMap<String, u64>,
    /// Requests never sent because the run hit its hard time bound.
    pub unsent: u64,
    /// From the start signal to the last response.
    pub elapsed_s: f64,
    /// Successful responses per second.
    pub throughput_rps: f64,
    /// Successful responses, from sending to the last byte.
    pub latency: Option<Summary>,
    /// Successful responses, from sending to the first body byte.
    pub first_byte: Option<Summary>,
    /// Open loop: how late requests were sent against their schedule.
    pub schedule_lag: Option<Summary>,
    /// Open loop: latency from the scheduled send time (no coordinated omission).
    pub corrected_latency: Option<Summary>,
    /// Successful responses by `x-corral-cache`.
    pub by_cache: BTreeMap<String, CacheBreakdown>,
    /// How many different bodies the successful responses had.
    pub distinct_bodies: u64,
    /// Billable calls the mock provider saw during the run.
    pub upstream_calls: Option<u64>,
    /// `1 - upstream_calls / ok`: the share of answers that cost no call.
    pub dedup_ratio: Option<f64>,
    pub requests_per_upstream_call: Option<f64>,
    /// corral's own counters over the run, when its `/metrics` is there.
    pub metrics: Option<MetricsDelta>,
    pub saved_usd_per_1000_requests: Option<f64>,
    pub server: Option<ServerUsage>,
    /// Connections the client had to reopen (the server closed them).
    pub reconnects: u64,
}

impl LoadReport {
    /// A few aligned lines for a terminal.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let mode = match self.rate_per_s {
            Some(rate) => format!("open loop at {rate} req/s"),
            None => "closed loop".to_owned(),
        };
        let stream = if self.stream { ", stream" } else { "" };
        let mut row = |key: &str, value: String| {
            let _ = writeln!(out, "  {key:<11} {value}");
        };
        row(
            "scenario",
            format!(
                "{} ({}{stream}, {} connections, {mode})",
                self.name, self.mix, self.concurrency
            ),
        );
        row("target", self.targets.join(", "));
        let errors = if self.errors_by_kind.is_empty() {
            String::new()
        } else {
            let kinds: Vec<String> = self
                .errors_by_kind
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect();
            format!(" ({})", kinds.join(", "))
        };
        row(
            "requests",
            format!(
                "{} sent, {} ok, {} errors{errors}{}, {:.2} s, {:.0} req/s",
                self.requests,
                self.ok,
                self.errors,
                if self.unsent > 0 {
                    format!(", {} unsent (time bound)", self.unsent)
                } else {
                    String::new()
                },
                self.elapsed_s,
                self.throughput_rps
            ),
        );
        if let Some(latency) = &self.latency {
            row("latency", latency.line());
        }
        if self.stream {
            if let Some(first) = &self.first_byte {
                row("first byte", first.line());
            }
        }
        if let Some(corrected) = &self.corrected_latency {
            row("from sched.", corrected.line());
        }
        for (label, breakdown) in &self.by_cache {
            row(
                &format!("  {label}"),
                format!(
                    "{:>7}  p50 {}  p99 {}{}",
                    breakdown.count,
                    fmt_ms(breakdown.latency.p50_ms),
                    fmt_ms(breakdown.latency.p99_ms),
                    if self.stream {
                        format!(
                            "  first byte p50 {} p99 {}",
                            fmt_ms(breakdown.first_byte.p50_ms),
                            fmt_ms(breakdown.first_byte.p99_ms)
                        )
                    } else {
                        String::new()
                    }
                ),
            );
        }
        if let Some(calls) = self.upstream_calls {
            row(
                "upstream",
                format!(
                    "{calls} calls, dedup ratio {}, {} requests per call, {} distinct bodies",
                    self.dedup_ratio
                        .map_or("-".into(), |r| format!("{:.2}%", r * 100.0)),
                    self.requests_per_upstream_call
                        .map_or("-".into(), |r| format!("{r:.1}")),
                    self.distinct_bodies
                ),
            );
        }
        match &self.metrics {
            Some(metrics) => row(
                "/metrics",
                format!(
                    "{} upstream calls, saved ${:.6} (spent ${:.6}), {} per 1000 requests",
                    metrics.upstream_requests,
                    metrics.saved_usd,
                    metrics.spent_usd,
                    self.saved_usd_per_1000_requests
                        .map_or("-".into(), |usd| format!("${usd:.6} saved"))
                ),
            ),
            None => row("/metrics", "not available".into()),
        }
        if let Some(server) = &self.server {
            row(
                "server",
                format!(
                    "pid {}: {:.1} µs CPU per request, RSS {} -> peak {}",
                    server.pid,
                    server.cpu_us_per_request,
                    fmt_bytes(server.rss_before_bytes),
                    fmt_bytes(server.rss_peak_bytes)
                ),
            );
        }
        out
    }
}

/// `0.412 ms`, `12.3 ms`, `1.20 s`.
pub fn fmt_ms(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else if ms >= 10.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{ms:.3} ms")
    }
}

pub fn fmt_bytes(bytes: u64) -> String {
    let mib = bytes as f64 / (1024.0 * 1024.0);
    if mib >= 1.0 {
        format!("{mib:.1} MiB")
    } else {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_come_from_the_histogram() {
        let mut h = histogram();
        for us in 1..=1000 {
            h.record(us).unwrap();
        }
        let s = Summary::of(&h).unwrap();
        assert_eq!(s.count, 1000);
        assert!((s.p50_ms - 0.5).abs() < 0.01, "{s:?}");
        assert!((s.p99_ms - 0.99).abs() < 0.01, "{s:?}");
        assert!((s.max_ms - 1.0).abs() < 0.01, "{s:?}");
        assert!(Summary::of(&histogram()).is_none());
    }

    #[test]
    fn times_print_with_sensible_precision() {
        assert_eq!(fmt_ms(0.4123), "0.412 ms");
        assert_eq!(fmt_ms(12.34), "12.3 ms");
        assert_eq!(fmt_ms(1200.0), "1.20 s");
        assert_eq!(fmt_bytes(2048), "2.0 KiB");
    }
}
