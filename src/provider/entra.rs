//! PLACEHOLDER (replaced by the entra branch).
use super::token::{Grant, Issued, TokenError};
use crate::config::Secret;
pub const COGNITIVE_SERVICES_SCOPE: &str = "https://cognitiveservices.azure.com/.default";
#[derive(Debug)]
pub struct EntraGrant;
impl EntraGrant {
    pub fn new(
        _a: &str,
        _t: &str,
        _c: &str,
        _s: Secret<String>,
        _client: reqwest::Client,
    ) -> anyhow::Result<Self> {
        Ok(Self)
    }
}
#[async_trait::async_trait]
impl Grant for EntraGrant {
    async fn issue(&self) -> Result<Issued, TokenError> {
        Err(TokenError::Failed)
    }
}
