//! PLACEHOLDER (replaced by the entra branch).
use crate::config::Secret;
use std::time::Duration;
pub struct Issued {
    pub token: Secret<String>,
    pub lifetime: Duration,
}
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("token endpoint failed")]
    Failed,
}
#[async_trait::async_trait]
pub trait Grant: Send + Sync + std::fmt::Debug {
    async fn issue(&self) -> Result<Issued, TokenError>;
}
#[derive(Debug)]
pub struct TokenCache {
    grant: Box<dyn Grant>,
}
impl TokenCache {
    pub fn new(grant: Box<dyn Grant>) -> Self {
        Self { grant }
    }
    pub async fn bearer(&self) -> Result<http::HeaderValue, TokenError> {
        let issued = self.grant.issue().await?;
        Ok(
            http::HeaderValue::from_str(&format!("Bearer {}", issued.token.expose()))
                .map_err(|_| TokenError::Failed)?,
        )
    }
}
