//! The load driver: opens every connection, warms up, releases all virtual
//! clients at once, and turns their samples into a [`LoadReport`].
//!
//! Two arrival models. Closed loop (no rate): each client sends its next
//! request when the previous one is answered, so `concurrency` requests are in
//! flight and throughput is what the server sustains. Open loop (`rate`):
//! request `n` is due at `start + n / rate` whatever happened before; a client
//! that is late sends at once, and the report shows both the latency from the
//! actual send and from the schedule (the latter free of coordinated
//! omission), plus how late sends were.
//!
//! Every loop is bounded: by the request count or the duration, and always by
//! `max_duration` and each request's `timeout`.

use std::{
    collections::{BTreeMap, HashSet},
    sync::{
        Arc, OnceLock,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};
use futures::{StreamExt as _, TryStreamExt as _};
use rand::{SeedableRng as _, rngs::StdRng};
use tokio::sync::Barrier;

use super::{
    http::{CacheLabel, Conn, Failure, Outcome, Target},
    probe::{self, MetricsDelta},
    report::{CacheBreakdown, LoadReport, ServerUsage, Summary, histogram},
    workload::{Mix, Prompt, Workload},
};

/// When a run ends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Stop {
    /// After this many requests in all.
    Requests(u64),
    /// After this long (open loop: `rate × duration` requests).
    Duration(Duration),
}

/// Everything one run needs.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: String,
    /// OpenAI-compatible base URLs (`http://host:port/v1`); clients are spread
    /// over them round-robin.
    pub targets: Vec<String>,
    /// The mock provider's base URL, to count upstream calls.
    pub mock: Option<String>,
    /// Scrape each target's `/metrics` before and after (absent: no metrics).
    pub scrape_metrics: bool,
    pub corpus: Arc<Vec<Prompt>>,
    pub mix: Mix,
    pub stream: bool,
    /// Connections, one virtual client each.
    pub concurrency: usize,
    pub stop: Stop,
    /// Fixed arrival rate in requests per second (open loop).
    pub rate: Option<f64>,
    /// Requests sent on each target before the clock starts (not counted).
    pub warmup: u64,
    /// Sent as `Authorization: Bearer …`.
    pub bearer: Option<String>,
    /// Bound on one request, first byte to last.
    pub timeout: Duration,
    /// Hard bound on the measured phase.
    pub max_duration: Duration,
    /// Made part of every body, so a run starts cold and never shares keys
    /// with another run.
    pub nonce: String,
    pub seed: u64,
    /// Connections opened at once while setting up.
    pub connect_parallelism: usize,
    /// A server process whose CPU time and memory to report.
    pub watch_pid: Option<u32>,
}

impl Scenario {
    /// A closed-loop run of 1,000 identical requests over 8 connections.
    pub fn new(name: &str, targets: Vec<String>, corpus: Arc<Vec<Prompt>>) -> Self {
        Self {
            name: name.to_owned(),
            targets,
            mock: None,
            scrape_metrics: true,
            corpus,
            mix: Mix::Identical { index: 0 },
            stream: false,
            concurrency: 8,
            stop: Stop::Requests(1000),
            rate: None,
            warmup: 0,
            bearer: Some("sk-bench".to_owned()),
            timeout: Duration::from_secs(60),
            max_duration: Duration::from_secs(300),
            nonce: format!("{:016x}", rand::random::<u64>()),
            seed: 1,
            connect_parallelism: 64,
            watch_pid: None,
        }
    }
}

struct Sample {
    result: Result<Outcome, Failure>,
    /// Open loop: how late the send was against its schedule.
    lag: Option<Duration>,
    done: Instant,
}

struct Shared {
    workload: Workload,
    scenario: Scenario,
    paths: Vec<String>,
    next: AtomicU64,
    sent: AtomicU64,
    barrier: Barrier,
    start: OnceLock<Instant>,
}

/// Runs `scenario` and reports it.
pub async fn run(scenario: &Scenario) -> anyhow::Result<LoadReport> {
    ensure!(scenario.concurrency >= 1, "concurrency must be at least 1");
    ensure!(!scenario.targets.is_empty(), "no target");
    if let Stop::Requests(n) = scenario.stop {
        ensure!(n >= 1, "a run needs at least one request");
    }
    if let Some(rate) = scenario.rate {
        ensure!(rate > 0.0 && rate.is_finite(), "the rate must be > 0");
    }
    let workload = Workload::new(
        &scenario.corpus,
        scenario.mix,
        scenario.stream,
        &scenario.nonce,
    )?;
    let mut targets = Vec::new();
    for url in &scenario.targets {
        targets.push(Target::resolve(url).await?);
    }

    let opened: Vec<Conn> = futures::stream::iter(0..scenario.concurrency)
        .map(|i| {
            let target = &targets[i % targets.len()];
            Conn::open(target, scenario.bearer.as_deref())
        })
        .buffered(scenario.connect_parallelism.max(1))
        .try_collect()
        .await
        .with_context(|| {
            format!(
                "opening {} connections (is `ulimit -n` high enough?)",
                scenario.concurrency
            )
        })?;
    let mut conns = opened;

    let mut rng = StdRng::seed_from_u64(scenario.seed);
    for (t, target) in targets.iter().enumerate() {
        for i in 0..scenario.warmup {
            let request = workload.request(u64::MAX - i, &mut rng);
            let path = format!("{}{}", target.base_path, request.path);
            if let Err(failure) = conns[t]
                .post(&path, request.body, scenario.stream, scenario.timeout)
                .await
            {
                bail!(
                    "warm-up request to {} failed: {}",
                    target.base_url,
                    failure.label()
                );
            }
        }
    }

    let client = probe::client();
    let calls_before = match &scenario.mock {
        Some(mock) => Some(probe::mock_calls(&client, mock).await?),
        None => None,
    };
    let scrapes_before = scrape_all(&client, &targets, scenario.scrape_metrics).await;
    let rss_before = scenario.watch_pid.and_then(probe::rss_bytes);
    let cpu_before = scenario.watch_pid.and_then(probe::cpu_time);
    let sampling = Arc::new(AtomicBool::new(true));
    let rss_peak = scenario
        .watch_pid
        .map(|pid| tokio::spawn(sample_rss(pid, sampling.clone())));

    let paths = targets.iter().map(|t| t.base_path.clone()).collect();
    let shared = Arc::new(Shared {
        workload,
        scenario: scenario.clone(),
        paths,
        next: AtomicU64::new(0),
        sent: AtomicU64::new(0),
        barrier: Barrier::new(scenario.concurrency + 1),
        start: OnceLock::new(),
    });
    let workers: Vec<_> = conns
        .drain(..)
        .enumerate()
        .map(|(id, conn)| tokio::spawn(worker(id, conn, shared.clone())))
        .collect();
    let start = Instant::now();
    shared.start.set(start).expect("the start is set once");
    shared.barrier.wait().await;

    let mut samples = Vec::new();
    let mut reconnects = 0;
    for worker in workers {
        let (mine, conn_reconnects) = worker.await.context("a client task panicked")?;
        samples.extend(mine);
        reconnects += conn_reconnects;
    }
    let end = samples
        .iter()
        .map(|s| s.done)
        .max()
        .unwrap_or_else(Instant::now);
    let cpu_after = scenario.watch_pid.and_then(probe::cpu_time);
    sampling.store(false, Ordering::Relaxed);
    let rss_peak = match rss_peak {
        Some(task) => task.await.ok().flatten(),
        None => None,
    };

    let calls_after = match &scenario.mock {
        Some(mock) => Some(probe::mock_calls(&client, mock).await?),
        None => None,
    };
    let scrapes_after = scrape_all(&client, &targets, scenario.scrape_metrics).await;

    let elapsed = end.saturating_duration_since(start);
    let mut report = summarize(scenario, &samples, elapsed);
    report.reconnects = reconnects;
    report.unsent = match scenario.stop {
        Stop::Requests(n) => n.saturating_sub(shared.sent.load(Ordering::Relaxed)),
        Stop::Duration(_) => 0,
    };
    if let (Some(before), Some(after)) = (calls_before, calls_after) {
        let calls = after.saturating_sub(before);
        report.upstream_calls = Some(calls);
        if report.ok > 0 {
            report.dedup_ratio = Some(1.0 - calls as f64 / report.ok as f64);
        }
        if calls > 0 {
            report.requests_per_upstream_call = Some(report.ok as f64 / calls as f64);
        }
    }
    if let (Some(before), Some(after)) = (scrapes_before, scrapes_after) {
        let delta = MetricsDelta::between(&before, &after);
        if report.requests > 0 {
            report.saved_usd_per_1000_requests =
                Some(delta.saved_usd / report.requests as f64 * 1000.0);
        }
        report.metrics = Some(delta);
    }
    if let (Some(pid), Some(before), Some(after)) = (scenario.watch_pid, cpu_before, cpu_after) {
        let cpu = after.saturating_sub(before);
        report.server = Some(ServerUsage {
            pid,
            cpu_ms: cpu.as_secs_f64() * 1000.0,
            cpu_us_per_request: if report.requests > 0 {
                cpu.as_secs_f64() * 1e6 / report.requests as f64
            } else {
                0.0
            },
            rss_before_bytes: rss_before.unwrap_or(0),
            rss_peak_bytes: rss_peak.unwrap_or(0).max(rss_before.unwrap_or(0)),
        });
    }
    Ok(report)
}

async fn worker(id: usize, mut conn: Conn, shared: Arc<Shared>) -> (Vec<Sample>, u64) {
    shared.barrier.wait().await;
    let scenario = &shared.scenario;
    let start = *shared.start.get().expect("set before the barrier opens");
    let hard_end = start + scenario.max_duration;
    let soft_end = match scenario.stop {
        Stop::Duration(duration) => Some(start + duration),
        Stop::Requests(_) => None,
    };
    let total = match (scenario.stop, scenario.rate) {
        (Stop::Requests(n), _) => Some(n),
        (Stop::Duration(duration), Some(rate)) => Some((duration.as_secs_f64() * rate) as u64),
        (Stop::Duration(_), None) => None,
    };
    let base_path = &shared.paths[id % shared.paths.len()];
    let mut rng = StdRng::seed_from_u64(scenario.seed.wrapping_add(id as u64 + 1));
    let mut samples = Vec::new();
    loop {
        let now = Instant::now();
        if now >= hard_end || soft_end.is_some_and(|end| now >= end && scenario.rate.is_none()) {
            break;
        }
        let seq = shared.next.fetch_add(1, Ordering::Relaxed);
        if total.is_some_and(|total| seq >= total) {
            break;
        }
        let scheduled = scenario
            .rate
            .map(|rate| start + Duration::from_secs_f64(seq as f64 / rate));
        if let Some(at) = scheduled {
            if at >= hard_end {
                break;
            }
            tokio::time::sleep_until(at.into()).await;
        }
        let request = shared.workload.request(seq, &mut rng);
        let path = format!("{base_path}{}", request.path);
        shared.sent.fetch_add(1, Ordering::Relaxed);
        let sent = Instant::now();
        let result = conn
            .post(&path, request.body, scenario.stream, scenario.timeout)
            .await;
        samples.push(Sample {
            result,
            lag: scheduled.map(|at| sent.saturating_duration_since(at)),
            done: Instant::now(),
        });
    }
    (samples, conn.reconnects)
}

async fn scrape_all(
    client: &reqwest::Client,
    targets: &[Target],
    enabled: bool,
) -> Option<Vec<probe::Scrape>> {
    if !enabled {
        return None;
    }
    let mut origins: Vec<&str> = targets.iter().map(|t| t.origin.as_str()).collect();
    origins.dedup();
    let mut scrapes = Vec::new();
    for origin in origins {
        scrapes.push(probe::scrape(client, origin).await?);
    }
    Some(scrapes)
}

/// The highest RSS seen every 10 ms until `running` turns false.
async fn sample_rss(pid: u32, running: Arc<AtomicBool>) -> Option<u64> {
    let mut peak = None;
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    while running.load(Ordering::Relaxed) {
        tick.tick().await;
        if let Some(rss) = probe::rss_bytes(pid) {
            peak = Some(peak.unwrap_or(0).max(rss));
        }
    }
    peak
}

fn summarize(scenario: &Scenario, samples: &[Sample], elapsed: Duration) -> LoadReport {
    let us = |d: Duration| (d.as_micros() as u64).max(1);
    let mut latency = histogram();
    let mut first_byte = histogram();
    let mut lag = histogram();
    let mut corrected = histogram();
    let mut by_cache: BTreeMap<
        CacheLabel,
        (hdrhistogram::Histogram<u64>, hdrhistogram::Histogram<u64>),
    > = BTreeMap::new();
    let mut errors_by_kind: BTreeMap<String, u64> = BTreeMap::new();
    let mut bodies = HashSet::new();
    let mut ok = 0;
    for sample in samples {
        if let Some(late) = sample.lag {
            let _ = lag.record(us(late));
        }
        match &sample.result {
            Ok(outcome) => {
                ok += 1;
                bodies.insert(outcome.body_hash);
                let _ = latency.record(us(outcome.total));
                let _ = first_byte.record(us(outcome.first_byte));
                if let Some(late) = sample.lag {
                    let _ = corrected.record(us(outcome.total + late));
                }
                let (l, f) = by_cache
                    .entry(outcome.cache)
                    .or_insert_with(|| (histogram(), histogram()));
                let _ = l.record(us(outcome.total));
                let _ = f.record(us(outcome.first_byte));
            }
            Err(failure) => *errors_by_kind.entry(failure.label()).or_default() += 1,
        }
    }
    let requests = samples.len() as u64;
    let open_loop = scenario.rate.is_some();
    LoadReport {
        name: scenario.name.clone(),
        targets: scenario.targets.clone(),
        mix: scenario.mix.to_string(),
        stream: scenario.stream,
        concurrency: scenario.concurrency,
        rate_per_s: scenario.rate,
        requests,
        ok,
        errors: requests - ok,
        errors_by_kind,
        unsent: 0,
        elapsed_s: elapsed.as_secs_f64(),
        throughput_rps: if elapsed.is_zero() {
            0.0
        } else {
            ok as f64 / elapsed.as_secs_f64()
        },
        latency: Summary::of(&latency),
        first_byte: Summary::of(&first_byte),
        schedule_lag: if open_loop { Summary::of(&lag) } else { None },
        corrected_latency: if open_loop {
            Summary::of(&corrected)
        } else {
            None
        },
        by_cache: by_cache
            .into_iter()
            .filter_map(|(label, (l, f))| {
                Some((
                    label.as_str().to_owned(),
                    CacheBreakdown {
                        count: l.len(),
                        latency: Summary::of(&l)?,
                        first_byte: Summary::of(&f)?,
                    },
                ))
            })
            .collect(),
        distinct_bodies: bodies.len() as u64,
        upstream_calls: None,
        dedup_ratio: None,
        requests_per_upstream_call: None,
        metrics: None,
        saved_usd_per_1000_requests: None,
        server: None,
        reconnects: 0,
    }
}
