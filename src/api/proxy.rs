//! Every other `/v1/*` path (files, audio, images, Anthropic's
//! `messages/count_tokens`, ...) is proxied through unchanged: no dedup, no
//! cache, the caller's own response. The path must stay inside the provider's
//! API and the pass-through policy must allow it (`passthrough.rs`). Paths
//! below `/v1/messages` are Anthropic's: routed among `api: anthropic`
//! upstreams and refused in Anthropic's error shape. `GET /v1/models` is the
//! one exception: it lists the models of every upstream (`models.rs`).

use std::sync::Arc;

use axum::{
    body::Body,
    extract::{FromRequest, Request, State},
    http::{HeaderMap, HeaderName, Method, Uri, header},
    response::{IntoResponse, Response},
};
use bytes::Bytes;

use tokio::time::Instant;

use super::{models, read_body};
use crate::{
    auth::forwarded_credential,
    config::Api,
    error::{ErrorShape, GatewayError},
    passthrough::ProxyPath,
    request::KEYED_HEADERS,
    state::AppState,
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

pub async fn passthrough(State(app): State<Arc<AppState>>, request: Request) -> Response {
    let shape = ErrorShape::for_path(request.uri().path());
    proxy(app, request)
        .await
        .unwrap_or_else(|error| error.to_response_as(shape))
}

/// The API a proxied path belongs to: Anthropic's below `/v1/messages`.
fn api_of(path: &str) -> Api {
    match ErrorShape::for_path(path) {
        ErrorShape::Anthropic => Api::Anthropic,
        ErrorShape::OpenAi => Api::OpenAi,
    }
}

async fn proxy(app: Arc<AppState>, request: Request) -> Result<Response, GatewayError> {
    let (mut parts, body) = request.into_parts();
    // The raw path, not a percent-decoded one: `%2e%2e` must be seen as what
    // the provider (or a URL parser) would make of it.
    let path = ProxyPath::parse(parts.uri.path())?;
    let method = parts.method.clone();
    let headers = std::mem::take(&mut parts.headers);
    let query = parts.uri.query().map(str::to_owned);
    // What the provider will make of the path: rules and routes match this.
    let full_path = path.decoded().to_owned();
    let body = Bytes::from_request(Request::from_parts(parts, body), &()).await;
    let body = read_body(body, app.config.limits.max_body_bytes)?;
    if method == Method::GET && full_path == "/v1/models" {
        return models::list(&app, &headers).await;
    }
    // Anthropic's paths only ever go to an Anthropic upstream; others prefer
    // an OpenAI one and fall back to any whose models match.
    let api = api_of(&full_path);
    let upstream = match (
        routing_model(&method, &full_path, &headers, &body).await,
        api,
    ) {
        (Some(model), Api::Anthropic) => app
            .routes
            .route_for(api, &model)
            .ok_or(GatewayError::NoRoute { model })?,
        (Some(model), Api::OpenAi) => app
            .routes
            .route_preferring(api, &model)
            .ok_or(GatewayError::NoRoute { model })?,
        (None, Api::Anthropic) => {
            app.routes
                .first_of(api)
                .ok_or_else(|| GatewayError::NoRoute {
                    model: "(none: no upstream speaks the Anthropic API)".to_owned(),
                })?
        }
        (None, Api::OpenAi) => app.routes.first_of(api).unwrap_or(0),
    };
    app.passthrough.check(
        &method,
        &full_path,
        app.config.upstreams[upstream].api_key.is_some(),
    )?;
    let outbound = Outbound {
        upstream,
        method,
        path: path.below_base().to_owned().into(),
        query,
        headers: forwarded_headers(&headers),
        authorization: forwarded_credential(&headers),
        body,
    };
    relay(&app, &outbound).await
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

/// Sends `outbound` and streams the provider's answer back, whatever its status.
async fn relay(app: &AppState, outbound: &Outbound) -> Result<Response, GatewayError> {
    // A provider error comes back as `GatewayError::Upstream`, relayed with its status and body.
    let started = Instant::now();
    let upstream = app.upstream.call_streaming(outbound).await?;
    let status = upstream.status();
    let shared_key = app.config.upstreams[outbound.upstream].api_key.is_some();
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
    let total = app
        .upstream
        .request_timeout(outbound.upstream)
        .saturating_sub(started.elapsed());
    let stall = app.config.coalesce.stream_stall_timeout;
    let body = body::bounded(upstream, stall, total, app.cut_upstream.clone());
    let mut response = (status, Body::from_stream(body)).into_response();
    response.headers_mut().extend(response_headers);
    Ok(response)
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

pub async fn unknown_path(uri: Uri) -> GatewayError {
    GatewayError::UnknownPath {
        path: uri.path().to_owned(),
    }
}
