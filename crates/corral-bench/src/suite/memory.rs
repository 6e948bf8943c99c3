//! The memory scenarios, each against fresh corral processes (a process that
//! served earlier scenarios reuses memory it freed, and would flatter every
//! figure):
//!
//! - `memory`: what a live stream costs per byte it holds (20 streams of
//!   8 MB, all live at once: the mock pads them and holds each before its
//!   final event), whether RSS comes back after a burst (those streams, and
//!   2,000 coalesced callers; read 10 s after each burst ends), and what RSS
//!   a distinct-key flood of small answers reaches with the shipped
//!   `cache.max_bytes` (256 MiB).
//! - `flood`: the same flood at a 16 MiB budget, quicker; its target bounds
//!   RSS growth, since at that budget the idle process is as large as the cache.
//!
//! Every RSS target is the (#25, item 7): RSS per live stream byte
//! at most 1.5, RSS after a burst within 32 MiB of before, and under a flood
//! at most 1.25 × `cache.max_bytes` + 32 MiB.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, ensure};
use serde_json::{Value, json};

use corral::fingerprint::Endpoint;

use super::{Bench, STAMPEDE_LATENCY, ScenarioResult, ensure_files, start_corral};
use crate::{load::Stop, probe, process::Service, report::LoadReport, workload::Mix};

/// `cache.max_bytes` of the `flood` scenario's corral.
const FLOOD_BUDGET_BYTES: u64 = 16 * 1024 * 1024;
/// The shipped `cache.max_bytes` (config.yaml), which `memory` floods.
const SHIPPED_BUDGET_BYTES: u64 = 256 * 1024 * 1024;
/// What RSS may reach under a flood: this share of the cache budget...
const FLOOD_RSS_BUDGET_SHARE: f64 = 1.25;
/// ...plus this much for the process itself, connections and buffers.
const RSS_ALLOWANCE_BYTES: u64 = 32 * 1024 * 1024;
/// How far RSS may stay above its level before a burst, once it settled.
const SETTLED_ALLOWANCE_BYTES: u64 = 32 * 1024 * 1024;
/// RSS per live stream byte the streams may cost.
const MAX_RSS_PER_STREAM_BYTE: f64 = 1.5;
/// How long after a burst RSS is read (the 10 s).
const SETTLE: Duration = Duration::from_secs(10);
/// Bound on waiting for every stream to be live and in corral's logs.
const LIVE_DEADLINE: Duration = Duration::from_secs(120);

const MIB: f64 = 1024.0 * 1024.0;

/// What one flood measured.
struct Flood {
    report: LoadReport,
    budget: u64,
    stats: Value,
    rss_idle: Option<u64>,
    rss_end: Option<u64>,
}

impl Bench {
    /// Streams, bursts and the flood at the shipped budget (see the module doc).
    pub(super) async fn memory(&mut self) -> anyhow::Result<ScenarioResult> {
        let mut result = ScenarioResult::new("memory");
        let settle = if self.options.quick {
            Duration::from_secs(2)
        } else {
            SETTLE
        };
        let outcome = async {
            self.live_streams(&mut result, settle).await?;
            self.caller_burst(&mut result, settle).await?;
            let flood = self
                .flood_run(
                    "corral-memory-flood",
                    self.scaled(SHIPPED_BUDGET_BYTES, FLOOD_BUDGET_BYTES),
                    self.scaled(400_000, 5_000),
                )
                .await?;
            flood_figures(&mut result, &flood, RssBound::Absolute);
            result.runs.push(flood.report);
            anyhow::Ok(())
        }
        .await;
        // Whatever happened, the mock goes back to plain streams for the next scenario.
        let _ = probe::mock_control(&self.probe, &self.mock.ready, "reset", None).await;
        outcome?;
        result
            .extra
            .insert("settle_s".into(), json!(settle.as_secs_f64()));
        Ok(result)
    }

    /// 20 distinct streams of 8 MB, all live at once in a fresh corral: RSS
    /// growth per stream byte held, and RSS `settle` after they all ended.
    async fn live_streams(
        &mut self,
        result: &mut ScenarioResult,
        settle: Duration,
    ) -> anyhow::Result<()> {
        let streams = self.scaled(20, 4) as usize;
        let stream_bytes = self.scaled(8_000_000, 1_000_000);
        let fresh = self.fresh_corral("corral-memory-streams").await?;
        let outcome = async {
            let pid = fresh.pid().context("the fresh corral has no pid")?;
            let before = probe::rss_bytes(pid).context("reading corral's RSS")?;
            let mock = &self.mock.ready;
            probe::mock_control(
                &self.probe,
                mock,
                "stream_padding",
                Some(json!({"bytes": stream_bytes})),
            )
            .await?;
            probe::mock_control(
                &self.probe,
                mock,
                "stream_ends",
                Some(json!({"held": true})),
            )
            .await?;

            // Distinct chat streams (the mock pads chat), so each is a flight and a log of its own.
            let chat: Vec<_> = self
                .corpus
                .iter()
                .filter(|prompt| prompt.endpoint == Endpoint::ChatCompletions)
                .cloned()
                .collect();
            let mut scenario = self.scenario(
                &format!("memory: {streams} live streams of {stream_bytes} bytes"),
                vec![format!("{}/v1", fresh.ready)],
            );
            scenario.corpus = Arc::new(chat);
            scenario.nonce = format!("memory-{:08x}", rand::random::<u32>());
            scenario.mix = Mix::Distinct;
            scenario.stream = true;
            scenario.concurrency = streams;
            scenario.stop = Stop::Requests(streams as u64);
            scenario.timeout = LIVE_DEADLINE + Duration::from_secs(60);
            scenario.max_duration = LIVE_DEADLINE + Duration::from_secs(120);
            scenario.watch_pid = Some(pid);
            let run = tokio::spawn(async move { crate::load::run(&scenario).await });

            let live = self.until_streams_live(&fresh, streams).await;
            let rss_live = probe::rss_bytes(pid);
            probe::mock_control(
                &self.probe,
                mock,
                "stream_ends",
                Some(json!({"held": false})),
            )
            .await?;
            let report = run.await.context("the stream run's task")??;
            eprintln!("{}", report.table());
            let (held, logged) = live?;
            ensure!(
                report.ok == streams as u64 && report.errors == 0,
                "{} of {streams} streams answered, {} errors ({:?})",
                report.ok,
                report.errors,
                report.errors_by_kind
            );
            let live = rss_live.context("reading corral's RSS")?;
            tokio::time::sleep(settle).await;
            let after = probe::rss_bytes(pid).context("reading corral's RSS")?;
            let stats = self.stats(&fresh).await?;

            let grown = live.saturating_sub(before) as f64;
            let per_byte = grown / held.max(1) as f64;
            result.figure("live streams", streams as f64, "streams");
            result.figure("live stream bytes", held as f64 / MIB, "MiB");
            result.figure(
                "stream log bytes / live stream bytes",
                logged as f64 / held.max(1) as f64,
                "ratio",
            );
            result.figure("RSS before the streams", before as f64 / MIB, "MiB");
            result.figure("RSS growth with every stream live", grown / MIB, "MiB");
            result.target(
                "RSS growth per live stream byte",
                per_byte,
                "ratio",
                &format!("<= {MAX_RSS_PER_STREAM_BYTE}"),
                per_byte <= MAX_RSS_PER_STREAM_BYTE,
            );
            settled_target(result, "RSS after the stream burst - before", before, after);
            result.figure(
                "cache bytes after the stream burst (assembled answers)",
                stats["cache_bytes"].as_f64().unwrap_or_default() / MIB,
                "MiB",
            );
            result.runs.push(report);
            anyhow::Ok(())
        }
        .await;
        fresh.stop().await;
        outcome
    }

    /// Waits until `streams` streams wait at their end in the mock and
    /// corral's logs hold everything the mock sent them; returns the bytes the
    /// mock sent and the bytes corral's logs count.
    async fn until_streams_live(
        &self,
        corral: &Service,
        streams: usize,
    ) -> anyhow::Result<(u64, u64)> {
        let deadline = Instant::now() + LIVE_DEADLINE;
        let url = format!(
            "{}/__mock/stream_ends?wait_for={streams}&timeout_ms={}",
            probe::origin_of(&self.mock.ready),
            LIVE_DEADLINE.as_millis()
        );
        // A client of its own: the probe's timeout is shorter than this wait.
        let ends = probe::get_json(&reqwest::Client::new(), &url).await?;
        ensure!(
            ends["reached"] == true,
            "only {} of {streams} streams reached their end in the mock",
            ends["waiting"]
        );
        let held = ends["waiting_bytes"].as_u64().unwrap_or_default();
        // The mock has written every byte; corral is still reading the last
        // ones from its sockets. Its logs count at least as many bytes as the
        // mock sent (both views of an event, in a corral that keeps two) and
        // then stop growing.
        let mut last = 0;
        loop {
            let logged = self.stats(corral).await?["stream_log_bytes"]
                .as_u64()
                .unwrap_or_default();
            if logged >= held && logged == last {
                return Ok((held, logged));
            }
            ensure!(
                Instant::now() < deadline,
                "corral's logs hold {logged} of the {held} bytes the mock sent"
            );
            last = logged;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// 2,000 identical callers at once against a fresh corral (mock latency
    /// `STAMPEDE_LATENCY`): its RSS `settle` after they were all answered.
    async fn caller_burst(
        &mut self,
        result: &mut ScenarioResult,
        settle: Duration,
    ) -> anyhow::Result<()> {
        let callers = self.scaled(2_000, 200) as usize;
        ensure_files(callers)?;
        let fresh = self.fresh_corral("corral-memory-burst").await?;
        let outcome = async {
            let pid = fresh.pid().context("the fresh corral has no pid")?;
            let before = probe::rss_bytes(pid).context("reading corral's RSS")?;
            self.set_latency(STAMPEDE_LATENCY).await?;
            let mut scenario = self.stampede_scenario(
                &format!("memory: a burst of {callers} callers"),
                vec![format!("{}/v1", fresh.ready)],
                callers,
            );
            scenario.watch_pid = Some(pid);
            let report = self.run(&scenario).await;
            self.set_latency(Duration::ZERO).await?;
            let report = report?;
            ensure!(
                report.ok == callers as u64 && report.errors == 0,
                "{} of {callers} callers answered, {} errors",
                report.ok,
                report.errors
            );
            tokio::time::sleep(settle).await;
            let after = probe::rss_bytes(pid).context("reading corral's RSS")?;
            result.figure("burst callers", callers as f64, "callers");
            if let Some(server) = &report.server {
                result.figure(
                    "RSS growth during the caller burst (peak)",
                    server.rss_peak_bytes.saturating_sub(before) as f64 / MIB,
                    "MiB",
                );
            }
            settled_target(result, "RSS after the caller burst - before", before, after);
            result.runs.push(report);
            anyhow::Ok(())
        }
        .await;
        fresh.stop().await;
        outcome
    }

    /// A distinct-key flood against a fresh corral whose cache budget is
    /// `FLOOD_BUDGET_BYTES`.
    pub(super) async fn flood(&mut self) -> anyhow::Result<ScenarioResult> {
        let mut result = ScenarioResult::new("flood");
        let flood = self
            .flood_run(
                "corral-flood",
                FLOOD_BUDGET_BYTES,
                self.scaled(60_000, 5_000),
            )
            .await?;
        flood_figures(&mut result, &flood, RssBound::Growth);
        result.runs.push(flood.report);
        Ok(result)
    }

    /// `requests` distinct requests over 64 connections against a fresh
    /// corral with `cache.max_bytes` = `budget`.
    async fn flood_run(&mut self, name: &str, budget: u64, requests: u64) -> anyhow::Result<Flood> {
        self.set_latency(Duration::ZERO).await?;
        let max_bytes = budget.to_string();
        let fresh = start_corral(
            &self.options,
            &self.logs,
            name,
            &self.mock.ready,
            &[("CORRAL_CACHE__MAX_BYTES", &max_bytes)],
        )
        .await?;
        let rss_idle = fresh.pid().and_then(probe::rss_bytes);
        let mut scenario = self.scenario(
            &format!("{name}: {requests} distinct requests, cache.max_bytes {budget}"),
            vec![format!("{}/v1", fresh.ready)],
        );
        scenario.nonce = format!("flood-{:08x}", rand::random::<u32>());
        scenario.mix = Mix::Distinct;
        scenario.concurrency = 64;
        scenario.stop = Stop::Requests(requests);
        scenario.max_duration = Duration::from_secs(600);
        scenario.watch_pid = fresh.pid();
        let report = self.run(&scenario).await;
        let stats = self.stats(&fresh).await;
        let rss_end = fresh.pid().and_then(probe::rss_bytes);
        fresh.stop().await;
        Ok(Flood {
            report: report?,
            budget,
            stats: stats?,
            rss_idle,
            rss_end,
        })
    }

    async fn fresh_corral(&self, name: &str) -> anyhow::Result<Service> {
        start_corral(&self.options, &self.logs, name, &self.mock.ready, &[]).await
    }

    async fn stats(&self, corral: &Service) -> anyhow::Result<Value> {
        probe::get_json(&self.probe, &format!("{}/stats", corral.ready)).await
    }
}

/// `after - before` against the settled allowance.
fn settled_target(result: &mut ScenarioResult, name: &str, before: u64, after: u64) {
    let above = after.saturating_sub(before);
    result.target(
        name,
        above as f64 / MIB,
        "MiB",
        &format!("<= {} MiB", SETTLED_ALLOWANCE_BYTES >> 20),
        above <= SETTLED_ALLOWANCE_BYTES,
    );
}

/// What a flood's RSS target bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RssBound {
    /// RSS itself (the figure, at the shipped budget).
    Absolute,
    /// RSS growth over the idle process: at a small budget the process's own
    /// RSS and the request memo's fixed 16 MiB are as large as the cache.
    Growth,
}

/// The cache within its budget, and RSS within the budget's share plus the allowance.
fn flood_figures(result: &mut ScenarioResult, flood: &Flood, bound: RssBound) {
    let budget = flood.budget as f64;
    let cache_bytes = flood.stats["cache_bytes"].as_u64().unwrap_or_default();
    result.figure("flood requests", flood.report.ok as f64, "requests");
    result.figure("cache budget (cache.max_bytes)", budget / MIB, "MiB");
    result.target(
        "cache bytes / budget",
        cache_bytes as f64 / budget,
        "ratio",
        "<= 1",
        cache_bytes <= flood.budget,
    );
    result.figure(
        "cache entries",
        flood.stats["cache_entries"].as_f64().unwrap_or_default(),
        "entries",
    );
    if let Some(idle) = flood.rss_idle {
        result.figure("RSS before the flood", idle as f64 / MIB, "MiB");
    }
    if let Some(server) = &flood.report.server {
        let limit = FLOOD_RSS_BUDGET_SHARE * budget + RSS_ALLOWANCE_BYTES as f64;
        let target = format!(
            "<= {FLOOD_RSS_BUDGET_SHARE} x budget + {} MiB = {:.0} MiB",
            RSS_ALLOWANCE_BYTES >> 20,
            limit / MIB
        );
        let peak = server.rss_peak_bytes as f64;
        let grown = server
            .rss_peak_bytes
            .saturating_sub(flood.rss_idle.unwrap_or(server.rss_before_bytes))
            as f64;
        match bound {
            RssBound::Absolute => {
                result.target(
                    "RSS under the flood (peak)",
                    peak / MIB,
                    "MiB",
                    &target,
                    peak <= limit,
                );
                result.figure("RSS growth under the flood (peak)", grown / MIB, "MiB");
            }
            RssBound::Growth => {
                result.figure("RSS under the flood (peak)", peak / MIB, "MiB");
                result.target(
                    "RSS growth under the flood (peak)",
                    grown / MIB,
                    "MiB",
                    &target,
                    grown <= limit,
                );
            }
        }
        result.figure("RSS under the flood / budget", peak / budget, "ratio");
    }
    if let Some(end) = flood.rss_end {
        result.figure("RSS at the flood's end", end as f64 / MIB, "MiB");
    }
}
