//! Google Vertex AI: Claude and Gemini models of one project and location,
//! the account's `base_url` naming both
//! (`https://us-east5-aiplatform.googleapis.com/v1/projects/my-proj/locations/us-east5`).
//!
//! - An Anthropic pool's Messages go to
//!   `{base_url}/publishers/anthropic/models/{model}:rawPredict` (or
//!   `:streamRawPredict` for `"stream": true`), the model out of the body and
//!   `"anthropic_version": "vertex-2023-10-16"` in it; a token count goes to
//!   `.../models/count-tokens:rawPredict`, the model kept in the body. This is
//!   what Anthropic's own `AnthropicVertex` client sends, `anthropic-beta`
//!   header included, as the caller sent it.
//! - A Gemini pool's `/models/{model}:{method}` goes to
//!   `{base_url}/publishers/google/models/{model}:{method}`, with the query
//!   (`alt=sse`) and the body as they came: Vertex speaks Gemini's wire.
//!
//! Auth is always the account's own: an access token for its service account
//! (`google::ServiceAccountGrant`), fetched by one request for all callers and
//! refreshed before it expires (`token::TokenCache`).

use anyhow::Context as _;
use axum::http::{HeaderValue, header};
use bytes::Bytes;
use serde_json::{Map, Value};

use super::{Account, Adapter, Call, Prepared, google::ServiceAccountGrant, token::TokenCache};
use crate::{
    auth,
    config::{Api, Member},
    error::GatewayError,
};

/// The Messages API version Vertex serves Claude by, in the body (Vertex
/// takes no `anthropic-version` header): the one `AnthropicVertex` sends.
pub const VERTEX_ANTHROPIC_VERSION: &str = "vertex-2023-10-16";

#[derive(Debug)]
pub(super) struct Vertex {
    account: Account,
    /// Which publisher's models the pool calls: Anthropic's or Google's.
    api: Api,
    tokens: TokenCache,
}

impl Vertex {
    pub(super) fn new(
        mut account: Account,
        member: &Member,
        client: &reqwest::Client,
    ) -> anyhow::Result<Self> {
        if !matches!(member.api, Api::Anthropic | Api::Gemini) {
            anyhow::bail!(
                "the Vertex AI account `{}` serves Anthropic's or Gemini's API, not {:?}",
                member.name,
                member.api
            );
        }
        let key = member.service_account.as_ref().with_context(|| {
            format!(
                "the Vertex AI account `{}` has no service account key (credentials_file or credentials_env)",
                member.name
            )
        })?;
        let grant = ServiceAccountGrant::new(key, client.clone())
            .with_context(|| format!("the Vertex AI account `{}`", member.name))?;
        // A caller's credential is never sent here; whatever the host, a
        // Vertex account is Google's.
        account.owner = auth::Provider::Google;
        Ok(Self {
            account,
            api: member.api,
            tokens: TokenCache::new(Box::new(grant)),
        })
    }

    /// The path below the base URL and the body, for a call of Anthropic's
    /// Messages API.
    fn anthropic(&self, call: &Call<'_>) -> Result<(String, Bytes), GatewayError> {
        let mut body = json_object(call.body)?;
        body.entry("anthropic_version")
            .or_insert_with(|| Value::String(VERTEX_ANTHROPIC_VERSION.to_owned()));
        let path = match call.path {
            "/messages" => {
                let named = body.remove("model");
                let model = match (self.account.deployment(call), call.model, &named) {
                    (Some(name), _, _) => name,
                    (None, Some(model), _) => model,
                    (None, None, Some(Value::String(model))) => model,
                    (None, None, _) => {
                        return Err(GatewayError::invalid_param(
                            "model",
                            "a Messages request names its model",
                        ));
                    }
                };
                let specifier = if body.get("stream") == Some(&Value::Bool(true)) {
                    "streamRawPredict"
                } else {
                    "rawPredict"
                };
                format!(
                    "/publishers/anthropic/models/{}:{specifier}",
                    model_segment(model)?
                )
            }
            "/messages/count_tokens" => {
                if let Some(name) = self.account.deployment(call) {
                    body.insert("model".to_owned(), Value::String(name.to_owned()));
                }
                "/publishers/anthropic/models/count-tokens:rawPredict".to_owned()
            }
            path => {
                return Err(GatewayError::invalid(format!(
                    "`{path}` is not served for Claude on Vertex AI: only /v1/messages \
                     and /v1/messages/count_tokens are"
                )));
            }
        };
        let body = serde_json::to_vec(&body)
            .map_err(|error| GatewayError::Internal(error.into()))?
            .into();
        Ok((path, body))
    }

    /// The path below the base URL for a call of Gemini's API.
    fn gemini(&self, call: &Call<'_>) -> Result<String, GatewayError> {
        let not_served = || {
            GatewayError::invalid(format!(
                "`{}` is not served for Gemini on Vertex AI: only /models/{{model}}:{{method}} is",
                call.path
            ))
        };
        let (model, method) = call
            .path
            .strip_prefix("/models/")
            .and_then(|rest| rest.split_once(':'))
            .ok_or_else(not_served)?;
        if method.is_empty() || !method.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(not_served());
        }
        let model = self
            .account
            .deployments
            .get(model)
            .map_or(model, String::as_str);
        Ok(format!(
            "/publishers/google/models/{}:{method}",
            model_segment(model)?
        ))
    }
}

impl Adapter for Vertex {
    fn account(&self) -> &Account {
        &self.account
    }

    fn has_own_credential(&self) -> bool {
        true
    }

    fn token(&self) -> Option<&TokenCache> {
        Some(&self.tokens)
    }

    /// The caller's query goes to Gemini's methods (`alt=sse`), not to
    /// Claude's, whose only one (`beta=true`, from Anthropic's SDKs) Vertex
    /// has no use for.
    fn prepare(
        &self,
        call: &Call<'_>,
        token: Option<&HeaderValue>,
    ) -> Result<Prepared, GatewayError> {
        let (path, query, body) = match self.api {
            Api::Gemini => (self.gemini(call)?, call.query, call.body.clone()),
            _ => {
                let (path, body) = self.anthropic(call)?;
                (path, None, body)
            }
        };
        let headers = token
            .map(|token| (header::AUTHORIZATION, token.clone()))
            .into_iter()
            .collect();
        Ok(Prepared {
            url: self.account.url(&path, query)?,
            headers,
            body,
        })
    }
}

/// The request body as a JSON object: Messages are nothing else.
fn json_object(body: &Bytes) -> Result<Map<String, Value>, GatewayError> {
    serde_json::from_slice(body)
        .map_err(|_| GatewayError::invalid("the request body is not a JSON object"))
}

/// `model` as one path segment: a Vertex model id (`claude-sonnet-4-5@20250929`,
/// `gemini-2.5-pro`) is letters, digits and `-._@`; anything else would
/// change the path rather than name a model.
fn model_segment(model: &str) -> Result<&str, GatewayError> {
    let valid = !model.is_empty()
        && !model.starts_with('.')
        && model
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'@'));
    if valid {
        Ok(model)
    } else {
        Err(GatewayError::invalid_param(
            "model",
            format!(
                "{:?} is not a Vertex AI model id (letters, digits and -._@)",
                model.chars().take(100).collect::<String>()
            ),
        ))
    }
}

#[cfg(test)]
mod tests;
