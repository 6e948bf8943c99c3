//! Every `/v1/*` request that is not a deduplicated endpoint's `POST` is
//! proxied through by the pass-through (`passthrough/`), its body as
//! admission read it: the path must stay inside the provider's API. Gemini's
//! native API (`/v1beta/*`, a Gemini model method, a Gemini key) goes to a
//! Gemini upstream only (404 in Gemini's shape without one). A call the
//! provider bills is held to the caller's budgets (`passthrough/paid.rs`).

use std::sync::Arc;

use axum::{
    http::{Uri, request::Parts},
    response::Response,
};
use bytes::Bytes;

use crate::{
    auth,
    error::{ErrorShape, GatewayError},
    passthrough::{ProxyPath, decoded_path, gemini},
    state::AppState,
    tenant::TenantScope,
};

/// Serves an admitted pass-through request of `tenant` (its own scope, as
/// admission found it); an error is answered in the shape of the API its
/// path belongs to.
pub(super) async fn serve(
    app: &AppState,
    parts: Parts,
    body: Bytes,
    tenant: &TenantScope,
) -> Response {
    // The tenant's name in the books and budgets, as a deduplicated call's.
    // One key, one label, wherever it was sent (`auth::credential`); a
    // credential admission read is read the same way here.
    let credential = auth::credential(&parts.headers, parts.uri.query())
        .ok()
        .flatten();
    let tenant = app.auth().tenant_label(credential.as_deref(), Some(tenant));
    let path = parts.uri.path();
    // Recognized as the provider reads the path, as the pipeline did.
    if gemini::is_native(&decoded_path(path), &parts.headers, parts.uri.query()) {
        return app
            .passthrough()
            .serve_gemini(
                parts.method,
                path,
                &parts.headers,
                parts.uri.query(),
                body,
                &tenant,
            )
            .await
            .unwrap_or_else(|error| error.to_response_as(ErrorShape::Gemini));
    }
    let shape = ErrorShape::for_path(&decoded_path(path));
    proxy(app, parts, body, &tenant)
        .await
        .unwrap_or_else(|error| error.to_response_as(shape))
}

async fn proxy(
    app: &AppState,
    parts: Parts,
    body: Bytes,
    tenant: &Arc<str>,
) -> Result<Response, GatewayError> {
    // The raw path, not a percent-decoded one: `%2e%2e` must be seen as what
    // the provider (or a URL parser) would make of it.
    let path = ProxyPath::parse(parts.uri.path())?;
    let query = parts.uri.query().map(str::to_owned);
    app.passthrough()
        .serve(parts.method, path, parts.headers, query, body, tenant)
        .await
}

pub async fn unknown_path(uri: Uri) -> GatewayError {
    GatewayError::UnknownPath {
        path: uri.path().to_owned(),
    }
}
