//! What a request to a provider carries beside its body: the credential and
//! version headers each API expects (corral's own key, or the caller's in
//! the form its provider takes), and a URL confined below the member's base
//! URL.

use axum::http::{HeaderName, HeaderValue, header};

use super::Outbound;
use crate::{
    auth::{API_KEY_HEADER, GEMINI_KEY_HEADER, bearer_token},
    config::{Api, Secret},
    error::GatewayError,
};

/// The API version an Anthropic request is sent with when its caller named
/// none (the version every current SDK sends).
pub const DEFAULT_ANTHROPIC_VERSION: &str = "2023-06-01";

const ANTHROPIC_VERSION: HeaderName = HeaderName::from_static("anthropic-version");

/// The prefix of Anthropic's OAuth access tokens (Claude subscriptions, as
/// Claude Code sends them): Anthropic accepts those only as a bearer token,
/// never as `x-api-key`.
const ANTHROPIC_OAUTH_TOKEN_PREFIX: &[u8] = b"sk-ant-oat";

/// Adds the credential in the form the target's API expects: corral's own
/// key when it has one, else the caller's. OpenAI: `Authorization` (the
/// caller's as it came, scheme included). Anthropic: `x-api-key` (the
/// caller's bearer token or `x-api-key`; an OAuth access token stays a bearer
/// token, the only form Anthropic takes it in), plus `anthropic-version` when
/// the caller sent none.
pub(super) fn authenticate(
    mut request: reqwest::RequestBuilder,
    api: Api,
    own_key: Option<&Secret<String>>,
    outbound: &Outbound,
) -> Result<reqwest::RequestBuilder, GatewayError> {
    match api {
        Api::OpenAi => match (own_key, &outbound.authorization) {
            (Some(key), _) => request = request.bearer_auth(key.expose()),
            (None, Some(caller)) => request = request.header(header::AUTHORIZATION, caller),
            (None, None) => {}
        },
        Api::Anthropic => {
            let key = match (own_key, &outbound.authorization) {
                (Some(key), _) => Some(HeaderValue::from_str(key.expose())),
                (None, Some(caller)) => {
                    let token = bearer_token(caller.as_bytes());
                    if token.starts_with(ANTHROPIC_OAUTH_TOKEN_PREFIX) {
                        let mut bearer = caller.clone();
                        bearer.set_sensitive(true);
                        request = request.header(header::AUTHORIZATION, bearer);
                        None
                    } else {
                        Some(HeaderValue::from_bytes(token))
                    }
                }
                (None, None) => None,
            };
            if let Some(key) = key {
                let mut key = key.map_err(|_| {
                    GatewayError::invalid("the API key is not a valid header value")
                })?;
                key.set_sensitive(true);
                request = request.header(API_KEY_HEADER, key);
            }
            if !outbound
                .headers
                .iter()
                .any(|(name, _)| name == ANTHROPIC_VERSION)
            {
                request = request.header(ANTHROPIC_VERSION, DEFAULT_ANTHROPIC_VERSION);
            }
        }
        // The caller's Gemini key as it is; an OAuth token (`Bearer <token>`,
        // from `?access_token=`, `auth::gemini_key`) as `Authorization`.
        Api::Gemini => {
            let key = match (own_key, &outbound.authorization) {
                (Some(key), _) => Some(HeaderValue::from_str(key.expose()).map_err(|_| {
                    GatewayError::invalid("the API key is not a valid header value")
                })?),
                (None, Some(caller)) if caller.as_bytes().starts_with(b"Bearer ") => {
                    let mut bearer = caller.clone();
                    bearer.set_sensitive(true);
                    request = request.header(header::AUTHORIZATION, bearer);
                    None
                }
                (None, Some(caller)) => Some(caller.clone()),
                (None, None) => None,
            };
            if let Some(mut key) = key {
                key.set_sensitive(true);
                request = request.header(GEMINI_KEY_HEADER, key);
            }
        }
    }
    Ok(request)
}

/// The request URL: the base URL joined with the outbound path and query. It
/// must be a strict extension of the base URL's path on the same origin
/// (`passthrough::ProxyPath` already refused every way out; this is the last
/// word, for every caller of the client).
pub(super) fn confined_url(
    base: &reqwest::Url,
    path: &str,
    query: Option<&str>,
) -> Result<reqwest::Url, GatewayError> {
    let base_path = base.path().trim_end_matches('/');
    let mut text = format!("{}{path}", base.as_str().trim_end_matches('/'));
    if let Some(query) = query {
        text.push('?');
        text.push_str(query);
    }
    let refused = || GatewayError::PathRefused {
        reason: "it leads outside the upstream's base_url",
    };
    let url = reqwest::Url::parse(&text).map_err(|_| refused())?;
    let inside = url.origin() == base.origin()
        && url
            .path()
            .strip_prefix(base_path)
            .is_some_and(|rest| rest.len() > 1 && rest.starts_with('/'));
    if inside { Ok(url) } else { Err(refused()) }
}
