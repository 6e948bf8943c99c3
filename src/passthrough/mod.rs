//! The pass-through: every `/v1/*` path that is not deduplicated (files,
//! audio, images, batches, Anthropic's `messages/count_tokens`, ...) is
//! proxied through unchanged, and `GET /v1/models` is every upstream's list
//! merged. One module: the path (`path.rs`), the policy (`policy.rs`), the
//! routing and relay (`relay.rs`) and the merged model list (`models.rs`),
//! taking only the upstream client, the routes and the policy it needs
//! ([`Passthrough`]); `api/` reads the body and hands it over.
//!
//! The pass-through's two fences: every proxied path stays inside the
//! provider's API ([`ProxyPath`]), and only the endpoints the policy allows
//! are proxied at all ([`Policy`]). Past them, a call the provider bills is
//! held to the budgets and booked like a deduplicated miss (`paid.rs`).
//!
//! **Confinement.** A path reaches the provider joined to `base_url`, with the
//! provider key when corral holds one. A dot-segment, or anything that a URL
//! parser or the provider could turn into one (`%2e`, `%2f`, `%5c`, `\`, a
//! double-encoded `%25..`), an empty segment (`//host` would be read as an
//! authority) or a malformed escape could walk out of `base_url`'s path, so
//! each is refused (400) before anything is sent. The joined URL is checked
//! again by the client (`upstream/client.rs`), and redirects are never followed.
//!
//! **Policy.** When corral sends its own provider key, every tenant shares
//! the provider account: a file one tenant uploads, a batch, an assistant or a
//! stored response would be listed and read by every other. Then only
//! stateless endpoints pass by default ([`STATELESS`]); `passthrough.allow`
//! adds more, `passthrough.deny` removes any, and deny wins. When callers
//! bring their own provider keys, the provider separates them and everything
//! is allowed unless denied.

pub mod gemini;
mod models;
mod paid;
mod path;
mod policy;
mod relay;
mod usage_scan;

use std::{sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;

pub use paid::{Billing, FREE, is_paid};
pub use path::{ProxyPath, decoded_path};
pub use policy::{Policy, STATELESS};

use crate::{
    config::UpstreamConfig,
    pins::Pins,
    upstream::{Routes, Upstream},
};

/// What the pass-through needs of the gateway, borrowed for one request
/// (`AppState::passthrough`).
#[derive(Debug, Clone, Copy)]
pub struct Passthrough<'a> {
    upstream: &'a Upstream,
    routes: &'a Routes,
    policy: &'a Policy,
    /// Which upstreams corral calls with its own provider key.
    upstreams: &'a [UpstreamConfig],
    /// The longest silence of a proxied body (`coalesce.stream_stall_timeout`).
    stream_stall_timeout: Duration,
    /// Cancelled when the shutdown drain times out: running bodies end.
    cut_upstream: &'a CancellationToken,
    /// Which pool member made each file, batch, upload, vector store and
    /// stored response: a path or body naming one goes there (`pins.rs`).
    pins: &'a Arc<Pins>,
    /// The budgets and books a paid call is held to and booked in.
    billing: Billing<'a>,
}

impl<'a> Passthrough<'a> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        upstream: &'a Upstream,
        routes: &'a Routes,
        policy: &'a Policy,
        upstreams: &'a [UpstreamConfig],
        stream_stall_timeout: Duration,
        cut_upstream: &'a CancellationToken,
        pins: &'a Arc<Pins>,
        billing: Billing<'a>,
    ) -> Self {
        Self {
            upstream,
            routes,
            policy,
            upstreams,
            stream_stall_timeout,
            cut_upstream,
            pins,
            billing,
        }
    }
}
