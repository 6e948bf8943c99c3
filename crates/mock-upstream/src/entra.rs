//! Microsoft Entra ID's token endpoint, as a confidential client sees it: `POST
//! /{tenant}/oauth2/v2.0/token` with the client-credentials grant, answered with an opaque bearer
//! token that the Azure routes then accept until it expires.
//!
//! Tokens expire by the mock's monotonic clock (tokio's `Instant`), so a test under a paused
//! clock can age a token without waiting; the lifetime of the next tokens can be queued, so a
//! test can hand out a one-second token and watch the gateway refresh it. Token requests are not
//! billable calls: they have their own counter, which a test waits on the way it waits on
//! calls, to assert that a gateway fetched one token for many concurrent callers.
//!
//! The errors are Entra's own (`{"error","error_description","error_codes",...}` with the
//! `AADSTS` codes), in the order Entra checks: grant type, client id, secret, scope.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::extract::rejection::FormRejection;
use axum::extract::{Form, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{Shared, lock};

/// Lifetime of a token when none is queued: Entra's usual hour.
pub(super) const DEFAULT_TOKEN_LIFETIME: Duration = Duration::from_secs(3600);

/// Audiences whose tokens the Azure OpenAI routes accept: Cognitive Services' and the newer
/// Azure AI one. A token for any other resource is issued (Entra does) but refused there.
const AZURE_OPENAI_SCOPES: [&str; 2] = [
    "https://cognitiveservices.azure.com/.default",
    "https://ai.azure.com/.default",
];

/// The app registration the token endpoint knows, set by
/// [`MockSettings::entra_client`](super::MockSettings::entra_client) or
/// [`MockProvider::set_entra_client`](super::MockProvider::set_entra_client).
#[derive(Clone, PartialEq, Eq)]
pub struct EntraClient {
    /// The application (client) id, sent as `client_id`.
    pub client_id: String,
    /// The client secret's value, sent as `client_secret`.
    pub client_secret: String,
}

impl EntraClient {
    pub fn new(client_id: impl Into<String>, client_secret: impl Into<String>) -> Self {
        Self {
            client_id: client_id.into(),
            client_secret: client_secret.into(),
        }
    }
}

/// The secret stays out of logs and test failure output.
impl fmt::Debug for EntraClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EntraClient")
            .field("client_id", &self.client_id)
            .field("client_secret", &"<redacted>")
            .finish()
    }
}

/// The token endpoint's state: who may ask, how long the next tokens live, what was issued.
pub(super) struct Entra {
    configured: Option<EntraClient>,
    client: Mutex<Option<EntraClient>>,
    lifetimes: Mutex<VecDeque<Duration>>,
    tokens: Mutex<HashMap<String, Issued>>,
    /// Every request to the token endpoint, refused ones included; a watch so waiters wake.
    requests: watch::Sender<u64>,
}

/// One issued token.
struct Issued {
    expires: Instant,
    /// Whether it was issued for Azure OpenAI's audience.
    for_azure_openai: bool,
}

impl Entra {
    pub(super) fn new(configured: Option<EntraClient>) -> Self {
        Self {
            client: Mutex::new(configured.clone()),
            configured,
            lifetimes: Mutex::new(VecDeque::new()),
            tokens: Mutex::new(HashMap::new()),
            requests: watch::Sender::new(0),
        }
    }

    pub(super) fn set_client(&self, client: Option<EntraClient>) {
        *lock(&self.client) = client;
    }

    pub(super) fn push_lifetime(&self, lifetime: Duration) {
        lock(&self.lifetimes).push_back(lifetime);
    }

    pub(super) fn set_lifetimes(&self, lifetimes: Vec<Duration>) {
        *lock(&self.lifetimes) = lifetimes.into();
    }

    pub(super) fn requests(&self) -> u64 {
        *self.requests.borrow()
    }

    /// Wait until `requests() >= n`, the timeout passes or the server stops; true if reached.
    pub(super) async fn wait_for_requests(
        &self,
        n: u64,
        timeout: Duration,
        stopping: &tokio_util::sync::CancellationToken,
    ) -> bool {
        let mut requests = self.requests.subscribe();
        tokio::select! {
            reached = tokio::time::timeout(timeout, requests.wait_for(|r| *r >= n)) => {
                matches!(reached, Ok(Ok(_)))
            }
            () = stopping.cancelled() => self.requests() >= n,
        }
    }

    /// Whether `token` was issued here for Azure OpenAI and has not expired.
    pub(super) fn accepts(&self, token: &str) -> bool {
        lock(&self.tokens)
            .get(token)
            .is_some_and(|issued| issued.for_azure_openai && Instant::now() < issued.expires)
    }

    /// Back to the startup client, no queued lifetimes, the counter at zero. Issued tokens stay
    /// valid: a gateway holding one across a test's reset did nothing wrong.
    pub(super) fn reset(&self) {
        self.set_client(self.configured.clone());
        lock(&self.lifetimes).clear();
        self.requests.send_replace(0);
    }

    /// Issue a token for `scope`, forgetting the expired ones so the table stays bounded.
    fn issue(&self, scope: &str) -> (String, Duration) {
        let lifetime = lock(&self.lifetimes)
            .pop_front()
            .unwrap_or(DEFAULT_TOKEN_LIFETIME);
        let token = format!("mock-entra-{}", hex::encode(rand::random::<[u8; 32]>()));
        let now = Instant::now();
        let mut tokens = lock(&self.tokens);
        tokens.retain(|_, issued| issued.expires > now);
        tokens.insert(
            token.clone(),
            Issued {
                expires: now + lifetime,
                for_azure_openai: AZURE_OPENAI_SCOPES.contains(&scope),
            },
        );
        (token, lifetime)
    }
}

pub(super) fn router() -> Router<Arc<Shared>> {
    Router::new().route("/{tenant}/oauth2/v2.0/token", post(token))
}

/// `POST /{tenant}/oauth2/v2.0/token`: the client-credentials grant.
async fn token(
    State(shared): State<Arc<Shared>>,
    Path(tenant): Path<String>,
    form: Result<Form<BTreeMap<String, String>>, FormRejection>,
) -> Response {
    let entra = &shared.entra;
    entra.requests.send_modify(|n| *n += 1);
    // Entra reads a body that is not a form as one without parameters.
    let form = form.map(|Form(form)| form).unwrap_or_default();
    let field = |name: &str| form.get(name).map(String::as_str).filter(|v| !v.is_empty());

    let Some(grant_type) = field("grant_type") else {
        return missing_parameter("grant_type");
    };
    if grant_type != "client_credentials" {
        return entra_error(
            StatusCode::BAD_REQUEST,
            "unsupported_grant_type",
            70003,
            &format!("AADSTS70003: The app requested an unsupported grant type '{grant_type}'."),
        );
    }
    let Some(client_id) = field("client_id") else {
        return missing_parameter("client_id");
    };
    let known = lock(&entra.client).clone();
    if let Some(known) = &known
        && known.client_id != client_id
    {
        return entra_error(
            StatusCode::BAD_REQUEST,
            "unauthorized_client",
            700016,
            &format!(
                "AADSTS700016: Application with identifier '{client_id}' was not found in the \
                 directory '{tenant}'. This can happen if the application has not been installed \
                 by the administrator of the tenant or consented to by any user in the tenant. \
                 You may have sent your authentication request to the wrong tenant."
            ),
        );
    }
    let Some(secret) = field("client_secret") else {
        return entra_error(
            StatusCode::UNAUTHORIZED,
            "invalid_client",
            7000216,
            "AADSTS7000216: 'client_assertion', 'client_secret' or 'request' is required for \
             the 'client_credentials' grant type.",
        );
    };
    if known.is_some_and(|known| known.client_secret != secret) {
        return entra_error(
            StatusCode::UNAUTHORIZED,
            "invalid_client",
            7000215,
            &format!(
                "AADSTS7000215: Invalid client secret provided. Ensure the secret being sent in \
                 the request is the client secret value, not the client secret ID, for a secret \
                 added to app '{client_id}'."
            ),
        );
    }
    let Some(scope) = field("scope") else {
        return missing_parameter("scope");
    };
    if !scope.ends_with("/.default") {
        return entra_error(
            StatusCode::BAD_REQUEST,
            "invalid_scope",
            1002012,
            &format!(
                "AADSTS1002012: The provided value for scope {scope} is not valid. Client \
                 credential flows must have a scope value with /.default suffixed to the \
                 resource identifier (application ID URI)."
            ),
        );
    }

    let (access_token, lifetime) = entra.issue(scope);
    // Whole seconds, rounded down: a client that refreshes on this figure is never late.
    let expires_in = lifetime.as_secs();
    Json(json!({
        "token_type": "Bearer",
        "expires_in": expires_in,
        "ext_expires_in": expires_in,
        "access_token": access_token,
    }))
    .into_response()
}

fn missing_parameter(name: &str) -> Response {
    entra_error(
        StatusCode::BAD_REQUEST,
        "invalid_request",
        900144,
        &format!("AADSTS900144: The request body must contain the following parameter: '{name}'."),
    )
}

/// An error in Entra's shape: the description ends with the trace, correlation and time
/// lines Entra appends, which the body repeats as fields.
fn entra_error(status: StatusCode, error: &str, code: u32, description: &str) -> Response {
    let trace_id = random_guid();
    let correlation_id = random_guid();
    let timestamp = humantime::format_rfc3339_seconds(SystemTime::now())
        .to_string()
        .replace('T', " ");
    let body = json!({
        "error": error,
        "error_description": format!(
            "{description} Trace ID: {trace_id} Correlation ID: {correlation_id} Timestamp: {timestamp}"
        ),
        "error_codes": [code],
        "timestamp": timestamp,
        "trace_id": trace_id,
        "correlation_id": correlation_id,
        "error_uri": format!("https://login.microsoftonline.com/error?code={code}"),
    });
    (status, Json(body)).into_response()
}

/// A random GUID in its usual 8-4-4-4-12 form.
pub(super) fn random_guid() -> String {
    let hex = hex::encode(rand::random::<[u8; 16]>());
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

#[cfg(test)]
#[path = "entra_tests.rs"]
mod tests;
