//! Gateway keys and tenant identity.
//!
//! With `auth.keys` (SHA-256 hashes of the keys, hex) or `auth.keys_env` (a
//! variable holding the keys themselves, comma-separated, hashed at load), a
//! `/v1/*` request must carry one of them as its credential, else 401.
//! Only hashes are kept in memory; the raw key is never stored or logged.
//!
//! A caller's credential is its Google credential when it sends one (a
//! Gemini key in `x-goog-api-key` or `?key=`, an OAuth token in
//! `?access_token=` or `?oauth_token=`: what goes upstream to Gemini), else
//! its `Authorization: Bearer` token (OpenAI clients), else its `x-api-key`
//! (Anthropic clients). [`credential`] is the one place that decides it: the
//! gateway key check, the tenant scope, its label, rate limit and budgets,
//! and the credential forwarded upstream all see the same key, wherever it
//! was sent.
//!
//! A credential goes only to the provider it belongs to: a key whose form
//! names a provider ([`Provider::of_key`]: Google's `AIza…`/`ya29.…`,
//! Anthropic's `sk-ant-…`, OpenAI's `sk-proj-…`) is refused before it would
//! be forwarded to another one (`Upstream::check_credential`).
//!
//! The tenant a request belongs to is derived from its credential by
//! [`TenantKey`]: an HMAC-SHA-256 under a server secret
//! (`auth.tenant_secret_env`), so a tenant scope seen in Redis or a log cannot
//! be linked back to an API key by anyone who does not hold the secret, not
//! even by hashing a guessed key.

use std::{
    borrow::Cow,
    collections::{HashMap, HashSet},
    sync::Arc,
};

use axum::http::{HeaderMap, HeaderName, HeaderValue, header};

use crate::{
    config::{Api, Config},
    error::GatewayError,
    tenant::TenantScope,
};

use crate::tenant::{TenantKey, key_hash};

/// The token of `Bearer <token>` (scheme case-insensitive, RFC 9110), else
/// the whole value; `Bearer` with no token is empty (no credential).
pub fn bearer_token(value: &[u8]) -> &[u8] {
    let value = value.trim_ascii();
    if value.eq_ignore_ascii_case(b"bearer") {
        return &[];
    }
    match value.get(..7) {
        Some(scheme) if scheme.eq_ignore_ascii_case(b"bearer ") => value[7..].trim_ascii(),
        _ => value,
    }
}

/// Anthropic's credential header (its SDKs, curl examples, coding agents).
pub const API_KEY_HEADER: HeaderName = HeaderName::from_static("x-api-key");

/// Azure OpenAI's credential header (`AzureOpenAI(api_key=...)`).
pub const AZURE_KEY_HEADER: HeaderName = HeaderName::from_static("api-key");

/// The header Google's SDKs carry a Gemini key in (also `?key=`).
pub const GEMINI_KEY_HEADER: HeaderName = HeaderName::from_static("x-goog-api-key");

/// The caller's credential, wherever it was sent: its Google credential
/// (`x-goog-api-key`, `?key=`, `?access_token=`, `?oauth_token=`; a Gemini
/// request's, which is what goes upstream), else the token of its
/// `Authorization` header, else its `x-api-key` or `api-key`; an empty one is none. Every
/// reader of a caller's identity goes through here (admission, the tenant
/// scope, its label, rate limit and budgets), so two places can never name
/// two tenants for one request. Two different Google credentials are a 400
/// ([`gemini_key`]).
pub fn credential<'a>(
    headers: &'a HeaderMap,
    query: Option<&str>,
) -> Result<Option<Cow<'a, [u8]>>, GatewayError> {
    if headers.contains_key(&GEMINI_KEY_HEADER) || query_credential(query).is_some() {
        let (google, _) = gemini_key(headers, query)?;
        if let Some(google) = google {
            return Ok(Some(Cow::Owned(bearer_token(google.as_bytes()).to_vec())));
        }
    }
    Ok(header_credential(headers).map(Cow::Borrowed))
}

/// Whether an `Authorization` value is an AWS SigV4 signature (an AWS SDK's
/// request): corral cannot verify one, so it identifies nobody and goes
/// nowhere.
pub fn is_sigv4(value: &[u8]) -> bool {
    value.trim_ascii().starts_with(b"AWS4-HMAC-SHA256")
}

/// The token of the caller's `Authorization` header, else its `x-api-key`.
fn header_credential(headers: &HeaderMap) -> Option<&[u8]> {
    headers
        .get(header::AUTHORIZATION)
        .filter(|value| !is_sigv4(value.as_bytes()))
        .map(|value| bearer_token(value.as_bytes()))
        .filter(|token| !token.is_empty())
        .or_else(|| key_header(headers))
}

/// The caller's key header: Anthropic's `x-api-key`, else Azure's `api-key`
/// (what an `AzureOpenAI` client sends).
fn key_header(headers: &HeaderMap) -> Option<&[u8]> {
    [API_KEY_HEADER, AZURE_KEY_HEADER].iter().find_map(|name| {
        headers
            .get(name)
            .map(|value| value.as_bytes().trim_ascii())
            .filter(|key| !key.is_empty())
    })
}

/// The caller's credential as an `Authorization` value, to forward when the
/// upstream has no key of its own: its `Authorization` header as it came
/// (the scheme kept), else `Bearer <x-api-key>`. The upstream client sends it
/// in the form its provider expects (`x-api-key` to Anthropic).
pub fn forwarded_credential(headers: &HeaderMap) -> Option<HeaderValue> {
    if let Some(value) = headers.get(header::AUTHORIZATION)
        && !is_sigv4(value.as_bytes())
        && !bearer_token(value.as_bytes()).is_empty()
    {
        return Some(value.clone());
    }
    let key = key_header(headers)?;
    let mut value = b"Bearer ".to_vec();
    value.extend_from_slice(key);
    let mut value = HeaderValue::from_bytes(&value).ok()?;
    value.set_sensitive(true);
    Some(value)
}

#[derive(Debug)]
pub struct Auth {
    /// Hashes of the accepted gateway keys; empty: auth is off.
    keys: HashSet<[u8; 32]>,
    tenant_key: Option<TenantKey>,
    /// `auth.key_labels`: gateway key hash -> the tenant's name on `/stats`.
    labels: HashMap<[u8; 32], Arc<str>>,
}

/// Characters of a tenant scope `/stats` shows for an unlabelled tenant: its
/// tag and 12 hex digits, enough to tell tenants apart, too few to be a key.
const SHORT_SCOPE: usize = 13;

impl Auth {
    pub fn new(config: &Config) -> Self {
        Self {
            keys: config.auth.key_hashes.iter().copied().collect(),
            tenant_key: config
                .auth
                .tenant_secret
                .as_ref()
                .map(|secret| TenantKey::new(secret.expose())),
            labels: config
                .auth
                .labels_by_hash
                .iter()
                .map(|(hash, label)| (*hash, Arc::from(label.as_str())))
                .collect(),
        }
    }

    /// The tenant's name on `/stats`, in budgets and token rates: its key's
    /// configured label (`auth.key_labels`), else the short form of its
    /// scope (`scope` when the caller has it, else derived here). Never the
    /// credential. `credential`: the caller's, as [`credential`] decides it.
    pub fn tenant_label(&self, credential: Option<&[u8]>, scope: Option<&TenantScope>) -> Arc<str> {
        if !self.labels.is_empty()
            && let Some(label) = credential.and_then(|token| self.labels.get(&key_hash(token)))
        {
            return label.clone();
        }
        let derived;
        let scope = match scope {
            Some(scope) => scope,
            None => {
                derived = TenantScope::of_credential(self.tenant_key(), credential);
                &derived
            }
        };
        let text = scope.as_str();
        Arc::from(&text[..text.len().min(SHORT_SCOPE)])
    }

    /// Whether any key has a label: only then does a request's label need
    /// its credential (`tenant_label`), else its scope says it.
    pub fn has_labels(&self) -> bool {
        !self.labels.is_empty()
    }

    pub fn enabled(&self) -> bool {
        !self.keys.is_empty()
    }

    pub fn tenant_key(&self) -> Option<&TenantKey> {
        self.tenant_key.as_ref()
    }

    /// Checks the gateway key (when auth is on) and returns the caller's
    /// tenant, the key rate limits are kept under. This is the caller's own
    /// scope even with `cache.scope: global`: sharing answers is not sharing
    /// a rate limit.
    /// The credential is the caller's wherever it was sent ([`credential`]):
    /// one key is one tenant, in whichever place it came.
    pub fn authenticate(
        &self,
        headers: &HeaderMap,
        query: Option<&str>,
    ) -> Result<TenantScope, GatewayError> {
        self.authenticate_credential(credential(headers, query)?.as_deref())
    }

    /// As [`authenticate`](Self::authenticate), for a credential already read.
    pub fn authenticate_credential(
        &self,
        credential: Option<&[u8]>,
    ) -> Result<TenantScope, GatewayError> {
        if self.enabled() {
            let known = credential.is_some_and(|token| self.keys.contains(&key_hash(token)));
            if !known {
                return Err(GatewayError::Unauthorized);
            }
        }
        Ok(TenantScope::of_credential(self.tenant_key(), credential))
    }
}

/// The query parameters Google's APIs read a caller's credential from: an
/// API key (`key`), or an OAuth access token (`access_token`, `oauth_token`),
/// which goes upstream as `Authorization: Bearer`.
const QUERY_CREDENTIALS: [(&str, bool); 3] = [
    ("key", false),
    ("access_token", true),
    ("oauth_token", true),
];

/// A credential read from the query: its value, decoded, and whether it is
/// an OAuth token (else an API key).
#[derive(Clone, PartialEq, Eq)]
pub struct QueryCredential {
    value: String,
    oauth: bool,
}

impl std::fmt::Debug for QueryCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueryCredential")
            .field("oauth", &self.oauth)
            .finish_non_exhaustive()
    }
}

impl QueryCredential {
    /// The value it goes upstream as: the key as it is (`x-goog-api-key`),
    /// an OAuth token as `Bearer <token>` (`Authorization`).
    fn forwarded(&self) -> Result<HeaderValue, GatewayError> {
        let value = if self.oauth {
            HeaderValue::from_str(&format!("Bearer {}", self.value))
        } else {
            HeaderValue::from_str(&self.value)
        };
        let mut value = value.map_err(|_| {
            GatewayError::invalid("the credential in the query is not a valid key or token")
        })?;
        value.set_sensitive(true);
        Ok(value)
    }
}

/// A query's `&`-separated pairs, each with its value decoded when it is a
/// credential parameter ([`QUERY_CREDENTIALS`], its name percent-decoded, as
/// Google reads it). The one reader of them: recognizing, authenticating and
/// relaying a Gemini request all see the same credential.
fn credential_params(query: &str) -> impl Iterator<Item = (&str, Option<QueryCredential>)> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let name = percent_encoding::percent_decode_str(name).decode_utf8_lossy();
            let credential = QUERY_CREDENTIALS
                .iter()
                .find(|(known, _)| *known == name)
                .map(|&(_, oauth)| QueryCredential {
                    value: percent_encoding::percent_decode_str(&value.replace('+', " "))
                        .decode_utf8_lossy()
                        .into_owned(),
                    oauth,
                });
            (pair, credential)
        })
}

/// The first credential in a query (`key`, `access_token`, `oauth_token`),
/// decoded ([`gemini_key`] refuses two different ones).
pub fn query_credential(query: Option<&str>) -> Option<QueryCredential> {
    credential_params(query?).find_map(|(_, credential)| credential)
}

/// The caller's Google credential (`x-goog-api-key`, else the query's `key`,
/// `access_token` or `oauth_token`) as it goes upstream (a key as itself, an
/// OAuth token as `Bearer <token>`), and the query without it: a credential
/// goes upstream in a header only, never in the URL. Two different
/// credentials in one request are refused: whose would it be? An empty one
/// is none.
pub fn gemini_key(
    headers: &HeaderMap,
    query: Option<&str>,
) -> Result<(Option<HeaderValue>, Option<String>), GatewayError> {
    let mut from_query: Option<QueryCredential> = None;
    let mut kept = Vec::new();
    for (pair, credential) in credential_params(query.unwrap_or_default()) {
        match credential {
            Some(credential) => {
                if credential.value.is_empty() {
                    continue;
                }
                if from_query.as_ref().is_some_and(|seen| *seen != credential) {
                    return Err(two_keys());
                }
                from_query = Some(credential);
            }
            None => kept.push(pair),
        }
    }
    let from_header = headers
        .get(&GEMINI_KEY_HEADER)
        .filter(|value| !value.as_bytes().trim_ascii().is_empty())
        .cloned();
    let key = match (from_header, from_query) {
        (Some(header), Some(query))
            if query.oauth || header.as_bytes() != query.value.as_bytes() =>
        {
            return Err(two_keys());
        }
        (Some(header), _) => Some(header),
        (None, Some(query)) => Some(query.forwarded()?),
        (None, None) => None,
    };
    let query = (!kept.is_empty()).then(|| kept.join("&"));
    Ok((key, query))
}

fn two_keys() -> GatewayError {
    GatewayError::invalid(
        "the request carries two different Google credentials (of `x-goog-api-key`, `key`, `access_token`, `oauth_token`); send one",
    )
}

/// A provider a credential can belong to, by the credential's form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    OpenAi,
    Anthropic,
    Google,
    /// Azure's keys have no form of their own: only an Azure account is
    /// this, and only another provider's form is refused for it.
    Azure,
}

impl Provider {
    /// The provider whose form a credential (a token, without its scheme)
    /// has: Google's API keys (`AIza…`) and OAuth access tokens (`ya29.…`),
    /// Anthropic's keys and OAuth tokens (`sk-ant-…`), OpenAI's project,
    /// service-account and admin keys (`sk-proj-…`, `sk-svcacct-…`,
    /// `sk-admin-…`). A bare `sk-…` names nobody: OpenAI's older keys have
    /// it, and so do many OpenAI-compatible providers' (DeepSeek, ...).
    pub fn of_key(token: &[u8]) -> Option<Self> {
        const FORMS: [(&[u8], Provider); 6] = [
            (b"AIza", Provider::Google),
            (b"ya29.", Provider::Google),
            (b"sk-ant-", Provider::Anthropic),
            (b"sk-proj-", Provider::OpenAi),
            (b"sk-svcacct-", Provider::OpenAi),
            (b"sk-admin-", Provider::OpenAi),
        ];
        FORMS
            .iter()
            .find(|(prefix, _)| token.starts_with(prefix))
            .map(|&(_, provider)| provider)
    }

    /// The provider an upstream is: its host's, for the providers' own hosts
    /// (Google's and Anthropic's OpenAI-compatible endpoints take their own
    /// keys), else its API's.
    pub fn of_upstream(api: Api, host: Option<&str>) -> Self {
        let host = host.unwrap_or_default().to_ascii_lowercase();
        let under = |domain: &str| {
            host == domain
                || host
                    .strip_suffix(domain)
                    .is_some_and(|rest| rest.ends_with('.'))
        };
        if under("googleapis.com") {
            Self::Google
        } else if under("anthropic.com") {
            Self::Anthropic
        } else if under("openai.com") {
            Self::OpenAi
        } else {
            match api {
                Api::OpenAi => Self::OpenAi,
                Api::Anthropic => Self::Anthropic,
                Api::Gemini => Self::Google,
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::OpenAi => "OpenAI",
            Self::Anthropic => "Anthropic",
            Self::Google => "Google",
            Self::Azure => "Azure",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use sha2::{Digest as _, Sha256};

    #[test]
    fn the_key_leaves_the_query_and_two_different_keys_are_refused() {
        let none = HeaderMap::new();
        let (key, query) = gemini_key(&none, Some("alt=sse&key=AIza%2Dx&pageSize=2")).unwrap();
        assert_eq!(key.unwrap(), "AIza-x");
        assert_eq!(query.as_deref(), Some("alt=sse&pageSize=2"));
        let (key, query) = gemini_key(&none, Some("key=AIza-x")).unwrap();
        assert_eq!(key.unwrap(), "AIza-x");
        assert_eq!(query, None);
        let mut keyed = HeaderMap::new();
        keyed.insert(GEMINI_KEY_HEADER, HeaderValue::from_static("AIza-x"));
        assert_eq!(
            gemini_key(&keyed, Some("key=AIza-x")).unwrap().0.unwrap(),
            "AIza-x",
            "the same key in both places is one key"
        );
        assert!(gemini_key(&keyed, Some("key=AIza-y")).is_err());
        assert!(gemini_key(&none, Some("key=AIza-x&key=AIza-y")).is_err());
        assert_eq!(gemini_key(&none, None).unwrap(), (None, None));
    }

    #[test]
    fn an_oauth_token_in_the_query_is_the_credential_and_leaves_the_query() {
        let none = HeaderMap::new();
        for name in ["access_token", "oauth_token", "access%5Ftoken"] {
            let query = format!("alt=sse&{name}=ya29.tok%2Den");
            let (forwarded, rest) = gemini_key(&none, Some(&query)).unwrap();
            let forwarded = forwarded.unwrap();
            assert_eq!(forwarded, "Bearer ya29.tok-en", "{name}");
            assert!(forwarded.is_sensitive());
            assert_eq!(rest.as_deref(), Some("alt=sse"));
            assert_eq!(
                credential(&none, Some(&query)).unwrap().as_deref(),
                Some(&b"ya29.tok-en"[..]),
                "the token, without its scheme, is the tenant's credential"
            );
        }
        // One token is one tenant, in the query or in `Authorization`.
        let auth = Auth::new(&Config::for_tests("http://127.0.0.1:1/v1"));
        assert_eq!(
            auth.authenticate(&none, Some("access_token=ya29.a"))
                .unwrap(),
            auth.authenticate(&headers(Some("Bearer ya29.a")), None)
                .unwrap()
        );
        assert_ne!(
            auth.authenticate(&none, Some("access_token=ya29.a"))
                .unwrap()
                .as_str(),
            "anonymous"
        );
        assert!(gemini_key(&none, Some("key=AIza-x&access_token=ya29.a")).is_err());
        let mut keyed = HeaderMap::new();
        keyed.insert(GEMINI_KEY_HEADER, HeaderValue::from_static("AIza-x"));
        assert!(gemini_key(&keyed, Some("oauth_token=AIza-x")).is_err());
        assert_eq!(
            gemini_key(&none, Some("key=&a=1")).unwrap(),
            (None, Some("a=1".to_owned()))
        );
    }

    #[test]
    fn a_key_names_its_provider_by_its_form_and_an_upstream_by_its_host_or_api() {
        for (key, provider) in [
            ("AIzaSyA-x", Some(Provider::Google)),
            ("ya29.a0Af", Some(Provider::Google)),
            ("sk-ant-api03-x", Some(Provider::Anthropic)),
            ("sk-ant-oat01-x", Some(Provider::Anthropic)),
            ("sk-proj-x", Some(Provider::OpenAi)),
            ("sk-svcacct-x", Some(Provider::OpenAi)),
            ("sk-abc", None),
            ("gw-team-a", None),
            ("", None),
        ] {
            assert_eq!(Provider::of_key(key.as_bytes()), provider, "{key}");
        }
        assert_eq!(
            Provider::of_upstream(Api::OpenAi, Some("127.0.0.1")),
            Provider::OpenAi
        );
        assert_eq!(
            Provider::of_upstream(Api::OpenAi, Some("generativelanguage.googleapis.com")),
            Provider::Google,
            "Gemini's OpenAI-compatible endpoint takes Google's keys"
        );
        assert_eq!(
            Provider::of_upstream(Api::OpenAi, Some("api.anthropic.com")),
            Provider::Anthropic
        );
        assert_eq!(
            Provider::of_upstream(Api::Anthropic, Some("api.deepseek.com")),
            Provider::Anthropic
        );
        assert_eq!(Provider::of_upstream(Api::Gemini, None), Provider::Google);
        assert_eq!(
            Provider::of_upstream(Api::OpenAi, Some("notgoogleapis.com")),
            Provider::OpenAi
        );
    }

    fn headers(authorization: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(value) = authorization {
            headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    #[test]
    fn only_configured_keys_pass_when_auth_is_on() {
        let mut config = Config::for_tests("http://127.0.0.1:1/v1");
        config.auth.key_hashes = vec![key_hash(b"gw-good")];
        let auth = Auth::new(&config);
        assert!(
            auth.authenticate(&headers(Some("Bearer gw-good")), None)
                .is_ok()
        );
        assert!(
            auth.authenticate(&headers(Some("bearer   gw-good ")), None)
                .is_ok()
        );
        for bad in [None, Some("Bearer gw-bad"), Some("Bearer "), Some("gw-goo")] {
            assert!(
                matches!(
                    auth.authenticate(&headers(bad), None),
                    Err(GatewayError::Unauthorized)
                ),
                "{bad:?}"
            );
        }
    }

    fn api_key(key: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(API_KEY_HEADER, HeaderValue::from_str(key).unwrap());
        headers
    }

    #[test]
    fn a_gateway_key_passes_in_either_header() {
        let mut config = Config::for_tests("http://127.0.0.1:1/v1");
        config.auth.key_hashes = vec![key_hash(b"gw-good")];
        let auth = Auth::new(&config);
        let bearer = auth
            .authenticate(&headers(Some("Bearer gw-good")), None)
            .unwrap();
        let x_api_key = auth.authenticate(&api_key("gw-good"), None).unwrap();
        assert_eq!(bearer, x_api_key, "one key, one tenant, whichever header");
        for bad in ["gw-bad", "", " "] {
            assert!(
                matches!(
                    auth.authenticate(&api_key(bad), None),
                    Err(GatewayError::Unauthorized)
                ),
                "{bad:?}"
            );
        }
        // An empty Authorization does not hide a good x-api-key.
        let mut both = api_key("gw-good");
        both.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer "));
        assert!(auth.authenticate(&both, None).is_ok());
    }

    #[test]
    fn x_api_keys_are_tenants_like_bearer_tokens() {
        let auth = Auth::new(&Config::for_tests("http://127.0.0.1:1/v1"));
        let a = auth.authenticate(&api_key("sk-ant-a"), None).unwrap();
        let b = auth.authenticate(&api_key("sk-ant-b"), None).unwrap();
        assert_ne!(a, b);
        assert_ne!(a.as_str(), "anonymous");
        assert_eq!(
            a,
            auth.authenticate(&headers(Some("Bearer sk-ant-a")), None)
                .unwrap()
        );
    }

    #[test]
    fn the_forwarded_credential_keeps_authorization_or_carries_the_api_key() {
        let scheme = headers(Some("Basic abc"));
        assert_eq!(forwarded_credential(&scheme).unwrap(), "Basic abc");
        let key = forwarded_credential(&api_key(" sk-ant-a ")).unwrap();
        assert_eq!(key, "Bearer sk-ant-a");
        assert!(key.is_sensitive());
        assert!(forwarded_credential(&HeaderMap::new()).is_none());
    }

    #[test]
    fn a_gemini_key_is_a_credential_in_its_header_or_the_query() {
        let config = Config::for_tests("http://127.0.0.1:1/v1");
        let auth = Auth::new(&config);
        let mut goog = HeaderMap::new();
        goog.insert(GEMINI_KEY_HEADER, HeaderValue::from_static("AIza-a"));
        assert_eq!(
            credential(&goog, None).unwrap().as_deref(),
            Some(&b"AIza-a"[..])
        );
        let from_header = auth.authenticate(&goog, None).unwrap();
        assert!(from_header == auth.authenticate(&api_key("AIza-a"), None).unwrap());
        assert!(
            from_header
                == auth
                    .authenticate(&HeaderMap::new(), Some("key=AIza-a"))
                    .unwrap()
        );
        assert!(from_header != auth.authenticate(&api_key("AIza-b"), None).unwrap());
        // The Gemini key comes first: it is what goes upstream.
        goog.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer sk-x"),
        );
        assert_eq!(
            credential(&goog, None).unwrap().as_deref(),
            Some(&b"AIza-a"[..])
        );
        assert!(from_header == auth.authenticate(&goog, None).unwrap());
        assert!(forwarded_credential(&headers(Some("Bearer  "))).is_none());
    }

    #[test]
    fn auth_off_lets_everyone_in_with_their_own_tenant() {
        let auth = Auth::new(&Config::for_tests("http://127.0.0.1:1/v1"));
        let a = auth.authenticate(&headers(Some("Bearer a")), None).unwrap();
        let b = auth.authenticate(&headers(Some("Bearer b")), None).unwrap();
        assert_ne!(a, b);
        assert_eq!(
            auth.authenticate(&headers(None), None).unwrap().as_str(),
            "anonymous"
        );
    }

    #[test]
    fn tenants_are_named_by_their_key_label_or_a_short_scope() {
        let mut config = Config::for_tests("http://127.0.0.1:1/v1");
        config.auth.labels_by_hash = vec![(key_hash(b"gw-team-a"), "team-a".to_owned())];
        let auth = Auth::new(&config);
        assert_eq!(&*auth.tenant_label(Some(b"gw-team-a"), None), "team-a");
        let other = auth.tenant_label(Some(b"sk-other"), None);
        assert_eq!(other.len(), SHORT_SCOPE);
        assert!(other.starts_with('t'), "{other}");
        assert!(!other.contains("sk-other"));
        let scope = auth
            .authenticate(&headers(Some("Bearer sk-other")), None)
            .unwrap();
        assert_eq!(auth.tenant_label(None, Some(&scope)), other);
        assert_eq!(&*auth.tenant_label(None, None), "anonymous");
    }

    #[test]
    fn keyed_scopes_depend_on_the_secret_and_never_show_the_plain_hash() {
        let one = TenantKey::new(b"secret-one");
        let two = TenantKey::new(b"secret-two");
        let a1 = TenantScope::of_credential(Some(&one), Some(b"sk-a"));
        assert_ne!(a1, TenantScope::of_credential(Some(&two), Some(b"sk-a")));
        assert_ne!(a1, TenantScope::of_credential(None, Some(b"sk-a")));
        assert_eq!(a1, TenantScope::of_credential(Some(&one), Some(b"sk-a")));
        let plain = hex::encode(Sha256::digest(b"sk-a"));
        assert!(!plain.contains(&a1.as_str()[1..]));
        assert!(!format!("{one:?}").contains("secret"));
    }
}
