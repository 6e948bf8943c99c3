//! Gateway keys and tenant identity.
//!
//! With `auth.keys` (SHA-256 hashes of the keys, hex) or `auth.keys_env` (a
//! variable holding the keys themselves, comma-separated, hashed at load), a
//! `/v1/*` request must carry one of them as its credential, else 401.
//! Only hashes are kept in memory; the raw key is never stored or logged.
//!
//! A caller's credential is its `Authorization: Bearer` token (OpenAI clients)
//! or, without one, its `x-api-key` (Anthropic clients). [`credential`] is the
//! one place that reads them: the gateway key check, the tenant scope, the
//! rate limit and the credential forwarded upstream all see the same key,
//! whichever header carried it.
//!
//! The tenant a request belongs to is derived from its credential by
//! [`TenantKey`]: an HMAC-SHA-256 under a server secret
//! (`auth.tenant_secret_env`), so a tenant scope seen in Redis or a log cannot
//! be linked back to an API key by anyone who does not hold the secret, not
//! even by hashing a guessed key.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use axum::http::{HeaderMap, HeaderName, HeaderValue, header};

use crate::{config::Config, error::GatewayError, tenant::TenantScope};

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

/// The header Google's SDKs carry a Gemini key in (also `?key=`).
pub const GEMINI_KEY_HEADER: HeaderName = HeaderName::from_static("x-goog-api-key");

/// The caller's credential: the token of its `Authorization` header, else its
/// `x-api-key`, else its `x-goog-api-key` (Google's SDKs); an empty one is
/// none. Every reader of a caller's identity goes through here, so two
/// headers can never name two tenants for one request. (A Gemini key in the
/// query, `?key=`, is the same credential: [`Auth::authenticate_credential`].)
pub fn credential(headers: &HeaderMap) -> Option<&[u8]> {
    headers
        .get(header::AUTHORIZATION)
        .map(|value| bearer_token(value.as_bytes()))
        .filter(|token| !token.is_empty())
        .or_else(|| {
            [API_KEY_HEADER, GEMINI_KEY_HEADER].iter().find_map(|name| {
                headers
                    .get(name)
                    .map(|value| value.as_bytes().trim_ascii())
                    .filter(|key| !key.is_empty())
            })
        })
}

/// The caller's credential as an `Authorization` value, to forward when the
/// upstream has no key of its own: its `Authorization` header as it came
/// (the scheme kept), else `Bearer <x-api-key>`. The upstream client sends it
/// in the form its provider expects (`x-api-key` to Anthropic).
pub fn forwarded_credential(headers: &HeaderMap) -> Option<HeaderValue> {
    if let Some(value) = headers.get(header::AUTHORIZATION)
        && !bearer_token(value.as_bytes()).is_empty()
    {
        return Some(value.clone());
    }
    let key = headers
        .get(API_KEY_HEADER)
        .map(|value| value.as_bytes().trim_ascii())
        .filter(|key| !key.is_empty())?;
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

    /// The tenant's name on `/stats`: its gateway key's configured label, else
    /// the short form of its scope (`scope` when the caller has it, else
    /// derived here). Never the credential.
    pub fn tenant_label(&self, headers: &HeaderMap, scope: Option<&TenantScope>) -> Arc<str> {
        let credential = credential(headers);
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
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<TenantScope, GatewayError> {
        self.authenticate_credential(credential(headers))
    }

    /// As [`authenticate`](Self::authenticate), for a credential found
    /// elsewhere (a Gemini key in the query): one key is one tenant, in
    /// whichever place it came.
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

/// A query's `&`-separated pairs, each with its value decoded when it is
/// Gemini's `key` parameter (its name percent-decoded, as Google reads it).
/// The one reader of `key`: recognizing, authenticating and relaying a
/// Gemini request all see the same key.
fn key_params(query: &str) -> impl Iterator<Item = (&str, Option<String>)> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let is_key = percent_encoding::percent_decode_str(name).decode_utf8_lossy() == "key";
            let key = is_key.then(|| {
                percent_encoding::percent_decode_str(&value.replace('+', " "))
                    .decode_utf8_lossy()
                    .into_owned()
            });
            (pair, key)
        })
}

/// The Gemini key in a query's `key` parameter, percent-decoded (its first,
/// when there are several; [`gemini_key`] refuses two different ones).
pub fn query_key(query: Option<&str>) -> Option<String> {
    key_params(query?).find_map(|(_, key)| key)
}

/// The caller's Gemini key (`x-goog-api-key`, else `?key=`), and the query
/// without it: the key goes upstream in its header only, never in the URL.
/// Two different keys in one request are refused: whose would it be?
pub fn gemini_key(
    headers: &HeaderMap,
    query: Option<&str>,
) -> Result<(Option<HeaderValue>, Option<String>), GatewayError> {
    let mut from_query = None;
    let mut kept = Vec::new();
    for (pair, key) in key_params(query.unwrap_or_default()) {
        match key {
            Some(value) => {
                if from_query.as_ref().is_some_and(|seen| *seen != value) {
                    return Err(two_keys());
                }
                from_query = Some(value);
            }
            None => kept.push(pair),
        }
    }
    let from_header = headers.get(&GEMINI_KEY_HEADER).cloned();
    let key = match (from_header, from_query) {
        (Some(header), Some(query)) if header.as_bytes() != query.as_bytes() => {
            return Err(two_keys());
        }
        (Some(header), _) => Some(header),
        (None, Some(query)) => Some(
            HeaderValue::from_str(&query)
                .map_err(|_| GatewayError::invalid("the `key` parameter is not a valid key"))?,
        ),
        (None, None) => None,
    };
    let query = (!kept.is_empty()).then(|| kept.join("&"));
    Ok((key, query))
}

fn two_keys() -> GatewayError {
    GatewayError::invalid(
        "the request carries two different Gemini keys (`x-goog-api-key` and `key`); send one",
    )
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
        assert!(auth.authenticate(&headers(Some("Bearer gw-good"))).is_ok());
        assert!(
            auth.authenticate(&headers(Some("bearer   gw-good ")))
                .is_ok()
        );
        for bad in [None, Some("Bearer gw-bad"), Some("Bearer "), Some("gw-goo")] {
            assert!(
                matches!(
                    auth.authenticate(&headers(bad)),
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
        let bearer = auth.authenticate(&headers(Some("Bearer gw-good"))).unwrap();
        let x_api_key = auth.authenticate(&api_key("gw-good")).unwrap();
        assert_eq!(bearer, x_api_key, "one key, one tenant, whichever header");
        for bad in ["gw-bad", "", " "] {
            assert!(
                matches!(
                    auth.authenticate(&api_key(bad)),
                    Err(GatewayError::Unauthorized)
                ),
                "{bad:?}"
            );
        }
        // An empty Authorization does not hide a good x-api-key.
        let mut both = api_key("gw-good");
        both.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer "));
        assert!(auth.authenticate(&both).is_ok());
    }

    #[test]
    fn x_api_keys_are_tenants_like_bearer_tokens() {
        let auth = Auth::new(&Config::for_tests("http://127.0.0.1:1/v1"));
        let a = auth.authenticate(&api_key("sk-ant-a")).unwrap();
        let b = auth.authenticate(&api_key("sk-ant-b")).unwrap();
        assert_ne!(a, b);
        assert_ne!(a.as_str(), "anonymous");
        assert_eq!(
            a,
            auth.authenticate(&headers(Some("Bearer sk-ant-a")))
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
        assert_eq!(credential(&goog), Some(&b"AIza-a"[..]));
        let from_header = auth.authenticate(&goog).unwrap();
        assert!(from_header == auth.authenticate(&api_key("AIza-a")).unwrap());
        assert!(from_header == auth.authenticate_credential(Some(b"AIza-a")).unwrap());
        assert!(from_header != auth.authenticate(&api_key("AIza-b")).unwrap());
        // `Authorization` still comes first.
        goog.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer sk-x"),
        );
        assert_eq!(credential(&goog), Some(&b"sk-x"[..]));
        assert!(forwarded_credential(&headers(Some("Bearer  "))).is_none());
    }

    #[test]
    fn auth_off_lets_everyone_in_with_their_own_tenant() {
        let auth = Auth::new(&Config::for_tests("http://127.0.0.1:1/v1"));
        let a = auth.authenticate(&headers(Some("Bearer a"))).unwrap();
        let b = auth.authenticate(&headers(Some("Bearer b"))).unwrap();
        assert_ne!(a, b);
        assert_eq!(
            auth.authenticate(&headers(None)).unwrap().as_str(),
            "anonymous"
        );
    }

    #[test]
    fn tenants_are_named_by_their_key_label_or_a_short_scope() {
        let mut config = Config::for_tests("http://127.0.0.1:1/v1");
        config.auth.labels_by_hash = vec![(key_hash(b"gw-team-a"), "team-a".to_owned())];
        let auth = Auth::new(&config);
        assert_eq!(
            &*auth.tenant_label(&headers(Some("Bearer gw-team-a")), None),
            "team-a"
        );
        let other = auth.tenant_label(&headers(Some("Bearer sk-other")), None);
        assert_eq!(other.len(), SHORT_SCOPE);
        assert!(other.starts_with('t'), "{other}");
        assert!(!other.contains("sk-other"));
        let scope = auth
            .authenticate(&headers(Some("Bearer sk-other")))
            .unwrap();
        assert_eq!(auth.tenant_label(&headers(None), Some(&scope)), other);
        assert_eq!(&*auth.tenant_label(&headers(None), None), "anonymous");
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
