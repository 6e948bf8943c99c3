//! OpenAI, and every provider compatible with it: `Authorization: Bearer`.

use axum::http::{HeaderValue, header};

use super::{Account, Adapter, Call, Prepared, confined_url, with_model};
use crate::{auth, config::ProviderKind, error::GatewayError};

#[derive(Debug)]
pub(super) struct OpenAi {
    account: Account,
    owner: auth::Provider,
}

impl OpenAi {
    pub(super) fn new(account: Account) -> Self {
        let owner =
            auth::Provider::of_upstream(crate::config::Api::OpenAi, account.base.host_str());
        Self { account, owner }
    }
}

impl Adapter for OpenAi {
    fn kind(&self) -> ProviderKind {
        ProviderKind::OpenAi
    }

    fn base(&self) -> &reqwest::Url {
        &self.account.base
    }

    fn owner(&self) -> auth::Provider {
        self.owner
    }

    fn has_own_credential(&self) -> bool {
        self.account.api_key.is_some()
    }

    /// Corral's own key as a bearer token, else the caller's `Authorization`
    /// as it came (scheme included).
    fn prepare(
        &self,
        call: &Call<'_>,
        _token: Option<&HeaderValue>,
    ) -> Result<Prepared, GatewayError> {
        let mut headers = Vec::with_capacity(1);
        match (&self.account.api_key, call.authorization) {
            (Some(key), _) => headers.push((
                header::AUTHORIZATION,
                super::sensitive(format!("Bearer {}", key.expose()).as_bytes())?,
            )),
            (None, Some(caller)) => headers.push((header::AUTHORIZATION, caller.clone())),
            (None, None) => {}
        }
        let body = match self.account.deployment(call) {
            Some(name) => with_model(call.body, name),
            None => call.body.clone(),
        };
        Ok(Prepared {
            url: confined_url(&self.account.base, call.path, call.query)?,
            headers,
            body,
        })
    }
}
