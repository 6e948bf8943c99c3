//! OpenAI, and every provider compatible with it: `Authorization: Bearer`.

use axum::http::{HeaderValue, header};

use super::{Account, Adapter, Call, Prepared};
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
        match (self.account.bearer_value()?, call.authorization) {
            (Some(bearer), _) => headers.push((header::AUTHORIZATION, bearer)),
            (None, Some(caller)) => headers.push((header::AUTHORIZATION, caller.clone())),
            (None, None) => {}
        }
        let body = self.account.body(call);
        Ok(Prepared {
            url: self.account.url(call.path, call.query)?,
            headers,
            body,
        })
    }
}
