//! Deadlines on an upstream body that corral passes on without parsing (a
//! `no-store` stream, a proxied `/v1/*` response): every chunk must arrive
//! within the idle timeout, and the whole body within the total one. Without
//! them a provider that goes silent holds the caller's connection, and
//! corral's, for ever.

use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt as _};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Why a bounded body ended early. `Display` is what a client may see.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("the upstream body sent nothing for {0:?}")]
    Idle(Duration),
    #[error("the upstream body did not complete within {0:?}")]
    Total(Duration),
    #[error("reading the upstream body failed")]
    Transport(#[source] reqwest::Error),
    #[error("the gateway is shutting down; the response was cut")]
    ShuttingDown,
}

/// `response`'s body, ended with a [`BodyError`] when a chunk takes longer than
/// `idle`, the body as a whole longer than `total` (from now), or `cut` fires
/// (shutdown past its drain timeout).
pub fn bounded(
    response: reqwest::Response,
    idle: Duration,
    total: Duration,
    cut: CancellationToken,
) -> impl Stream<Item = Result<Bytes, BodyError>> + Send + 'static {
    let deadline = Instant::now() + total;
    let body = response.bytes_stream().boxed();
    futures::stream::unfold(Some((body, cut)), move |state| async move {
        let (mut body, cut) = state?;
        let idle_at = Instant::now() + idle;
        let next = tokio::select! {
            next = tokio::time::timeout_at(idle_at.min(deadline), body.next()) => next,
            () = cut.cancelled() => return Some((Err(BodyError::ShuttingDown), None)),
        };
        match next {
            Ok(Some(Ok(chunk))) => Some((Ok(chunk), Some((body, cut)))),
            // Without its URL: a query may carry a credential.
            Ok(Some(Err(error))) => Some((Err(BodyError::Transport(error.without_url())), None)),
            Ok(None) => None,
            Err(_) if deadline <= idle_at => Some((Err(BodyError::Total(total)), None)),
            Err(_) => Some((Err(BodyError::Idle(idle)), None)),
        }
    })
}
