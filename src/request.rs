//! A deduplicable request, parsed and classified once: its body, route,
//! tenant scope, fingerprint, the headers to forward, and what it may do with
//! the cache.

use std::{sync::Arc, time::Duration};

use axum::http::{HeaderMap, HeaderName, HeaderValue, header};
use bytes::Bytes;
use serde_json::{Map, Value};

use crate::{
    auth,
    config::{Api, CacheConfig, CacheScope, LimitsConfig},
    error::{ErrorShape, GatewayError},
    fingerprint::{
        Endpoint, Fingerprint, IdempotencyKey, KeyInput, LabelFields, Normalization,
        canonical_body_with,
    },
    sse::Framing,
    tenant::{TenantKey, TenantScope},
    upstream::{DEFAULT_ANTHROPIC_VERSION, Routes},
    validate::{self, InputLimits},
    wire::{self, Echo, PathApi, PathCall, Wire},
};

/// What parsing holds a request to, besides routing: the cache settings, the
/// input limits and the server's tenant key. `&CacheConfig` converts into it
/// with the default limits and no key (tests, tools).
#[derive(Debug, Clone, Copy)]
pub struct RequestRules<'a> {
    pub cache: &'a CacheConfig,
    pub limits: InputLimits,
    pub tenant_key: Option<&'a TenantKey>,
    /// The caller's own tenant, as admission derived it from this request's
    /// credential under `tenant_key` (`Auth::authenticate`): the parse takes
    /// it rather than read the credential and hash it again. `None`: derived
    /// here (tests, tools).
    pub caller: Option<&'a TenantScope>,
}

impl<'a> From<&'a CacheConfig> for RequestRules<'a> {
    fn from(cache: &'a CacheConfig) -> Self {
        Self {
            cache,
            limits: InputLimits::from(&LimitsConfig::default()),
            tenant_key: None,
            caller: None,
        }
    }
}

/// Request headers that can change the provider's answer: keyed and forwarded.
/// Each API's are absent from the other's requests, so one list serves both.
/// `X-Corral-Coalesce: off`: the caller's own upstream call, shared with nobody.
pub const COALESCE_HEADER: HeaderName = HeaderName::from_static("x-corral-coalesce");

pub const KEYED_HEADERS: [HeaderName; 5] = [
    HeaderName::from_static("openai-beta"),
    HeaderName::from_static("openai-organization"),
    HeaderName::from_static("openai-project"),
    ANTHROPIC_VERSION,
    ANTHROPIC_BETA,
];

const ANTHROPIC_VERSION: HeaderName = HeaderName::from_static("anthropic-version");
const ANTHROPIC_BETA: HeaderName = HeaderName::from_static("anthropic-beta");

/// Request headers forwarded without being keyed, because they cannot change the
/// answer. Every other header is dropped: an input that is neither keyed nor
/// stripped would let one caller poison another's cache entry.
pub const FORWARDED_HEADERS: [HeaderName; 1] = [header::ACCEPT];

/// What a request may do with the cache, from `Cache-Control` and the sampling policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CachePolicy {
    /// May be answered from a stored entry.
    pub read: bool,
    /// Its answer may be stored.
    pub write: bool,
    /// Only entries at most this old may answer it (`max-age=N`).
    pub max_age: Option<Duration>,
    /// `no-store`: neither coalesced nor cached, sent upstream as is.
    pub bypass: bool,
    /// `no-cache`: the caller asked to skip stored entries (RFC 9211 `fwd=request`).
    pub revalidate: bool,
    /// Shares a flight with identical callers (the default). `X-Corral-Coalesce: off`:
    /// the caller's own upstream call (best-of-N in parallel wants N samples),
    /// still counted and still feeding the retry window.
    pub coalesce: bool,
}

impl CachePolicy {
    fn from_headers(headers: &HeaderMap) -> Self {
        let mut policy = Self {
            read: true,
            write: true,
            max_age: None,
            bypass: false,
            revalidate: false,
            coalesce: true,
        };
        if headers
            .get(&COALESCE_HEADER)
            .is_some_and(|value| value.as_bytes().trim_ascii().eq_ignore_ascii_case(b"off"))
        {
            policy.coalesce = false;
        }
        for value in headers.get_all(header::CACHE_CONTROL) {
            let Ok(value) = value.to_str() else { continue };
            for directive in value.split(',').map(|d| d.trim().to_ascii_lowercase()) {
                if directive == "no-store" {
                    policy.bypass = true;
                    policy.read = false;
                    policy.write = false;
                } else if directive == "no-cache" {
                    policy.read = false;
                    policy.revalidate = true;
                } else if let Some(seconds) = directive.strip_prefix("max-age=") {
                    if let Ok(seconds) = seconds.trim_matches('"').parse::<u64>() {
                        policy.max_age = Some(Duration::from_secs(seconds));
                    }
                }
            }
        }
        policy
    }
}

/// The SDKs' retry counter: `0` on a first attempt, `N` on the Nth retry.
pub const RETRY_COUNT_HEADER: HeaderName = HeaderName::from_static("x-stainless-retry-count");
/// IETF draft `httpapi-idempotency-key-header`.
pub const IDEMPOTENCY_KEY_HEADER: HeaderName = HeaderName::from_static("idempotency-key");
/// Longest `Idempotency-Key` accepted (a UUID is 36; Stripe allows 255).
const MAX_IDEMPOTENCY_KEY_CHARS: usize = 255;

/// How a request says it may repeat an earlier attempt of the same client.
/// Neither mark is keyed or forwarded: they change who may read the retry
/// window (`retry_window.rs`), never the answer.
#[derive(Debug, Clone, Default)]
pub struct RetryMarks {
    /// `X-Stainless-Retry-Count` > 0: an SDK retries an attempt it gave up on.
    pub sdk_retry: bool,
    /// `Idempotency-Key`, hashed with the sending credential's tenant.
    pub idempotency_key: Option<IdempotencyKey>,
}

impl RetryMarks {
    fn from_headers(
        headers: &HeaderMap,
        tenant: impl FnOnce() -> TenantScope,
    ) -> Result<Self, GatewayError> {
        // A counter that does not parse is no retry mark; it is no error either,
        // since the header is informational for every other server.
        let sdk_retry = headers
            .get(RETRY_COUNT_HEADER)
            .and_then(|value| value.to_str().ok())
            .and_then(|text| text.trim().parse::<u32>().ok())
            .is_some_and(|count| count > 0);
        let idempotency_key = match headers.get(IDEMPOTENCY_KEY_HEADER) {
            None => None,
            Some(value) => {
                // The draft sends an sf-string ("..."); SDKs send the bare token.
                let text = value.to_str().unwrap_or_default().trim();
                let text = text
                    .strip_prefix('"')
                    .and_then(|t| t.strip_suffix('"'))
                    .unwrap_or(text);
                if text.is_empty() || text.len() > MAX_IDEMPOTENCY_KEY_CHARS {
                    return Err(GatewayError::invalid(format!(
                        "the Idempotency-Key header must be 1 to {MAX_IDEMPOTENCY_KEY_CHARS} visible ASCII characters"
                    )));
                }
                Some(IdempotencyKey::of(tenant(), text.as_bytes()))
            }
        };
        Ok(Self {
            sdk_retry,
            idempotency_key,
        })
    }

    /// Whether the request carries any mark (only those consult the window).
    pub fn any(&self) -> bool {
        self.sdk_retry || self.idempotency_key.is_some()
    }
}

#[derive(Debug)]
pub struct DedupRequest {
    pub endpoint: Endpoint,
    /// The endpoint's wire format adapter.
    pub wire: &'static dyn Wire,
    /// The body as the caller sent it; this is what goes upstream.
    pub raw_body: Bytes,
    pub model: String,
    pub stream: bool,
    /// Index into `config.upstreams`.
    pub upstream: usize,
    pub scope: TenantScope,
    /// The caller's own tenant, whatever the cache shares (`scope` under
    /// `cache.scope: tenant`): idempotency keys and retries are its own.
    pub own_scope: TenantScope,
    pub fingerprint: Fingerprint,
    /// The caller's credential (`auth::forwarded_credential`), forwarded when
    /// the upstream has no key of its own.
    pub authorization: Option<HeaderValue>,
    /// Keyed and allowlisted headers to send upstream.
    pub forward_headers: Vec<(HeaderName, HeaderValue)>,
    /// Raw query string, forwarded as is (it is keyed).
    pub query: Option<String>,
    pub policy: CachePolicy,
    /// temperature 0 or a seed: the same request deserves the same answer.
    pub deterministic: bool,
    /// The parsed body (embeddings key each of its inputs).
    pub body: Map<String, Value>,
    /// The keyed headers and sorted query pairs the fingerprint holds, for
    /// keys derived from this request (an embeddings batch's items).
    pub keyed_headers: Vec<(String, String)>,
    pub query_pairs: Vec<(String, String)>,
    /// Retry counter and idempotency key, for the retry window.
    pub retry: RetryMarks,
    /// What the path named (Gemini's model and method, Azure's deployment),
    /// when it named them (`wire::PathCall`).
    pub call: Option<PathCall>,
    /// The error shape its caller parses: its path's, else its wire's.
    pub shape: ErrorShape,
    /// How the caller receives a stream (events, or Gemini's JSON array).
    pub framing: Framing,
    /// The caller's own values of the label fields its answer echoes.
    pub echo: Option<Arc<Echo>>,
    /// Which member of a pool the call goes to first (`routing::affinity_key`):
    /// never part of the key, so every member's answer is every caller's.
    /// Read only for a pool that orders by session (`Routes::orders_by_session`), else 0.
    pub affinity: u64,
}

impl DedupRequest {
    /// Parses and classifies a request; every client mistake is a 400 here,
    /// before anything is sent upstream.
    pub fn parse<'a>(
        endpoint: Endpoint,
        headers: &HeaderMap,
        query: Option<&str>,
        raw_body: Bytes,
        routes: &Routes,
        upstream_keys: &[String],
        rules: impl Into<RequestRules<'a>>,
    ) -> Result<Self, GatewayError> {
        Self::parse_named(
            endpoint,
            None,
            headers,
            query,
            raw_body,
            routes,
            upstream_keys,
            rules,
        )
    }

    /// As [`parse`](Self::parse), for a request whose path names its model
    /// (`call`: Gemini's, keyed with the path's API version; an Azure
    /// deployment, which becomes the body's `model`). A Gemini caller's key
    /// (its `x-goog-api-key`, or a `key` query parameter, which leaves the
    /// query) is its credential, sent upstream only as `x-goog-api-key`; an
    /// Azure caller's `api-version` leaves the query (it names the wire).
    #[allow(clippy::too_many_arguments)]
    pub fn parse_named<'a>(
        endpoint: Endpoint,
        call: Option<&PathCall>,
        headers: &HeaderMap,
        query: Option<&str>,
        raw_body: Bytes,
        routes: &Routes,
        upstream_keys: &[String],
        rules: impl Into<RequestRules<'a>>,
    ) -> Result<Self, GatewayError> {
        let rules = rules.into();
        let cache = rules.cache;
        let wire = wire::of(endpoint);
        if wire.api() == Api::Gemini && routes.first_of(Api::Gemini).is_none() {
            // Said before anything is parsed: nothing here can be sent anywhere.
            return Err(GatewayError::NoGeminiUpstream {
                path: call.map_or_else(String::new, |call| call.path().to_owned()),
            });
        }
        let body = validate::parse_json(&raw_body, rules.limits)?;
        let Value::Object(mut body) = body else {
            return Err(GatewayError::invalid(
                "the request body must be a JSON object",
            ));
        };
        let mut raw_body = raw_body;
        // A cloud's Messages body (Bedrock's, Vertex AI's) names no model and
        // carries the cloud's own version and betas: as Anthropic's API takes
        // it, so its key, flight and call are a Messages path's.
        let cloud_betas = match call {
            Some(call) if call.is_cloud_messages() => {
                raw_body = Bytes::new();
                cloud_messages_body(&mut body, call.stream().unwrap_or(false))?
            }
            _ => None,
        };
        // An Azure deployment, or a cloud's model id, is the model the
        // request names: the body says it too (a cloud's id by its public
        // name), so the key and the call are an OpenAI or Messages path's
        // for that model.
        let path_model = call.and_then(|call| match (&call.via, &call.model) {
            (PathApi::Azure { .. }, Some(deployment)) => Some(deployment.as_str()),
            (PathApi::Bedrock { .. } | PathApi::Vertex { .. }, Some(id)) => {
                Some(routes.public_name(id))
            }
            _ => None,
        });
        if let Some(model) = path_model
            && body.get("model").and_then(Value::as_str) != Some(model)
        {
            body.insert("model".to_owned(), Value::String(model.to_owned()));
            raw_body = Bytes::new();
        }
        if raw_body.is_empty() {
            raw_body =
                Bytes::from(serde_json::to_vec(&body).map_err(|_| {
                    GatewayError::invalid("the request body must be a JSON object")
                })?);
        }
        let model = match (
            path_model.or_else(|| call.and_then(|call| call.model.as_deref())),
            body.get("model"),
        ) {
            (Some(model), _) => model.to_owned(),
            (None, Some(Value::String(model))) if !model.is_empty() => model.clone(),
            (None, Some(_)) => {
                return Err(GatewayError::invalid_param(
                    "model",
                    "`model` must be a string",
                ));
            }
            (None, None) => {
                return Err(GatewayError::invalid_param(
                    "model",
                    "you must provide a model parameter",
                ));
            }
        };
        let upstream =
            routes
                .route_for(wire.api(), &model)
                .ok_or_else(|| GatewayError::NoRoute {
                    model: model.clone(),
                })?;
        wire.check(&body, rules.limits)?;
        let stream = call
            .and_then(PathCall::stream)
            .unwrap_or_else(|| wire.is_stream(&body));

        // The caller's tenant: its credential's wherever it was sent
        // (`auth::credential`), one key, one tenant. A Gemini request's
        // (`x-goog-api-key`, `?key=`, an OAuth token in the query) is the one
        // that goes upstream, and the query keeps none.
        let own_scope = match rules.caller {
            Some(caller) => caller.clone(),
            None => {
                let credential = auth::credential(headers, query)?;
                TenantScope::of_credential(rules.tenant_key, credential.as_deref())
            }
        };
        let framing = match call.map(|call| call.via) {
            Some(PathApi::Bedrock { stream: true }) => Framing::AwsEventStream,
            _ => wire.stream_framing(query),
        };
        let query_dedupable = wire.dedupable_query(query);
        let (authorization, query) = if wire.api() == Api::Gemini {
            auth::gemini_key(headers, query)?
        } else if let Some(PathApi::Azure { .. }) = call.map(|call| call.via) {
            (
                auth::forwarded_credential(headers),
                without_api_version(query),
            )
        } else {
            (
                auth::forwarded_credential(headers),
                query.map(str::to_owned),
            )
        };
        // The cache's scope: the caller's own tenant, or the one every
        // tenant shares. Idempotency keys stay the caller's own (`own_scope`).
        let scope = match cache.scope {
            CacheScope::Tenant => own_scope.clone(),
            CacheScope::Global => TenantScope::global(),
        };
        let retry = RetryMarks::from_headers(headers, || own_scope.clone())?;

        let mut keyed_headers = Vec::new();
        let mut forward_headers = Vec::new();
        for name in KEYED_HEADERS {
            for value in headers.get_all(&name) {
                let text = value.to_str().map_err(|_| {
                    GatewayError::invalid(format!("header {name} must be visible ASCII"))
                })?;
                keyed_headers.push((name.as_str().to_owned(), text.to_owned()));
                forward_headers.push((name.clone(), value.clone()));
            }
        }
        // Anthropic is sent the default version when the caller names none
        // (`upstream::client`): keyed as that version, both spellings are one
        // request. In `KEYED_HEADERS` order, so the key does not depend on it.
        if wire.api() == Api::Anthropic
            && !keyed_headers
                .iter()
                .any(|(name, _)| name == ANTHROPIC_VERSION.as_str())
        {
            let at = keyed_headers
                .iter()
                .position(|(name, _)| name == ANTHROPIC_BETA.as_str())
                .unwrap_or(keyed_headers.len());
            keyed_headers.insert(
                at,
                (
                    ANTHROPIC_VERSION.as_str().to_owned(),
                    DEFAULT_ANTHROPIC_VERSION.to_owned(),
                ),
            );
        }
        // Bedrock's betas come in its body: keyed and sent as Anthropic's
        // header, in `KEYED_HEADERS` order (after the version).
        if let Some(betas) = cloud_betas {
            let value = HeaderValue::from_str(&betas).map_err(|_| {
                GatewayError::invalid_param("anthropic_beta", "betas must be visible ASCII")
            })?;
            keyed_headers.retain(|(name, _)| name != ANTHROPIC_BETA.as_str());
            forward_headers.retain(|(name, _)| *name != ANTHROPIC_BETA);
            keyed_headers.push((ANTHROPIC_BETA.as_str().to_owned(), betas));
            forward_headers.push((ANTHROPIC_BETA, value));
        }
        for name in FORWARDED_HEADERS {
            if let Some(value) = headers.get(&name) {
                forward_headers.push((name, value.clone()));
            }
        }
        // A stream's framing (Gemini's `alt`) is delivery: neither keyed nor
        // sent with a shared call (a streamed call asks for its own framing).
        let query = query.map(|query| {
            query
                .split('&')
                .filter(|pair| {
                    let name = pair.split_once('=').map_or(*pair, |(name, _)| name);
                    !pair.is_empty() && !wire.is_delivery_param(name)
                })
                .collect::<Vec<_>>()
                .join("&")
        });
        let mut query_pairs = sorted_query_pairs(query.as_deref());
        if let Some(call) = call {
            // What the path names is keyed beside the query (`:` starts no
            // parameter): Gemini's model, which the body does not hold, and
            // its API version.
            for (at, pair) in call.keyed().into_iter().enumerate() {
                query_pairs.insert(at, pair);
            }
        }

        let normalization = Normalization {
            case_fold: cache.case_fold,
            labels: if cache.ignore_label_fields {
                LabelFields::Ignored
            } else {
                LabelFields::Keyed
            },
        };
        let canonical = canonical_body_with(&body, normalization, wire.keying());
        // With the label fields keyed, every caller of an answer sent the same ones.
        let echo = match normalization.labels {
            LabelFields::Ignored => wire.echo(&body).map(Arc::new),
            LabelFields::Keyed => None,
        };
        let fingerprint = Fingerprint::of(&KeyInput {
            endpoint,
            upstream: &upstream_keys[upstream],
            scope: &scope,
            headers: &keyed_headers,
            query: &query_pairs,
            body: &canonical,
        });

        let deterministic = wire.is_deterministic(&body);
        let mut policy = CachePolicy::from_headers(headers);
        if !wire.dedupable(&body) || !query_dedupable {
            // Neither coalesced nor cached: sent upstream as it came.
            policy.bypass = true;
            policy.read = false;
            policy.write = false;
        }
        if !deterministic && !cache.sampled {
            // A sampled answer is not stored, and none stored earlier is served.
            policy.read = false;
            policy.write = false;
        }

        // Read only where a pool picks its member by it (3,000 instructions
        // a miss otherwise spent on a key nothing reads).
        let affinity = if routes.orders_by_session(upstream) {
            crate::routing::affinity_key(headers, &body).0
        } else {
            0
        };
        Ok(Self {
            affinity,
            endpoint,
            wire,
            raw_body,
            model,
            stream,
            upstream,
            scope,
            own_scope,
            fingerprint,
            authorization,
            forward_headers,
            query: query.filter(|q| !q.is_empty()),
            policy,
            deterministic,
            body,
            keyed_headers,
            query_pairs,
            retry,
            echo,
            shape: call.map_or_else(|| wire.error_shape(), PathCall::error_shape),
            call: call.cloned(),
            framing,
        })
    }
}

/// A cloud's Messages body made Anthropic's: its `anthropic_version` (the
/// cloud's wire, not the answer) gone, `stream` as its path says, and its
/// `anthropic_beta` list taken out, returned as the `anthropic-beta` header's
/// value.
fn cloud_messages_body(
    body: &mut Map<String, Value>,
    stream: bool,
) -> Result<Option<String>, GatewayError> {
    body.remove("anthropic_version");
    if stream {
        body.insert("stream".to_owned(), Value::Bool(true));
    } else {
        body.remove("stream");
    }
    match body.remove("anthropic_beta") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(betas)) => {
            let names: Option<Vec<&str>> = betas.iter().map(Value::as_str).collect();
            let names = names.ok_or_else(|| {
                GatewayError::invalid_param(
                    "anthropic_beta",
                    "`anthropic_beta` must be a list of strings",
                )
            })?;
            Ok((!names.is_empty()).then(|| names.join(",")))
        }
        Some(_) => Err(GatewayError::invalid_param(
            "anthropic_beta",
            "`anthropic_beta` must be a list of strings",
        )),
    }
}

/// An Azure caller's query without its `api-version`, which names the wire
/// it speaks, not the answer it asks for.
fn without_api_version(query: Option<&str>) -> Option<String> {
    let kept: Vec<&str> = query?
        .split('&')
        .filter(|pair| !pair.is_empty() && pair.split('=').next() != Some("api-version"))
        .collect();
    (!kept.is_empty()).then(|| kept.join("&"))
}

fn sorted_query_pairs(query: Option<&str>) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = query
        .unwrap_or_default()
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((name, value)) => (name.to_owned(), value.to_owned()),
            None => (pair.to_owned(), String::new()),
        })
        .collect();
    pairs.sort();
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn header_map(headers: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    fn parse(headers: &[(&str, &str)], query: Option<&str>, body: &str) -> DedupRequest {
        try_parse_with(headers, query, body).unwrap()
    }

    fn try_parse(headers: &[(&str, &str)]) -> Result<DedupRequest, GatewayError> {
        try_parse_with(headers, None, BODY)
    }

    fn try_parse_with(
        headers: &[(&str, &str)],
        query: Option<&str>,
        body: &str,
    ) -> Result<DedupRequest, GatewayError> {
        let config = Config::for_tests("http://127.0.0.1:1/v1");
        let routes = Routes::new(&config.upstreams);
        let names: Vec<String> = config.upstreams.iter().map(|u| u.identity()).collect();
        let map = header_map(headers);
        DedupRequest::parse(
            Endpoint::ChatCompletions,
            &map,
            query,
            Bytes::from(body.to_owned()),
            &routes,
            &names,
            &config.cache,
        )
    }

    const BODY: &str =
        r#"{"model":"m","temperature":0,"messages":[{"role":"user","content":"hi"}]}"#;

    /// A Messages request to an `api: anthropic` upstream.
    fn parse_messages(headers: &[(&str, &str)]) -> DedupRequest {
        let mut config = Config::for_tests("http://127.0.0.1:1/v1");
        config.upstreams[0].api = Api::Anthropic;
        let routes = Routes::new(&config.upstreams);
        let names: Vec<String> = config.upstreams.iter().map(|u| u.identity()).collect();
        let map = header_map(headers);
        let body = r#"{"model":"m","max_tokens":16,"temperature":0,"messages":[{"role":"user","content":"hi"}]}"#;
        DedupRequest::parse(
            Endpoint::Messages,
            &map,
            None,
            Bytes::from_static(body.as_bytes()),
            &routes,
            &names,
            &config.cache,
        )
        .unwrap()
    }

    #[test]
    fn an_absent_anthropic_version_is_keyed_as_the_default_it_is_sent_with() {
        let absent = parse_messages(&[]).fingerprint;
        assert_eq!(
            absent,
            parse_messages(&[("anthropic-version", DEFAULT_ANTHROPIC_VERSION)]).fingerprint
        );
        assert_ne!(
            absent,
            parse_messages(&[("anthropic-version", "2023-01-01")]).fingerprint
        );
        let beta = ("anthropic-beta", "prompt-caching-2024-07-31");
        assert_eq!(
            parse_messages(&[beta]).fingerprint,
            parse_messages(&[("anthropic-version", DEFAULT_ANTHROPIC_VERSION), beta]).fingerprint,
            "the default takes the version's place before the beta header"
        );
        assert_ne!(absent, parse_messages(&[beta]).fingerprint);
    }

    #[test]
    fn keyed_headers_and_query_change_the_fingerprint_others_do_not() {
        let base = parse(&[], None, BODY).fingerprint;
        assert_ne!(
            base,
            parse(&[("openai-organization", "org-1")], None, BODY).fingerprint
        );
        assert_ne!(
            base,
            parse(&[], Some("api-version=2024-01-01"), BODY).fingerprint
        );
        assert_eq!(
            base,
            parse(&[("x-stainless-lang", "python")], None, BODY).fingerprint
        );
        assert_eq!(
            parse(&[], Some("a=1&b=2"), BODY).fingerprint,
            parse(&[], Some("b=2&a=1"), BODY).fingerprint
        );
    }

    #[test]
    fn unlisted_headers_are_not_forwarded() {
        let request = parse(
            &[
                ("x-stainless-lang", "python"),
                ("accept", "application/json"),
            ],
            None,
            BODY,
        );
        let names: Vec<&str> = request
            .forward_headers
            .iter()
            .map(|(n, _)| n.as_str())
            .collect();
        assert_eq!(names, ["accept"]);
    }

    #[test]
    fn cache_control_and_sampling_decide_the_policy() {
        let request = parse(&[("cache-control", "no-cache")], None, BODY);
        assert!(!request.policy.read && request.policy.write);
        let request = parse(&[("cache-control", "no-store")], None, BODY);
        assert!(request.policy.bypass);
        let request = parse(&[("cache-control", "max-age=5")], None, BODY);
        assert_eq!(request.policy.max_age, Some(Duration::from_secs(5)));
        let sampled = parse(&[], None, r#"{"model":"m","messages":[]}"#);
        assert!(!sampled.deterministic && !sampled.policy.write && !sampled.policy.read);
        let seeded = parse(
            &[],
            None,
            r#"{"model":"m","seed":7,"temperature":0.9,"messages":[]}"#,
        );
        assert!(seeded.deterministic && seeded.policy.write);
    }

    #[test]
    fn retry_marks_are_read_and_neither_keyed_nor_forwarded() {
        let plain = parse(&[], None, BODY);
        assert!(!plain.retry.any());
        for (count, retry) in [("0", false), ("1", true), ("2", true), ("x", false)] {
            let request = parse(&[("x-stainless-retry-count", count)], None, BODY);
            assert_eq!(request.retry.sdk_retry, retry, "count {count}");
            assert_eq!(request.fingerprint, plain.fingerprint);
        }
        let keyed = parse(&[("idempotency-key", "k-1")], None, BODY);
        assert_eq!(keyed.fingerprint, plain.fingerprint);
        assert!(keyed.forward_headers.is_empty());
        let quoted = parse(&[("idempotency-key", "\"k-1\"")], None, BODY);
        assert_eq!(quoted.retry.idempotency_key, keyed.retry.idempotency_key);
        let other_tenant = parse(
            &[("idempotency-key", "k-1"), ("authorization", "Bearer sk-b")],
            None,
            BODY,
        );
        assert_ne!(
            other_tenant.retry.idempotency_key,
            keyed.retry.idempotency_key
        );
        let long = "k".repeat(256);
        for bad in ["", "\"\"", long.as_str()] {
            let err = try_parse(&[("idempotency-key", bad)]).unwrap_err();
            assert_eq!(err.status(), axum::http::StatusCode::BAD_REQUEST, "{bad:?}");
        }
    }

    /// The tenant admission derived (`RequestRules::caller`) is the one the
    /// parse would derive from the same credential, under either cache scope.
    #[test]
    fn the_callers_tenant_from_admission_parses_as_its_credential_would() {
        let config = Config::for_tests("http://127.0.0.1:1/v1");
        let routes = Routes::new(&config.upstreams);
        let names: Vec<String> = config.upstreams.iter().map(|u| u.identity()).collect();
        let key = TenantKey::new(b"a secret of the server's own, long enough");
        let map = header_map(&[("authorization", "Bearer sk-a"), ("idempotency-key", "k1")]);
        for scope in [CacheScope::Tenant, CacheScope::Global] {
            let cache = CacheConfig {
                scope,
                ..config.cache.clone()
            };
            let parse = |caller: Option<&TenantScope>| {
                DedupRequest::parse(
                    Endpoint::ChatCompletions,
                    &map,
                    None,
                    Bytes::from_static(BODY.as_bytes()),
                    &routes,
                    &names,
                    RequestRules {
                        cache: &cache,
                        limits: InputLimits::from(&LimitsConfig::default()),
                        tenant_key: Some(&key),
                        caller,
                    },
                )
                .unwrap()
            };
            let derived = parse(None);
            let admitted = TenantScope::of_credential(Some(&key), Some(b"sk-a"));
            let given = parse(Some(&admitted));
            assert_eq!(given.own_scope, derived.own_scope, "{scope:?}");
            assert_eq!(given.own_scope, admitted, "{scope:?}");
            assert_eq!(given.scope, derived.scope, "{scope:?}");
            assert_eq!(given.fingerprint, derived.fingerprint, "{scope:?}");
            assert_eq!(
                given.retry.idempotency_key, derived.retry.idempotency_key,
                "{scope:?}"
            );
        }
    }

    #[test]
    fn tenants_split_the_fingerprint() {
        let a = parse(&[("authorization", "Bearer sk-a")], None, BODY).fingerprint;
        let b = parse(&[("authorization", "Bearer sk-b")], None, BODY).fingerprint;
        assert_ne!(a, b);
        assert_eq!(
            a,
            parse(&[("authorization", "bearer  sk-a")], None, BODY).fingerprint
        );
    }
}
