//! The `corral` binary: CLI -> config -> tracing -> AppState -> serve.

use std::{path::PathBuf, process::ExitCode, sync::Arc};

use anyhow::Context;
use clap::Parser;
use corral::{AppState, Config, config::EMBEDDED_DEFAULT};

/// jemalloc, tuned to give memory back: corral's memory comes in bursts (a
/// stampede's connections, live streams' logs, a flood's cache churn), and
/// glibc's malloc kept what a burst took (RSS stayed ~400 MiB above its level
/// after 20 streams of 8 MB ended, and a flood of small answers cost 1.7× the
/// cache budget in fragmented arenas). jemalloc's background threads purge
/// freed pages once they have been unused for `dirty_decay_ms`, without any
/// request paying for it; muzzy pages are returned at once. Measured in
/// BENCHMARKS.md ("Memory that follows the bytes held") against glibc; the
/// hit path's throughput did not change (mimalloc was tried before and cost
/// the miss path its tail). The binary sets it, not the library: an embedder
/// chooses its own allocator. Its options are built in (`.cargo/config.toml`,
/// `JEMALLOC_SYS_WITH_MALLOC_CONF`: background purging, `dirty_decay_ms:1000`,
/// `muzzy_decay_ms:0`); `_RJEM_MALLOC_CONF` at run time overrides them.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    version,
    about = "An OpenAI-compatible gateway that turns N identical LLM requests into one upstream call"
)]
struct Cli {
    /// YAML config file; when it does not exist, the embedded defaults are used.
    #[arg(long, default_value = "config.yaml")]
    config: PathBuf,
    /// Ask the gateway at the configured `listen` address for `/healthz` and
    /// exit 0 when it answers 200 (the container health check).
    #[arg(long)]
    healthcheck: bool,
}

/// A startup error is one line on stderr (`corral: what: why`) and exit code
/// 1: no backtrace, no `Debug` dump.
#[tokio::main]
async fn main() -> ExitCode {
    match run(Cli::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("corral: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let yaml = match std::fs::read_to_string(&cli.config) {
        Ok(yaml) => yaml,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => EMBEDDED_DEFAULT.to_owned(),
        Err(err) => return Err(err).with_context(|| format!("reading {}", cli.config.display())),
    };
    let config = Config::load_from_process_env(&yaml)
        .with_context(|| format!("invalid configuration in {}", cli.config.display()))?;
    if cli.healthcheck {
        return healthcheck(config.listen).await;
    }
    // Held until run returns: queued log lines are written on the way out.
    let _log = corral::telemetry::init(config.log.format);
    for variable in &config.ignored_env {
        tracing::warn!("ignoring environment variable {variable}: it names no corral setting");
    }
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    let address = listener.local_addr()?;
    let state = Arc::new(AppState::build(config)?);
    tracing::info!(%address, "corral listening");
    println!("corral listening on http://{address}");
    corral::serve(listener, state, shutdown_signal()).await?;
    Ok(())
}

async fn healthcheck(listen: std::net::SocketAddr) -> anyhow::Result<()> {
    let host = if listen.ip().is_unspecified() {
        std::net::SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), listen.port())
    } else {
        listen
    };
    let response = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(2))
        .build()?
        .get(format!("http://{host}/healthz"))
        .send()
        .await?;
    anyhow::ensure!(
        response.status().is_success(),
        "healthz answered {}",
        response.status()
    );
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing the SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
