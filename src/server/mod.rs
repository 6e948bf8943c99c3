//! The HTTP edge: the accept loop, connection timeouts and graceful shutdown.
//! Admission (gateway keys, rate limits, the global cap, bounded bodies) is
//! the request pipeline's (`api/pipeline.rs`).
//!
//! `axum::serve` installs no timer, so hyper's header-read timeout is inert
//! there and a client that trickles its headers (slowloris) holds a socket
//! forever. This loop serves each connection with hyper's HTTP/1.1 server and a
//! tokio timer of the connection's own (`head_timer`): the header-read timeout
//! (`server.header_read_timeout`) runs from the moment the connection waits for
//! a request head, so it also closes a connection that never sends a byte and
//! an idle keep-alive one. Bodies are read under `server.body_read_timeout`
//! (408 after) and `limits.max_body_bytes` (413, with or without a
//! `Content-Length`). Responses are written under
//! `server.write_timeout`: a client that accepts no byte for that long (it
//! opened a stream and stopped reading) is disconnected, which drops its
//! response body and whatever the body held.
//!
//! HTTP/2 is not served: hyper's h2 server has no handshake timeout, so a slow
//! preface would be a slowloris of its own; clients of an OpenAI API speak
//! HTTP/1.1, and a TLS terminator in front can speak h2 to them.

mod head_timer;

use std::{future::Future, pin::pin, sync::Arc, time::Duration};

use hyper::server::conn::http1;
use hyper_util::{rt::TokioIo, server::graceful::GracefulShutdown, service::TowerToHyperService};
use tokio::net::TcpListener;
use tokio_io_timeout::TimeoutStream;

use crate::{api, state::AppState};

/// Pause after a failed accept (out of file descriptors, say), so the loop does
/// not spin while the condition lasts.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// After the drain timeout, running upstream calls are cut; this is how long
/// their flights get to release Redis locks and answer their callers.
const CUT_GRACE: Duration = Duration::from_secs(5);

/// Serves the API on `listener` until `shutdown` resolves, then (after
/// `shutdown.unready_delay`, during which `/readyz` answers 503 and requests
/// are still served) drains: no new connections, running requests and
/// flights finish (bounded by `shutdown.drain_timeout`), then whatever still
/// runs is cut. Shared by the binary and the tests.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = api::router(state.clone());
    let service = TowerToHyperService::new(app);
    let mut http = http1::Builder::new();
    http.header_read_timeout(state.config().server.header_read_timeout)
        .keep_alive(true);
    let graceful = GracefulShutdown::new();
    let mut shutdown = pin!(shutdown);
    // Once shutdown begins: `/readyz` answers 503 at once, and new requests
    // are still accepted for `shutdown.unready_delay`, so a load balancer
    // polling readiness stops sending before the port closes.
    let mut unready_until: Option<tokio::time::Instant> = None;
    loop {
        let stream = tokio::select! {
            biased;
            () = &mut shutdown, if unready_until.is_none() => {
                state.draining().cancel();
                let delay = state.config().shutdown.unready_delay;
                if delay.is_zero() {
                    break;
                }
                tracing::info!(?delay, "shutting down: /readyz answers 503; still accepting for the unready delay");
                unready_until = Some(tokio::time::Instant::now() + delay);
                continue;
            }
            () = async {
                match unready_until {
                    Some(deadline) => tokio::time::sleep_until(deadline).await,
                    None => std::future::pending().await,
                }
            } => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(err) => {
                    tracing::warn!(error = %err, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        // A write that makes no progress for `server.write_timeout` fails the
        // connection: a client that stopped reading is dropped, and with it its
        // response body (a stream reader, the log it holds).
        let mut stream = TimeoutStream::new(stream);
        stream.set_write_timeout(Some(state.config().server.write_timeout));
        // A timer of the connection's own: see `head_timer`.
        let connection = graceful.watch(
            http.clone()
                .timer(head_timer::ConnectionTimer::default())
                .serve_connection(TokioIo::new(Box::pin(stream)), service.clone()),
        );
        tokio::spawn(async move {
            // Header timeouts, resets and half-read bodies end up here; none is ours to report.
            if let Err(err) = connection.await {
                tracing::debug!(error = %err, "connection closed with an error");
            }
        });
    }
    drop(listener);
    tracing::info!("shutting down: no new connections; draining");
    drain(&state, graceful).await;
    // What was counted since the last flush reaches the cluster ledger (one
    // Redis round trip, bounded by redis.op_timeout; a failure loses only this
    // instance's last second of counts).
    if state.flush_ledger().await.is_err() {
        tracing::warn!("the last counts could not be added to the cluster ledger");
    }
    // Every request span ended with the drain: export what is queued.
    if let Some(traces) = state.traces()
        && let Err(err) = traces.shutdown().await
    {
        tracing::warn!(error = %err, "the last spans could not be exported");
    }
    Ok(())
}

async fn drain(state: &AppState, graceful: GracefulShutdown) {
    let drain_timeout = state.config().shutdown.drain_timeout;
    state.tasks().close();
    let tasks = state.tasks().clone();
    let mut finished = pin!(async move {
        graceful.shutdown().await;
        tasks.wait().await;
    });
    if tokio::time::timeout(drain_timeout, &mut finished)
        .await
        .is_ok()
    {
        tracing::info!("drained");
        return;
    }
    tracing::warn!(
        ?drain_timeout,
        "requests still running after the drain timeout; cutting their upstream calls"
    );
    // Flights end with `ShuttingDown`: owners release their Redis locks and
    // every waiter gets a 503, not a hang.
    state.cut_upstream().cancel();
    if tokio::time::timeout(CUT_GRACE, &mut finished)
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the cut; closing them");
    }
}
