//! The miss path (issue 41): most LLM traffic is unique, so what corral adds
//! to a request it must send upstream matters more than its hit path. Every
//! figure is corral against `bench-baseline --proxy-to`, a bare pooled
//! keep-alive hyper reverse proxy, both in front of the same mock (latency 0)
//! in the same run:
//!
//! - throughput at load with every body distinct (wrk, whose `request` hook
//!   makes each body unique; the suite's own load tool when wrk is missing),
//!   in alternating rounds so machine drift spreads over both servers;
//! - CPU per miss: the server's CPU time over the requests served, from
//!   `/proc/PID/stat`, taken around each of those runs;
//! - latency at one connection (sequential requests), each server's own and
//!   direct to the mock, so the hop each one adds is apart;
//! - a streamed miss's time to its first event, the same three ways;
//! - and, as before, the added latency at a moderate fixed rate.

use std::{collections::BTreeMap, time::Duration};

use anyhow::{Context as _, bail};
use serde_json::json;

use super::{Bench, START_DEADLINE, ScenarioResult};
use crate::{
    load::{Scenario, Stop},
    probe,
    process::{self, Service},
    report::{LoadReport, Summary},
    workload::{Mix, Workload},
    wrk,
};

/// Issue 41's bounds, which the report marks met or not: distinct-miss
/// throughput at least this share of the bare proxy's...
const MISS_THROUGHPUT_MIN: f64 = 0.8;
/// ...at most this much of corral's CPU per miss, in µs...
const MISS_CPU_US_MAX: f64 = 50.0;
/// ...and at one connection, corral's added p50 (plain, and a stream's first
/// event) at most this many times the bare proxy's.
const ADDED_P50_RATIO_MAX: f64 = 2.0;

/// The name of the proxy baseline's runs.
const BASELINE: &str = "baseline proxy";
/// The name of corral's runs.
const CORRAL: &str = "corral";

/// One server under test: where its `/v1` is and which process does its work.
struct Target {
    name: &'static str,
    base: String,
    pid: Option<u32>,
}

/// What one throughput run at load measured of one server.
#[derive(Debug, Clone, serde::Serialize)]
struct LoadRound {
    throughput_rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    requests: u64,
    errors: u64,
    /// CPU time of the server under test over the requests served.
    cpu_us_per_request: Option<f64>,
    /// Calls the mock answered over the requests served (1 when every one missed).
    upstream_calls_per_request: Option<f64>,
}

impl Bench {
    /// Miss path against the bare reverse proxy (see the module doc).
    pub(super) async fn miss(&mut self) -> anyhow::Result<ScenarioResult> {
        let mut result = ScenarioResult::new("miss");
        self.set_latency(Duration::ZERO).await?;
        let baseline = self.start_proxy_baseline().await?;
        let targets = [
            Target {
                name: BASELINE,
                base: format!("{}/v1", baseline.ready),
                pid: baseline.pid(),
            },
            Target {
                name: CORRAL,
                base: self.corral_base(),
                pid: self.corral.pid(),
            },
        ];
        let outcome = async {
            self.miss_at_fixed_rate(&mut result).await?;
            self.miss_at_load(&mut result, &targets).await?;
            self.miss_at_one_connection(&mut result, &targets, false)
                .await?;
            self.miss_at_one_connection(&mut result, &targets, true)
                .await?;
            anyhow::Ok(())
        }
        .await;
        baseline.stop().await;
        outcome?;
        Ok(result)
    }

    /// `bench-baseline --proxy-to` the suite's mock.
    async fn start_proxy_baseline(&self) -> anyhow::Result<Service> {
        process::start_proxy_baseline(
            &self.options.bin_dir.join("bench-baseline"),
            &probe::origin_of(&self.mock.ready),
            &self.logs.join("bench-baseline-proxy.log"),
            START_DEADLINE,
        )
        .await
    }

    fn distinct_scenario(&self, name: &str, base: &str, pid: Option<u32>) -> Scenario {
        let mut scenario = self.scenario(name, vec![base.to_owned()]);
        scenario.nonce = format!("miss-{:08x}", rand::random::<u32>());
        scenario.mix = Mix::Distinct;
        scenario.watch_pid = pid;
        scenario
    }

    /// Distinct requests at a moderate fixed rate, through corral and
    /// straight to the mock: the added latency below saturation.
    async fn miss_at_fixed_rate(&self, result: &mut ScenarioResult) -> anyhow::Result<()> {
        let rate = self.scaled(1000, 200) as f64;
        let fixed_rate = |name: &str, base: &str, pid: Option<u32>| {
            let mut scenario = self.distinct_scenario(name, base, pid);
            scenario.concurrency = 32;
            scenario.rate = Some(rate);
            scenario.stop = Stop::Duration(self.seconds(5, 1));
            scenario
        };
        let direct = self
            .run(&fixed_rate(
                "miss: direct to the mock",
                &self.mock.ready,
                self.mock.pid(),
            ))
            .await?;
        let via = self
            .run(&fixed_rate(
                "miss: through corral",
                &self.corral_base(),
                self.corral.pid(),
            ))
            .await?;
        let (Some(d), Some(v)) = (&direct.latency, &via.latency) else {
            bail!("a miss-path run had no successful response");
        };
        let added_p99 = v.p99_ms - d.p99_ms;
        result.target("added p99", added_p99, "ms", "<= 1 ms", added_p99 <= 1.0);
        result.figure("added p50", v.p50_ms - d.p50_ms, "ms");
        result.figure("p50 / direct p50", v.p50_ms / d.p50_ms, "ratio");
        result.figure("p99 / direct p99", v.p99_ms / d.p99_ms, "ratio");
        if let Some(calls) = via.upstream_calls {
            result.figure(
                "upstream calls per request",
                calls as f64 / via.ok.max(1) as f64,
                "ratio",
            );
        }
        if let Some(server) = &via.server {
            result.figure("corral CPU per request", server.cpu_us_per_request, "µs");
        }
        result.runs.extend([direct, via]);
        Ok(())
    }

    /// Throughput and CPU per miss at load, every body distinct, in rounds
    /// alternating the two servers; each ratio is taken within a round and
    /// the figure is the median of the rounds' ratios.
    async fn miss_at_load(
        &self,
        result: &mut ScenarioResult,
        targets: &[Target; 2],
    ) -> anyhow::Result<()> {
        let use_wrk = wrk::available().await;
        let rounds = self.scaled(6, 1);
        let duration = self.seconds(3, 1);
        let (threads, connections) = (2, 64);
        // wrk's hook writes its counter after this marker (the workload puts
        // the nonce in every body).
        let marker = format!("miss-load-{:08x}", rand::random::<u32>());
        let workload = Workload::new(&self.corpus, Mix::Identical { index: 0 }, false, &marker)?;
        let request = workload.request(0, &mut rand::rng());
        let body_file = self.logs.join("miss-request.json");
        std::fs::write(&body_file, &request.body)?;

        let mut runs: BTreeMap<&str, Vec<LoadRound>> = BTreeMap::new();
        for round in 0..rounds {
            // Each server first in every other round.
            let order: Vec<&Target> = if round % 2 == 0 {
                targets.iter().collect()
            } else {
                targets.iter().rev().collect()
            };
            for target in order {
                let cpu_before = target.pid.and_then(probe::cpu_time);
                let calls_before = probe::mock_calls(&self.probe, &self.mock.ready).await.ok();
                let mut measured = if use_wrk {
                    let url = format!("{}{}", target.base, request.path);
                    let report = wrk::run(
                        &wrk::WrkRun {
                            name: target.name,
                            url: &url,
                            body_file: &body_file,
                            threads,
                            connections,
                            duration,
                            unique_after: Some(&marker),
                        },
                        &self.logs,
                    )
                    .await?;
                    LoadRound {
                        throughput_rps: report.throughput_rps,
                        p50_ms: report.p50_ms,
                        p99_ms: report.p99_ms,
                        requests: report.requests,
                        errors: report.errors,
                        cpu_us_per_request: None,
                        upstream_calls_per_request: None,
                    }
                } else {
                    let mut scenario = self.distinct_scenario(
                        &format!("miss at load: {}", target.name),
                        &target.base,
                        None,
                    );
                    scenario.concurrency = connections;
                    scenario.stop = Stop::Duration(duration);
                    scenario.mock = None;
                    scenario.scrape_metrics = false;
                    let report = self.run(&scenario).await?;
                    let (p50_ms, p99_ms) = report
                        .latency
                        .as_ref()
                        .map_or((f64::NAN, f64::NAN), |l| (l.p50_ms, l.p99_ms));
                    LoadRound {
                        throughput_rps: report.throughput_rps,
                        p50_ms,
                        p99_ms,
                        requests: report.ok,
                        errors: report.errors,
                        cpu_us_per_request: None,
                        upstream_calls_per_request: None,
                    }
                };
                let served = measured.requests.max(1) as f64;
                if let (Some(before), Some(after)) =
                    (cpu_before, target.pid.and_then(probe::cpu_time))
                {
                    measured.cpu_us_per_request =
                        Some((after - before).as_secs_f64() * 1e6 / served);
                }
                if let (Some(before), Ok(after)) = (
                    calls_before,
                    probe::mock_calls(&self.probe, &self.mock.ready).await,
                ) {
                    measured.upstream_calls_per_request =
                        Some(after.saturating_sub(before) as f64 / served);
                }
                runs.entry(target.name).or_default().push(measured);
            }
        }

        let ratio = |pick: fn(&LoadRound) -> Option<f64>| {
            let ratios: Vec<f64> = runs[CORRAL]
                .iter()
                .zip(&runs[BASELINE])
                .filter_map(|(c, b)| Some(pick(c)? / pick(b)?))
                .collect();
            (!ratios.is_empty()).then(|| wrk::median(ratios))
        };
        let median = |name: &str, pick: fn(&LoadRound) -> Option<f64>| {
            let values: Vec<f64> = runs[name].iter().filter_map(pick).collect();
            (!values.is_empty()).then(|| wrk::median(values))
        };
        let throughput = |r: &LoadRound| Some(r.throughput_rps);
        let cpu = |r: &LoadRound| r.cpu_us_per_request;
        if let Some(share) = ratio(throughput) {
            result.target(
                "miss throughput / baseline proxy",
                share,
                "ratio",
                &format!(">= {MISS_THROUGHPUT_MIN}"),
                share >= MISS_THROUGHPUT_MIN,
            );
        }
        if let Some(cpu_us) = median(CORRAL, cpu) {
            result.target(
                "corral CPU per miss",
                cpu_us,
                "µs",
                &format!("<= {MISS_CPU_US_MAX} µs"),
                cpu_us <= MISS_CPU_US_MAX,
            );
        }
        let figures: [(&str, Option<f64>, &str); 7] = [
            ("CPU per miss / baseline proxy", ratio(cpu), "ratio"),
            (
                "p99 at load / baseline proxy",
                ratio(|r| Some(r.p99_ms)),
                "ratio",
            ),
            (
                "corral miss throughput",
                median(CORRAL, throughput),
                "req/s",
            ),
            (
                "baseline proxy throughput",
                median(BASELINE, throughput),
                "req/s",
            ),
            (
                "baseline proxy CPU per request",
                median(BASELINE, cpu),
                "µs",
            ),
            (
                "corral upstream calls per request at load",
                median(CORRAL, |r| r.upstream_calls_per_request),
                "ratio",
            ),
            (
                "baseline upstream calls per request at load",
                median(BASELINE, |r| r.upstream_calls_per_request),
                "ratio",
            ),
        ];
        for (name, value, unit) in figures {
            if let Some(value) = value {
                result.figure(name, value, unit);
            }
        }
        let errors: u64 = runs.values().flatten().map(|r| r.errors).sum();
        if errors > 0 {
            result.note = Some(format!(
                "{errors} errors at load (non-2xx, timeouts, resets)"
            ));
        }
        let generator = if use_wrk {
            format!(
                "wrk -t{threads} -c{connections}, every body unique (a Lua request hook), \
                 {rounds} alternating rounds of {}s",
                duration.as_secs()
            )
        } else {
            format!(
                "corral-bench's own load tool ({connections} connections, closed loop, \
                 distinct bodies), {rounds} alternating rounds of {}s; install wrk for the \
                 figures #41 is held to",
                duration.as_secs()
            )
        };
        result
            .extra
            .insert("load_generator".into(), json!(generator));
        result
            .extra
            .insert("load_runs".into(), serde_json::to_value(&runs)?);
        Ok(())
    }

    /// Sequential distinct requests at one connection, direct to the mock
    /// and through each server: their latency (or, `stream`ed, the time to
    /// the first event) and the hop each server adds.
    async fn miss_at_one_connection(
        &self,
        result: &mut ScenarioResult,
        targets: &[Target; 2],
        stream: bool,
    ) -> anyhow::Result<()> {
        // The mock paces a stream's chunks (a third of a second a stream),
        // so streams are fewer; the first event is what is measured.
        let (kind, requests, warmup) = if stream {
            ("streamed first event", self.scaled(60, 10), 2)
        } else {
            ("latency", self.scaled(2000, 50), 20)
        };
        let direct = Target {
            name: "direct",
            base: self.mock.ready.clone(),
            pid: self.mock.pid(),
        };
        let mut summaries: BTreeMap<&str, Summary> = BTreeMap::new();
        for target in std::iter::once(&direct).chain(targets) {
            let mut scenario = self.distinct_scenario(
                &format!("miss, 1 connection, {kind}: {}", target.name),
                &target.base,
                target.pid,
            );
            scenario.stream = stream;
            scenario.concurrency = 1;
            scenario.warmup = warmup;
            scenario.stop = Stop::Requests(requests);
            scenario.scrape_metrics = false;
            let report: LoadReport = self.run(&scenario).await?;
            let summary = if stream {
                report.first_byte
            } else {
                report.latency
            }
            .with_context(|| format!("{}: no successful response", scenario.name))?;
            summaries.insert(target.name, summary);
            result.runs.push(report);
        }
        let direct = &summaries["direct"];
        for (label, pick) in [
            ("p50", (|s: &Summary| s.p50_ms) as fn(&Summary) -> f64),
            ("p99", |s: &Summary| s.p99_ms),
        ] {
            let (c, b, d) = (
                pick(&summaries[CORRAL]),
                pick(&summaries[BASELINE]),
                pick(direct),
            );
            result.figure(&format!("1 connection {kind} {label}, corral"), c, "ms");
            result.figure(
                &format!("1 connection {kind} {label}, baseline proxy"),
                b,
                "ms",
            );
            result.figure(&format!("1 connection {kind} {label}, direct"), d, "ms");
            result.figure(
                &format!("1 connection {kind} {label} / baseline proxy"),
                c / b,
                "ratio",
            );
            result.figure(
                &format!("1 connection added {kind} {label}, corral"),
                c - d,
                "ms",
            );
            result.figure(
                &format!("1 connection added {kind} {label}, baseline proxy"),
                b - d,
                "ms",
            );
        }
        // What each server adds to the direct p50, corral's over the proxy's
        // (#41's bound). A proxy that added nothing measurable leaves no ratio.
        let p50 = |name: &str| summaries[name].p50_ms - direct.p50_ms;
        let (corral_adds, proxy_adds) = (p50(CORRAL), p50(BASELINE));
        if proxy_adds > 0.0 {
            let ratio = corral_adds / proxy_adds;
            result.target(
                &format!("1 connection added {kind} p50 / baseline proxy's"),
                ratio,
                "ratio",
                &format!("<= {ADDED_P50_RATIO_MAX}"),
                ratio <= ADDED_P50_RATIO_MAX,
            );
        }
        Ok(())
    }
}
