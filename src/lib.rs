//! corral: an OpenAI-compatible gateway that turns N identical LLM requests
//! into one upstream call. See ARCHITECTURE.md for the request's path.

pub mod api;
pub mod breaker;
pub mod cache;
pub mod clock;
pub mod cluster;
pub mod coalesce;
pub mod config;
pub mod dedup;
pub mod error;
pub mod fingerprint;
pub mod metrics;
pub mod mock;
pub mod request;
pub mod sse;
pub mod state;
pub mod telemetry;
pub mod upstream;

use std::{future::Future, sync::Arc, time::Duration};

use tokio::net::TcpListener;

pub use config::Config;
pub use state::AppState;

/// How long shutdown waits for detached flights to finish.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves the API on `listener` until `shutdown` resolves, then lets running
/// flights finish (bounded). Shared by the binary and the tests.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = api::router(state.clone());
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await?;
    state.tasks.close();
    if tokio::time::timeout(DRAIN_TIMEOUT, state.tasks.wait())
        .await
        .is_err()
    {
        tracing::warn!("flights still running after the drain timeout; exiting");
    }
    Ok(())
}
