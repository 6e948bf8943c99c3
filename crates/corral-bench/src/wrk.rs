//! `wrk` as the hit path's load generator. The suite's own load tool is Rust
//! on tokio with a histogram per request: on a two-core machine it saturates
//! before a bare hyper server does, so a ratio measured with it flatters the
//! slower server. wrk (C, epoll, one connection state machine per socket) is
//! faster than both servers, which makes it the honest referee: the baseline
//! server's rate under the same wrk is a floor on what wrk can generate, so a
//! corral rate below it is corral's, not the generator's.
//!
//! The request is a POST whose body comes from a file (a Lua script sets it),
//! and a `done` hook prints one machine-readable line with the totals and the
//! latency percentiles in microseconds, so nothing depends on wrk's
//! human-oriented output format.
//!
//! For the miss path every body must be new to corral's cache: with
//! [`WrkRun::unique_after`], a `request` hook makes each body unique by
//! writing a per-run salt, the thread's number and a counter right after a
//! marker the body carries.

use std::{path::Path, process::Stdio, time::Duration};

use anyhow::{Context as _, bail};
use serde::Serialize;
use tokio::process::Command;

/// The marker of the line the `done` hook prints.
const RESULT_MARKER: &str = "CORRAL_WRK";

/// What one wrk run measured.
#[derive(Debug, Clone, Serialize)]
pub struct WrkReport {
    pub name: String,
    pub requests: u64,
    pub errors: u64,
    pub throughput_rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub mean_ms: f64,
}

/// How one wrk run is shaped.
#[derive(Debug, Clone)]
pub struct WrkRun<'a> {
    pub name: &'a str,
    pub url: &'a str,
    pub body_file: &'a Path,
    pub threads: usize,
    pub connections: usize,
    pub duration: Duration,
    /// Make every body unique: text inserted after the first occurrence of
    /// this marker (which the body must contain, inside a JSON string).
    pub unique_after: Option<&'a str>,
}

/// Whether a `wrk` executable is on `PATH`.
pub async fn available() -> bool {
    Command::new("wrk")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await
        // wrk prints its usage and exits 1 for --version; only "not found" counts.
        .is_ok()
}

/// The Lua script: POST the file's bytes as JSON, report in one line.
fn script(body_file: &Path, unique_after: Option<&str>) -> String {
    let mut script = format!(
        r#"local f = assert(io.open({path:?}, "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("{RESULT_MARKER} %d %d %d %d %d %d\n",
    summary.requests, summary.duration,
    e.connect + e.read + e.write + e.status + e.timeout,
    latency:percentile(50), latency:percentile(99), math.floor(latency.mean)))
end
"#,
        path = body_file.display().to_string()
    );
    if let Some(marker) = unique_after {
        // Each thread runs its own copy of the script; `setup` numbers them
        // (a global set in the thread's state), the salt tells runs apart.
        let salt = format!("{:016x}", rand::random::<u64>());
        script.push_str(&format!(
            r#"local marker = {marker:?}
local at = assert(string.find(wrk.body, marker, 1, true), "the body lacks the marker")
local head = string.sub(wrk.body, 1, at + #marker - 1)
local tail = string.sub(wrk.body, at + #marker)
local threads = 0
setup = function(thread)
  threads = threads + 1
  thread:set("thread_number", threads)
end
local counter = 0
request = function()
  counter = counter + 1
  return wrk.format(nil, nil, nil,
    head .. "-{salt}-" .. (thread_number or 0) .. "-" .. counter .. tail)
end
"#
        ));
    }
    script
}

/// Runs wrk once and parses its result line.
pub async fn run(run: &WrkRun<'_>, scratch: &Path) -> anyhow::Result<WrkReport> {
    let script_path = scratch.join("wrk-post.lua");
    std::fs::write(&script_path, script(run.body_file, run.unique_after))
        .with_context(|| format!("writing {}", script_path.display()))?;
    let output = tokio::time::timeout(
        run.duration + Duration::from_secs(30),
        Command::new("wrk")
            .arg(format!("-t{}", run.threads))
            .arg(format!("-c{}", run.connections))
            .arg(format!("-d{}s", run.duration.as_secs().max(1)))
            .arg("-s")
            .arg(&script_path)
            .arg(run.url)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .context("wrk did not finish within its duration plus 30 s")?
    .context("running wrk")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "wrk exited with {}: {}{}",
            output.status,
            stdout,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let report = parse(run.name, &stdout)?;
    eprintln!(
        "{}: {:.0} req/s, p50 {:.3} ms, p99 {:.3} ms, {} errors (wrk -t{} -c{})",
        report.name,
        report.throughput_rps,
        report.p50_ms,
        report.p99_ms,
        report.errors,
        run.threads,
        run.connections
    );
    Ok(report)
}

/// Reads the `done` hook's line out of wrk's output.
fn parse(name: &str, stdout: &str) -> anyhow::Result<WrkReport> {
    let line = stdout
        .lines()
        .find_map(|line| line.strip_prefix(RESULT_MARKER))
        .with_context(|| format!("no {RESULT_MARKER} line in wrk's output: {stdout}"))?;
    let numbers: Vec<u64> = line
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .with_context(|| format!("unreadable wrk result line: {line}"))?;
    let [requests, duration_us, errors, p50_us, p99_us, mean_us] = numbers[..] else {
        bail!("wrk result line has {} numbers: {line}", numbers.len());
    };
    if duration_us == 0 {
        bail!("wrk ran for no time: {line}");
    }
    let ms = |us: u64| us as f64 / 1000.0;
    Ok(WrkReport {
        name: name.to_owned(),
        requests,
        errors,
        throughput_rps: requests as f64 / (duration_us as f64 / 1e6),
        p50_ms: ms(p50_us),
        p99_ms: ms(p99_us),
        mean_ms: ms(mean_us),
    })
}

/// The median of a non-empty list of figures (rounds of one configuration).
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_done_line_is_read_among_wrks_own_output() {
        let stdout = "Running 5s test @ http://127.0.0.1:1/v1/chat/completions\n  \
                      2 threads and 64 connections\nCORRAL_WRK 100000 5000000 3 450 2100 612\n\
                      Requests/sec:  20000.00\n";
        let report = parse("x", stdout).unwrap();
        assert_eq!(report.requests, 100_000);
        assert_eq!(report.errors, 3);
        assert!((report.throughput_rps - 20_000.0).abs() < 1e-6);
        assert!((report.p50_ms - 0.45).abs() < 1e-9);
        assert!((report.p99_ms - 2.1).abs() < 1e-9);
        assert!(parse("x", "Requests/sec: 1\n").is_err());
        assert!(parse("x", "CORRAL_WRK 1 2 3\n").is_err());
    }

    #[test]
    fn a_unique_body_script_splits_at_the_marker_and_salts_each_run() {
        let plain = script(Path::new("body.json"), None);
        assert!(!plain.contains("request = function"));
        let first = script(Path::new("body.json"), Some("miss-abc"));
        let second = script(Path::new("body.json"), Some("miss-abc"));
        assert!(first.contains(r#"local marker = "miss-abc""#), "{first}");
        assert!(first.contains("request = function"));
        assert_ne!(first, second, "two runs never share a salt");
    }

    #[test]
    fn the_median_of_rounds() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
    }
}
