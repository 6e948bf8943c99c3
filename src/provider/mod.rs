//! The providers corral calls, each one adapter behind [`Adapter`]: its
//! paths (where a call below its base URL goes, and the model's name there),
//! its auth (the credential's header and form, a token it fetches), and its
//! quirks. The client (`upstream`) sends what an adapter [`prepare`]s and
//! knows no provider by name; a new provider adds a file here.
//!
//! [`prepare`]: Adapter::prepare

mod anthropic;
mod azure;
mod bedrock;
pub mod entra;
mod eventstream;
mod gemini;
pub mod google;
mod oauth;
mod openai;
pub mod token;
mod vertex;

use std::fmt;

use axum::http::{HeaderName, HeaderValue, Method};
use bytes::Bytes;
use serde_json::Value;

use crate::{
    auth,
    config::{Member, ProviderKind, Secret},
    error::GatewayError,
};
pub use anthropic::DEFAULT_ANTHROPIC_VERSION;
use token::TokenCache;

/// One request to a provider, as the client has it: in the terms of the
/// pool's wire format (OpenAI's `/chat/completions`, Gemini's
/// `/models/{model}:{method}`), before any provider's own naming.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    pub method: &'a Method,
    /// Below the base URL, in the wire's own terms.
    pub path: &'a str,
    pub query: Option<&'a str>,
    /// The public model the request is routed by (`None`: a pass-through
    /// call, which names none).
    pub model: Option<&'a str>,
    /// The caller's headers that go upstream (keyed and allowlisted).
    pub headers: &'a [(HeaderName, HeaderValue)],
    /// The caller's credential, sent only to an account without one of its
    /// own, in the form its provider takes.
    pub authorization: Option<&'a HeaderValue>,
    pub body: &'a Bytes,
}

/// What one attempt sends, as the provider takes it.
#[derive(Debug)]
pub struct Prepared {
    pub url: reqwest::Url,
    /// The credential and version headers, added after the caller's.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: Bytes,
}

/// A provider: how a call in its wire's terms becomes a request it takes.
pub trait Adapter: Send + Sync + fmt::Debug {
    /// What it holds of its account.
    fn account(&self) -> &Account;

    fn kind(&self) -> ProviderKind {
        self.account().kind
    }

    /// Every request URL extends its path (`confined_url`).
    fn base(&self) -> &reqwest::Url {
        &self.account().base
    }

    /// Whose credentials the account may be sent: a caller's credential of
    /// another provider's form is refused before anything is sent.
    fn owner(&self) -> auth::Provider {
        self.account().owner
    }

    /// Whether corral authenticates itself (a key, a token it fetches): the
    /// caller's credential is then never sent.
    fn has_own_credential(&self) -> bool {
        self.account().api_key.is_some()
    }

    /// The account's token source, when it authenticates with tokens it
    /// fetches (Entra ID): the client asks it for a token before each attempt.
    fn token(&self) -> Option<&TokenCache> {
        None
    }

    /// Whether the caller's header `name` (keyed and allowlisted) goes to
    /// this provider: one that takes the caller's settings in the body
    /// instead (Bedrock's `anthropic_beta`), or signs its headers, refuses
    /// them.
    fn forwards(&self, _name: &HeaderName) -> bool {
        true
    }

    /// The request for `call`; `token` is the bearer from [`Adapter::token`].
    fn prepare(
        &self,
        call: &Call<'_>,
        token: Option<&HeaderValue>,
    ) -> Result<Prepared, GatewayError>;

    /// Every response of an attempt, before anything reads it, in the terms
    /// of the pool's wire: a provider whose stream or errors take another
    /// form (Bedrock's binary event stream, its `x-amzn-ErrorType` errors)
    /// answers as the wire's own provider would.
    fn answer(&self, response: reqwest::Response) -> reqwest::Response {
        response
    }
}

/// The adapter for `member`, calling with `client` (a token request too).
pub fn adapter(member: &Member, client: &reqwest::Client) -> anyhow::Result<Box<dyn Adapter>> {
    let account = Account::new(member)?;
    Ok(match member.provider {
        ProviderKind::OpenAi => Box::new(openai::OpenAi { account }),
        ProviderKind::Anthropic => Box::new(anthropic::Anthropic { account }),
        ProviderKind::Gemini => Box::new(gemini::Gemini { account }),
        ProviderKind::Azure => Box::new(azure::Azure::new(account, member, client)?),
        ProviderKind::Bedrock => Box::new(bedrock::Bedrock::new(account, member)?),
        ProviderKind::Vertex => Box::new(vertex::Vertex::new(account, member, client)?),
    })
}

/// What every adapter holds of its account.
#[derive(Debug)]
pub struct Account {
    kind: ProviderKind,
    base: reqwest::Url,
    /// Whose credentials it may be sent (`auth::Provider::of_upstream`; an
    /// Azure account is Azure's whatever its host).
    owner: auth::Provider,
    api_key: Option<Secret<String>>,
    /// Public model name -> the account's name for it.
    deployments: std::sync::Arc<std::collections::BTreeMap<String, String>>,
    /// The key as a header value, and as `Bearer <key>`, made once (both
    /// `None` without a key, or with one that is no header value).
    key_header: Option<HeaderValue>,
    bearer_header: Option<HeaderValue>,
    /// Request URLs already made for query-less paths (`url`).
    urls: UrlMemo,
}

impl Account {
    fn new(member: &Member) -> anyhow::Result<Self> {
        let base = reqwest::Url::parse(&member.base_url)?;
        let owner = match member.provider {
            ProviderKind::Azure => auth::Provider::Azure,
            _ => auth::Provider::of_upstream(member.api, base.host_str()),
        };
        let key = member.api_key.as_ref().map(|key| key.expose().as_str());
        Ok(Self {
            kind: member.provider,
            base,
            owner,
            api_key: member.api_key.clone(),
            deployments: member.deployments.clone(),
            key_header: key.and_then(|key| sensitive(key.as_bytes()).ok()),
            bearer_header: key.and_then(|key| sensitive(format!("Bearer {key}").as_bytes()).ok()),
            urls: UrlMemo::default(),
        })
    }

    /// The request URL for `path` and `query` (`confined_url`); a query-less
    /// path's is made once and cloned after (the deduplicated endpoints are a
    /// handful of paths, and a URL parse is a visible part of a miss's work).
    fn url(&self, path: &str, query: Option<&str>) -> Result<reqwest::Url, GatewayError> {
        if query.is_some() {
            return confined_url(&self.base, path, query);
        }
        if let Some(url) = self.urls.0.get(path) {
            return Ok(url);
        }
        let url = confined_url(&self.base, path, None)?;
        self.urls.0.insert(path.to_owned(), url.clone());
        Ok(url)
    }

    /// The account's name for the call's model, when it has one of its own.
    fn deployment(&self, call: &Call<'_>) -> Option<&str> {
        self.deployments.get(call.model?).map(String::as_str)
    }

    /// The call's body as this account takes it: naming the account's
    /// deployment of the model, when it has one (the body as it is else: a
    /// `Bytes` clone).
    fn body(&self, call: &Call<'_>) -> Bytes {
        match self.deployment(call) {
            Some(name) => with_model(call.body, name),
            None => call.body.clone(),
        }
    }

    /// The account's key as a header value, marked sensitive.
    fn key_value(&self) -> Result<Option<HeaderValue>, GatewayError> {
        self.key_header_made_once(&self.key_header)
    }

    /// `Bearer <the account's key>`, marked sensitive.
    fn bearer_value(&self) -> Result<Option<HeaderValue>, GatewayError> {
        self.key_header_made_once(&self.bearer_header)
    }

    /// A header made of the key when the account was made: none without a
    /// key, an error for a key that is no header value.
    fn key_header_made_once(
        &self,
        value: &Option<HeaderValue>,
    ) -> Result<Option<HeaderValue>, GatewayError> {
        match (self.api_key.is_some(), value) {
            (false, _) => Ok(None),
            (true, Some(value)) => Ok(Some(value.clone())),
            (true, None) => Err(invalid_key()),
        }
    }
}

/// The URLs an account made for query-less paths: at most
/// [`URL_MEMO_PATHS`], each checked by `confined_url` when first made.
struct UrlMemo(
    quick_cache::sync::Cache<
        String,
        reqwest::Url,
        quick_cache::UnitWeighter,
        foldhash::fast::RandomState,
    >,
);

/// Paths an account keeps the URL of: the deduplicated endpoints and the
/// common pass-through paths fit many times over; a miss costs one parse.
const URL_MEMO_PATHS: usize = 64;

impl Default for UrlMemo {
    fn default() -> Self {
        Self(quick_cache::sync::Cache::with(
            URL_MEMO_PATHS,
            URL_MEMO_PATHS as u64,
            quick_cache::UnitWeighter,
            foldhash::fast::RandomState::default(),
            Default::default(),
        ))
    }
}

impl std::fmt::Debug for UrlMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UrlMemo")
            .field("paths", &self.0.len())
            .finish()
    }
}

fn invalid_key() -> GatewayError {
    GatewayError::invalid("the API key is not a valid header value")
}

/// A credential as a header value that never reaches a log.
fn sensitive(bytes: &[u8]) -> Result<HeaderValue, GatewayError> {
    let mut value = HeaderValue::from_bytes(bytes).map_err(|_| invalid_key())?;
    value.set_sensitive(true);
    Ok(value)
}

/// `body` with its `model` set to `name`; the body as it is when it names
/// that already or is not a JSON object (a multipart upload).
fn with_model(body: &Bytes, name: &str) -> Bytes {
    let Ok(mut object) = serde_json::from_slice::<serde_json::Map<String, Value>>(body) else {
        return body.clone();
    };
    if object.get("model").and_then(Value::as_str) == Some(name) {
        return body.clone();
    }
    object.insert("model".to_owned(), Value::String(name.to_owned()));
    serde_json::to_vec(&object).map_or_else(|_| body.clone(), Bytes::from)
}

/// The request URL: the base URL joined with `path` and `query`. It must be
/// a strict extension of the base URL's path on the same origin
/// (`passthrough::ProxyPath` already refused every way out; this is the last
/// word, for every provider).
pub fn confined_url(
    base: &reqwest::Url,
    path: &str,
    query: Option<&str>,
) -> Result<reqwest::Url, GatewayError> {
    let base_path = base.path().trim_end_matches('/');
    let mut text = format!("{}{path}", base.as_str().trim_end_matches('/'));
    if let Some(query) = query {
        text.push('?');
        text.push_str(query);
    }
    let refused = || GatewayError::PathRefused {
        reason: "it leads outside the upstream's base_url",
    };
    let url = reqwest::Url::parse(&text).map_err(|_| refused())?;
    let inside = url.origin() == base.origin()
        && url
            .path()
            .strip_prefix(base_path)
            .is_some_and(|rest| rest.len() > 1 && rest.starts_with('/'));
    if inside { Ok(url) } else { Err(refused()) }
}

#[cfg(test)]
mod tests;
