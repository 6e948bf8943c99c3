//! Every other `/v1/*` path is proxied through by the pass-through
//! (`passthrough/`): the path must stay inside the provider's API, and the
//! body is read here, bounded, as every body at the edge is.

use std::sync::Arc;

use axum::{
    extract::{FromRequest, Request, State},
    http::Uri,
    response::Response,
};
use bytes::Bytes;

use super::routed_body;
use crate::{
    error::{ErrorShape, GatewayError},
    passthrough::ProxyPath,
    state::AppState,
};

pub async fn passthrough(State(app): State<Arc<AppState>>, request: Request) -> Response {
    let shape = ErrorShape::for_path(request.uri().path());
    proxy(app, request)
        .await
        .unwrap_or_else(|error| error.to_response_as(shape))
}

async fn proxy(app: Arc<AppState>, request: Request) -> Result<Response, GatewayError> {
    let (mut parts, body) = request.into_parts();
    // The raw path, not a percent-decoded one: `%2e%2e` must be seen as what
    // the provider (or a URL parser) would make of it.
    let path = ProxyPath::parse(parts.uri.path())?;
    let method = parts.method.clone();
    let headers = std::mem::take(&mut parts.headers);
    let query = parts.uri.query().map(str::to_owned);
    let body = Bytes::from_request(Request::from_parts(parts, body), &()).await;
    let body = routed_body(body, app.config.limits.max_body_bytes)?;
    app.passthrough()
        .serve(method, path, headers, query, body)
        .await
}

pub async fn unknown_path(uri: Uri) -> GatewayError {
    GatewayError::UnknownPath {
        path: uri.path().to_owned(),
    }
}
