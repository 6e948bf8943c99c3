//! A Google service account's OAuth 2.0 JWT-bearer grant (RFC 7523): the
//! account's key signs a short assertion, which Google's token endpoint
//! trades for an access token to Vertex AI.
//!
//! The key (the JSON file Google issues) is read once, at start: a missing or
//! unusable field is reported by its name, never with the key's text. Each
//! token costs one request: `POST {token_uri}` with the signed assertion as a
//! form. The answer is read bounded, and a refusal is reported by Google's own
//! error code, never with the key, the assertion or a token in its text.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use reqwest::Url;
use rsa::{
    RsaPrivateKey,
    pkcs1::{DecodeRsaPrivateKey, EncodeRsaPrivateKey},
    pkcs8::DecodePrivateKey,
};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{
    oauth::{bearer_only, post_form},
    token::{Grant, Issued, TokenError},
};
use crate::config::Secret;

/// The scope of a token for Vertex AI (and every Google Cloud API).
pub const CLOUD_PLATFORM_SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";

/// How long an assertion is valid: the longest Google accepts, as its own
/// client libraries sign them. The assertion is used at once and never kept.
pub const ASSERTION_LIFETIME: Duration = Duration::from_secs(3600);

/// The grant type of RFC 7523's JWT bearer assertion.
const JWT_BEARER_GRANT: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";

/// Why a service account's key cannot be used. No variant carries any of the
/// key's text: only which field is wrong and how.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error(
        "the service account key is not a JSON object (line {line}, column {column}); \
         it is the JSON key file Google issues for a service account"
    )]
    NotJson { line: usize, column: usize },
    #[error("the service account key has no `{0}`")]
    Missing(&'static str),
    #[error("the service account key's `{field}` {problem}")]
    Invalid {
        field: &'static str,
        problem: &'static str,
    },
}

/// A service account's key, ready to sign assertions for tokens of one scope.
pub struct ServiceAccountGrant {
    client_email: String,
    /// `kid` of every assertion, so Google finds the key without trying each.
    private_key_id: Option<String>,
    signing_key: EncodingKey,
    token_uri: Url,
    scope: String,
    client: reqwest::Client,
}

/// Only who the account is and where it asks: never its key.
impl std::fmt::Debug for ServiceAccountGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccountGrant")
            .field("client_email", &self.client_email)
            .field("token_uri", &self.token_uri.as_str())
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

impl ServiceAccountGrant {
    /// The grant of the service account whose JSON key is `key`, for tokens of
    /// [`CLOUD_PLATFORM_SCOPE`]; `client` brings the connection settings and
    /// timeouts. The key is checked whole here, signing included, so a bad
    /// one stops the start rather than the first request.
    pub fn new(key: &Secret<String>, client: reqwest::Client) -> Result<Self, KeyError> {
        let fields: Map<String, Value> =
            serde_json::from_str(key.expose()).map_err(|error| KeyError::NotJson {
                // serde's own text may quote the key; only where it failed is kept.
                line: error.line(),
                column: error.column(),
            })?;
        // Another kind of credential file (a user's `authorized_user`, a
        // workload identity's `external_account`) has none of a key's fields.
        if let Some(kind) = text_field(&fields, "type")?
            && kind != "service_account"
        {
            return Err(KeyError::Invalid {
                field: "type",
                problem: "is not \"service_account\": only a service account's key is taken",
            });
        }
        let client_email = required(&fields, "client_email")?;
        if client_email.trim().is_empty() {
            return Err(KeyError::Invalid {
                field: "client_email",
                problem: "is empty",
            });
        }
        // Optional, as in Google's own libraries: without it Google tries
        // each of the account's keys.
        let private_key_id = text_field(&fields, "private_key_id")?.map(str::to_owned);
        let token_uri = token_uri(required(&fields, "token_uri")?)?;
        let signing_key = signing_key(required(&fields, "private_key")?)?;
        let grant = Self {
            client_email: client_email.to_owned(),
            private_key_id,
            signing_key,
            token_uri,
            scope: CLOUD_PLATFORM_SCOPE.to_owned(),
            client,
        };
        grant.assertion(now())?;
        Ok(grant)
    }

    /// The service account's email (its identity in Google Cloud's IAM).
    pub fn client_email(&self) -> &str {
        &self.client_email
    }

    /// The signed JWT for a token request made at `issued_at` (seconds since
    /// the Unix epoch).
    fn assertion(&self, issued_at: u64) -> Result<String, KeyError> {
        let mut header = Header::new(Algorithm::RS256);
        header.kid.clone_from(&self.private_key_id);
        let claims = Claims {
            iss: &self.client_email,
            scope: &self.scope,
            aud: self.token_uri.as_str(),
            iat: issued_at,
            exp: issued_at + ASSERTION_LIFETIME.as_secs(),
        };
        jsonwebtoken::encode(&header, &claims, &self.signing_key).map_err(|_| KeyError::Invalid {
            field: "private_key",
            problem: "cannot sign an RS256 assertion",
        })
    }
}

/// The assertion's claims, as Google's token endpoint asks for them.
#[derive(Serialize)]
struct Claims<'a> {
    iss: &'a str,
    scope: &'a str,
    aud: &'a str,
    iat: u64,
    exp: u64,
}

/// `name` as text when present; a value of another type is refused by name.
fn text_field<'a>(
    fields: &'a Map<String, Value>,
    name: &'static str,
) -> Result<Option<&'a str>, KeyError> {
    match fields.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(_) => Err(KeyError::Invalid {
            field: name,
            problem: "is not a string",
        }),
    }
}

fn required<'a>(fields: &'a Map<String, Value>, name: &'static str) -> Result<&'a str, KeyError> {
    text_field(fields, name)?.ok_or(KeyError::Missing(name))
}

/// Where tokens are asked for: an http(s) URL without query or fragment
/// (the form is the request's whole content).
fn token_uri(text: &str) -> Result<Url, KeyError> {
    let invalid = KeyError::Invalid {
        field: "token_uri",
        problem: "is not an http(s) URL without query",
    };
    let url = Url::parse(text).map_err(|_| invalid.clone())?;
    if !matches!(url.scheme(), "https" | "http")
        || url.query().is_some()
        || url.fragment().is_some()
    {
        return Err(invalid);
    }
    Ok(url)
}

/// The RSA key of a PEM `private_key`: PKCS#8, as Google issues them, or
/// PKCS#1 (`BEGIN RSA PRIVATE KEY`), as `openssl` may have converted it.
fn signing_key(pem: &str) -> Result<EncodingKey, KeyError> {
    let invalid = |problem| KeyError::Invalid {
        field: "private_key",
        problem,
    };
    let key = RsaPrivateKey::from_pkcs8_pem(pem)
        .or_else(|_| RsaPrivateKey::from_pkcs1_pem(pem))
        .map_err(|_| invalid("is not an RSA private key in PEM"))?;
    let der = key
        .to_pkcs1_der()
        .map_err(|_| invalid("cannot be encoded for signing"))?;
    Ok(EncodingKey::from_rsa_der(der.as_bytes()))
}

/// Seconds since the Unix epoch; a clock before it signs as if at it (Google
/// then refuses the assertion, which says what is wrong).
fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

#[async_trait::async_trait]
impl Grant for ServiceAccountGrant {
    async fn issue(&self) -> Result<Issued, TokenError> {
        // The key signed at start; a failure now is no answer from anyone.
        let assertion = self
            .assertion(now())
            .map_err(|error| TokenError::Unreachable(error.to_string()))?;
        let form = [
            ("grant_type", JWT_BEARER_GRANT),
            ("assertion", assertion.as_str()),
        ];
        let answer: TokenAnswer = post_form(&self.client, self.token_uri.clone(), &form).await?;
        bearer_only(answer.token_type.as_deref())?;
        Ok(Issued {
            token: Secret::new(answer.access_token),
            lifetime: Duration::from_secs(answer.expires_in),
        })
    }
}

/// The parts of Google's answer that are used.
#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    expires_in: u64,
    token_type: Option<String>,
}

#[cfg(test)]
pub(super) mod tests;
