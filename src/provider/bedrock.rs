//! AWS Bedrock (to be written): Anthropic's Messages through InvokeModel.

use axum::http::HeaderValue;

use super::{Account, Adapter, Call, Prepared};
use crate::{
    config::{Member, ProviderKind},
    error::GatewayError,
};

#[derive(Debug)]
pub(super) struct Bedrock {
    account: Account,
}

impl Bedrock {
    pub(super) fn new(account: Account, _member: &Member) -> anyhow::Result<Self> {
        Ok(Self { account })
    }
}

impl Adapter for Bedrock {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Bedrock
    }

    fn account(&self) -> &Account {
        &self.account
    }

    fn prepare(
        &self,
        _call: &Call<'_>,
        _token: Option<&HeaderValue>,
    ) -> Result<Prepared, GatewayError> {
        Err(GatewayError::invalid("Bedrock accounts are not served yet"))
    }
}
