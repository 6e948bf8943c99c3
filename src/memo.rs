//! Requests seen before: what parsing derived from a request's exact bytes,
//! so a repeat skips the parse, the validation, the canonical body and the
//! SHA-256 (about two thirds of a cached hit's own work, BENCHMARKS.md).
//!
//! A request's derivation (its fingerprint, cache policy, billing) is a pure
//! function of its inputs: the endpoint, the caller's tenant, the query, the
//! headers `DedupRequest::parse` reads and the body. The memo is keyed by
//! exactly those bytes, compared in full on every lookup (the hash only picks
//! the bucket), so two requests share a derivation only when parsing would
//! have given both the same one. The configuration it also depends on is
//! fixed for the process's life.
//!
//! The caller's tenant is keyed as its [`TenantScope`] (a hash), never the
//! credential itself. Only requests the memo can answer completely are kept:
//! not streamed, not `no-store`, not embeddings (each input has its own key),
//! without a retry mark (`Idempotency-Key`, an SDK retry).
//!
//! Bounded in bytes ([`MAX_MEMO_BYTES`]; bodies above [`MAX_MEMO_BODY_BYTES`]
//! are not kept): losing an entry costs one parse.
//!
//! A request is kept the second time it is parsed, not the first (a
//! doorkeeper, as TinyLFU's: [`RequestMemo::admits`]). Most traffic is
//! unique (every agent turn, every new conversation), and keeping each such
//! request cost its miss a copy, a derivation and an insert (about 2,500
//! instructions, BENCHMARKS.md, issue 41) and pushed the requests that do
//! repeat out of the memo. A request that repeats pays one more parse.

use std::{
    hash::BuildHasher,
    sync::{
        Arc, Weak,
        atomic::{AtomicU64, Ordering},
    },
};

use arc_swap::ArcSwapOption;
use axum::http::{HeaderMap, HeaderName, HeaderValue, header};
use quick_cache::{Weighter, sync::Cache};

use crate::{
    cache::StoredResponse,
    fingerprint::{CacheKey, Endpoint},
    metrics::Attribution,
    request::{
        COALESCE_HEADER, CachePolicy, DedupRequest, IDEMPOTENCY_KEY_HEADER, KEYED_HEADERS,
        RETRY_COUNT_HEADER,
    },
    tenant::TenantScope,
    wire::Echo,
};

/// What the memo may hold in all (keys, derivations, bookkeeping).
pub const MAX_MEMO_BYTES: u64 = 16 << 20;

/// Larger bodies are parsed every time.
pub const MAX_MEMO_BODY_BYTES: usize = 64 << 10;

/// Requests the doorkeeper remembers having seen once, by a hash each (one
/// word a slot, 128 KiB in all): at 20,000 unique requests a second a slot
/// lasts about 0.8 s; a repeat later than that is recorded again and kept
/// the time after.
const SEEN_ONCE_SLOTS: usize = 1 << 14;

/// Bookkeeping per entry beyond its key bytes and model name, the prebuilt
/// hit headers included.
const ENTRY_OVERHEAD_BYTES: u64 = 768;

/// Headers `DedupRequest::parse` reads besides the credential (which the
/// tenant scope stands for) and [`KEYED_HEADERS`]. A new header read there
/// belongs here too.
const OTHER_READ_HEADERS: [HeaderName; 4] = [
    header::CACHE_CONTROL,
    RETRY_COUNT_HEADER,
    IDEMPOTENCY_KEY_HEADER,
    COALESCE_HEADER,
];

fn read_headers() -> [HeaderName; 9] {
    let [a, b, c, d, e] = KEYED_HEADERS;
    let [f, g, h, i] = OTHER_READ_HEADERS;
    [a, b, c, d, e, f, g, h, i]
}

/// What a request derives to, as the hit path needs it.
#[derive(Debug)]
pub struct Derived {
    pub endpoint: Endpoint,
    /// Before purge generations (`Purges::key` applies them per request).
    pub key: CacheKey,
    pub model: String,
    pub upstream: usize,
    pub policy: CachePolicy,
    pub bill: Attribution,
    /// `x-corral-fingerprint`, ready to clone.
    pub fingerprint_header: HeaderValue,
    /// The caller's own values of the label fields its answer echoes.
    pub echo: Option<Arc<Echo>>,
    /// The response headers of a HIT on the answer last served, built once.
    hit_headers: ArcSwapOption<HitHeaders>,
}

/// A HIT's response headers for one stored answer: built on the first hit
/// and cloned by the next ones instead of inserted one by one. The answer is
/// held weakly: the memo never keeps an answer the cache let go, and while
/// the `Weak` lives its allocation is not reused, so the pointer names it.
#[derive(Debug)]
struct HitHeaders {
    answer: Weak<StoredResponse>,
    headers: HeaderMap,
}

impl Derived {
    /// The derivation of `request`, when the memo may answer its repeats.
    pub fn of(request: &DedupRequest, bill: &Attribution) -> Option<Self> {
        let complete = !request.stream
            && !request.policy.bypass
            && !matches!(
                request.endpoint,
                Endpoint::Embeddings | Endpoint::EmbedContent
            )
            && !request.retry.any();
        complete.then(|| Self {
            endpoint: request.endpoint,
            key: CacheKey {
                scope: request.scope.clone(),
                fingerprint: request.fingerprint,
            },
            model: request.model.clone(),
            upstream: request.upstream,
            policy: request.policy,
            bill: bill.clone(),
            fingerprint_header: HeaderValue::from_str(&request.fingerprint.hex())
                .expect("hex is a valid header value"),
            echo: request.echo.clone(),
            hit_headers: ArcSwapOption::empty(),
        })
    }

    /// The headers of a HIT on `answer`: a clone of the ones built for it,
    /// or `build`'s (kept for the next hit on the same answer).
    pub fn hit_headers(
        &self,
        answer: &Arc<StoredResponse>,
        build: impl FnOnce() -> HeaderMap,
    ) -> HeaderMap {
        if let Some(built) = &*self.hit_headers.load()
            && Weak::as_ptr(&built.answer) == Arc::as_ptr(answer)
        {
            return built.headers.clone();
        }
        let headers = build();
        self.hit_headers.store(Some(Arc::new(HitHeaders {
            answer: Arc::downgrade(answer),
            headers: headers.clone(),
        })));
        headers
    }
}

#[derive(Clone)]
struct ByBytes;

impl Weighter<Box<[u8]>, Arc<Derived>> for ByBytes {
    fn weight(&self, key: &Box<[u8]>, derived: &Arc<Derived>) -> u64 {
        key.len() as u64 + derived.model.len() as u64 + ENTRY_OVERHEAD_BYTES
    }
}

/// The memo. See the module documentation.
pub struct RequestMemo {
    entries: Cache<Box<[u8]>, Arc<Derived>, ByBytes, foldhash::fast::RandomState>,
    /// The doorkeeper: a hash of each request parsed once lately, by slot.
    seen_once: Box<[AtomicU64]>,
    /// Seeded per process: nobody outside chooses which requests share a slot.
    seen_hasher: foldhash::fast::RandomState,
}

impl std::fmt::Debug for RequestMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestMemo")
            .field("entries", &self.entries.len())
            .field("bytes", &self.entries.weight())
            .finish()
    }
}

impl Default for RequestMemo {
    fn default() -> Self {
        Self::with_capacity(MAX_MEMO_BYTES)
    }
}

impl RequestMemo {
    pub fn with_capacity(max_bytes: u64) -> Self {
        Self {
            entries: Cache::with(
                (max_bytes / 1024) as usize,
                max_bytes,
                ByBytes,
                foldhash::fast::RandomState::default(),
                Default::default(),
            ),
            seen_once: (0..SEEN_ONCE_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            seen_hasher: foldhash::fast::RandomState::default(),
        }
    }

    /// Whether `key`, parsed just now and not in the memo, is worth keeping:
    /// it was parsed once before, lately. The first time it is only noted
    /// (see the module documentation). Two requests sharing a slot take turns
    /// in it, so either is kept at worst one parse later.
    pub fn admits(&self, key: &RequestBytes) -> bool {
        // Never zero, so an empty slot never matches.
        let hash = self.seen_hasher.hash_one(&*key.0) | 1;
        let slot = &self.seen_once[hash as usize % SEEN_ONCE_SLOTS];
        slot.swap(hash, Ordering::Relaxed) == hash
    }

    pub fn get(&self, key: &RequestBytes) -> Option<Arc<Derived>> {
        self.entries.get(&*key.0)
    }

    pub fn insert(&self, key: RequestBytes, derived: Derived) {
        self.entries
            .insert(key.0.into_boxed_slice(), Arc::new(derived));
    }

    /// Bytes held now, as the weigher counts them.
    pub fn bytes(&self) -> u64 {
        self.entries.weight()
    }
}

/// A request's inputs to parsing, as one comparable byte string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestBytes(Vec<u8>);

impl RequestBytes {
    /// `None` for a body too large to keep. `path`: the path, for a request
    /// whose path names more than its endpoint (Gemini's: the model and the
    /// method), which is kept too.
    pub fn of(
        endpoint: Endpoint,
        path: Option<&str>,
        tenant: &TenantScope,
        headers: &HeaderMap,
        query: Option<&str>,
        body: &[u8],
    ) -> Option<Self> {
        if body.len() > MAX_MEMO_BODY_BYTES {
            return None;
        }
        let mut bytes = Vec::with_capacity(body.len() + 96);
        bytes.push(endpoint as u8);
        field(&mut bytes, path.unwrap_or_default().as_bytes());
        field(&mut bytes, tenant.as_str().as_bytes());
        match query {
            None => bytes.push(0),
            Some(query) => {
                bytes.push(1);
                field(&mut bytes, query.as_bytes());
            }
        }
        // One pass over the request's headers, not a lookup per name read:
        // most requests carry none of them. Sorted by the name's place (a
        // stable sort keeps one name's values in their order).
        let read = read_headers();
        let mut found: Vec<(usize, &HeaderValue)> = headers
            .iter()
            .filter_map(|(name, value)| Some((read.iter().position(|r| r == name)?, value)))
            .collect();
        found.sort_by_key(|(at, _)| *at);
        let mut found = found.into_iter().peekable();
        for at in 0..read.len() {
            while let Some((_, value)) = found.next_if(|(name_at, _)| *name_at == at) {
                bytes.push(1);
                field(&mut bytes, value.as_bytes());
            }
            bytes.push(0);
        }
        bytes.extend_from_slice(body);
        Some(Self(bytes))
    }
}

/// Length-prefixed, so no two different inputs concatenate to one string.
fn field(bytes: &mut Vec<u8>, value: &[u8]) {
    bytes.extend_from_slice(&(value.len() as u32).to_le_bytes());
    bytes.extend_from_slice(value);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of(headers: &[(&str, &str)], query: Option<&str>, body: &str) -> RequestBytes {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        let tenant = TenantScope::of_credential(None, Some(b"sk-a"));
        RequestBytes::of(
            Endpoint::ChatCompletions,
            None,
            &tenant,
            &map,
            query,
            body.as_bytes(),
        )
        .unwrap()
    }

    #[test]
    fn every_input_of_the_parse_splits_the_key_and_nothing_else_does() {
        let base = bytes_of(&[], None, "{}");
        assert_eq!(
            base,
            bytes_of(&[("x-request-id", "r1"), ("user-agent", "u")], None, "{}")
        );
        assert_eq!(
            base,
            bytes_of(&[("accept", "text/event-stream")], None, "{}")
        );
        let mut others = vec![
            bytes_of(&[], Some(""), "{}"),
            bytes_of(&[], Some("a=1"), "{}"),
            bytes_of(&[], None, "{ }"),
        ];
        for name in read_headers() {
            others.push(bytes_of(&[(name.as_str(), "v")], None, "{}"));
            others.push(bytes_of(
                &[(name.as_str(), "v"), (name.as_str(), "v")],
                None,
                "{}",
            ));
        }
        let other_tenant = TenantScope::of_credential(None, Some(b"sk-b"));
        others.push(
            RequestBytes::of(
                Endpoint::ChatCompletions,
                None,
                &other_tenant,
                &HeaderMap::new(),
                None,
                b"{}",
            )
            .unwrap(),
        );
        others.push(
            RequestBytes::of(
                Endpoint::Completions,
                None,
                &TenantScope::of_credential(None, Some(b"sk-a")),
                &HeaderMap::new(),
                None,
                b"{}",
            )
            .unwrap(),
        );
        for (i, a) in others.iter().enumerate() {
            assert_ne!(*a, base, "input {i}");
            for b in &others[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }

    #[test]
    fn the_order_of_different_headers_does_not_matter_but_one_headers_values_do() {
        let one = bytes_of(
            &[("openai-beta", "x"), ("cache-control", "max-age=5")],
            None,
            "{}",
        );
        let other = bytes_of(
            &[("cache-control", "max-age=5"), ("openai-beta", "x")],
            None,
            "{}",
        );
        assert_eq!(one, other);
        let ab = bytes_of(&[("openai-beta", "a"), ("openai-beta", "b")], None, "{}");
        let ba = bytes_of(&[("openai-beta", "b"), ("openai-beta", "a")], None, "{}");
        assert_ne!(ab, ba, "the parse keys a header's values in their order");
    }

    #[test]
    fn a_value_cannot_spill_into_the_next_field() {
        // Without length prefixes these two would concatenate alike.
        let a = bytes_of(
            &[("openai-beta", "x"), ("openai-organization", "yz")],
            None,
            "{}",
        );
        let b = bytes_of(
            &[("openai-beta", "xy"), ("openai-organization", "z")],
            None,
            "{}",
        );
        assert_ne!(a, b);
    }

    /// A chat request of `body` alone (global scope, no headers or query).
    fn body_only(body: &[u8]) -> Option<RequestBytes> {
        RequestBytes::of(
            Endpoint::ChatCompletions,
            None,
            &TenantScope::global(),
            &HeaderMap::new(),
            None,
            body,
        )
    }

    #[test]
    fn large_bodies_are_not_kept_and_the_memo_stays_within_its_bytes() {
        let huge = vec![b' '; MAX_MEMO_BODY_BYTES + 1];
        assert!(body_only(&huge).is_none());
        let memo = RequestMemo::with_capacity(64 << 10);
        for i in 0..1000 {
            let body = format!("{{\"n\":{i},\"pad\":\"{}\"}}", "x".repeat(500));
            let key = body_only(body.as_bytes()).unwrap();
            memo.insert(key, derived_for_tests());
            assert!(memo.bytes() <= 64 << 10, "{} bytes", memo.bytes());
        }
    }

    #[test]
    fn a_request_is_admitted_the_second_time_it_is_seen() {
        let memo = RequestMemo::default();
        let key = |body: &str| body_only(body.as_bytes()).unwrap();
        assert!(!memo.admits(&key("{\"n\":1}")), "seen once: noted only");
        assert!(
            !memo.admits(&key("{\"n\":2}")),
            "another request is its own"
        );
        assert!(memo.admits(&key("{\"n\":1}")), "seen twice: kept");
        assert!(memo.admits(&key("{\"n\":2}")));
        // A flood of one-off requests passes the doorkeeper by none of them.
        let admitted = (0..(4 * SEEN_ONCE_SLOTS))
            .filter(|n| memo.admits(&key(&format!("{{\"unique\":{n}}}"))))
            .count();
        assert_eq!(admitted, 0);
    }

    fn derived_for_tests() -> Derived {
        let scope = TenantScope::global();
        Derived {
            endpoint: Endpoint::ChatCompletions,
            key: CacheKey {
                scope: scope.clone(),
                fingerprint: crate::fingerprint::Fingerprint::of(&crate::fingerprint::KeyInput {
                    endpoint: Endpoint::ChatCompletions,
                    upstream: "u",
                    scope: &scope,
                    headers: &[],
                    query: &[],
                    body: b"{}",
                }),
            },
            model: "m".into(),
            upstream: 0,
            policy: CachePolicy {
                read: true,
                write: true,
                max_age: None,
                bypass: false,
                revalidate: false,
                coalesce: true,
            },
            bill: Attribution {
                model: crate::metrics::ModelLabel::for_tests("m"),
                tenant: "t".into(),
                upstream: "u".into(),
                endpoint: "chat",
                member: None,
            },
            fingerprint_header: HeaderValue::from_static("f"),
            echo: None,
            hit_headers: ArcSwapOption::empty(),
        }
    }

    fn answer(body: &'static str) -> Arc<StoredResponse> {
        Arc::new(StoredResponse {
            status: axum::http::StatusCode::OK,
            headers: Vec::new(),
            body: bytes::Bytes::from_static(body.as_bytes()),
            usage: None,
        })
    }

    #[test]
    fn hit_headers_are_built_once_per_answer_and_never_keep_one_alive() {
        let derived = derived_for_tests();
        let built = |text: &'static str| {
            move || {
                let mut headers = HeaderMap::new();
                headers.insert("x-built", HeaderValue::from_static(text));
                headers
            }
        };
        let first = answer("one");
        assert_eq!(derived.hit_headers(&first, built("a"))["x-built"], "a");
        assert_eq!(
            derived.hit_headers(&first, built("b"))["x-built"],
            "a",
            "the same answer: the headers built for it"
        );
        let second = answer("two");
        assert_eq!(derived.hit_headers(&second, built("c"))["x-built"], "c");
        let weak = Arc::downgrade(&second);
        drop(second);
        assert!(weak.upgrade().is_none(), "the memo holds no answer");
    }
}
