//! `corral-bench`: the load tool (`run`) and the benchmark suite (`suite`).
//! This file only parses arguments; the work is in the `corral_bench` library.

use std::{path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use corral_bench::{
    Mix, Scenario, Stop,
    suite::{self, SuiteOptions},
    workload::load_corpus,
};

#[derive(Debug, Parser)]
#[command(
    name = "corral-bench",
    version,
    about = "Load tool and benchmark suite for corral"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Drive one OpenAI-compatible base URL (or several, round-robin) with one scenario.
    Run(RunArgs),
    /// Start the mock, corral, a baseline (and Redis, peers) and run every scenario.
    Suite(SuiteArgs),
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Base URL, e.g. http://127.0.0.1:8080/v1; repeat to spread clients over instances.
    #[arg(long = "url", required = true)]
    urls: Vec<String>,
    /// The mock provider's base URL: its `/__mock/calls` counts upstream calls.
    #[arg(long)]
    mock: Option<String>,
    /// Connections (virtual clients).
    #[arg(long, short = 'c', default_value_t = 64)]
    concurrency: usize,
    /// Total requests (default 10000 unless --duration is given).
    #[arg(long, short = 'n', conflicts_with = "duration")]
    requests: Option<u64>,
    /// Run for this long instead, e.g. `10s`.
    #[arg(long, short = 'd')]
    duration: Option<humantime::Duration>,
    /// Fixed arrival rate in requests per second (open loop).
    #[arg(long)]
    rate: Option<f64>,
    /// identical[:N], distinct, or zipf[:S] over the corpus.
    #[arg(long, default_value = "identical")]
    mix: Mix,
    /// Ask for SSE streams (`"stream": true`).
    #[arg(long)]
    stream: bool,
    /// Requests per target before the clock starts.
    #[arg(long, default_value_t = 0)]
    warmup: u64,
    #[arg(long, default_value = "prompts/corpus.jsonl")]
    corpus: PathBuf,
    /// Bearer token sent with every request (empty: none).
    #[arg(long, default_value = "sk-bench")]
    bearer: String,
    /// Bound on one request.
    #[arg(long, default_value = "60s")]
    timeout: humantime::Duration,
    /// Hard bound on the measured phase.
    #[arg(long, default_value = "5m")]
    max_duration: humantime::Duration,
    /// Text added to every body (default: random, so the run starts cold).
    #[arg(long)]
    nonce: Option<String>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Do not scrape the targets' `/metrics`.
    #[arg(long)]
    no_metrics: bool,
    /// A server process whose CPU time and RSS to report.
    #[arg(long)]
    pid: Option<u32>,
    #[arg(long, default_value = "run")]
    name: String,
    /// Write the JSON report here (`-` for stdout, after the table).
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct SuiteArgs {
    /// Where corral, mock-upstream and bench-baseline are.
    #[arg(long, default_value = "target/release")]
    bin_dir: PathBuf,
    #[arg(long, default_value = "crates/corral-bench/results")]
    out: PathBuf,
    #[arg(long, default_value = "prompts/corpus.jsonl")]
    corpus: PathBuf,
    #[arg(long, default_value = "config.yaml")]
    config: PathBuf,
    #[arg(long, default_value = "target/criterion")]
    criterion_dir: PathBuf,
    /// Run only these scenarios (comma-separated): hit, miss, stampede,
    /// stampede-redis, stream, zipf, flood, memory, fingerprint, peer-litellm.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Small counts and short runs (checks the suite, gives no figures).
    #[arg(long)]
    quick: bool,
    /// Also run a peer gateway (litellm).
    #[arg(long = "peer")]
    peers: Vec<String>,
    #[arg(long, default_value = "crates/corral-bench/.venv-litellm/bin/litellm")]
    litellm: PathBuf,
    #[arg(long, default_value = "redis-server")]
    redis_server: String,
    /// Concurrent callers of the peer stampede.
    #[arg(long, default_value_t = 1000)]
    peer_stampede: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Run(args) => run(args).await,
        Command::Suite(args) => {
            let report = suite::run(SuiteOptions {
                bin_dir: args.bin_dir,
                out_dir: args.out,
                corpus: args.corpus,
                corral_config: args.config,
                criterion_dir: args.criterion_dir,
                only: args.only,
                quick: args.quick,
                peers: args.peers,
                litellm: args.litellm,
                redis_server: args.redis_server,
                peer_stampede: args.peer_stampede,
            })
            .await?;
            println!("{}", suite::markdown(&report));
            anyhow::ensure!(!report.failed(), "a scenario failed (see the report)");
            Ok(())
        }
    }
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let corpus = Arc::new(load_corpus(&args.corpus)?);
    let mut scenario = Scenario::new(&args.name, args.urls, corpus);
    scenario.mock = args.mock;
    scenario.scrape_metrics = !args.no_metrics;
    scenario.mix = args.mix;
    scenario.stream = args.stream;
    scenario.concurrency = args.concurrency;
    scenario.stop = match (args.requests, args.duration) {
        (_, Some(duration)) => Stop::Duration(duration.into()),
        (Some(n), None) => Stop::Requests(n),
        (None, None) => Stop::Requests(10_000),
    };
    scenario.rate = args.rate;
    scenario.warmup = args.warmup;
    scenario.bearer = (!args.bearer.is_empty()).then_some(args.bearer);
    scenario.timeout = args.timeout.into();
    scenario.max_duration = Duration::from(args.max_duration);
    if let Some(nonce) = args.nonce {
        scenario.nonce = nonce;
    }
    scenario.seed = args.seed;
    scenario.watch_pid = args.pid;
    let report = corral_bench::run(&scenario).await?;
    print!("{}", report.table());
    if let Some(path) = args.json {
        let json = serde_json::to_string_pretty(&report)?;
        if path.as_os_str() == "-" {
            println!("{json}");
        } else {
            std::fs::write(&path, json).with_context(|| format!("writing {}", path.display()))?;
        }
    }
    Ok(())
}
