//! Routing and relay of a proxied request: no dedup, no cache, the caller's
//! own response. Paths below `/v1/messages` are Anthropic's: routed among
//! `api: anthropic` upstreams.

use std::sync::Arc;

use axum::{
    body::Body,
    http::{HeaderMap, HeaderName, Method, header},
    response::{IntoResponse, Response},
};
use bytes::Bytes;
use futures::{Stream, StreamExt as _, future::Either};
use tokio::time::Instant;

use super::{Passthrough, ProxyPath, paid::Caller};
use crate::{
    auth::forwarded_credential,
    config::Api,
    error::{ErrorShape, GatewayError},
    metrics::Attribution,
    pins::{self, CreatedId, Pins},
    request::KEYED_HEADERS,
    upstream::{Outbound, body},
};

/// Request headers a proxied call carries; the rest (cookies, hop-by-hop,
/// gateway-internal) stay here.
const PROXIED_REQUEST_HEADERS: &[&str] = &["accept", "content-type"];

/// Longest `model` form field read from a multipart body.
const MAX_MODEL_FIELD_BYTES: u64 = 1024;

/// Response headers that never cross a proxy (RFC 9110 hop-by-hop) or are set by the server.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
];

/// The API a proxied path belongs to: Anthropic's below `/v1/messages`.
fn api_of(path: &str) -> Api {
    match ErrorShape::for_path(path) {
        ErrorShape::Anthropic | ErrorShape::Bedrock => Api::Anthropic,
        ErrorShape::OpenAi | ErrorShape::Azure => Api::OpenAi,
        ErrorShape::Gemini => Api::Gemini,
    }
}

impl Passthrough<'_> {
    /// Proxies one request whose path passed the first fence and whose body
    /// was read (bounded) by the edge: routed by its model among the
    /// upstreams of its API, let through by the policy, held to `tenant`'s
    /// budgets when the provider bills it (`paid.rs`), relayed as the
    /// provider answers. `GET /v1/models` is the merged list (`models.rs`).
    pub async fn serve(
        &self,
        method: Method,
        path: ProxyPath,
        headers: HeaderMap,
        query: Option<String>,
        body: Bytes,
        tenant: &Arc<str>,
    ) -> Result<Response, GatewayError> {
        // What the provider will make of the path: rules and routes match this.
        let full_path = path.decoded().to_owned();
        if method == Method::GET && full_path == "/v1/models" {
            return self.models(&headers).await;
        }
        // Anthropic's paths only ever go to an Anthropic upstream; others prefer
        // an OpenAI one and fall back to any whose models match.
        let api = api_of(&full_path);
        let model = routing_model(&method, &full_path, &headers, &body).await;
        let no_route = |model: &str| GatewayError::NoRoute {
            model: model.to_owned(),
        };
        let upstream = match (model.as_deref(), api) {
            (Some(model), Api::Anthropic) => self
                .routes
                .route_for(api, model)
                .ok_or_else(|| no_route(model))?,
            (Some(model), Api::OpenAi) => self
                .routes
                .route_preferring(api, model)
                .ok_or_else(|| no_route(model))?,
            (None, Api::Anthropic) => {
                self.routes
                    .first_of(api)
                    .ok_or_else(|| GatewayError::NoRoute {
                        model: "(none: no upstream speaks the Anthropic API)".to_owned(),
                    })?
            }
            // An OpenAI path without a model: an OpenAI upstream, else any
            // but a Gemini one (which takes Gemini's requests only).
            (None, Api::OpenAi) => self
                .routes
                .first_of(api)
                .or_else(|| self.routes.first_of(Api::Anthropic))
                .ok_or_else(|| GatewayError::NoRoute {
                    model: "(none: no upstream speaks the OpenAI API)".to_owned(),
                })?,
            // Gemini's requests are `serve_gemini`'s (`gemini.rs`); one that
            // reads as Gemini's never goes to another provider.
            (_, Api::Gemini) => {
                return Err(GatewayError::NoGeminiUpstream { path: full_path });
            }
        };
        self.policy
            .check(&method, &full_path, self.shares_a_key(upstream))?;
        let caller = Caller {
            tenant,
            model: model.as_deref(),
        };
        let bill = self
            .admit_paid(&method, &full_path, upstream, caller)
            .await?;
        // In a pool, state stays with the account that made it: a path or
        // body naming an id goes to its member, and what a POST creates is
        // pinned to the member that created it.
        let pooled = self.upstream.is_pool(upstream);
        let creates = (pooled && method == Method::POST && pins::creates_state(&full_path))
            .then(|| tenant.clone());
        let pin = match pooled {
            true => self.pin_named(tenant, upstream, &full_path, &body).await,
            false => None,
        };
        let outbound = Outbound {
            upstream,
            method,
            path: path.below_base().to_owned().into(),
            query,
            headers: forwarded_headers(&headers),
            authorization: forwarded_credential(&headers),
            body,
            affinity: None,
            pin,
            model: None,
        };
        self.relay_pinning(&outbound, bill, creates).await
    }

    /// The member of `upstream`'s pool that made the state `path` (else a
    /// JSON `body`: a batch's `input_file_id`, ...) names, for `tenant`.
    async fn pin_named(
        &self,
        tenant: &str,
        upstream: usize,
        path: &str,
        body: &Bytes,
    ) -> Option<Arc<str>> {
        let pool = self.upstream.name(upstream);
        if let Some(id) = pins::id_in_path(path) {
            return self.pins.member(tenant, pool, id).await;
        }
        let body = serde_json::from_slice::<serde_json::Value>(body).ok()?;
        let id = pins::id_in_body(&body)?;
        self.pins.member(tenant, pool, id).await
    }

    /// Whether `upstream` is called with corral's own provider key, which
    /// every tenant then shares.
    pub(super) fn shares_a_key(&self, upstream: usize) -> bool {
        self.upstreams[upstream].has_own_keys()
    }

    /// Sends `outbound` and streams the provider's answer back, whatever its
    /// status; a paid call's answer (`bill`) is booked when its body ends.
    pub(super) async fn relay(
        &self,
        outbound: &Outbound,
        bill: Option<Attribution>,
    ) -> Result<Response, GatewayError> {
        self.relay_pinning(outbound, bill, None).await
    }

    /// As `relay`; for a request that creates state (`creates`: its
    /// tenant), the `id` of a 2xx JSON answer is pinned to the member that
    /// made it once the answer has passed whole.
    async fn relay_pinning(
        &self,
        outbound: &Outbound,
        bill: Option<Attribution>,
        creates: Option<Arc<str>>,
    ) -> Result<Response, GatewayError> {
        // A credential goes only to the provider it belongs to.
        self.upstream
            .check_credential(outbound.upstream, outbound.authorization.as_ref())?;
        // A provider error comes back as `GatewayError::Upstream`, relayed with its status and body.
        let started = Instant::now();
        let (upstream, member) = self.upstream.call_streaming(outbound).await?;
        let status = upstream.status();
        let shared_key = self.shares_a_key(outbound.upstream);
        let mut response_headers = HeaderMap::new();
        for (name, value) in upstream.headers() {
            // corral's own headers are corral's to set: a provider cannot forge them.
            let internal = name.as_str().starts_with("x-corral-");
            // Under corral's own key the account is every tenant's: its
            // organization, project and rate-limit state are nobody's to read.
            let account = shared_key && is_account_header(name.as_str());
            if !HOP_BY_HOP.contains(&name.as_str())
                && name != header::SET_COOKIE
                && !internal
                && !account
            {
                response_headers.append(name.clone(), value.clone());
            }
        }
        // The body is bounded like every upstream body: a silent provider ends it
        // (the client sees it cut short) instead of holding the connection.
        let total = self
            .upstream
            .request_timeout(outbound.upstream)
            .saturating_sub(started.elapsed());
        let stall = self.stream_stall_timeout;
        // Only a JSON answer reports its usage; audio and streams are booked without.
        let json = response_headers
            .get(header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| {
                value
                    .trim_start()
                    .to_ascii_lowercase()
                    .starts_with("application/json")
            });
        let body = body::bounded(upstream, stall, total, self.cut_upstream.clone());
        let body = match bill {
            Some(bill) => Either::Left(self.booked(bill, json, body)),
            None => Either::Right(body),
        };
        let body = match (creates, member) {
            (Some(tenant), Some(member)) if json && status.is_success() => {
                let pin = CreatedPin {
                    pins: self.pins.clone(),
                    tenant,
                    pool: self.upstream.name(outbound.upstream).to_owned(),
                    member,
                };
                Either::Left(pin.pinning(body))
            }
            _ => Either::Right(body),
        };
        let mut response = (status, Body::from_stream(body)).into_response();
        response.headers_mut().extend(response_headers);
        Ok(response)
    }
}

/// The caller's headers a proxied request carries: content negotiation (one
/// `Content-Type`, the caller's own) and the keyed API headers (OpenAI's
/// organization, project and beta; Anthropic's version and beta flags).
pub(super) fn forwarded_headers(headers: &HeaderMap) -> Vec<(HeaderName, axum::http::HeaderValue)> {
    PROXIED_REQUEST_HEADERS
        .iter()
        .map(|name| HeaderName::from_static(name))
        .chain(KEYED_HEADERS)
        .filter_map(|name| {
            let value = headers.get(&name)?.clone();
            Some((name, value))
        })
        .collect()
}

/// A response header that describes the provider account a call was made
/// with, not the call: its organization and project, its rate-limit state.
fn is_account_header(name: &str) -> bool {
    matches!(
        name,
        "openai-organization" | "openai-project" | "anthropic-organization-id"
    ) || name.starts_with("x-ratelimit-")
        || name.starts_with("anthropic-ratelimit-")
}

/// The model a proxied request is routed by: `GET /v1/models/{id}` by its
/// id, a JSON body by its `model`, a multipart form (an audio file, say) by
/// its `model` field. None: the first upstream.
async fn routing_model(
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    body: &Bytes,
) -> Option<String> {
    // `path` is decoded already (`ProxyPath::decoded`).
    if *method == Method::GET
        && let Some(id) = path.strip_prefix("/v1/models/")
    {
        return Some(id.to_owned());
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    if content_type
        .trim_start()
        .to_ascii_lowercase()
        .starts_with("multipart/form-data")
    {
        return multipart_model(content_type, body.clone()).await;
    }
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("model").and_then(|m| m.as_str()).map(str::to_owned))
}

/// The `model` field of a multipart form, read from the buffered body without
/// changing it (the body goes upstream byte for byte); None when the form is
/// malformed or has no such field.
async fn multipart_model(content_type: &str, body: Bytes) -> Option<String> {
    let boundary = multer::parse_boundary(content_type).ok()?;
    let stream = futures::stream::once(async move { Ok::<_, std::io::Error>(body) });
    let limits = multer::Constraints::new()
        .size_limit(multer::SizeLimit::new().for_field("model", MAX_MODEL_FIELD_BYTES));
    let mut form = multer::Multipart::with_constraints(stream, boundary, limits);
    while let Some(field) = form.next_field().await.ok()? {
        if field.name() == Some("model") {
            return field.text().await.ok().map(|model| model.trim().to_owned());
        }
    }
    None
}

/// The pin a created object's answer makes once it has passed whole.
struct CreatedPin {
    pins: Arc<Pins>,
    tenant: Arc<str>,
    pool: String,
    member: Arc<str>,
}

impl CreatedPin {
    /// `body` relayed as it comes, its `id` read as it passes (bounded:
    /// `pins::CreatedId`) and pinned before the body ends, so the caller's
    /// next request naming it finds the pin. A body that breaks pins nothing.
    fn pinning<S, E>(self, body: S) -> impl Stream<Item = Result<Bytes, E>> + Send + 'static
    where
        S: Stream<Item = Result<Bytes, E>> + Send + 'static,
        E: Send + 'static,
    {
        let state = (Box::pin(body), CreatedId::default(), self);
        futures::stream::unfold(Some(state), |state| async move {
            let (mut body, mut created, pin) = state?;
            match body.next().await {
                Some(Ok(chunk)) => {
                    created.feed(&chunk);
                    Some((Ok(chunk), Some((body, created, pin))))
                }
                Some(Err(err)) => Some((Err(err), None)),
                None => {
                    if let Some(id) = created.id() {
                        pin.pins
                            .record(&pin.tenant, &pin.pool, &id, &pin.member)
                            .await;
                    }
                    None
                }
            }
        })
    }
}
