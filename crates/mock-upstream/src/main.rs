//! `mock-upstream`: the shipped fake provider (OpenAI, Anthropic, Gemini, Azure OpenAI,
//! Bedrock and Vertex AI APIs, Entra's and Google's token endpoints included), for integration
//! tests, demos and load tests.
//!
//! It serves [`mock_upstream::MockProvider`] on a fixed address so that a gateway can be pointed
//! at it without an API key or a bill. Answers are deterministic per request, every billable
//! call is counted, and the `/__mock/*` routes (calls, reset, hold, release, failure, latency,
//! script, truncate, stream_padding, stream_ends, azure_keys, entra_client, token_lifetimes, tokens,
//! bedrock)
//! steer it while it runs. This file only wires: arguments, logging, bind,
//! one ready line on stdout, serve until ctrl-c or SIGTERM.

use std::io::Write as _;
use std::net::SocketAddr;

use anyhow::Context as _;
use clap::Parser;
use mock_upstream::{
    AwsCredentials, BEDROCK_DEFAULT_REGION, BEDROCK_TEST_ACCESS_KEY_ID, BEDROCK_TEST_API_KEY,
    BEDROCK_TEST_SECRET_ACCESS_KEY, BedrockSettings, EntraClient, FailureMode, MockProvider,
    MockSettings, service_account_json,
};
use tokio::net::TcpListener;
use tracing_subscriber::EnvFilter;

/// A fake OpenAI-, Anthropic-, Gemini-, Azure-OpenAI-, Bedrock- and Vertex-AI-compatible provider for
/// tests, demos and load tests.
#[derive(Debug, Parser)]
#[command(name = "mock-upstream", version)]
struct Args {
    /// Address to listen on; port 0 picks a free port (printed on the ready line).
    #[arg(long, default_value = "127.0.0.1:9090")]
    listen: SocketAddr,
    /// Delay added to every billable call, e.g. `250ms`.
    #[arg(long, default_value = "0ms")]
    latency: humantime::Duration,
    /// Pause between two SSE events of a streamed answer.
    #[arg(long, default_value = "20ms")]
    stream_chunk_delay: humantime::Duration,
    /// Silence before a streamed answer's first event (a model thinking), e.g. `100s`.
    #[arg(long, default_value = "0ms")]
    stream_first_event_delay: humantime::Duration,
    /// Make calls fail with this HTTP status.
    #[arg(long)]
    fail_status: Option<u16>,
    /// Share of calls that fail when `--fail-status` is set, between 0 and 1.
    #[arg(long, default_value_t = 1.0, requires = "fail_status")]
    fail_fraction: f64,
    /// `Retry-After` sent with failures, e.g. `2s`.
    #[arg(long, requires = "fail_status")]
    retry_after: Option<humantime::Duration>,
    /// `error.code` sent with failures, e.g. `insufficient_quota`.
    #[arg(long, requires = "fail_status")]
    fail_code: Option<String>,
    /// A key the Azure routes accept in `api-key`; repeat for more. None: any non-empty key.
    #[arg(long = "azure-key")]
    azure_keys: Vec<String>,
    /// The client id Entra's token endpoint knows. None: any client with a non-empty secret.
    #[arg(long, requires = "entra_client_secret")]
    entra_client_id: Option<String>,
    /// That client's secret.
    #[arg(long, requires = "entra_client_id")]
    entra_client_secret: Option<String>,
    /// Write the test service account's JSON key file (Vertex AI's credential, its token URI
    /// this mock's `/token`) to this path before the ready line.
    #[arg(long)]
    google_service_account_file: Option<std::path::PathBuf>,
    /// The AWS access key id Bedrock's SigV4 signatures must be made with.
    #[arg(long, default_value = BEDROCK_TEST_ACCESS_KEY_ID)]
    aws_access_key_id: String,
    /// Its secret access key.
    #[arg(long, default_value = BEDROCK_TEST_SECRET_ACCESS_KEY)]
    aws_secret_access_key: String,
    /// A session token requests must then send as `x-amz-security-token`.
    #[arg(long)]
    aws_session_token: Option<String>,
    /// The region Bedrock's signatures must be scoped to.
    #[arg(long, default_value = BEDROCK_DEFAULT_REGION)]
    aws_region: String,
    /// A Bedrock API key accepted as `Authorization: Bearer`; repeat for more. None: the test key.
    #[arg(long = "bedrock-api-key")]
    bedrock_api_keys: Vec<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Logs go to stderr: stdout carries only the ready line that scripts wait for.
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();

    if !(0.0..=1.0).contains(&args.fail_fraction) {
        anyhow::bail!("--fail-fraction must be between 0 and 1");
    }
    let settings = MockSettings {
        latency: args.latency.into(),
        stream_chunk_delay: args.stream_chunk_delay.into(),
        stream_first_event_delay: args.stream_first_event_delay.into(),
        failure: args.fail_status.map(|status| FailureMode {
            status,
            fraction: args.fail_fraction,
            retry_after: args.retry_after.map(Into::into),
            code: args.fail_code.clone(),
        }),
        models: None,
        azure_keys: args.azure_keys,
        entra_client: args
            .entra_client_id
            .zip(args.entra_client_secret)
            .map(|(id, secret)| EntraClient::new(id, secret)),
        bedrock: BedrockSettings {
            credentials: AwsCredentials {
                access_key_id: args.aws_access_key_id,
                secret_access_key: args.aws_secret_access_key,
                session_token: args.aws_session_token,
            },
            region: args.aws_region,
            api_keys: if args.bedrock_api_keys.is_empty() {
                vec![BEDROCK_TEST_API_KEY.to_owned()]
            } else {
                args.bedrock_api_keys
            },
        },
    };

    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let addr = listener.local_addr().context("reading the bound address")?;
    if let Some(path) = &args.google_service_account_file {
        std::fs::write(path, service_account_json(&format!("http://{addr}")))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "mock-upstream listening on http://{addr}/v1")?;
    stdout.flush()?;
    drop(stdout);

    MockProvider::serve(listener, settings, shutdown_signal()).await?;
    tracing::info!("mock-upstream stopped");
    Ok(())
}

/// Resolves on ctrl-c, or on SIGTERM where there is one (what `kill` and container runtimes send).
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::warn!(%error, "cannot listen for ctrl-c");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}
