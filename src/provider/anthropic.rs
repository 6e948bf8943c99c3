//! Anthropic's Messages API: `x-api-key` and `anthropic-version`.

use axum::http::{HeaderName, HeaderValue, header};

use super::{Account, Adapter, Call, Prepared};
use crate::{
    auth::{API_KEY_HEADER, bearer_token},
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

#[derive(Debug)]
pub(super) struct Anthropic {
    pub(super) account: Account,
}

impl Adapter for Anthropic {
    fn account(&self) -> &Account {
        &self.account
    }

    /// `x-api-key`: corral's own key, else the caller's bearer token or
    /// `x-api-key` (an OAuth access token stays a bearer token, the only form
    /// Anthropic takes it in); `anthropic-version` when the caller sent none.
    fn prepare(
        &self,
        call: &Call<'_>,
        _token: Option<&HeaderValue>,
    ) -> Result<Prepared, GatewayError> {
        let mut headers = Vec::with_capacity(2);
        match (self.account.key_value()?, call.authorization) {
            (Some(key), _) => headers.push((API_KEY_HEADER, key)),
            (None, Some(caller)) => {
                let token = bearer_token(caller.as_bytes());
                if token.starts_with(ANTHROPIC_OAUTH_TOKEN_PREFIX) {
                    let mut bearer = caller.clone();
                    bearer.set_sensitive(true);
                    headers.push((header::AUTHORIZATION, bearer));
                } else {
                    headers.push((API_KEY_HEADER, super::sensitive(token)?));
                }
            }
            (None, None) => {}
        }
        if !call
            .headers
            .iter()
            .any(|(name, _)| name == ANTHROPIC_VERSION)
        {
            headers.push((
                ANTHROPIC_VERSION,
                HeaderValue::from_static(DEFAULT_ANTHROPIC_VERSION),
            ));
        }
        let body = self.account.body(call);
        Ok(Prepared {
            url: self.account.url(call.path, call.query)?,
            headers,
            body,
        })
    }
}
