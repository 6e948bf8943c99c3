//! Operator access and the admin API.
//!
//! With admin keys (`auth.admin_keys`, hashed like gateway keys, or
//! `auth.admin_keys_env`), the reports (`/metrics`, `/stats`, the savings page
//! at `/` and `/dashboard`) and `/admin/*` require one, as
//! `Authorization: Bearer <key>` (what Prometheus sends from
//! `authorization.credentials`) or as the password of HTTP Basic auth (what a
//! browser sends for the page and its `/stats` polls after asking once). A
//! gateway key is not an admin key (config refuses a key that is both).
//! Without admin keys the reports are open, as before, and the admin API is
//! off: `/admin/*` answers 404 `admin_disabled`.
//!
//! `POST /admin/purge` takes exactly one of `{"fingerprint": "<64 hex>"}`
//! (the `x-corral-fingerprint` a response carried), `{"model": "<model>"}`
//! (the request's `model` field, exactly), `{"tenant": "<name>"}` (as `/stats`
//! names it: the key's label, else its 13-character short scope) or
//! `{"all": true}`. See `purge.rs` for how a purge works.

use std::{collections::HashSet, sync::Arc};

use axum::{
    Json, Router,
    body::Body,
    extract::{Request, State},
    http::{HeaderValue, StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{any, get, post},
};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::json;

use crate::{
    auth::bearer_token, error::GatewayError, fingerprint::Fingerprint, purge::PurgeScope,
    state::AppState, tenant::key_hash,
};

/// A purge body is a few dozen bytes; anything near this is not one.
const MAX_PURGE_BODY: usize = 4096;
/// Longest model name or tenant name a purge accepts.
const MAX_NAME: usize = 256;

/// The admin keys' hashes; empty: reports open, admin API off.
#[derive(Debug, Clone)]
pub struct AdminKeys {
    hashes: Arc<HashSet<[u8; 32]>>,
}

impl AdminKeys {
    pub fn new(hashes: &[[u8; 32]]) -> Self {
        Self {
            hashes: Arc::new(hashes.iter().copied().collect()),
        }
    }

    pub fn enabled(&self) -> bool {
        !self.hashes.is_empty()
    }

    /// Whether the request carries an admin key, as a bearer token or as the
    /// password of Basic auth (any user name).
    fn admits(&self, request: &Request) -> bool {
        let Some(value) = request.headers().get(header::AUTHORIZATION) else {
            return false;
        };
        let value = value.as_bytes().trim_ascii();
        let key = match value.get(..6) {
            Some(scheme) if scheme.eq_ignore_ascii_case(b"basic ") => {
                let Ok(decoded) =
                    base64::engine::general_purpose::STANDARD.decode(value[6..].trim_ascii())
                else {
                    return false;
                };
                match decoded.iter().position(|&b| b == b':') {
                    Some(colon) => return self.known(&decoded[colon + 1..]),
                    None => return false,
                }
            }
            _ => bearer_token(value),
        };
        self.known(key)
    }

    fn known(&self, key: &[u8]) -> bool {
        !key.is_empty() && self.hashes.contains(&key_hash(key))
    }
}

/// Routes that require an admin key when admin keys are configured: the
/// reports (open without them) and the admin API (off without them).
pub fn protect(reports: Router<Arc<AppState>>, keys: AdminKeys) -> Router<Arc<AppState>> {
    let admin = Router::new()
        .route("/admin", get(index))
        .route("/admin/purge", post(purge))
        .route("/admin/{*rest}", any(unknown))
        .route_layer(middleware::from_fn_with_state(keys.clone(), admin_access));
    reports
        .route_layer(middleware::from_fn_with_state(keys, report_access))
        .merge(admin)
}

async fn report_access(State(keys): State<AdminKeys>, request: Request, next: Next) -> Response {
    if !keys.enabled() || keys.admits(&request) {
        return next.run(request).await;
    }
    let page = matches!(request.uri().path(), "/" | "/dashboard");
    let mut response = GatewayError::AdminKeyRequired.into_response();
    if page {
        // A browser asks for a user name and password once and sends them on
        // with the page's `/stats` polls; the password is the admin key.
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"corral\", charset=\"UTF-8\""),
        );
    }
    response
}

async fn admin_access(State(keys): State<AdminKeys>, request: Request, next: Next) -> Response {
    if !keys.enabled() {
        return GatewayError::AdminDisabled.into_response();
    }
    if !keys.admits(&request) {
        return GatewayError::AdminKeyRequired.into_response();
    }
    next.run(request).await
}

/// `GET /admin`: what the admin API offers.
async fn index() -> Json<serde_json::Value> {
    Json(json!({
        "endpoints": [{
            "method": "POST",
            "path": "/admin/purge",
            "body": "exactly one of {\"fingerprint\": hex}, {\"model\": name}, {\"tenant\": name}, {\"all\": true}",
        }],
    }))
}

async fn unknown(request: Request) -> GatewayError {
    GatewayError::UnknownPath {
        path: request.uri().path().to_owned(),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PurgeBody {
    fingerprint: Option<String>,
    model: Option<String>,
    tenant: Option<String>,
    all: Option<bool>,
}

impl PurgeBody {
    fn scope(self, per_tenant: bool) -> Result<PurgeScope, GatewayError> {
        let named = |param: &'static str, name: String| {
            if name.is_empty() || name.len() > MAX_NAME {
                return Err(GatewayError::invalid_param(
                    param,
                    format!("`{param}` must be 1 to {MAX_NAME} bytes"),
                ));
            }
            Ok(name)
        };
        match self {
            Self {
                fingerprint: Some(hex),
                model: None,
                tenant: None,
                all: None,
            } => Fingerprint::from_hex(hex.trim())
                .map(PurgeScope::Fingerprint)
                .ok_or_else(|| {
                    GatewayError::invalid_param(
                        "fingerprint",
                        "`fingerprint` must be the 64 hex digits of an x-corral-fingerprint header",
                    )
                }),
            Self {
                fingerprint: None,
                model: Some(model),
                tenant: None,
                all: None,
            } => Ok(PurgeScope::Model(named("model", model)?)),
            Self {
                fingerprint: None,
                model: None,
                tenant: Some(tenant),
                all: None,
            } => {
                if !per_tenant {
                    return Err(GatewayError::invalid_param(
                        "tenant",
                        "cache.scope is global: entries are shared by every tenant and belong to none; purge by model, fingerprint or all",
                    ));
                }
                Ok(PurgeScope::Tenant(named("tenant", tenant)?))
            }
            Self {
                fingerprint: None,
                model: None,
                tenant: None,
                all: Some(true),
            } => Ok(PurgeScope::All),
            _ => Err(GatewayError::invalid(
                "send exactly one of {\"fingerprint\": hex}, {\"model\": name}, {\"tenant\": name} or {\"all\": true}",
            )),
        }
    }
}

/// `POST /admin/purge`.
async fn purge(State(app): State<Arc<AppState>>, body: Body) -> Result<Response, GatewayError> {
    // The edge's one body reader, bounded in bytes and time.
    let body =
        super::pipeline::read_body(body, MAX_PURGE_BODY, app.config().server.body_read_timeout)
            .await?;
    let body: PurgeBody = serde_json::from_slice(&body)
        .map_err(|err| GatewayError::invalid(format!("the purge body is not valid: {err}")))?;
    let scope = body.scope(app.purges().per_tenant())?;
    let reach = app
        .purges()
        .purge(&scope)
        .await
        .map_err(|_| GatewayError::PurgeNotRecorded)?;
    let purged = match &scope {
        PurgeScope::All => json!({"all": true}),
        PurgeScope::Model(model) => json!({"model": model}),
        PurgeScope::Tenant(tenant) => json!({"tenant": tenant}),
        PurgeScope::Fingerprint(fingerprint) => json!({"fingerprint": fingerprint.hex()}),
    };
    let fingerprint = match &scope {
        PurgeScope::Fingerprint(fingerprint) => fingerprint.short_hex().to_string(),
        _ => "-".to_owned(),
    };
    tracing::info!(
        scope = scope_kind(&scope),
        fingerprint,
        reach = reach.as_str(),
        "purged"
    );
    Ok((
        StatusCode::OK,
        Json(json!({"purged": purged, "reach": reach.as_str()})),
    )
        .into_response())
}

fn scope_kind(scope: &PurgeScope) -> &'static str {
    match scope {
        PurgeScope::All => "all",
        PurgeScope::Model(_) => "model",
        PurgeScope::Tenant(_) => "tenant",
        PurgeScope::Fingerprint(_) => "fingerprint",
    }
}
