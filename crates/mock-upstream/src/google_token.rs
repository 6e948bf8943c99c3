//! Google's OAuth token endpoint, as a service account sees it: `POST /token` with the JWT-bearer
//! grant (`grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer&assertion=<JWT>`), answered with
//! an opaque `ya29.` access token that the Vertex AI routes then accept until it expires.
//!
//! The assertion is checked as Google checks it: an RS256 signature by the mock's test service
//! account, issued by its `client_email`, for Google's token URI or this one as the client
//! addressed it, asking
//! for the `cloud-platform` scope, and short-lived (`exp - iat` at most an hour, not expired, not
//! issued in the future). The service account's keypair is generated on first use, once per
//! process, so nothing committed to the repository is a private key; its JSON key file, in
//! Google's format, is what [`MockProvider::service_account_json`] hands to a client.
//!
//! As with Entra (`entra.rs`), tokens expire by tokio's clock, so a paused test clock ages them;
//! their lifetimes can be queued; and requests are counted apart from the billable calls. The
//! errors are Google's (`{"error","error_description"}`).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::rejection::FormRejection;
use axum::extract::{Form, State};
use axum::http::header::HOST;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use rsa::pkcs1::EncodeRsaPublicKey as _;
use rsa::pkcs8::{EncodePrivateKey as _, LineEnding};
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest as _, Sha256};
use tokio::sync::watch;
use tokio::time::Instant;

use super::{MockProvider, Shared, lock};

/// Lifetime of a token when none is queued: what Google's endpoint reports for a fresh token.
pub(super) const DEFAULT_TOKEN_LIFETIME: Duration = Duration::from_secs(3599);

/// Google's token URI, the assertion's `aud` whatever the key file's `token_uri` says: Google's
/// Python library always names it, whereas other clients name the `token_uri` they post to.
const GOOGLE_TOKEN_URI: &str = "https://oauth2.googleapis.com/token";

/// The grant a service account uses to trade its signed assertion for an access token.
const JWT_BEARER_GRANT: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// The scope a token must carry for Vertex AI.
pub const CLOUD_PLATFORM_SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
/// The test service account's project, as its key file names it.
pub const SERVICE_ACCOUNT_PROJECT: &str = "mock-project";
/// The test service account's address: the assertion's `iss`.
pub const SERVICE_ACCOUNT_EMAIL: &str = "mock-vertex@mock-project.iam.gserviceaccount.com";
/// The test service account's numeric id, as its key file names it.
const SERVICE_ACCOUNT_CLIENT_ID: &str = "100000000000000000042";
/// Google refuses an assertion that lives longer than an hour.
const MAX_ASSERTION_LIFETIME_SECS: u64 = 3600;
/// How far the client's clock may run ahead of the mock's before an assertion is "from the
/// future", or behind before it is expired.
const CLOCK_SKEW_SECS: u64 = 60;

/// RSA modulus size of the test service account. Google requires 2048 bits of a real account;
/// the mock accepts what it issues, and a smaller key keeps debug-built unit tests fast (pure
/// Rust key generation is slow without optimisation).
const RSA_BITS: usize = if cfg!(test) { 1024 } else { 2048 };

/// The mock's test service account: a keypair made once per process.
struct ServiceAccount {
    /// The private key as the key file carries it, PKCS#8 PEM.
    private_key_pem: String,
    /// The public key the assertions are verified with.
    verifying_key: DecodingKey,
    /// The key's id (the assertion header's `kid`): a digest of the public key, hex.
    private_key_id: String,
}

/// The test service account, generated on first use.
fn service_account() -> &'static ServiceAccount {
    static ACCOUNT: OnceLock<ServiceAccount> = OnceLock::new();
    ACCOUNT.get_or_init(|| {
        // With both of jsonwebtoken's backends enabled in one build (a crate beside the mock
        // choosing aws-lc), the crate picks neither by itself: choose the one this crate asks
        // for, unless the process installed one already (then that one serves).
        let _already_installed = jsonwebtoken::crypto::CryptoProvider::install_default(
            &jsonwebtoken::crypto::rust_crypto::DEFAULT_PROVIDER,
        );
        let private_key = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, RSA_BITS)
            .expect("generating the test service account's RSA key");
        let public_der = private_key
            .to_public_key()
            .to_pkcs1_der()
            .expect("encoding the test service account's public key");
        let private_key_pem = private_key
            .to_pkcs8_pem(LineEnding::LF)
            .expect("encoding the test service account's private key")
            .to_string();
        let digest = Sha256::digest(public_der.as_bytes());
        ServiceAccount {
            private_key_pem,
            verifying_key: DecodingKey::from_rsa_der(public_der.as_bytes()),
            private_key_id: hex::encode(&digest[..20]),
        }
    })
}

/// The test service account's JSON key file, in the format Google's libraries read
/// (`google.oauth2.service_account.Credentials.from_service_account_file`), its `token_uri`
/// pointing at the mock whose root URL (`http://HOST:PORT`) is `root`. The key is made on the
/// first call in a process, which takes a moment in a debug build.
pub fn service_account_json(root: &str) -> String {
    let account = service_account();
    let email = SERVICE_ACCOUNT_EMAIL;
    json!({
        "type": "service_account",
        "project_id": SERVICE_ACCOUNT_PROJECT,
        "private_key_id": account.private_key_id,
        "private_key": account.private_key_pem,
        "client_email": email,
        "client_id": SERVICE_ACCOUNT_CLIENT_ID,
        "auth_uri": "https://accounts.google.com/o/oauth2/auth",
        "token_uri": format!("{root}/token"),
        "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
        "client_x509_cert_url": format!(
            "https://www.googleapis.com/robot/v1/metadata/x509/{}",
            email.replace('@', "%40")
        ),
        "universe_domain": "googleapis.com",
    })
    .to_string()
}

impl MockProvider {
    /// The test service account's JSON key file, its `token_uri` this mock's `POST /token`:
    /// what `google.oauth2.service_account.Credentials` (or corral's Vertex account) reads.
    pub fn service_account_json(&self) -> String {
        service_account_json(&format!("http://{}", self.inner.addr))
    }

    /// This mock's Google token URL, in place of `https://oauth2.googleapis.com/token`.
    pub fn google_token_url(&self) -> String {
        format!("http://{}/token", self.inner.addr)
    }

    /// Queue the lifetime of the next Google access token issued (FIFO); tokens beyond the
    /// queue live 3599 s. `expires_in` reports it in whole seconds, rounded down; the token is
    /// refused from the exact instant it expires, by tokio's clock.
    pub fn push_google_token_lifetime(&self, lifetime: Duration) {
        self.inner.shared.google.push_lifetime(lifetime);
    }

    /// Requests to Google's token endpoint so far, refused ones included. Not billable calls.
    pub fn google_token_requests(&self) -> u64 {
        *self.inner.shared.google.requests.borrow()
    }

    /// Wait until `google_token_requests() >= n`; false if `timeout` passed first (or the mock
    /// stopped short of it). Woken by each arrival.
    pub async fn wait_for_google_token_requests(&self, n: u64, timeout: Duration) -> bool {
        let shared = &self.inner.shared;
        let mut requests = shared.google.requests.subscribe();
        tokio::select! {
            reached = tokio::time::timeout(timeout, requests.wait_for(|r| *r >= n)) => {
                matches!(reached, Ok(Ok(_)))
            }
            () = shared.stopping.cancelled() => self.google_token_requests() >= n,
        }
    }
}

/// The token endpoint's state: how long the next tokens live, what was issued, how often asked.
#[derive(Default)]
pub(super) struct GoogleTokens {
    lifetimes: Mutex<VecDeque<Duration>>,
    /// Issued tokens and when each expires.
    tokens: Mutex<HashMap<String, Instant>>,
    /// Every request to the token endpoint, refused ones included; a watch so waiters wake.
    requests: watch::Sender<u64>,
}

impl GoogleTokens {
    pub(super) fn push_lifetime(&self, lifetime: Duration) {
        lock(&self.lifetimes).push_back(lifetime);
    }

    /// Whether `token` was issued here and has not expired.
    pub(super) fn accepts(&self, token: &str) -> bool {
        lock(&self.tokens)
            .get(token)
            .is_some_and(|expires| Instant::now() < *expires)
    }

    /// No queued lifetimes, the counter at zero. Issued tokens stay valid, as Entra's do.
    pub(super) fn reset(&self) {
        lock(&self.lifetimes).clear();
        self.requests.send_replace(0);
    }

    /// Issue a token, forgetting the expired ones so the table stays bounded.
    pub(super) fn issue(&self) -> (String, Duration) {
        let lifetime = lock(&self.lifetimes)
            .pop_front()
            .unwrap_or(DEFAULT_TOKEN_LIFETIME);
        let token = format!("ya29.mock-{}", hex::encode(rand::random::<[u8; 32]>()));
        let now = Instant::now();
        let mut tokens = lock(&self.tokens);
        tokens.retain(|_, expires| *expires > now);
        tokens.insert(token.clone(), now + lifetime);
        (token, lifetime)
    }
}

pub(super) fn router() -> Router<Arc<Shared>> {
    Router::new().route("/token", post(token))
}

/// The claims of a service account's assertion that the endpoint judges.
#[derive(Debug, Deserialize)]
struct Assertion {
    scope: Option<String>,
    iat: Option<u64>,
    exp: Option<u64>,
}

/// Why an assertion was refused, in Google's words.
#[derive(Debug, PartialEq, Eq)]
struct Refusal {
    error: &'static str,
    description: &'static str,
}

const INVALID_SIGNATURE: Refusal = Refusal {
    error: "invalid_grant",
    description: "Invalid JWT Signature.",
};
const BAD_TIMEFRAME: Refusal = Refusal {
    error: "invalid_grant",
    description: "Invalid JWT: Token must be a short-lived token (60 minutes) and in a \
                  reasonable timeframe. Check your iat and exp values in the JWT claim.",
};

/// `POST /token`: the JWT-bearer grant.
async fn token(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    form: Result<Form<BTreeMap<String, String>>, FormRejection>,
) -> Response {
    let google = &shared.google;
    google.requests.send_modify(|n| *n += 1);
    // Google reads a body that is not a form as one without parameters.
    let form = form.map(|Form(form)| form).unwrap_or_default();
    let field = |name: &str| form.get(name).map(String::as_str).filter(|v| !v.is_empty());

    let grant_type = field("grant_type").unwrap_or_default();
    if grant_type != JWT_BEARER_GRANT {
        return google_error(
            "unsupported_grant_type",
            &format!("Invalid grant_type: {grant_type}"),
        );
    }
    let Some(assertion) = field("assertion") else {
        return google_error("invalid_request", "Missing required parameter: assertion");
    };
    let host = headers
        .get(HOST)
        .and_then(|host| host.to_str().ok())
        .unwrap_or_default();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    if let Err(refusal) = verify(assertion, &format!("http://{host}/token"), now) {
        return google_error(refusal.error, refusal.description);
    }

    let (access_token, lifetime) = google.issue();
    Json(json!({
        "access_token": access_token,
        // Whole seconds, rounded down: a client that refreshes on this figure is never late.
        "expires_in": lifetime.as_secs(),
        "token_type": "Bearer",
    }))
    .into_response()
}

/// Judge an assertion posted to the token URI `this_uri` at unix time `now`, in the order
/// Google does: signature and issuer, audience (`this_uri` or Google's), timeframe, scope.
fn verify(assertion: &str, this_uri: &str, now: u64) -> Result<(), Refusal> {
    let account = service_account();
    let header = jsonwebtoken::decode_header(assertion).map_err(|_| Refusal {
        error: "invalid_grant",
        description: "Invalid JWT.",
    })?;
    if header.kid.is_some_and(|kid| kid != account.private_key_id) {
        return Err(INVALID_SIGNATURE);
    }
    let mut validation = Validation::new(Algorithm::RS256);
    validation.set_issuer(&[SERVICE_ACCOUNT_EMAIL]);
    validation.set_audience(&[this_uri, GOOGLE_TOKEN_URI]);
    validation.set_required_spec_claims(&["iss", "aud"]);
    // The timeframe is judged below, in Google's terms rather than the crate's.
    validation.validate_exp = false;
    let claims = jsonwebtoken::decode::<Assertion>(assertion, &account.verifying_key, &validation)
        .map_err(|error| match error.kind() {
            ErrorKind::InvalidIssuer | ErrorKind::MissingRequiredClaim(_) => Refusal {
                error: "invalid_grant",
                description: "Invalid grant: account not found",
            },
            ErrorKind::InvalidAudience => Refusal {
                error: "invalid_grant",
                description: "Invalid JWT: Failed audience check.",
            },
            _ => INVALID_SIGNATURE,
        })?
        .claims;
    let (Some(iat), Some(exp)) = (claims.iat, claims.exp) else {
        return Err(BAD_TIMEFRAME);
    };
    let sane = iat < exp
        && exp - iat <= MAX_ASSERTION_LIFETIME_SECS
        && iat <= now + CLOCK_SKEW_SECS
        && exp + CLOCK_SKEW_SECS > now;
    if !sane {
        return Err(BAD_TIMEFRAME);
    }
    let scopes: HashSet<&str> = claims
        .scope
        .as_deref()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    if !scopes.contains(CLOUD_PLATFORM_SCOPE) {
        return Err(Refusal {
            error: "invalid_scope",
            description: "Invalid OAuth scope or ID token audience provided.",
        });
    }
    Ok(())
}

/// An error in the shape of Google's token endpoint; all of them are 400s.
fn google_error(error: &str, description: &str) -> Response {
    let body = json!({"error": error, "error_description": description});
    (StatusCode::BAD_REQUEST, Json(body)).into_response()
}

#[cfg(test)]
#[path = "google_token_tests.rs"]
mod tests;
