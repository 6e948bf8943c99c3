//! The deduplicated endpoints (`POST /v1/chat/completions`, `/v1/completions`,
//! `/v1/embeddings`, `/v1/responses`, `/v1/messages`) as one service,
//! [`Dedup`]: parse and fingerprint a request, pick the strategy that serves
//! it ([`Plan`]), and answer the caller with what it decided ([`Decided`]).
//!
//! - `service.rs`: the service and the parts of the gateway it holds;
//! - `remembered.rs`: a request seen before, served from its memo entry unparsed;
//! - `bypass.rs`: `no-store`, straight to the provider and back;
//! - `buffered.rs`: a complete answer, cached and coalesced;
//! - `stream.rs`: a streamed answer, live fan-out or a replay;
//! - `embeddings/`: a batch of inputs, each cached and coalesced on its own;
//! - `loaders.rs`: the upstream calls a flight makes;
//! - `respond.rs`: the caller's response built from a shared answer.

mod buffered;
mod bypass;
mod embeddings;
mod fallback;
mod loaders;
mod pinning;
mod remembered;
mod respond;
mod service;
mod stream;

use std::{borrow::Cow, sync::Arc};

use axum::{
    http::{HeaderMap, HeaderValue, Method},
    response::Response,
};
use bytes::Bytes;
use tracing::Instrument;

use fallback::Fallbacks;

use crate::{
    cache_status::CacheStatus,
    config::CacheScope,
    error::GatewayError,
    fingerprint::{CacheKey, Endpoint, Fingerprint},
    memo::{Derived, RequestBytes},
    metrics::Attribution,
    request::{DedupRequest, RequestRules},
    retry_window::Retained,
    tenant::TenantScope,
    upstream::Outbound,
    wire::{self, PathCall},
};

pub use embeddings::ITEMS_HEADER;
pub use respond::{
    BUDGET_HEADER, CACHE_HEADER, CACHE_HEADER_NAME, FINGERPRINT_HEADER, FINGERPRINT_HEADER_NAME,
    REQUEST_ID_HEADER, REQUEST_ID_HEADER_NAME,
};
pub use service::{Dedup, DedupParts, stream_log_limits, stream_silence};

/// Who sent the request, as the edge admitted it.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The request id the response echoes (`x-request-id`).
    pub request_id: HeaderValue,
    /// The caller's own tenant (its credential's scope), whatever the cache shares.
    pub tenant: TenantScope,
}

impl Caller {
    /// The span a request's logs nest in. Made only when the request does
    /// more than read the cache: a hit logs nothing but its access line,
    /// which carries the same fields, and making the span was a tenth of a
    /// hit's CPU (BENCHMARKS.md).
    fn span(&self, endpoint: Endpoint) -> tracing::Span {
        self.span_at(format_args!("/v1{}", endpoint.path()))
    }

    /// As [`span`](Self::span), for a request whose path says more than its
    /// endpoint (Gemini's names its model and method).
    fn span_at(&self, path: impl std::fmt::Display) -> tracing::Span {
        tracing::info_span!(
            "request",
            request_id = %self.request_id.to_str().unwrap_or_default(),
            method = %"POST",
            path = %path,
        )
    }
}

/// What the service decided for a request, beside its response: the edge
/// counts, logs and traces the request by it, as values, never by reading
/// the response's headers back.
#[derive(Debug, Clone, Copy, Default)]
pub struct Decided {
    /// How the answer was served; `None`: an error.
    pub cache: Option<CacheStatus>,
    /// The request's fingerprint, once it was parsed.
    pub fingerprint: Option<Fingerprint>,
}

/// A response and what was decided for it.
#[derive(Debug)]
pub struct Answered {
    pub response: Response,
    pub decided: Decided,
}

impl Answered {
    fn new(response: Response, cache: Option<CacheStatus>, fingerprint: Fingerprint) -> Self {
        Self {
            response,
            decided: Decided {
                cache,
                fingerprint: Some(fingerprint),
            },
        }
    }
}

/// Which strategy serves a parsed request. (A request seen before is
/// served from its memo entry before it is parsed: `remembered.rs`.)
enum Plan {
    /// `no-store` (or `cache: false`): the provider's answer, not shared.
    Bypass,
    /// Embeddings: each input cached and coalesced on its own key.
    Itemized,
    /// A streamed answer: the flight's live log, or a replay of a stored one.
    Stream,
    /// A complete answer from the cache, a flight, or the retry window.
    Buffered,
}

impl Plan {
    fn of(request: &DedupRequest) -> Self {
        match (request.policy.bypass, request.endpoint, request.stream) {
            (true, _, _) => Self::Bypass,
            (false, Endpoint::Embeddings | Endpoint::EmbedContent, _) => Self::Itemized,
            (false, _, true) => Self::Stream,
            (false, _, false) => Self::Buffered,
        }
    }
}

impl Dedup {
    /// Serves one admitted request; an error is answered in its endpoint's
    /// API's shape. `call`: what a Gemini path names (the model and the
    /// delivery), which the memo keeps with the request.
    pub async fn serve(
        self: &Arc<Self>,
        endpoint: Endpoint,
        call: Option<PathCall>,
        caller: Caller,
        headers: HeaderMap,
        query: Option<String>,
        body: Bytes,
    ) -> Answered {
        let seen = RequestBytes::of(
            endpoint,
            call.as_ref().map(PathCall::path),
            &caller.tenant,
            &headers,
            query.as_deref(),
            &body,
        );
        let shape = call
            .as_ref()
            .map_or_else(|| wire::of(endpoint).error_shape(), PathCall::error_shape);
        let raw = RawRequest {
            endpoint,
            call,
            headers,
            query,
            body,
            tenant: caller.tenant.clone(),
        };
        if let Some(derived) = seen.as_ref().and_then(|seen| self.memo.get(seen)) {
            // Boxed: held inline, the memo's path would make every request's
            // future (boxed whole by the pipeline) kilobytes larger.
            return Box::pin(remembered::serve(self, &derived, &caller, raw)).await;
        }
        let span = raw.span(&caller);
        // Boxed: inline, its states (streams, embeddings, the retry window) would
        // make every request's future that large, hits included.
        Box::pin(self.clone().serve_parsed(raw, seen))
            .instrument(span)
            .await
            .unwrap_or_else(|error| Answered {
                response: error.to_response_as(shape),
                decided: Decided::default(),
            })
    }

    /// A request not in the memo: parsed, remembered when the memo can answer
    /// its repeats, then served by its plan's strategy.
    async fn serve_parsed(
        self: Arc<Self>,
        raw: RawRequest,
        seen: Option<RequestBytes>,
    ) -> Result<Answered, GatewayError> {
        let mut request = raw.parse(&self)?;
        // Before anything is kept or sent: a credential goes only to its provider.
        self.upstream
            .check_credential(request.upstream, request.authorization.as_ref())?;
        let bill = self.attribution(&request, &raw)?;
        if let Some(seen) = seen
            && self.memo.admits(&seen)
            && let Some(derived) = Derived::of(&request, &bill)
        {
            self.memo.insert(seen, derived);
        }
        if self.traced {
            crate::traces::record_request(&request.model, &self.upstream_names[request.upstream]);
        }
        let mut outbound = outbound_of(&mut request);
        outbound.pin = self.pin_of(&request).await;
        // The other plans' states are boxed: this future is boxed whole for
        // every miss (`serve`), so its size is the largest plan's, and the
        // buffered miss, the common one, would move the streaming one's.
        match Plan::of(&request) {
            Plan::Bypass => Box::pin(bypass::serve(&self, &request, outbound, &bill)).await,
            Plan::Itemized => {
                Ok(Box::pin(embeddings::serve(&self, &request, outbound, bill)).await)
            }
            Plan::Stream => {
                let fallbacks = Fallbacks::of(&self, request.upstream, &raw, &bill.tenant);
                Box::pin(stream::serve(&self, request, outbound, bill, fallbacks)).await
            }
            Plan::Buffered => {
                let fallbacks = Fallbacks::of(&self, request.upstream, &raw, &bill.tenant);
                buffered::serve(&self, &request, outbound, &bill, fallbacks).await
            }
        }
    }

    /// Whom the request's answer is billed to (metrics, `/stats`, budgets and
    /// token rates): the tenant of its credential wherever it was sent, so a
    /// labelled key is its label in the query too.
    fn attribution(
        &self,
        request: &DedupRequest,
        raw: &RawRequest,
    ) -> Result<Attribution, GatewayError> {
        // Read again only to find a labelled key's label: else the scope,
        // which admission derived from it, says the tenant.
        let credential = match self.auth.has_labels() {
            true => crate::auth::credential(&raw.headers, raw.query.as_deref())?,
            false => None,
        };
        Ok(Attribution {
            model: self.metrics.model(&request.model),
            tenant: self
                .auth
                .tenant_label(credential.as_deref(), Some(&request.own_scope)),
            upstream: self.upstream_names[request.upstream].as_str().into(),
            endpoint: request.endpoint.label(),
            member: None,
        })
    }

    /// The key a request's answer lives under (its fingerprint, re-keyed by
    /// purges), and the answer its client's earlier attempt paid for, when
    /// this is a retry the retry window kept one for.
    async fn key_and_retained(
        &self,
        request: &DedupRequest,
        bill: &Attribution,
    ) -> Result<(CacheKey, Option<Arc<Retained>>), GatewayError> {
        let fingerprint = request.fingerprint;
        let key = self.key_of(request, &bill.tenant);
        let retained = match &self.retry_window {
            Some(window) => {
                window
                    .recall_for(
                        &request.retry,
                        request.policy,
                        &fingerprint,
                        self.own_retry_key(request, &key).as_ref().unwrap_or(&key),
                    )
                    .await?
            }
            None => None,
        };
        Ok((key, retained))
    }

    /// The key a request's answer lives under: its fingerprint, re-keyed by
    /// the purges of its model and of `tenant` (its bill's).
    fn key_of(&self, request: &DedupRequest, tenant: &str) -> CacheKey {
        let fingerprint = request.fingerprint;
        self.purges.key(
            CacheKey {
                scope: request.scope.clone(),
                fingerprint,
            },
            &fingerprint,
            &request.model,
            tenant,
        )
    }

    /// Where the retry window keeps a request's answer for its client's
    /// retries, when that is not the cache key: under a cache every tenant
    /// shares (`cache.scope: global`), the caller's own key, so another
    /// tenant's retry never receives this tenant's sample.
    fn own_retry_key(&self, request: &DedupRequest, key: &CacheKey) -> Option<CacheKey> {
        (self.cache.scope == CacheScope::Global).then(|| CacheKey {
            scope: request.own_scope.clone(),
            fingerprint: key.fingerprint.within(&request.own_scope),
        })
    }

    /// A request that failed frees its `Idempotency-Key`: the client may
    /// correct its body (after a provider's 400, say) and send it under the
    /// same key.
    async fn release_key_of_failed(&self, request: &DedupRequest, failed: bool) {
        if let (true, Some(window), Some(key)) =
            (failed, &self.retry_window, &request.retry.idempotency_key)
        {
            // Boxed: a rare step, whose future would otherwise make every
            // buffered request's larger.
            Box::pin(window.release(key, &request.fingerprint)).await;
        }
    }
}

/// `query` with the wire's stream query (Gemini's `alt=sse`: the provider
/// streams events) added.
fn add_stream_query(query: &mut Option<String>, wire: &dyn wire::Wire) {
    if let Some(framing) = wire.stream_query() {
        *query = Some(match query.take() {
            Some(query) => format!("{query}&{framing}"),
            None => framing.to_owned(),
        });
    }
}

/// A request as it came, kept for the upstream call of a request the memo
/// answered: parsed only if that call runs; kept too by a flight whose
/// pool has a fallback, which parses it again naming the fallback model.
#[derive(Debug, Clone)]
struct RawRequest {
    endpoint: Endpoint,
    /// What the path names (Gemini's model and method, Azure's deployment).
    call: Option<PathCall>,
    headers: HeaderMap,
    query: Option<String>,
    body: Bytes,
    /// The caller's own tenant, as admission derived it from these headers
    /// and query (`Caller::tenant`).
    tenant: TenantScope,
}

impl RawRequest {
    /// The span of the request's logs: its path, Gemini's as it came.
    fn span(&self, caller: &Caller) -> tracing::Span {
        match &self.call {
            Some(call) => caller.span_at(crate::telemetry::clipped(call.path())),
            None => caller.span(self.endpoint),
        }
    }

    /// The error shape its caller parses: its path's, else its endpoint's.
    fn shape(&self) -> crate::error::ErrorShape {
        self.call.as_ref().map_or_else(
            || wire::of(self.endpoint).error_shape(),
            PathCall::error_shape,
        )
    }

    fn parse(&self, dedup: &Dedup) -> Result<DedupRequest, GatewayError> {
        DedupRequest::parse_named(
            self.endpoint,
            self.call.as_ref(),
            &self.headers,
            self.query.as_deref(),
            self.body.clone(),
            &dedup.routes,
            &dedup.upstream_keys,
            RequestRules {
                caller: Some(&self.tenant),
                ..dedup.request_rules()
            },
        )
    }
}

/// What goes upstream, moved out of the request, not copied: nothing reads it
/// again, and a cache hit should not pay for the copies.
fn outbound_of(request: &mut DedupRequest) -> Outbound {
    Outbound {
        upstream: request.upstream,
        method: Method::POST,
        // A Gemini request goes to the method its caller named, below the
        // upstream's version; the others to their endpoint's path.
        path: match &request.call {
            Some(call) => call.upstream_path(),
            None => Cow::Borrowed(request.endpoint.path()),
        },
        query: request.query.take(),
        headers: std::mem::take(&mut request.forward_headers),
        authorization: request.authorization.take(),
        body: request.raw_body.clone(),
        affinity: Some(request.affinity),
        pin: None,
        model: Some(request.model.as_str().into()),
    }
}
