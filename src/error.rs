//! `GatewayError`: every way a request can fail, and its one mapping to an
//! HTTP response in the error shape of the API the caller speaks (OpenAI's,
//! Anthropic's on `/v1/messages`, Gemini's under `/v1beta/`), so SDKs raise
//! the exception they would raise against the provider itself.

use std::time::Duration;

use axum::{
    http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use bytes::Bytes;
use serde_json::json;

/// The header the OpenAI and Anthropic SDKs read before deciding to retry a failed call.
const SHOULD_RETRY: HeaderName = HeaderName::from_static("x-should-retry");

/// Which API's error body a response carries: the caller's SDK parses it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ErrorShape {
    /// `{"error":{"message","type","param","code"}}`.
    #[default]
    OpenAi,
    /// `{"type":"error","error":{"type","message"}}`.
    Anthropic,
    /// Google's `{"error":{"code","message","status"}}`, `code` the HTTP
    /// status as an integer: the `google-genai` SDKs raise their own
    /// `APIError` types only for that shape.
    Gemini,
    /// Azure OpenAI's `{"error":{"code","message"}}` (`code` a string), for
    /// callers of Azure's paths.
    Azure,
    /// AWS's `{"message"}` with the error's name in `x-amzn-ErrorType`, for
    /// callers of Bedrock's paths (the AWS SDKs read both).
    Bedrock,
}

impl ErrorShape {
    /// Anthropic's below `/v1/messages` (Messages, `count_tokens`), Gemini's
    /// below `/v1beta/`, Azure's below `/openai/`, OpenAI's everywhere else: a request is answered in its route's shape even when
    /// it is refused before any handler runs (admission).
    pub fn for_path(path: &str) -> Self {
        if path == "/v1beta" || path.starts_with("/v1beta/") {
            return Self::Gemini;
        }
        if path == "/openai" || path.starts_with("/openai/") {
            return Self::Azure;
        }
        if path.starts_with("/model/") {
            return Self::Bedrock;
        }
        match path.strip_prefix("/v1/messages") {
            Some(rest) if rest.is_empty() || rest.starts_with('/') => Self::Anthropic,
            _ => Self::OpenAi,
        }
    }
}

/// What one error is called in each shape, with its status.
struct Mapping {
    status: StatusCode,
    /// OpenAI's `error.type`.
    openai_type: &'static str,
    /// OpenAI's `error.code`.
    code: Option<&'static str>,
    /// Anthropic's `error.type` (it has no code).
    anthropic_type: &'static str,
}

const fn map(
    status: StatusCode,
    openai_type: &'static str,
    code: Option<&'static str>,
    anthropic_type: &'static str,
) -> Mapping {
    Mapping {
        status,
        openai_type,
        code,
        anthropic_type,
    }
}

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
    /// A stream cancelled because every caller left (`coalesce.cancel_when_abandoned`):
    /// this instance's decision, never an answer about the request.
    #[error("the upstream stream was cancelled: every caller left")]
    StreamAbandoned,
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
        "Incorrect or missing API key. Send a corral gateway key as `Authorization: Bearer <key>` or `x-api-key: <key>`."
    )]
    Unauthorized,
    #[error("rate limit reached for {reason}; retry in {}s", .retry_after.as_secs().max(1))]
    RateLimited {
        retry_after: Duration,
        reason: &'static str,
    },
    /// A spend budget (`budgets`) or token rate (`limits.per_tenant.tokens_per_minute`)
    /// used up: only a new upstream call is refused, never a stored or shared answer.
    #[error("{what} is used up until its window ends; retry in {}s", .retry_after.as_secs().max(1))]
    BudgetExceeded {
        retry_after: Duration,
        /// Names the budget, e.g. `the budget of tenant team-a ($0.01 per day)`.
        what: String,
        /// `budget_exceeded` or `token_rate_exceeded`.
        code: &'static str,
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
    /// Gemini's native API with no `api: gemini` upstream to send it to
    /// (`passthrough/gemini.rs`): it never goes to another provider.
    #[error(
        "`{path}` is Gemini's native API, and this gateway has no upstream with `api: gemini`; \
         a Gemini request (or key) is never sent to another provider"
    )]
    NoGeminiUpstream { path: String },
    /// The caller's credential has the form of another provider's key than
    /// the upstream it would be forwarded to (`auth::Provider`): refused
    /// before it leaves, never sent there. The key itself is never echoed.
    #[error(
        "the API key has the form of a {owner} credential, and upstream `{upstream}` is not          {owner}'s; corral sends a caller's key only to the provider it belongs to"
    )]
    ForeignCredential {
        owner: &'static str,
        upstream: String,
    },
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
    /// A protocol upgrade (a WebSocket dial, Codex's first try at
    /// `/v1/responses`): corral speaks HTTP only and never forwards one. 426
    /// makes Codex fall back to HTTP at once (any other status costs it
    /// reconnects).
    #[error(
        "corral does not accept WebSocket or other protocol upgrades; send the request over HTTP (with `stream: true` to stream)"
    )]
    UpgradeRefused,
    /// Redis is configured but could not record a purge; nothing was purged.
    #[error(
        "the purge could not be recorded in Redis for the other instances; nothing was purged, retry"
    )]
    PurgeNotRecorded,
    /// `error`, answered in `shape` wherever it is rendered: a flight's error
    /// reaches its followers (on other instances too, through Redis) in the
    /// flight's API's shape, whoever renders it.
    #[error("{error}")]
    Shaped {
        shape: ErrorShape,
        error: Box<GatewayError>,
    },
}

/// Whether a provider's status refuses the request's own bytes: a 4xx other
/// than a credential's (401, 403), a missing model's (404), a timeout (408),
/// a conflict (409) or a rate limit (429).
pub fn refuses_the_bytes_sent(status: StatusCode) -> bool {
    status.is_client_error() && !matches!(status.as_u16(), 401 | 403 | 404 | 408 | 409 | 429)
}

impl GatewayError {
    /// This error, answered in `shape` wherever it goes (OpenAI's, the
    /// default, needs no wrapper).
    pub fn in_shape(self, shape: ErrorShape) -> Self {
        match (shape, self) {
            (ErrorShape::OpenAi, error) | (_, error @ Self::Shaped { .. }) => error,
            (shape, error) => Self::Shaped {
                shape,
                error: Box::new(error),
            },
        }
    }

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

    /// Status and the error's name in each shape: OpenAI's `type` and `code`,
    /// Anthropic's `type`. No `_` arm: a new variant must choose here.
    fn mapping(&self) -> Mapping {
        use StatusCode as S;
        match self {
            Self::InvalidRequest { .. } => map(
                S::BAD_REQUEST,
                "invalid_request_error",
                None,
                "invalid_request_error",
            ),
            Self::BodyTooLarge { .. } => map(
                S::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                Some("request_too_large"),
                "request_too_large",
            ),
            Self::NoRoute { .. } => map(
                S::NOT_FOUND,
                "invalid_request_error",
                Some("model_not_found"),
                "not_found_error",
            ),
            Self::UnknownPath { .. } => map(
                S::NOT_FOUND,
                "invalid_request_error",
                Some("unknown_url"),
                "not_found_error",
            ),
            Self::UpgradeRefused => map(
                S::UPGRADE_REQUIRED,
                "invalid_request_error",
                Some("websocket_not_supported"),
                "invalid_request_error",
            ),
            Self::TooManyWaiters { .. } => map(
                S::SERVICE_UNAVAILABLE,
                "server_error",
                Some("too_many_waiters"),
                "overloaded_error",
            ),
            Self::WaitTimedOut => map(
                S::GATEWAY_TIMEOUT,
                "timeout_error",
                Some("coalesce_wait_timeout"),
                "timeout_error",
            ),
            Self::UpstreamUnreachable { .. } => map(
                S::BAD_GATEWAY,
                "server_error",
                Some("upstream_unreachable"),
                "api_error",
            ),
            Self::UpstreamTimeout { .. } => map(
                S::GATEWAY_TIMEOUT,
                "timeout_error",
                Some("upstream_timeout"),
                "timeout_error",
            ),
            Self::UpstreamInvalid { .. } => map(
                S::BAD_GATEWAY,
                "server_error",
                Some("upstream_invalid_response"),
                "api_error",
            ),
            Self::StreamAbandoned => map(
                S::BAD_GATEWAY,
                "server_error",
                Some("stream_abandoned"),
                "api_error",
            ),
            // Relayed as the provider sent it; the names are never used.
            Self::Upstream { status, .. } => map(*status, "upstream_error", None, "api_error"),
            Self::Internal(_) => map(S::INTERNAL_SERVER_ERROR, "server_error", None, "api_error"),
            Self::Unauthorized => map(
                S::UNAUTHORIZED,
                "invalid_request_error",
                Some("invalid_api_key"),
                "authentication_error",
            ),
            Self::RateLimited { .. } => map(
                S::TOO_MANY_REQUESTS,
                "requests",
                Some("rate_limit_exceeded"),
                "rate_limit_error",
            ),
            Self::BudgetExceeded { code, .. } => map(
                S::TOO_MANY_REQUESTS,
                "requests",
                Some(*code),
                "rate_limit_error",
            ),
            Self::CircuitOpen { .. } => map(
                S::SERVICE_UNAVAILABLE,
                "server_error",
                Some("upstream_circuit_open"),
                "overloaded_error",
            ),
            Self::Overloaded { .. } => map(
                S::SERVICE_UNAVAILABLE,
                "server_error",
                Some("server_overloaded"),
                "overloaded_error",
            ),
            Self::BodyTimeout { .. } => map(
                S::REQUEST_TIMEOUT,
                "invalid_request_error",
                Some("request_timeout"),
                "timeout_error",
            ),
            Self::ShuttingDown => map(
                S::SERVICE_UNAVAILABLE,
                "server_error",
                Some("shutting_down"),
                "overloaded_error",
            ),
            Self::ForeignCredential { .. } => map(
                S::UNAUTHORIZED,
                "invalid_request_error",
                Some("foreign_credential"),
                "authentication_error",
            ),
            Self::NoGeminiUpstream { .. } => map(
                S::NOT_FOUND,
                "invalid_request_error",
                Some("no_gemini_upstream"),
                "not_found_error",
            ),
            Self::PathRefused { .. } => map(
                S::BAD_REQUEST,
                "invalid_request_error",
                Some("invalid_path"),
                "invalid_request_error",
            ),
            Self::PassthroughDenied { .. } => map(
                S::FORBIDDEN,
                "invalid_request_error",
                Some("passthrough_denied"),
                "permission_error",
            ),
            Self::IdempotencyKeyReused => map(
                S::UNPROCESSABLE_ENTITY,
                "invalid_request_error",
                Some("idempotency_key_reused"),
                "invalid_request_error",
            ),
            Self::AdminKeyRequired => map(
                S::UNAUTHORIZED,
                "invalid_request_error",
                Some("invalid_admin_key"),
                "authentication_error",
            ),
            Self::AdminDisabled => map(
                S::NOT_FOUND,
                "invalid_request_error",
                Some("admin_disabled"),
                "not_found_error",
            ),
            Self::PurgeNotRecorded => map(
                S::SERVICE_UNAVAILABLE,
                "server_error",
                Some("purge_not_recorded"),
                "overloaded_error",
            ),
            Self::Shaped { error, .. } => error.mapping(),
        }
    }

    pub fn status(&self) -> StatusCode {
        self.mapping().status
    }

    /// When the caller may try again, for the errors that know.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::TooManyWaiters { retry_after }
            | Self::RateLimited { retry_after, .. }
            | Self::BudgetExceeded { retry_after, .. }
            | Self::CircuitOpen { retry_after, .. }
            | Self::Overloaded { retry_after } => Some(*retry_after),
            Self::ShuttingDown | Self::PurgeNotRecorded => Some(Duration::from_secs(1)),
            Self::Shaped { error, .. } => error.retry_after(),
            _ => None,
        }
    }

    /// Whether this error ends corral's own retry loop for an upstream call
    /// (`upstream/retry.rs`, at most `retry.max_attempts` attempts). Its
    /// response then says `x-should-retry: false`, which both OpenAI SDKs
    /// obey: their own retries on top would multiply the attempts a provider
    /// that answers 429 sees.
    pub fn ends_upstream_retries(&self) -> bool {
        if let Self::Shaped { error, .. } = self {
            return error.ends_upstream_retries();
        }
        matches!(
            self,
            Self::Upstream { .. }
                | Self::UpstreamTimeout { .. }
                | Self::UpstreamUnreachable { .. }
                | Self::UpstreamInvalid { .. }
        )
    }

    /// Whether this is a provider's failure that another attempt might have
    /// cured: a status either API retries (408, 409, 429, any 5xx) or no
    /// connection at all. A timeout is not one: the provider may have had
    /// the whole request and been computing it.
    pub fn is_transient_upstream_failure(&self) -> bool {
        match self {
            Self::Shaped { error, .. } => error.is_transient_upstream_failure(),
            Self::Upstream { status, .. } => {
                matches!(status.as_u16(), 408 | 409 | 429) || status.is_server_error()
            }
            Self::UpstreamUnreachable { .. } => true,
            _ => false,
        }
    }

    /// Whether this is a provider's refusal of the request's own bytes (a 4xx
    /// other than a credential's, a missing model's, a timeout, a conflict
    /// or a rate limit): another caller's bytes of the same key may be fine.
    pub fn refuses_the_bytes_sent(&self) -> bool {
        match self {
            Self::Shaped { error, .. } => error.refuses_the_bytes_sent(),
            Self::Upstream { status, .. } => refuses_the_bytes_sent(*status),
            _ => false,
        }
    }

    /// Whether this error is about the caller whose call it was (its budget
    /// or token rate), not about the request: it answers no other caller.
    pub fn is_callers_own(&self) -> bool {
        match self {
            Self::Shaped { error, .. } => error.is_callers_own(),
            Self::BudgetExceeded { .. } => true,
            _ => false,
        }
    }

    /// The provider's own `Retry-After` of a relayed error, in (possibly
    /// fractional) seconds, at most `cap`. An HTTP date or junk is `None`.
    pub fn provider_retry_after(&self, cap: Duration) -> Option<Duration> {
        match self {
            Self::Shaped { error, .. } => error.provider_retry_after(cap),
            Self::Upstream {
                retry_after: Some(value),
                ..
            } => {
                let seconds: f64 = value.to_str().ok()?.trim().parse().ok()?;
                (seconds.is_finite() && seconds >= 0.0)
                    .then(|| Duration::from_secs_f64(seconds.min(cap.as_secs_f64())))
            }
            _ => None,
        }
    }

    /// Whether this failure is local to this instance (its circuit, its rate
    /// cap, its waiter caps, its shutdown), not an answer about the request:
    /// it is never recorded in Redis for the cluster's other instances.
    pub fn is_local_to_instance(&self) -> bool {
        if let Self::Shaped { error, .. } = self {
            return error.is_local_to_instance();
        }
        matches!(
            self,
            Self::CircuitOpen { .. }
                | Self::RateLimited { .. }
                | Self::BudgetExceeded { .. }
                | Self::TooManyWaiters { .. }
                | Self::Overloaded { .. }
                | Self::ShuttingDown
                | Self::WaitTimedOut
                | Self::StreamAbandoned
        )
    }

    /// Builds the response without consuming the error: one failed flight is
    /// relayed to every caller that waited on it.
    pub fn to_response(&self) -> Response {
        self.to_response_as(ErrorShape::OpenAi)
    }

    /// As `to_response`, in `shape`.
    pub fn to_response_as(&self, shape: ErrorShape) -> Response {
        let (status, headers, body) = self.parts_as(shape);
        if status.is_server_error() {
            tracing::warn!(error = %self, source = ?std::error::Error::source(self), "request failed");
        }
        (status, headers, body).into_response()
    }

    /// As `to_response_as`, for one of the callers a failed flight answers:
    /// the flight logged its failure once (`coalesce`), not once a waiter.
    pub fn shared_response_as(&self, shape: ErrorShape) -> Response {
        self.parts_as(shape).into_response()
    }

    /// Status, headers and body of the error response, synchronously: a
    /// flight's error is also recorded in Redis for followers on other instances.
    pub fn parts(&self) -> (StatusCode, HeaderMap, Bytes) {
        self.parts_as(ErrorShape::OpenAi)
    }

    /// As `parts`, in `shape`. A provider's own error is relayed as it came,
    /// in either shape: it is already in its API's.
    pub fn parts_as(&self, shape: ErrorShape) -> (StatusCode, HeaderMap, Bytes) {
        if let Self::Shaped { shape, error } = self {
            return error.parts_as(*shape);
        }
        let Mapping {
            status,
            openai_type,
            code,
            anthropic_type,
        } = self.mapping();
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
                // The SDKs honour a `Retry-After` of up to 60 s; a budget
                // whose window ends later is not worth their retries.
                let budget_for_long = matches!(
                    self,
                    Self::BudgetExceeded { retry_after, .. } if *retry_after > Duration::from_secs(60)
                );
                if self.ends_upstream_retries() || budget_for_long {
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
                let body = match shape {
                    ErrorShape::OpenAi => {
                        json!({"error": {"message": self.to_string(), "type": openai_type, "param": param, "code": code}})
                    }
                    ErrorShape::Anthropic => {
                        json!({"type": "error", "error": {"type": anthropic_type, "message": self.to_string()}})
                    }
                    ErrorShape::Gemini => {
                        json!({"error": {"code": status.as_u16(), "message": self.to_string(), "status": google_status(status)}})
                    }
                    ErrorShape::Bedrock => {
                        headers.insert(
                            HeaderName::from_static("x-amzn-errortype"),
                            HeaderValue::from_static(aws_error_type(status)),
                        );
                        json!({"message": self.to_string()})
                    }
                    ErrorShape::Azure => {
                        let code = code.map_or_else(|| status.as_str().to_owned(), str::to_owned);
                        json!({"error": {"code": code, "message": self.to_string()}})
                    }
                };
                Bytes::from(body.to_string())
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

/// AWS's name for an error of `status`, as Bedrock's `x-amzn-ErrorType` says it.
fn aws_error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 | 403 => "AccessDeniedException",
        404 => "ResourceNotFoundException",
        408 | 504 => "ModelTimeoutException",
        400..=428 => "ValidationException",
        429 => "ThrottlingException",
        503 | 529 => "ServiceUnavailableException",
        _ => "InternalServerException",
    }
}

/// Google's canonical status name for an HTTP status (`google.rpc.Code`),
/// as its error bodies carry it.
fn google_status(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 413 | 422 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        409 => "ABORTED",
        429 => "RESOURCE_EXHAUSTED",
        499 => "CANCELLED",
        501 => "UNIMPLEMENTED",
        502 | 503 => "UNAVAILABLE",
        408 | 504 => "DEADLINE_EXCEEDED",
        400..=499 => "FAILED_PRECONDITION",
        _ => "INTERNAL",
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

    #[test]
    fn messages_paths_take_anthropics_shape() {
        for path in [
            "/v1/messages",
            "/v1/messages/count_tokens",
            "/v1/messages/batches/b-1",
        ] {
            assert_eq!(ErrorShape::for_path(path), ErrorShape::Anthropic, "{path}");
        }
        for path in [
            "/v1/chat/completions",
            "/v1/messagesx",
            "/messages",
            "/v1/responses",
        ] {
            assert_eq!(ErrorShape::for_path(path), ErrorShape::OpenAi, "{path}");
        }
    }

    #[tokio::test]
    async fn anthropic_shaped_errors_name_anthropics_types_with_the_same_status() {
        let cases = [
            (GatewayError::invalid("bad"), 400, "invalid_request_error"),
            (GatewayError::Unauthorized, 401, "authentication_error"),
            (
                GatewayError::PassthroughDenied {
                    method: axum::http::Method::POST,
                    path: "/v1/messages/batches".into(),
                    setting: "x",
                },
                403,
                "permission_error",
            ),
            (
                GatewayError::NoRoute { model: "m".into() },
                404,
                "not_found_error",
            ),
            (
                GatewayError::BodyTooLarge { limit: 1 },
                413,
                "request_too_large",
            ),
            (
                GatewayError::RateLimited {
                    retry_after: Duration::from_secs(2),
                    reason: "r",
                },
                429,
                "rate_limit_error",
            ),
            (
                GatewayError::Internal(anyhow::anyhow!("secret detail")),
                500,
                "api_error",
            ),
            (
                GatewayError::Overloaded {
                    retry_after: Duration::from_secs(1),
                },
                503,
                "overloaded_error",
            ),
            (
                GatewayError::UpstreamTimeout {
                    upstream: "anthropic".into(),
                },
                504,
                "timeout_error",
            ),
        ];
        for (error, status, kind) in cases {
            let openai_status = error.to_response().status();
            let response = error.to_response_as(ErrorShape::Anthropic);
            assert_eq!(response.status().as_u16(), status, "{error:?}");
            assert_eq!(
                openai_status,
                response.status(),
                "one status in both shapes"
            );
            let retry_after = response.headers().get(header::RETRY_AFTER).cloned();
            let body = body_json(response).await;
            assert_eq!(body["type"], "error", "{body}");
            assert_eq!(body["error"]["type"], kind, "{body}");
            assert!(body["error"]["message"].is_string(), "{body}");
            assert!(body.get("code").is_none() && body["error"].get("code").is_none());
            assert!(!body.to_string().contains("secret detail"));
            if status == 429 {
                assert_eq!(retry_after.unwrap(), "2");
            }
        }
        // A provider's own error is relayed as it came.
        let relayed = GatewayError::Upstream {
            status: StatusCode::from_u16(529).unwrap(),
            content_type: Some(HeaderValue::from_static("application/json")),
            retry_after: Some(HeaderValue::from_static("3")),
            body: Bytes::from_static(
                br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
            ),
        }
        .to_response_as(ErrorShape::Anthropic);
        assert_eq!(relayed.status().as_u16(), 529);
        assert_eq!(relayed.headers()[header::RETRY_AFTER], "3");
        assert_eq!(
            body_json(relayed).await["error"]["type"],
            "overloaded_error"
        );
    }

    #[tokio::test]
    async fn a_shaped_error_keeps_its_shape_and_its_nature() {
        let timeout = GatewayError::UpstreamTimeout {
            upstream: "anthropic".into(),
        };
        assert!(matches!(
            GatewayError::WaitTimedOut.in_shape(ErrorShape::OpenAi),
            GatewayError::WaitTimedOut
        ));
        let shaped = timeout
            .in_shape(ErrorShape::Anthropic)
            .in_shape(ErrorShape::Anthropic);
        assert!(shaped.ends_upstream_retries());
        assert!(!shaped.is_local_to_instance());
        assert_eq!(shaped.status(), StatusCode::GATEWAY_TIMEOUT);
        // Rendered as an OpenAI error by code that knows no better (a Redis record), it is
        // still Anthropic's.
        let (status, _, body) = shaped.parts();
        assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["type"], "error");
        assert_eq!(body["error"]["type"], "timeout_error");
        let local = GatewayError::ShuttingDown.in_shape(ErrorShape::Anthropic);
        assert!(local.is_local_to_instance());
        assert_eq!(local.retry_after(), Some(Duration::from_secs(1)));
    }

    #[tokio::test]
    async fn internal_detail_stays_out_of_the_body() {
        let response = GatewayError::Internal(anyhow::anyhow!("secret detail")).to_response();
        let body = body_json(response).await;
        assert_eq!(body["error"]["message"], "internal error");
    }
}
