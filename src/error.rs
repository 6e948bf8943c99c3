//! `GatewayError`: every way a request can fail, and its one mapping to an
//! OpenAI-style HTTP response, so SDKs raise the exception they would raise
//! against the provider itself.

use std::time::Duration;

use axum::{
    extract::rejection::BytesRejection,
    http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use bytes::Bytes;
use serde_json::json;

/// The header both OpenAI SDKs read before deciding to retry a failed call.
const SHOULD_RETRY: HeaderName = HeaderName::from_static("x-should-retry");

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("{message}")]
    InvalidRequest {
        message: String,
        param: Option<&'static str>,
    },
    #[error("request body is larger than the limit of {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error("no upstream is configured for model `{model}`")]
    NoRoute { model: String },
    #[error("unknown path {path}")]
    UnknownPath { path: String },
    #[error("too many callers are waiting for this request; retry in {}s", .retry_after.as_secs().max(1))]
    TooManyWaiters { retry_after: Duration },
    #[error("timed out waiting for an identical in-flight request")]
    WaitTimedOut,
    #[error("upstream {upstream} is unreachable: {reason}")]
    UpstreamUnreachable { upstream: String, reason: String },
    #[error("upstream {upstream} did not answer in time")]
    UpstreamTimeout { upstream: String },
    #[error("upstream {upstream} sent an invalid response: {reason}")]
    UpstreamInvalid { upstream: String, reason: String },
    /// The provider's own error, relayed with its status and body.
    #[error("upstream answered {status}")]
    Upstream {
        status: StatusCode,
        content_type: Option<HeaderValue>,
        retry_after: Option<HeaderValue>,
        body: Bytes,
    },
    /// Detail goes to the logs, never to the client.
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
    /// No or an unknown gateway key (the key itself is never echoed).
    #[error(
        "Incorrect or missing API key. Send a corral gateway key as `Authorization: Bearer <key>`."
    )]
    Unauthorized,
    #[error("rate limit reached for {reason}; retry in {}s", .retry_after.as_secs().max(1))]
    RateLimited {
        retry_after: Duration,
        reason: &'static str,
    },
    #[error("upstream {upstream} is failing and its circuit is open; retry in {}s", .retry_after.as_secs().max(1))]
    CircuitOpen {
        upstream: String,
        retry_after: Duration,
    },
    #[error("the gateway is serving as many requests as it may; retry in {}s", .retry_after.as_secs().max(1))]
    Overloaded { retry_after: Duration },
    #[error("the request body did not arrive within {}s", .timeout.as_secs_f64())]
    BodyTimeout { timeout: Duration },
    #[error("the gateway is shutting down; retry")]
    ShuttingDown,
    /// A pass-through path that could leave the provider's API (`passthrough.rs`).
    #[error("the request path is refused: {reason}; corral forwards only plain /v1/ paths")]
    PathRefused { reason: &'static str },
    /// The pass-through policy refuses this endpoint; `setting` says which setting decides.
    #[error("`{method} {path}` is not passed through: {setting}")]
    PassthroughDenied {
        method: axum::http::Method,
        path: String,
        setting: &'static str,
    },
    /// An `Idempotency-Key` bound (within the retry window) to another request.
    #[error(
        "this Idempotency-Key was already used with a different request; send a new key with a new request"
    )]
    IdempotencyKeyReused,
    /// An operator endpoint without a valid admin key (`auth.admin_keys`); a
    /// gateway key is not one. The key itself is never echoed.
    #[error(
        "this endpoint requires an admin key: send one of auth.admin_keys as `Authorization: Bearer <key>`"
    )]
    AdminKeyRequired,
    /// `/admin/*` while no admin key is configured: the admin API is off.
    #[error("the admin API is off: set auth.admin_keys or auth.admin_keys_env to turn it on")]
    AdminDisabled,
    /// Redis is configured but could not record a purge; nothing was purged.
    #[error(
        "the purge could not be recorded in Redis for the other instances; nothing was purged, retry"
    )]
    PurgeNotRecorded,
}

impl GatewayError {
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::InvalidRequest {
            message: message.into(),
            param: None,
        }
    }

    pub fn invalid_param(param: &'static str, message: impl Into<String>) -> Self {
        Self::InvalidRequest {
            message: message.into(),
            param: Some(param),
        }
    }

    /// Status, OpenAI error `type` and `code`. No `_` arm: a new variant must
    /// choose its status here.
    fn status_type_code(&self) -> (StatusCode, &'static str, Option<&'static str>) {
        match self {
            Self::InvalidRequest { .. } => (StatusCode::BAD_REQUEST, "invalid_request_error", None),
            Self::BodyTooLarge { .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                Some("request_too_large"),
            ),
            Self::NoRoute { .. } => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                Some("model_not_found"),
            ),
            Self::UnknownPath { .. } => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                Some("unknown_url"),
            ),
            Self::TooManyWaiters { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                Some("too_many_waiters"),
            ),
            Self::WaitTimedOut => (
                StatusCode::GATEWAY_TIMEOUT,
                "timeout_error",
                Some("coalesce_wait_timeout"),
            ),
            Self::UpstreamUnreachable { .. } => (
                StatusCode::BAD_GATEWAY,
                "server_error",
                Some("upstream_unreachable"),
            ),
            Self::UpstreamTimeout { .. } => (
                StatusCode::GATEWAY_TIMEOUT,
                "timeout_error",
                Some("upstream_timeout"),
            ),
            Self::UpstreamInvalid { .. } => (
                StatusCode::BAD_GATEWAY,
                "server_error",
                Some("upstream_invalid_response"),
            ),
            Self::Upstream { status, .. } => (*status, "upstream_error", None),
            Self::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "server_error", None),
            Self::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                Some("invalid_api_key"),
            ),
            Self::RateLimited { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "requests",
                Some("rate_limit_exceeded"),
            ),
            Self::CircuitOpen { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                Some("upstream_circuit_open"),
            ),
            Self::Overloaded { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                Some("server_overloaded"),
            ),
            Self::BodyTimeout { .. } => (
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                Some("request_timeout"),
            ),
            Self::ShuttingDown => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                Some("shutting_down"),
            ),
            Self::PathRefused { .. } => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("invalid_path"),
            ),
            Self::PassthroughDenied { .. } => (
                StatusCode::FORBIDDEN,
                "invalid_request_error",
                Some("passthrough_denied"),
            ),
            Self::IdempotencyKeyReused => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_request_error",
                Some("idempotency_key_reused"),
            ),
            Self::AdminKeyRequired => (
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                Some("invalid_admin_key"),
            ),
            Self::AdminDisabled => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                Some("admin_disabled"),
            ),
            Self::PurgeNotRecorded => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                Some("purge_not_recorded"),
            ),
        }
    }

    pub fn status(&self) -> StatusCode {
        self.status_type_code().0
    }

    /// When the caller may try again, for the errors that know.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::TooManyWaiters { retry_after }
            | Self::RateLimited { retry_after, .. }
            | Self::CircuitOpen { retry_after, .. }
            | Self::Overloaded { retry_after } => Some(*retry_after),
            Self::ShuttingDown | Self::PurgeNotRecorded => Some(Duration::from_secs(1)),
            _ => None,
        }
    }

    /// Whether this error ends corral's own retry loop for an upstream call
    /// (`upstream/retry.rs`, at most `retry.max_attempts` attempts). Its
    /// response then says `x-should-retry: false`, which both OpenAI SDKs
    /// obey: their own retries on top would multiply the attempts a provider
    /// that answers 429 sees.
    pub fn ends_upstream_retries(&self) -> bool {
        matches!(
            self,
            Self::Upstream { .. }
                | Self::UpstreamTimeout { .. }
                | Self::UpstreamUnreachable { .. }
                | Self::UpstreamInvalid { .. }
        )
    }

    /// Whether this failure is local to this instance (its circuit, its rate
    /// cap, its waiter caps, its shutdown), not an answer about the request:
    /// it is never recorded in Redis for the cluster's other instances.
    pub fn is_local_to_instance(&self) -> bool {
        matches!(
            self,
            Self::CircuitOpen { .. }
                | Self::RateLimited { .. }
                | Self::TooManyWaiters { .. }
                | Self::Overloaded { .. }
                | Self::ShuttingDown
                | Self::WaitTimedOut
        )
    }

    /// Builds the response without consuming the error: one failed flight is
    /// relayed to every caller that waited on it.
    pub fn to_response(&self) -> Response {
        let (status, headers, body) = self.parts();
        if status.is_server_error() {
            tracing::warn!(error = %self, source = ?std::error::Error::source(self), "request failed");
        }
        (status, headers, body).into_response()
    }

    /// Status, headers and body of the error response, synchronously: a
    /// flight's error is also recorded in Redis for followers on other instances.
    pub fn parts(&self) -> (StatusCode, HeaderMap, Bytes) {
        let (status, kind, code) = self.status_type_code();
        let mut headers = HeaderMap::new();
        let body = match self {
            Self::Upstream {
                content_type,
                retry_after,
                body,
                ..
            } => {
                if let Some(value) = retry_after {
                    headers.insert(header::RETRY_AFTER, value.clone());
                }
                if let Some(value) = content_type {
                    headers.insert(header::CONTENT_TYPE, value.clone());
                }
                headers.insert(SHOULD_RETRY, HeaderValue::from_static("false"));
                body.clone()
            }
            _ => {
                if let Some(retry_after) = self.retry_after() {
                    headers.insert(
                        header::RETRY_AFTER,
                        HeaderValue::from(retry_after.as_secs().max(1)),
                    );
                }
                if self.ends_upstream_retries() {
                    headers.insert(SHOULD_RETRY, HeaderValue::from_static("false"));
                }
                if let Self::Unauthorized | Self::AdminKeyRequired = self {
                    headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                }
                headers.insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                let param = match self {
                    Self::InvalidRequest { param, .. } => *param,
                    _ => None,
                };
                Bytes::from(
                    json!({"error": {"message": self.to_string(), "type": kind, "param": param, "code": code}})
                        .to_string(),
                )
            }
        };
        (status, headers, body)
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        self.to_response()
    }
}

impl From<BytesRejection> for GatewayError {
    fn from(rejection: BytesRejection) -> Self {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            // The limit itself is reported by the handler, which knows it.
            Self::BodyTooLarge { limit: 0 }
        } else {
            Self::invalid(format!("could not read the request body: {rejection}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body_json(response: Response) -> serde_json::Value {
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[tokio::test]
    async fn gateway_errors_have_the_openai_shape() {
        let response =
            GatewayError::invalid_param("model", "you must provide a model").to_response();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        let body = body_json(response).await;
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["param"], "model");
        assert_eq!(body["error"]["message"], "you must provide a model");
    }

    #[tokio::test]
    async fn too_many_waiters_carries_retry_after() {
        let response = GatewayError::TooManyWaiters {
            retry_after: Duration::from_secs(2),
        }
        .to_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
    }

    #[tokio::test]
    async fn protection_errors_carry_their_status_code_and_retry_after() {
        let limited = GatewayError::RateLimited {
            retry_after: Duration::from_secs(3),
            reason: "this API key's request rate",
        }
        .to_response();
        assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(limited.headers()[header::RETRY_AFTER], "3");
        assert_eq!(
            body_json(limited).await["error"]["code"],
            "rate_limit_exceeded"
        );
        let open = GatewayError::CircuitOpen {
            upstream: "openai".into(),
            retry_after: Duration::from_secs(9),
        }
        .to_response();
        assert_eq!(open.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(open.headers()[header::RETRY_AFTER], "9");
        let unauthorized = GatewayError::Unauthorized.to_response();
        assert_eq!(unauthorized.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(unauthorized.headers()[header::WWW_AUTHENTICATE], "Bearer");
        assert_eq!(
            body_json(unauthorized).await["error"]["code"],
            "invalid_api_key"
        );
        assert_eq!(
            GatewayError::BodyTimeout {
                timeout: Duration::from_secs(1)
            }
            .status(),
            StatusCode::REQUEST_TIMEOUT
        );
    }

    #[test]
    fn relayed_provider_errors_tell_sdks_not_to_retry_on_top() {
        let limited = GatewayError::Upstream {
            status: StatusCode::TOO_MANY_REQUESTS,
            content_type: None,
            retry_after: Some(HeaderValue::from_static("7")),
            body: Bytes::new(),
        }
        .to_response();
        assert_eq!(limited.headers()["x-should-retry"], "false");
        assert_eq!(limited.headers()[header::RETRY_AFTER], "7");
        let timeout = GatewayError::UpstreamTimeout {
            upstream: "openai".into(),
        }
        .to_response();
        assert_eq!(timeout.headers()["x-should-retry"], "false");
        // corral's own refusals leave the SDK's retry decision alone.
        let open = GatewayError::CircuitOpen {
            upstream: "openai".into(),
            retry_after: Duration::from_secs(1),
        }
        .to_response();
        assert!(open.headers().get("x-should-retry").is_none());
    }

    #[tokio::test]
    async fn internal_detail_stays_out_of_the_body() {
        let response = GatewayError::Internal(anyhow::anyhow!("secret detail")).to_response();
        let body = body_json(response).await;
        assert_eq!(body["error"]["message"], "internal error");
    }
}
