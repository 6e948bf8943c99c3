//! Gemini's native API (`/models/{model}:{method}` below its version):
//! `x-goog-api-key`, or an OAuth token as `Authorization`.

use axum::http::{HeaderValue, header};

use super::{Account, Adapter, Call, Prepared};
use crate::{auth::GEMINI_KEY_HEADER, error::GatewayError};

#[derive(Debug)]
pub(super) struct Gemini {
    pub(super) account: Account,
}

impl Adapter for Gemini {
    fn account(&self) -> &Account {
        &self.account
    }

    /// The caller's Gemini key as it is; an OAuth token (`Bearer <token>`,
    /// from `?access_token=`, `auth::gemini_key`) as `Authorization`. The
    /// model named in the path becomes the account's name for it.
    fn prepare(
        &self,
        call: &Call<'_>,
        _token: Option<&HeaderValue>,
    ) -> Result<Prepared, GatewayError> {
        let mut headers = Vec::with_capacity(1);
        match (self.account.key_value()?, call.authorization) {
            (Some(key), _) => headers.push((GEMINI_KEY_HEADER, key)),
            (None, Some(caller)) if caller.as_bytes().starts_with(b"Bearer ") => {
                let mut bearer = caller.clone();
                bearer.set_sensitive(true);
                headers.push((header::AUTHORIZATION, bearer));
            }
            (None, Some(caller)) => {
                let mut key = caller.clone();
                key.set_sensitive(true);
                headers.push((GEMINI_KEY_HEADER, key));
            }
            (None, None) => {}
        }
        let renamed = match (call.model, self.account.deployment(call)) {
            (Some(model), Some(name)) => call
                .path
                .strip_prefix("/models/")
                .and_then(|rest| rest.strip_prefix(model))
                .filter(|method| method.starts_with(':'))
                .map(|method| format!("/models/{name}{method}")),
            _ => None,
        };
        Ok(Prepared {
            url: self
                .account
                .url(renamed.as_deref().unwrap_or(call.path), call.query)?,
            headers,
            body: call.body.clone(),
        })
    }
}
