//! Azure OpenAI: OpenAI's wire at an Azure resource. Two shapes, by whether
//! the account names an `api_version`:
//! - v1 (none): `{base_url}/chat/completions`, the deployment in the body's
//!   `model` (`https://{resource}.openai.azure.com/openai/v1`);
//! - versioned: `{base_url}/deployments/{deployment}/chat/completions
//!   ?api-version=...` for the endpoints Azure routes by deployment, and
//!   `{base_url}/responses?api-version=...` for the others
//!   (`https://{resource}.openai.azure.com/openai`).
//!
//! Auth is the account's `api-key`, or an Entra ID token (`entra`) fetched
//! by one request for all callers and refreshed before it expires
//! (`token::TokenCache`); a caller's own credential, when the account has
//! neither, goes as `api-key` (an Azure key has no form of its own: only
//! another provider's form is refused, by `owner`).

use axum::http::{HeaderValue, header};

use super::{Account, Adapter, Call, Prepared, entra::EntraGrant, token::TokenCache};
use crate::{
    auth::{AZURE_KEY_HEADER, bearer_token},
    config::Member,
    error::GatewayError,
};

/// The endpoints Azure's versioned API routes by deployment (the others,
/// `/responses`, `/files`, `/models`, are below the resource).
const BY_DEPLOYMENT: [&str; 6] = [
    "/chat/completions",
    "/completions",
    "/embeddings",
    "/audio/transcriptions",
    "/audio/speech",
    "/images/generations",
];

#[derive(Debug)]
pub(super) struct Azure {
    account: Account,
    /// `api-version=...`, made once: what the versioned shape's every URL ends in.
    version_query: Option<String>,
    entra: Option<TokenCache>,
}

impl Azure {
    pub(super) fn new(
        account: Account,
        member: &Member,
        client: &reqwest::Client,
    ) -> anyhow::Result<Self> {
        let entra = member
            .entra
            .as_ref()
            .map(|entra| -> anyhow::Result<TokenCache> {
                let secret = entra.client_secret.clone().ok_or_else(|| {
                    anyhow::anyhow!(
                        "the Entra client secret of `{}` was not resolved",
                        member.name
                    )
                })?;
                let grant = EntraGrant::new(
                    &entra.authority,
                    &entra.tenant_id,
                    &entra.client_id,
                    secret,
                    client.clone(),
                )?;
                Ok(TokenCache::new(Box::new(grant)))
            })
            .transpose()?;
        Ok(Self {
            account,
            version_query: member.api_version.as_ref().map(|version| {
                form_urlencoded::Serializer::new(String::new())
                    .append_pair("api-version", version)
                    .finish()
            }),
            entra,
        })
    }

    /// The path below the base URL: in the versioned shape, the endpoints
    /// Azure routes by deployment go below `/deployments/{deployment}`.
    fn path(&self, call: &Call<'_>) -> String {
        match (&self.version_query, call.model) {
            (Some(_), Some(model)) if BY_DEPLOYMENT.contains(&call.path) => {
                let deployment = self.account.deployment(call).unwrap_or(model);
                format!("/deployments/{deployment}{}", call.path)
            }
            _ => call.path.to_owned(),
        }
    }

    /// The query: the caller's pairs but its `api-version`, then the
    /// account's (the version names Azure's wire, which this account speaks).
    fn query(&self, call: &Call<'_>) -> Option<String> {
        let Some(version) = &self.version_query else {
            return call.query.map(str::to_owned);
        };
        let Some(caller) = call.query.filter(|query| !query.is_empty()) else {
            return Some(version.clone());
        };
        let mut query = form_urlencoded::Serializer::new(String::new());
        for (name, value) in form_urlencoded::parse(caller.as_bytes()) {
            if name != "api-version" {
                query.append_pair(&name, &value);
            }
        }
        let mut query = query.finish();
        if !query.is_empty() {
            query.push('&');
        }
        query.push_str(version);
        Some(query)
    }
}

impl Adapter for Azure {
    fn account(&self) -> &Account {
        &self.account
    }

    fn has_own_credential(&self) -> bool {
        self.account.api_key.is_some() || self.entra.is_some()
    }

    fn token(&self) -> Option<&TokenCache> {
        self.entra.as_ref()
    }

    fn prepare(
        &self,
        call: &Call<'_>,
        token: Option<&HeaderValue>,
    ) -> Result<Prepared, GatewayError> {
        let mut headers = Vec::with_capacity(1);
        match (self.account.key_value()?, token, call.authorization) {
            (Some(key), _, _) => headers.push((AZURE_KEY_HEADER, key)),
            (None, Some(token), _) => headers.push((header::AUTHORIZATION, token.clone())),
            (None, None, Some(caller)) => headers.push((
                AZURE_KEY_HEADER,
                super::sensitive(bearer_token(caller.as_bytes()))?,
            )),
            (None, None, None) => {}
        }
        let body = self.account.body(call);
        let query = self.query(call);
        Ok(Prepared {
            url: self.account.url(&self.path(call), query.as_deref())?,
            headers,
            body,
        })
    }
}
