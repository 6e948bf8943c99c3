//! The `prompts/` corpus as golden tests of the fingerprint, and its loader.
//!
//! The loader is public because the HTTP tests and the benchmarks send the
//! same corpus through the real gateway: what is proven equal here must also
//! be answered by one upstream call there.

use std::{
    collections::{BTreeMap, HashMap},
    fs,
    path::{Path, PathBuf},
    sync::LazyLock,
};

use axum::http::{HeaderMap, HeaderName, HeaderValue, header};
use bytes::Bytes;
use corral::{
    config::{CacheConfig, Config},
    fingerprint::Endpoint,
    request::DedupRequest,
    upstream::Routes,
};
use serde::Deserialize;
use serde_json::Value;

/// One file of `prompts/equal/` or `prompts/distinct/`.
#[allow(dead_code)]
#[derive(Debug, Clone)]
pub struct PromptGroup {
    /// The file name without `.json`.
    pub name: String,
    pub description: String,
    /// The group's default endpoint; each request carries its own resolved one.
    pub endpoint: Endpoint,
    pub requests: Vec<PromptRequest>,
}

/// One request exactly as a client would send it.
#[allow(dead_code)]
#[derive(Debug, Clone)]
pub struct PromptRequest {
    pub endpoint: Endpoint,
    /// Bearer token sent as `Authorization: Bearer <tenant>`; `None` sends none.
    pub tenant: Option<String>,
    /// Extra request headers, names as written in the file.
    pub headers: Vec<(String, String)>,
    /// Query string without the `?`.
    pub query: Option<String>,
    /// The exact body bytes.
    pub raw: String,
}

#[allow(dead_code)]
impl PromptRequest {
    /// Every header the request carries: the tenant's `Authorization`, then the file's headers.
    pub fn header_map(&self) -> HeaderMap {
        let mut map = HeaderMap::new();
        if let Some(tenant) = &self.tenant {
            let value = HeaderValue::from_str(&format!("Bearer {tenant}"))
                .unwrap_or_else(|err| panic!("tenant {tenant:?} is not a header value: {err}"));
            map.append(header::AUTHORIZATION, value);
        }
        for (name, value) in &self.headers {
            // `from_bytes` lower-cases the name, as HTTP/1 and HTTP/2 servers do.
            let name = HeaderName::from_bytes(name.as_bytes())
                .unwrap_or_else(|err| panic!("bad header name {name:?}: {err}"));
            let value = HeaderValue::from_str(value)
                .unwrap_or_else(|err| panic!("bad value for header {name}: {err}"));
            map.append(name, value);
        }
        map
    }

    pub fn body(&self) -> Bytes {
        Bytes::from(self.raw.clone())
    }

    /// Path below the gateway's base URL, query included, e.g. `/v1/chat/completions?a=b`.
    pub fn path_and_query(&self) -> String {
        match self.query.as_deref().filter(|q| !q.is_empty()) {
            Some(query) => format!("/v1{}?{query}", self.endpoint.path()),
            None => format!("/v1{}", self.endpoint.path()),
        }
    }
}

pub fn prompts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("prompts")
}

/// The endpoint whose `label()` is `label`: "chat", "completions" or "embeddings".
pub fn endpoint_named(label: &str) -> Endpoint {
    [
        Endpoint::ChatCompletions,
        Endpoint::Completions,
        Endpoint::Embeddings,
    ]
    .into_iter()
    .find(|endpoint| endpoint.label() == label)
    .unwrap_or_else(|| panic!("unknown endpoint {label:?}: use chat, completions or embeddings"))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupFile {
    description: String,
    endpoint: String,
    requests: Vec<RequestFile>,
}

// Unknown fields are rejected so a misspelt `"tenat"` cannot silently turn a
// tenant test into an anonymous one.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RequestFile {
    #[serde(default)]
    endpoint: Option<String>,
    #[serde(default)]
    tenant: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    query: Option<String>,
    raw: String,
}

impl RequestFile {
    fn resolve(self, default: Endpoint) -> PromptRequest {
        PromptRequest {
            endpoint: self.endpoint.as_deref().map_or(default, endpoint_named),
            tenant: self.tenant,
            headers: self.headers.into_iter().collect(),
            query: self.query,
            raw: self.raw,
        }
    }
}

/// Every group in `prompts/{kind}/*.json`, in file-name order.
pub fn load_groups(kind: &str) -> Vec<PromptGroup> {
    let dir = prompts_dir().join(kind);
    let mut paths: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|err| panic!("cannot list {}: {err}", dir.display()))
        .map(|entry| entry.expect("readable directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|path| {
            let text = fs::read_to_string(path)
                .unwrap_or_else(|err| panic!("cannot read {}: {err}", path.display()));
            let file: GroupFile = serde_json::from_str(&text)
                .unwrap_or_else(|err| panic!("{} is not a prompt group: {err}", path.display()));
            let endpoint = endpoint_named(&file.endpoint);
            PromptGroup {
                name: path
                    .file_stem()
                    .expect("a .json file has a stem")
                    .to_string_lossy()
                    .into_owned(),
                description: file.description,
                endpoint,
                requests: file
                    .requests
                    .into_iter()
                    .map(|request| request.resolve(endpoint))
                    .collect(),
            }
        })
        .collect()
}

/// `prompts/corpus.jsonl`, in line order (line order is popularity rank). The
/// lines carry no tenant; callers choose one.
#[allow(dead_code)]
pub fn load_corpus() -> Vec<PromptRequest> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Line {
        endpoint: String,
        body: Value,
    }
    let path = prompts_dir().join("corpus.jsonl");
    let text = fs::read_to_string(&path)
        .unwrap_or_else(|err| panic!("cannot read {}: {err}", path.display()));
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(index, line)| {
            let line: Line = serde_json::from_str(line)
                .unwrap_or_else(|err| panic!("corpus.jsonl line {}: {err}", index + 1));
            assert!(
                line.body.is_object(),
                "corpus.jsonl line {}: body must be an object",
                index + 1
            );
            PromptRequest {
                endpoint: endpoint_named(&line.endpoint),
                tenant: None,
                headers: Vec::new(),
                query: None,
                raw: line.body.to_string(),
            }
        })
        .collect()
}

/// What `DedupRequest::parse` needs besides the request, built once: the test
/// config's routes, upstream identities and cache settings.
struct Gateway {
    routes: Routes,
    names: Vec<String>,
    cache: CacheConfig,
}

static GATEWAY: LazyLock<Gateway> = LazyLock::new(|| {
    let config = Config::for_tests("http://127.0.0.1:1/v1");
    Gateway {
        routes: Routes::new(&config.upstreams),
        names: config.upstreams.iter().map(|u| u.identity()).collect(),
        cache: config.cache,
    }
});

/// Parses `request` as the gateway would; panics on a request the gateway rejects.
pub fn parse(request: &PromptRequest) -> DedupRequest {
    let gateway = &*GATEWAY;
    DedupRequest::parse(
        request.endpoint,
        &request.header_map(),
        request.query.as_deref(),
        request.body(),
        &gateway.routes,
        &gateway.names,
        &gateway.cache,
    )
    .unwrap_or_else(|err| panic!("the gateway rejected {request:?}: {err}"))
}

/// Hex fingerprint of `request`.
pub fn fingerprint_of(r: &PromptRequest) -> String {
    parse(r).fingerprint.hex()
}

#[test]
fn prompts_corpus_keeps_its_coverage() {
    let equal = load_groups("equal");
    let distinct = load_groups("distinct");
    assert!(equal.len() >= 8, "prompts/equal has {} groups", equal.len());
    assert!(
        distinct.len() >= 4,
        "prompts/distinct has {} files",
        distinct.len()
    );
    let distinct_requests: usize = distinct.iter().map(|g| g.requests.len()).sum();
    assert!(
        distinct_requests >= 20,
        "prompts/distinct has {distinct_requests} requests"
    );
    for endpoint in [
        Endpoint::ChatCompletions,
        Endpoint::Completions,
        Endpoint::Embeddings,
    ] {
        assert!(
            equal.iter().any(|g| g.endpoint == endpoint),
            "no equal group covers {endpoint:?}"
        );
    }
    for group in &equal {
        assert!(
            group.requests.len() >= 3,
            "equal/{} needs at least 3 variants",
            group.name
        );
    }
    for group in &distinct {
        assert!(
            group.requests.len() >= 2,
            "distinct/{} needs at least 2 requests",
            group.name
        );
    }
}

#[test]
fn prompts_equal_groups_share_one_fingerprint() {
    for group in load_groups("equal") {
        let first = fingerprint_of(&group.requests[0]);
        for (index, request) in group.requests.iter().enumerate().skip(1) {
            assert_eq!(
                fingerprint_of(request),
                first,
                "equal/{}: request {index} differs from request 0\n{}\nrequest: {request:?}",
                group.name,
                group.description,
            );
        }
    }
}

#[test]
fn prompts_equal_groups_differ_from_each_other() {
    let mut seen: HashMap<String, String> = HashMap::new();
    for group in load_groups("equal") {
        let fingerprint = fingerprint_of(&group.requests[0]);
        if let Some(other) = seen.insert(fingerprint, group.name.clone()) {
            panic!("equal/{} and equal/{other} share a fingerprint", group.name);
        }
    }
}

#[test]
fn prompts_distinct_files_are_pairwise_distinct() {
    for group in load_groups("distinct") {
        let mut seen: HashMap<String, usize> = HashMap::new();
        for (index, request) in group.requests.iter().enumerate() {
            if let Some(other) = seen.insert(fingerprint_of(request), index) {
                panic!(
                    "distinct/{}: requests {other} and {index} share a fingerprint\n{}\n{:?}\n{request:?}",
                    group.name, group.description, group.requests[other],
                );
            }
        }
    }
}

#[test]
fn prompts_corpus_lines_are_deterministic_and_pairwise_distinct() {
    const MODELS: &[&str] = &["gpt-4o-mini", "gpt-4o", "text-embedding-3-small"];
    let corpus = load_corpus();
    assert!(
        corpus.len() >= 50,
        "corpus.jsonl has {} lines",
        corpus.len()
    );
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (index, request) in corpus.iter().enumerate() {
        let line = index + 1;
        let parsed = parse(request);
        assert!(
            parsed.deterministic,
            "corpus.jsonl line {line} is not deterministic"
        );
        assert!(!parsed.stream, "corpus.jsonl line {line} streams");
        assert!(
            MODELS.contains(&parsed.model.as_str()),
            "corpus.jsonl line {line}: unexpected model {}",
            parsed.model
        );
        if let Some(other) = seen.insert(parsed.fingerprint.hex(), line) {
            panic!("corpus.jsonl lines {other} and {line} share a fingerprint");
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GoldenFile {
    #[allow(dead_code)]
    description: String,
    entries: Vec<GoldenEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GoldenEntry {
    name: String,
    endpoint: String,
    request: RequestFile,
    fingerprint: String,
}

/// Pins exact key bytes: any change to the canonical form, the key layout or the
/// tenant hash shows up here, and must come with a bump of `KEY_VERSION` so keys
/// already stored in Redis cannot alias the new ones.
#[test]
fn prompts_golden_fingerprints_are_pinned() {
    let path = prompts_dir().join("golden-fingerprints.json");
    let text = fs::read_to_string(&path)
        .unwrap_or_else(|err| panic!("cannot read {}: {err}", path.display()));
    let golden: GoldenFile = serde_json::from_str(&text)
        .unwrap_or_else(|err| panic!("{} is malformed: {err}", path.display()));
    assert!(golden.entries.len() >= 2);
    let mismatches: Vec<String> = golden
        .entries
        .into_iter()
        .filter_map(|entry| {
            let request = entry.request.resolve(endpoint_named(&entry.endpoint));
            let actual = fingerprint_of(&request);
            (actual != entry.fingerprint)
                .then(|| format!("{}: pinned {}, now {actual}", entry.name, entry.fingerprint))
        })
        .collect();
    assert!(
        mismatches.is_empty(),
        "the fingerprint format changed. If that is intended, bump KEY_VERSION in \
         src/fingerprint.rs and update prompts/golden-fingerprints.json:\n{}",
        mismatches.join("\n")
    );
}
