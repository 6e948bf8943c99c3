//! OpenAI, and every provider compatible with it: `Authorization: Bearer`.

use axum::http::{HeaderValue, header};

use super::{Account, Adapter, Call, Prepared, confined_url};
use crate::error::GatewayError;

#[derive(Debug)]
pub(super) struct OpenAi {
    pub(super) account: Account,
}

impl Adapter for OpenAi {
    fn account(&self) -> &Account {
        &self.account
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
        let body = self.account.body(call);
        Ok(Prepared {
            url: confined_url(&self.account.base, call.path, call.query)?,
            headers,
            body,
        })
    }
}
