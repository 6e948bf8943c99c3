//! Google Vertex AI (to be written).

use axum::http::HeaderValue;

use super::{Account, Adapter, Call, Prepared};
use crate::{
    config::{Member, ProviderKind},
    error::GatewayError,
};

#[derive(Debug)]
pub(super) struct Vertex {
    account: Account,
}

impl Vertex {
    pub(super) fn new(
        account: Account,
        _member: &Member,
        _client: &reqwest::Client,
    ) -> anyhow::Result<Self> {
        Ok(Self { account })
    }
}

impl Adapter for Vertex {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Vertex
    }

    fn account(&self) -> &Account {
        &self.account
    }

    fn prepare(
        &self,
        _call: &Call<'_>,
        _token: Option<&HeaderValue>,
    ) -> Result<Prepared, GatewayError> {
        Err(GatewayError::invalid("Vertex accounts are not served yet"))
    }
}
