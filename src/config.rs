//! Configuration: YAML, then `CORRAL_*` environment overrides, then path-precise
//! deserialization errors, then `validate()`.
//!
//! The environment is passed in as a list of pairs rather than read from the
//! process, so tests never touch (or race on) the process environment.

pub use crate::budget::{BudgetRule, Period};
pub use crate::passthrough::PassthroughConfig;
pub use crate::pricing::ModelPrice;
use std::{collections::BTreeMap, fmt, net::SocketAddr, time::Duration};

use serde::{Deserialize, Serialize};
use serde_yaml_ng::{Mapping, Value};

/// The configuration the binary falls back to when no config file exists: the
/// commented example shipped at the repository root.
pub const EMBEDDED_DEFAULT: &str = include_str!("../config.yaml");

/// Prefix of every environment override.
const ENV_PREFIX: &str = "CORRAL_";

/// Short aliases for the settings people change most, mapped onto config paths.
const ENV_ALIASES: &[(&str, &str)] = &[
    ("CORRAL_UPSTREAM_BASE_URL", "upstreams.0.base_url"),
    ("CORRAL_UPSTREAM_API_KEY_ENV", "upstreams.0.api_key_env"),
    ("CORRAL_REDIS_URL", "redis.url"),
];

/// Holds the provider key given directly in the environment (instead of naming
/// another variable through `api_key_env`).
const ENV_UPSTREAM_API_KEY: &str = "CORRAL_UPSTREAM_API_KEY";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config is not valid YAML: {0}")]
    Yaml(#[from] serde_yaml_ng::Error),
    #[error("config key `{path}`: {message}")]
    Key { path: String, message: String },
    #[error("environment variable {var}: {message}")]
    Env { var: String, message: String },
}

impl ConfigError {
    fn key(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Key {
            path: path.into(),
            message: message.into(),
        }
    }
}

/// A value that must never be printed: `Debug` and `Display` redact it.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret<T>(T);

impl<T> Secret<T> {
    pub fn new(value: T) -> Self {
        Self(value)
    }
    /// The only way to read the secret; grep for it when auditing.
    pub fn expose(&self) -> &T {
        &self.0
    }
}

impl<T> fmt::Debug for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub listen: SocketAddr,
    pub upstreams: Vec<UpstreamConfig>,
    #[serde(default)]
    pub cache: CacheConfig,
    #[serde(default)]
    pub coalesce: CoalesceConfig,
    #[serde(default)]
    pub retry: RetryConfig,
    #[serde(default)]
    pub limits: LimitsConfig,
    #[serde(default)]
    pub log: LogConfig,
    /// USD per million tokens by model, for the cost metrics (`/metrics`, `/stats`).
    #[serde(default)]
    pub pricing: PricingConfig,
    /// The books behind `/stats`: the cluster ledger in Redis, tenant bounds.
    #[serde(default)]
    pub ledger: LedgerConfig,
    /// Absent: the embedded in-memory mode (one instance, local singleflight).
    #[serde(default)]
    pub redis: Option<RedisConfig>,
    #[serde(default)]
    pub auth: AuthConfig,
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub shutdown: ShutdownConfig,
    #[serde(default)]
    pub passthrough: PassthroughConfig,
    /// Traces (OpenTelemetry over OTLP/HTTP); off unless an endpoint is set.
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    /// Caps on what the provider bills, per tenant or per upstream, per window
    /// (`budget.rs`); cache hits and shared answers spend nothing.
    #[serde(default)]
    pub budgets: Vec<BudgetRule>,
    /// `CORRAL_*` variables that name no setting (Kubernetes' service links,
    /// say): ignored, each logged once as a warning by the binary.
    #[serde(skip)]
    pub ignored_env: Vec<String>,
}

/// The shared L2 cache, cluster-wide owner lock and completion announcements.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisConfig {
    /// A single Redis (`redis://host:port`), or the first node of a cluster.
    pub url: Option<String>,
    /// Redis Cluster seed nodes; setting them (or `cluster: true`) selects cluster mode.
    pub nodes: Vec<String>,
    pub cluster: bool,
    /// Prefix of every key corral writes.
    pub key_prefix: String,
    /// Application deadline of each Redis operation: past it, the request
    /// degrades to local singleflight + L1 instead of waiting.
    #[serde(with = "humantime_serde")]
    pub op_timeout: Duration,
    /// Lease of the cluster owner lock; the owner extends it every third of it
    /// while the upstream call runs, so a slow provider never lets a second owner in.
    #[serde(with = "humantime_serde")]
    pub lock_ttl: Duration,
    /// Upper bound of a remote follower's backstop poll (announcements can be lost).
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
    /// Lifetime of the in-process L1 copy of a Redis entry.
    #[serde(with = "humantime_serde")]
    pub l1_ttl: Duration,
    /// Consecutive Redis failures that open the breaker (Redis skipped entirely).
    pub breaker_failures: u32,
    /// How long the breaker stays open before one probe is let through.
    #[serde(with = "humantime_serde")]
    pub breaker_cool_down: Duration,
    /// Most connections of this instance that follow mirrored streams with a
    /// blocking read (one per stream while it is relayed); a stream relayed
    /// beyond them polls on the shared connection instead, so a busy fleet
    /// never exhausts Redis's `maxclients`.
    pub max_relay_connections: usize,
    /// Variable holding the 32-byte key (64 hex digits) cache values in Redis
    /// are encrypted with. Absent: values are stored in the clear.
    pub encryption_key_env: Option<String>,
    /// Resolved at load time from `encryption_key_env`.
    #[serde(skip)]
    pub encryption_key: Option<Secret<[u8; 32]>>,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            url: None,
            nodes: Vec::new(),
            cluster: false,
            key_prefix: "corral".to_owned(),
            op_timeout: Duration::from_millis(150),
            lock_ttl: Duration::from_secs(10),
            poll_interval: Duration::from_millis(500),
            l1_ttl: Duration::from_secs(5),
            breaker_failures: 3,
            breaker_cool_down: Duration::from_secs(1),
            max_relay_connections: 32,
            encryption_key_env: None,
            encryption_key: None,
        }
    }
}

impl RedisConfig {
    /// The node URLs to connect to, the single URL first.
    pub fn node_urls(&self) -> Vec<String> {
        let mut urls: Vec<String> = self.url.iter().cloned().collect();
        urls.extend(
            self.nodes
                .iter()
                .filter(|n| Some(*n) != self.url.as_ref())
                .cloned(),
        );
        urls
    }

    pub fn is_cluster(&self) -> bool {
        self.cluster || !self.nodes.is_empty()
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    pub name: String,
    /// Which API this provider speaks. A request is routed only among the
    /// upstreams that speak its API, so a catch-all OpenAI upstream
    /// (`models: ["*"]`) never shadows an Anthropic one for `/v1/messages`.
    #[serde(default)]
    pub api: Api,
    pub base_url: String,
    /// Name of the environment variable holding the provider key. Absent: the
    /// caller's own credential (`Authorization: Bearer` or `x-api-key`) is
    /// forwarded, in the form the provider expects.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Glob patterns over the request's `model`; the first upstream of the
    /// request's API that matches wins.
    #[serde(default = "default_models")]
    pub models: Vec<String>,
    #[serde(default = "default_connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Bound on one attempt, from sending the request to the last body byte.
    #[serde(default = "default_request_timeout", with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Bound on one attempt until the response headers arrive.
    #[serde(default = "default_first_byte_timeout", with = "humantime_serde")]
    pub first_byte_timeout: Duration,
    /// Cap on this upstream's request rate (real calls only; hits and
    /// coalesced followers spend none of it). Beyond it: 429 + Retry-After.
    #[serde(default)]
    pub rate: Option<RateConfig>,
    /// Cap on concurrent calls to this upstream; beyond it attempts queue.
    #[serde(default)]
    pub max_concurrency: Option<usize>,
    /// Consecutive failed attempts that open this upstream's circuit.
    #[serde(default = "default_breaker_failures")]
    pub breaker_failures: u32,
    /// How long the circuit stays open before one probe is let through.
    #[serde(default = "default_breaker_cool_down", with = "humantime_serde")]
    pub breaker_cool_down: Duration,
    /// Resolved at load time from `api_key_env` (or `CORRAL_UPSTREAM_API_KEY`).
    #[serde(skip)]
    pub api_key: Option<Secret<String>>,
}

/// The wire format an upstream speaks, and with it how corral authenticates
/// to it (`upstream/client.rs`) and which endpoints it serves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
pub enum Api {
    /// OpenAI's API (`/chat/completions`, `/completions`, `/embeddings`, ...),
    /// and every provider compatible with it: `Authorization: Bearer <key>`.
    #[default]
    #[serde(rename = "openai")]
    OpenAi,
    /// Anthropic Messages (`/messages`, `/messages/count_tokens`):
    /// `x-api-key: <key>` and an `anthropic-version` header.
    #[serde(rename = "anthropic")]
    Anthropic,
}

impl UpstreamConfig {
    /// What answers this upstream's requests, as keys name it: the API it
    /// speaks and its base URL, never its name (a label an operator may move
    /// to another provider, or give two upstreams). A changed provider or base
    /// URL is another key, so no answer of the old one is served for it.
    pub fn identity(&self) -> String {
        format!(
            "{}\u{0}{}",
            self.api.as_str(),
            self.base_url.trim_end_matches('/')
        )
    }
}

impl Api {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OpenAi => "openai",
            Self::Anthropic => "anthropic",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheScope {
    /// Entries are scoped to a hash of the caller's bearer token.
    Tenant,
    /// Every caller shares every entry (one trusted application behind corral).
    Global,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    #[serde(with = "humantime_serde")]
    pub soft_ttl: Duration,
    #[serde(with = "humantime_serde")]
    pub hard_ttl: Duration,
    /// Each TTL is stretched by a random factor in `[1, 1 + ttl_jitter]` so keys
    /// written together do not expire together.
    pub ttl_jitter: f64,
    /// Bound on the in-process cache, in bytes (each entry weighed by its
    /// body, headers and a fixed overhead); least valuable entries go first.
    pub max_bytes: u64,
    /// An answer larger than this is served but not stored (neither in
    /// process nor in Redis), so one huge answer cannot evict thousands.
    pub max_entry_bytes: u64,
    /// Whether responses to sampled requests (temperature > 0 or absent, no seed)
    /// are stored. Concurrent identical requests are coalesced either way.
    pub sampled: bool,
    pub scope: CacheScope,
    /// Opt-in normalization level: fold message text to lower case before hashing.
    pub case_fold: bool,
    /// Leave each API's label fields (`user`, `safety_identifier`,
    /// `prompt_cache_key`, `metadata`, Responses `client_metadata` and inline
    /// input item ids, Messages tools' `eager_input_streaming`; README lists
    /// them) out of the key: they name, track or route a request without
    /// changing what the model generates. `false` keys them like any field.
    pub ignore_label_fields: bool,
    /// How long a failed upstream call is remembered (negative caching), so
    /// followers everywhere get the error at once and a failing provider is
    /// not hammered by each replica in turn. Zero disables it.
    #[serde(with = "humantime_serde")]
    pub error_ttl: Duration,
    /// XFetch: refresh early with probability `exp(-(soft_expiry - now) / (delta * beta))`,
    /// delta being the upstream compute time. 0 disables early refresh.
    pub early_refresh_beta: f64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            soft_ttl: Duration::from_secs(300),
            hard_ttl: Duration::from_secs(3600),
            ttl_jitter: 0.1,
            max_bytes: 256 * 1024 * 1024,
            max_entry_bytes: 8 * 1024 * 1024,
            sampled: false,
            scope: CacheScope::Tenant,
            case_fold: false,
            ignore_label_fields: true,
            error_ttl: Duration::from_secs(5),
            early_refresh_beta: 1.0,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CoalesceConfig {
    /// Callers allowed to wait on one flight; beyond it they get 503 + Retry-After.
    pub max_waiters: usize,
    /// How long a follower waits for the owner's result before giving up (504).
    #[serde(with = "humantime_serde")]
    pub wait_timeout: Duration,
    /// A streamed upstream response that sends no event for this long after
    /// its first one is broken: every reader gets an error event, nothing is
    /// cached.
    #[serde(with = "humantime_serde")]
    pub stream_stall_timeout: Duration,
    /// The longest silence before a stream's first event: long enough for a
    /// reasoning model that thinks for minutes before it says anything.
    #[serde(with = "humantime_serde")]
    pub first_event_timeout: Duration,
    /// While a stream is silent (a model thinking), each reader receives an
    /// SSE comment this often, so proxies and load balancers with idle
    /// timeouts do not cut it; the SDKs ignore comments, and they are never
    /// stored or replayed. Zero: none.
    #[serde(with = "humantime_serde")]
    pub keepalive_interval: Duration,
    /// A streaming caller that falls further behind the live stream than this
    /// (bytes written since it joined that it has not read) gets an error event
    /// and is cut, instead of pinning the stream while it dawdles.
    pub max_reader_lag_bytes: usize,
    /// Cancel a streamed upstream call once every caller reading it has gone
    /// (stops the spend; the answer is then not cached). Off: it completes and is cached.
    pub cancel_when_abandoned: bool,
    /// Callers waiting on all flights together; beyond it, 503 + Retry-After.
    pub max_total_waiters: usize,
    /// What a follower does when `wait_timeout` passes: `error` (504) or
    /// `own_call` (make its own upstream call, outside the flight).
    pub on_wait_timeout: OnWaitTimeout,
}

/// A follower's choice when its wait for the owner runs out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnWaitTimeout {
    /// Answer 504: the provider is not asked twice for one answer.
    #[default]
    Error,
    /// Call upstream itself: the caller gets an answer, at the price of a second call.
    OwnCall,
}

impl Default for CoalesceConfig {
    fn default() -> Self {
        Self {
            max_waiters: 10_000,
            // Past the upstreams' `request_timeout` (10 minutes): a follower
            // never gives up on a call that is still within its time.
            wait_timeout: Duration::from_secs(900),
            stream_stall_timeout: Duration::from_secs(60),
            first_event_timeout: Duration::from_secs(600),
            keepalive_interval: Duration::from_secs(15),
            max_reader_lag_bytes: 8 * 1024 * 1024,
            cancel_when_abandoned: false,
            max_total_waiters: 100_000,
            on_wait_timeout: OnWaitTimeout::Error,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Attempts in all, the first included.
    pub max_attempts: usize,
    #[serde(with = "humantime_serde")]
    pub base_delay: Duration,
    #[serde(with = "humantime_serde")]
    pub max_delay: Duration,
    /// After this long from a call's start, no retry starts (and no wait for
    /// one): it bounds the retries, not an attempt under way, which runs to
    /// its upstream's `request_timeout`.
    #[serde(with = "humantime_serde")]
    pub deadline: Duration,
    /// Retries per upstream are at most this fraction of first attempts
    /// (over 10 s), plus `budget_min_per_sec`.
    pub budget_ratio: f64,
    /// Retries per second always allowed, so a quiet upstream can still retry.
    pub budget_min_per_sec: f64,
    /// Resend a request the provider may already have (an attempt that timed
    /// out or lost its connection after the request was sent). Off: the
    /// provider may be generating it, and bills it; connect errors and
    /// retryable statuses are retried either way.
    pub resend_sent_requests: bool,
    /// How long the answer of a completed flight (sampled or not) stays
    /// readable by the client's own retries (`X-Stainless-Retry-Count` > 0, or
    /// a repeated `Idempotency-Key`), and how long an idempotency key stays
    /// bound to its request. 0 turns the retry window off.
    #[serde(with = "humantime_serde")]
    pub dedup_window: Duration,
    /// Bytes of answers the retry window keeps in this process (bodies and
    /// stream events); the least recently used go first.
    pub dedup_max_bytes: u64,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            base_delay: Duration::from_millis(250),
            max_delay: Duration::from_secs(8),
            deadline: Duration::from_secs(150),
            budget_ratio: 0.2,
            budget_min_per_sec: 1.0,
            resend_sent_requests: false,
            dedup_window: Duration::from_secs(300),
            dedup_max_bytes: 64 * 1024 * 1024,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Largest request body accepted (413 beyond).
    pub max_body_bytes: usize,
    /// Largest upstream response body read into memory (502 beyond).
    pub max_response_bytes: usize,
    /// Deepest JSON nesting accepted in a request body (400 beyond).
    pub max_json_depth: usize,
    /// Most `messages` in one chat or Messages request (400 beyond).
    pub max_messages: usize,
    /// Most inputs in one embeddings request (400 beyond; OpenAI's own limit).
    pub max_embedding_inputs: usize,
    /// Largest single embeddings input, in bytes of its canonical JSON (400 beyond).
    pub max_embedding_input_bytes: usize,
    /// Per-tenant request rate and requests at once, per instance (429 +
    /// Retry-After beyond either).
    pub per_tenant: Option<TenantLimitsConfig>,
    /// `/v1/*` requests served at once, waiters included, each until its
    /// response body ends (503 + Retry-After beyond).
    pub max_concurrent_requests: Option<usize>,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            // Anthropic takes 32 MB requests: agents send screenshots and whole files.
            max_body_bytes: 32 * 1024 * 1024,
            max_response_bytes: 32 * 1024 * 1024,
            max_json_depth: 64,
            // Anthropic's own limit; a long agent session sends thousands.
            max_messages: 100_000,
            max_embedding_inputs: 2048,
            max_embedding_input_bytes: 256 * 1024,
            per_tenant: None,
            max_concurrent_requests: None,
        }
    }
}

/// A token bucket: `rps` requests per second on average, `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RateConfig {
    pub rps: u32,
    pub burst: u32,
}

/// What one caller key may take of an instance: a request rate (`rps` with
/// `burst`, a token bucket) and requests at once (`max_concurrent`, each held
/// until its response body ends, so a long stream keeps its place). Either
/// half works alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TenantLimitsConfig {
    pub rps: Option<u32>,
    /// Defaults to `rps` (one second's worth at once).
    pub burst: Option<u32>,
    pub max_concurrent: Option<usize>,
    /// Tokens the provider billed for the tenant's calls per UTC minute
    /// (cached input included); cache hits and shared answers count nothing.
    pub tokens_per_minute: Option<u64>,
}

impl TenantLimitsConfig {
    /// The rate half, when `rps` is set.
    pub fn rate(&self) -> Option<RateConfig> {
        self.rps.map(|rps| RateConfig {
            rps,
            burst: self.burst.unwrap_or(rps),
        })
    }
}

/// Gateway keys and the tenant secret.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// SHA-256 hashes (hex) of the accepted gateway keys (`printf %s KEY | sha256sum`).
    pub keys: Vec<String>,
    /// Variable holding accepted gateway keys themselves, comma-separated.
    pub keys_env: Option<String>,
    /// Variable holding the secret tenant scopes are keyed with (HMAC-SHA-256).
    pub tenant_secret_env: Option<String>,
    /// Lets corral start on a non-loopback address while it sends its own
    /// provider key and no gateway key is set: anyone who reaches it spends
    /// that key. Off, such a start is refused (no accidental open relay).
    pub allow_anonymous: bool,
    /// Names for gateway keys on `/stats`: label -> SHA-256 of the key (hex,
    /// as in `keys`). A tenant without a label is shown as its scope's short hash.
    pub key_labels: BTreeMap<String, String>,
    /// Resolved at load from `key_labels`: key hash -> label.
    #[serde(skip)]
    pub labels_by_hash: Vec<([u8; 32], String)>,
    /// Resolved at load: every accepted key's hash, from `keys` and `keys_env`.
    #[serde(skip)]
    pub key_hashes: Vec<[u8; 32]>,
    /// SHA-256 hashes (hex) of the admin keys, as `keys`. With any admin key,
    /// `/metrics`, `/stats`, the savings page and `/admin/*` require one
    /// (`api/admin.rs`); without, the reports are open and `/admin` is off.
    pub admin_keys: Vec<String>,
    /// Variable holding admin keys themselves, comma-separated, as `keys_env`.
    pub admin_keys_env: Option<String>,
    /// Resolved at load: every admin key's hash, from `admin_keys` and `admin_keys_env`.
    #[serde(skip)]
    pub admin_key_hashes: Vec<[u8; 32]>,
    /// Resolved at load from `tenant_secret_env`.
    #[serde(skip)]
    pub tenant_secret: Option<Secret<Vec<u8>>>,
}

/// Connection-level timeouts of the HTTP server.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// A request's head must arrive within this (idle keep-alive included).
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// A request's body must arrive within this (408 after).
    #[serde(with = "humantime_serde")]
    pub body_read_timeout: Duration,
    /// A client that accepts no byte of its response for this long is
    /// disconnected and what its response held is freed (a stalled reader).
    #[serde(with = "humantime_serde")]
    pub write_timeout: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShutdownConfig {
    /// On SIGTERM/SIGINT, how long running requests and flights may finish
    /// before their upstream calls are cut.
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// On SIGTERM/SIGINT, how long corral goes on accepting and serving new
    /// requests while `/readyz` already answers 503, so a load balancer that
    /// polls it stops sending before the port closes. Then the drain begins.
    /// 0 behind Kubernetes with a `preStop` sleep (which does the same).
    #[serde(with = "humantime_serde")]
    pub unready_delay: Duration,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        Self {
            drain_timeout: Duration::from_secs(30),
            unready_delay: Duration::from_secs(5),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    pub format: LogFormat,
    /// One `info` line per finished request (request id, status, cache status,
    /// fingerprint prefix, latency). Off: only upstream calls and problems are logged.
    pub requests: bool,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            requests: true,
        }
    }
}

/// Observability exports beyond logs and `/metrics`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    pub otlp: OtlpConfig,
}

/// OTLP trace export (`traces.rs`). No endpoint: no exporter is built.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct OtlpConfig {
    /// The collector's base OTLP/HTTP URL (`http://collector:4318`); corral
    /// posts to `{endpoint}/v1/traces`. Absent: `OTEL_EXPORTER_OTLP_ENDPOINT`
    /// when that is set, else traces are off.
    pub endpoint: Option<String>,
    pub protocol: OtlpProtocol,
    /// `service.name` of every span.
    pub service_name: String,
    /// Share of traces that start at corral which are recorded (0 to 1); a
    /// caller's `traceparent` sampled flag decides for its own traces.
    pub sample_ratio: f64,
    /// Variable holding extra export headers, `key=value,key2=value2`
    /// (a collector's auth token): never written in the file.
    pub headers_env: Option<String>,
    /// Bound on one export request.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Spans are exported in batches at least this often.
    #[serde(with = "humantime_serde")]
    pub export_interval: Duration,
    /// Ended spans waiting for export; beyond it new spans are dropped, so a
    /// slow collector never slows a request.
    pub max_queue_spans: usize,
    /// Resolved at load from `headers_env`.
    #[serde(skip)]
    pub headers: Option<Secret<Vec<(String, String)>>>,
}

/// The OTLP transport. Only OTLP/HTTP with protobuf bodies is built in (a
/// collector's port 4318); gRPC would add a tonic/h2 client to every build.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
pub enum OtlpProtocol {
    #[default]
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
}

impl Default for OtlpConfig {
    fn default() -> Self {
        Self {
            endpoint: None,
            protocol: OtlpProtocol::HttpProtobuf,
            service_name: "corral".to_owned(),
            sample_ratio: 1.0,
            headers_env: None,
            timeout: Duration::from_secs(10),
            export_interval: Duration::from_secs(5),
            max_queue_spans: 2048,
            headers: None,
        }
    }
}

/// The standard OpenTelemetry variable honoured when `telemetry.otlp.endpoint` is absent.
pub const OTEL_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

impl OtlpConfig {
    /// The endpoint from `OTEL_EXPORTER_OTLP_ENDPOINT` when the file sets
    /// none, and the export headers from `headers_env`.
    fn resolve(&mut self, env: &BTreeMap<&str, &str>) -> Result<(), ConfigError> {
        if self.endpoint.is_none()
            && let Some(endpoint) = env.get(OTEL_ENDPOINT_ENV).filter(|e| !e.trim().is_empty())
        {
            self.endpoint = Some((*endpoint).to_owned());
        }
        if let Some(var) = &self.headers_env {
            let text = env.get(var.as_str()).ok_or_else(|| ConfigError::Env {
                var: var.clone(),
                message: "not set, but telemetry.otlp.headers_env names it".into(),
            })?;
            let headers = parse_export_headers(text).map_err(|message| ConfigError::Env {
                var: var.clone(),
                message,
            })?;
            self.headers = Some(Secret::new(headers));
        }
        Ok(())
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if let Some(endpoint) = &self.endpoint {
            let url = reqwest::Url::parse(endpoint)
                .map_err(|err| ConfigError::key("telemetry.otlp.endpoint", err.to_string()))?;
            if !matches!(url.scheme(), "http" | "https") {
                return Err(ConfigError::key(
                    "telemetry.otlp.endpoint",
                    "must be an http or https URL (OTLP/HTTP, a collector's port 4318)",
                ));
            }
        }
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            return Err(ConfigError::key(
                "telemetry.otlp.sample_ratio",
                "must be between 0 and 1",
            ));
        }
        if self.max_queue_spans == 0 {
            return Err(ConfigError::key(
                "telemetry.otlp.max_queue_spans",
                "must be at least 1",
            ));
        }
        if self.timeout.is_zero() || self.export_interval.is_zero() {
            return Err(ConfigError::key(
                "telemetry.otlp",
                "timeout and export_interval must be above 0",
            ));
        }
        Ok(())
    }
}

/// `key=value,key2=value2` (the `OTEL_EXPORTER_OTLP_HEADERS` format; values
/// may be percent-encoded), each a valid header. Errors never quote a value.
fn parse_export_headers(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut headers = Vec::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, value) = pair
            .split_once('=')
            .ok_or("wants key=value pairs separated by commas")?;
        let name = name.trim();
        let value = percent_encoding::percent_decode_str(value.trim())
            .decode_utf8()
            .map_err(|_| format!("the value of `{name}` is not UTF-8 once decoded"))?;
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(format!("`{name}` is not a header name"));
        }
        if http::HeaderValue::from_str(&value).is_err() {
            return Err(format!("the value of `{name}` is not a valid header value"));
        }
        headers.push((name.to_owned(), value.into_owned()));
    }
    Ok(headers)
}

/// The label a model gets when no price and no literal route names it; reserved.
pub const OTHER_MODEL: &str = "other";

/// Model prices for the cost metrics, over the embedded snapshot (`pricing.rs`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct PricingConfig {
    /// When the prices below were read off the providers' price pages (shown on `/stats`).
    pub as_of: Option<String>,
    /// Whether the embedded price snapshot (`pricing/genai-prices.json`) prices
    /// the models `models` does not. Off: only `models` is priced.
    pub snapshot: bool,
    /// Model name or glob -> price, consulted before the embedded snapshot (an
    /// entry here overrides it). Names match case-insensitively; an exact name
    /// wins over a glob, and among globs the first listed wins, so list
    /// specific patterns before broad ones.
    pub models: PriceTable,
}

impl Default for PricingConfig {
    fn default() -> Self {
        Self {
            as_of: None,
            snapshot: true,
            models: PriceTable::default(),
        }
    }
}

/// The books behind `/stats` (`ledger.rs`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LedgerConfig {
    /// How often each instance adds its counts into the Redis ledger (and reads
    /// the cluster's totals back). Without Redis there is no ledger to flush.
    #[serde(with = "humantime_serde")]
    pub flush_interval: Duration,
    /// The ledger's Redis keys expire this long after the last flush of any instance.
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
    /// Distinct tenants counted by name, per instance and in the cluster
    /// ledger; later ones are counted as `other`.
    pub max_tenants: usize,
    /// Tenants `/stats` lists by name (the most spent first); the rest are summed as `other`.
    pub top_tenants: usize,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        Self {
            flush_interval: Duration::from_secs(1),
            retention: Duration::from_secs(400 * 24 * 3600),
            max_tenants: 1000,
            top_tenants: 10,
        }
    }
}

/// `pricing.models` in the order written: the order decides among globs, so a
/// plain map (which sorts or hashes its keys) would not do.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PriceTable(pub Vec<(String, ModelPrice)>);

impl<'de> Deserialize<'de> for PriceTable {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entries;
        impl<'de> serde::de::Visitor<'de> for Entries {
            type Value = PriceTable;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map from model name or glob to {input, output, cached_input}")
            }
            fn visit_unit<E>(self) -> Result<PriceTable, E> {
                Ok(PriceTable::default())
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<PriceTable, A::Error> {
                let mut entries: Vec<(String, ModelPrice)> = Vec::new();
                while let Some((name, price)) = map.next_entry::<String, ModelPrice>()? {
                    if entries
                        .iter()
                        .any(|(seen, _)| seen.eq_ignore_ascii_case(&name))
                    {
                        return Err(serde::de::Error::custom(format!(
                            "model `{name}` is priced twice"
                        )));
                    }
                    entries.push((name, price));
                }
                Ok(PriceTable(entries))
            }
        }
        deserializer.deserialize_map(Entries)
    }
}

impl Serialize for PriceTable {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, price) in &self.0 {
            map.serialize_entry(name, price)?;
        }
        map.end()
    }
}

fn default_models() -> Vec<String> {
    vec!["*".to_owned()]
}
fn default_connect_timeout() -> Duration {
    Duration::from_secs(5)
}
/// The provider SDKs wait 10 minutes: a reasoning model may take that long.
fn default_request_timeout() -> Duration {
    Duration::from_secs(600)
}
fn default_first_byte_timeout() -> Duration {
    Duration::from_secs(60)
}
fn default_breaker_failures() -> u32 {
    5
}
fn default_breaker_cool_down() -> Duration {
    Duration::from_secs(10)
}

impl Config {
    /// Parses YAML, applies `CORRAL_*` overrides from `env`, resolves provider
    /// keys from `env`, and validates.
    pub fn load<'a>(
        yaml: &str,
        env: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, ConfigError> {
        let env: BTreeMap<&str, &str> = env.into_iter().collect();
        let mut tree: Value = serde_yaml_ng::from_str(yaml)?;
        if tree.is_null() {
            tree = Value::Mapping(Mapping::new());
        }
        let ignored_env = apply_env_overrides(&mut tree, &env)?;
        let mut config: Config = serde_path_to_error::deserialize(tree).map_err(|err| {
            let path = err.path().to_string();
            ConfigError::key(path, err.into_inner().to_string())
        })?;
        config.ignored_env = ignored_env;
        config.resolve_keys(&env)?;
        config.resolve_protection_secrets(&env)?;
        config.telemetry.otlp.resolve(&env)?;
        config.validate()?;
        Ok(config)
    }

    /// Reads the process environment; only the binary calls this.
    pub fn load_from_process_env(yaml: &str) -> Result<Self, ConfigError> {
        let vars: Vec<(String, String)> = std::env::vars().collect();
        Self::load(yaml, vars.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }

    /// A small, fast configuration pointing at one upstream, for tests.
    pub fn for_tests(upstream_base_url: &str) -> Self {
        let mut config = Self::load(
            "listen: 127.0.0.1:0\nupstreams: [{name: mock, base_url: http://127.0.0.1:1/v1}]",
            [],
        )
        .expect("the test config is valid");
        config.upstreams[0].base_url = upstream_base_url.trim_end_matches('/').to_owned();
        config.cache.ttl_jitter = 0.0;
        config.retry.base_delay = Duration::from_millis(10);
        config.retry.max_delay = Duration::from_millis(100);
        config.retry.deadline = Duration::from_secs(20);
        config.coalesce.wait_timeout = Duration::from_secs(30);
        config.upstreams[0].request_timeout = Duration::from_secs(30);
        // Tests about other things must not trip the protections; theirs set them.
        config.upstreams[0].breaker_failures = 1_000_000;
        config.retry.budget_min_per_sec = 1_000_000.0;
        // Tests stop instances often; theirs of readiness set it.
        config.shutdown.unready_delay = Duration::ZERO;
        config
    }

    /// Gateway keys, the tenant secret and the Redis encryption key, from `env`.
    fn resolve_protection_secrets(
        &mut self,
        env: &BTreeMap<&str, &str>,
    ) -> Result<(), ConfigError> {
        let required = |var: &str, key: &str| {
            env.get(var).copied().ok_or_else(|| ConfigError::Env {
                var: var.to_owned(),
                message: format!("not set, but {key} names it"),
            })
        };
        let auth = &mut self.auth;
        auth.key_hashes.clear();
        for (i, hash) in auth.keys.iter().enumerate() {
            let mut bytes = [0u8; 32];
            hex::decode_to_slice(hash.trim(), &mut bytes).map_err(|_| {
                ConfigError::key(
                    format!("auth.keys[{i}]"),
                    "must be the SHA-256 of a key, 64 hex digits (printf %s KEY | sha256sum)",
                )
            })?;
            auth.key_hashes.push(bytes);
        }
        auth.labels_by_hash.clear();
        for (label, hash) in &auth.key_labels {
            let mut bytes = [0u8; 32];
            hex::decode_to_slice(hash.trim(), &mut bytes).map_err(|_| {
                ConfigError::key(
                    format!("auth.key_labels.{label}"),
                    "must be the SHA-256 of a key, 64 hex digits (printf %s KEY | sha256sum)",
                )
            })?;
            if label.is_empty() || label.len() > 64 || label == crate::ledger::OTHER {
                return Err(ConfigError::key(
                    format!("auth.key_labels.{label}"),
                    "a label must be 1 to 64 characters and not `other`",
                ));
            }
            auth.labels_by_hash.push((bytes, label.clone()));
        }
        if let Some(var) = &auth.keys_env {
            let keys = required(var, "auth.keys_env")?;
            for key in keys.split(',').map(str::trim).filter(|k| !k.is_empty()) {
                auth.key_hashes
                    .push(crate::tenant::key_hash(key.as_bytes()));
            }
            if auth.key_hashes.is_empty() {
                return Err(ConfigError::Env {
                    var: var.clone(),
                    message: "holds no key (auth.keys_env wants comma-separated keys)".into(),
                });
            }
        }
        auth.admin_key_hashes.clear();
        for (i, hash) in auth.admin_keys.iter().enumerate() {
            let mut bytes = [0u8; 32];
            hex::decode_to_slice(hash.trim(), &mut bytes).map_err(|_| {
                ConfigError::key(
                    format!("auth.admin_keys[{i}]"),
                    "must be the SHA-256 of a key, 64 hex digits (printf %s KEY | sha256sum)",
                )
            })?;
            auth.admin_key_hashes.push(bytes);
        }
        if let Some(var) = &auth.admin_keys_env {
            let keys = required(var, "auth.admin_keys_env")?;
            for key in keys.split(',').map(str::trim).filter(|k| !k.is_empty()) {
                auth.admin_key_hashes
                    .push(crate::tenant::key_hash(key.as_bytes()));
            }
            if auth.admin_key_hashes.is_empty() {
                return Err(ConfigError::Env {
                    var: var.clone(),
                    message: "holds no key (auth.admin_keys_env wants comma-separated keys)".into(),
                });
            }
        }
        // A gateway key reaches callers' code; an admin key must not be one.
        if auth
            .admin_key_hashes
            .iter()
            .any(|admin| auth.key_hashes.contains(admin))
        {
            return Err(ConfigError::key(
                "auth.admin_keys",
                "an admin key is also a gateway key (auth.keys or auth.keys_env); use a key of its own",
            ));
        }
        if let Some(var) = &auth.tenant_secret_env {
            let secret = required(var, "auth.tenant_secret_env")?;
            if secret.len() < 16 {
                return Err(ConfigError::Env {
                    var: var.clone(),
                    message: "the tenant secret must be at least 16 bytes".into(),
                });
            }
            auth.tenant_secret = Some(Secret::new(secret.as_bytes().to_vec()));
        }
        if let Some(redis) = &mut self.redis
            && let Some(var) = &redis.encryption_key_env
        {
            let text = required(var, "redis.encryption_key_env")?;
            let key =
                crate::crypto::Sealer::parse_key(text).map_err(|message| ConfigError::Env {
                    var: var.clone(),
                    message,
                })?;
            redis.encryption_key = Some(Secret::new(key));
        }
        Ok(())
    }

    /// The protection settings' checks, each naming its key.
    fn validate_protection(&self) -> Result<(), ConfigError> {
        let rate = |rate: &RateConfig, key: &str| {
            if rate.rps == 0 || rate.burst == 0 {
                return Err(ConfigError::key(key, "rps and burst must be at least 1"));
            }
            Ok(())
        };
        if let Some(per_tenant) = &self.limits.per_tenant {
            if per_tenant.rps.is_none() && per_tenant.burst.is_some() {
                return Err(ConfigError::key(
                    "limits.per_tenant",
                    "burst needs rps (the rate it refills at)",
                ));
            }
            if let Some(per_tenant_rate) = per_tenant.rate() {
                rate(&per_tenant_rate, "limits.per_tenant")?;
            }
            if per_tenant.max_concurrent == Some(0) {
                return Err(ConfigError::key(
                    "limits.per_tenant.max_concurrent",
                    "must be at least 1",
                ));
            }
            if per_tenant.tokens_per_minute == Some(0) {
                return Err(ConfigError::key(
                    "limits.per_tenant.tokens_per_minute",
                    "must be at least 1",
                ));
            }
            if per_tenant.rps.is_none()
                && per_tenant.max_concurrent.is_none()
                && per_tenant.tokens_per_minute.is_none()
            {
                return Err(ConfigError::key(
                    "limits.per_tenant",
                    "set rps (with burst), max_concurrent, tokens_per_minute, or any of them together",
                ));
            }
        }
        for (i, rule) in self.budgets.iter().enumerate() {
            let key = format!("budgets[{i}]");
            match (&rule.tenant, &rule.upstream) {
                (Some(tenant), None) if !tenant.is_empty() => {}
                (None, Some(upstream)) => {
                    if !self.upstreams.iter().any(|known| &known.name == upstream) {
                        return Err(ConfigError::key(
                            format!("{key}.upstream"),
                            format!("no upstream is named `{upstream}`"),
                        ));
                    }
                }
                _ => {
                    return Err(ConfigError::key(
                        key,
                        "set exactly one of tenant (a key label, a short scope or \"*\") and upstream",
                    ));
                }
            }
            if rule.limit_nanos().is_none() {
                return Err(ConfigError::key(
                    format!("{key}.usd"),
                    "must be a sum of USD >= 0",
                ));
            }
        }
        if self.limits.max_concurrent_requests == Some(0) {
            return Err(ConfigError::key(
                "limits.max_concurrent_requests",
                "must be at least 1",
            ));
        }
        if self.limits.max_json_depth < 2 || self.limits.max_json_depth > 128 {
            return Err(ConfigError::key(
                "limits.max_json_depth",
                "must be between 2 and 128",
            ));
        }
        if self.limits.max_messages == 0 {
            return Err(ConfigError::key(
                "limits.max_messages",
                "must be at least 1",
            ));
        }
        if self.limits.max_embedding_inputs == 0 || self.limits.max_embedding_input_bytes == 0 {
            return Err(ConfigError::key(
                "limits.max_embedding_inputs",
                "max_embedding_inputs and max_embedding_input_bytes must be at least 1",
            ));
        }
        for (i, upstream) in self.upstreams.iter().enumerate() {
            if let Some(upstream_rate) = &upstream.rate {
                rate(upstream_rate, &format!("upstreams[{i}].rate"))?;
            }
            if upstream.max_concurrency == Some(0) {
                return Err(ConfigError::key(
                    format!("upstreams[{i}].max_concurrency"),
                    "must be at least 1",
                ));
            }
            if upstream.breaker_failures == 0 {
                return Err(ConfigError::key(
                    format!("upstreams[{i}].breaker_failures"),
                    "must be at least 1",
                ));
            }
            if upstream.first_byte_timeout.is_zero() || upstream.request_timeout.is_zero() {
                return Err(ConfigError::key(
                    format!("upstreams[{i}].first_byte_timeout"),
                    "first_byte_timeout and request_timeout must be above zero",
                ));
            }
            // With gateway keys, the caller's Authorization is a gateway key:
            // forwarding it would hand it to the provider.
            if !self.auth.key_hashes.is_empty() && upstream.api_key.is_none() {
                return Err(ConfigError::key(
                    format!("upstreams[{i}].api_key_env"),
                    "is required when auth.keys or auth.keys_env is set (the caller's key is a gateway key, not a provider key)",
                ));
            }
        }
        if !(self.retry.budget_ratio.is_finite() && self.retry.budget_ratio >= 0.0) {
            return Err(ConfigError::key(
                "retry.budget_ratio",
                "must be a number >= 0",
            ));
        }
        if !(self.retry.budget_min_per_sec.is_finite() && self.retry.budget_min_per_sec >= 0.0) {
            return Err(ConfigError::key(
                "retry.budget_min_per_sec",
                "must be a number >= 0",
            ));
        }
        if self.server.write_timeout.is_zero() {
            return Err(ConfigError::key(
                "server.write_timeout",
                "must be above zero",
            ));
        }
        if self.server.header_read_timeout.is_zero() || self.server.body_read_timeout.is_zero() {
            return Err(ConfigError::key(
                "server.header_read_timeout",
                "header_read_timeout and body_read_timeout must be above zero",
            ));
        }
        if self.shutdown.drain_timeout.is_zero() {
            return Err(ConfigError::key(
                "shutdown.drain_timeout",
                "must be above zero",
            ));
        }
        Ok(())
    }

    /// Refuses the set-ups that would expose one caller's spending or
    /// answers to others: an open relay, a cache shared by unauthenticated
    /// callers who each pay with their own key; and checks the pass-through rules.
    fn validate_exposure(&self) -> Result<(), ConfigError> {
        let gateway_keys = !self.auth.key_hashes.is_empty();
        if let Some(i) = self.upstreams.iter().position(|u| u.api_key.is_some())
            && !gateway_keys
            && !self.listen.ip().is_loopback()
            && !self.auth.allow_anonymous
        {
            return Err(ConfigError::key(
                "auth.allow_anonymous",
                format!(
                    "refusing to start an open relay: corral listens on {} and sends its own provider key (upstreams[{i}]) for anyone who reaches it, and no gateway key is set. Set auth.keys or auth.keys_env, listen on a loopback address, or set auth.allow_anonymous: true if that is intended",
                    self.listen
                ),
            ));
        }
        if self.cache.scope == CacheScope::Global
            && !gateway_keys
            && let Some(i) = self.upstreams.iter().position(|u| u.api_key.is_none())
        {
            return Err(ConfigError::key(
                "cache.scope",
                format!(
                    "`global` is refused while callers bring their own provider keys (upstreams[{i}] has no api_key_env) and no gateway key authenticates them: an answer paid by one key would be served to any key or none, and one bad key's error to everyone. Use `tenant`, or set api_key_env and gateway keys (auth.keys)"
                ),
            ));
        }
        crate::passthrough::Policy::new(&self.passthrough)
            .map_err(|(key, message)| ConfigError::key(key, message))?;
        Ok(())
    }

    fn resolve_keys(&mut self, env: &BTreeMap<&str, &str>) -> Result<(), ConfigError> {
        for (index, upstream) in self.upstreams.iter_mut().enumerate() {
            if let Some(var) = &upstream.api_key_env {
                let value = env.get(var.as_str()).ok_or_else(|| ConfigError::Env {
                    var: var.clone(),
                    message: format!(
                        "not set, but upstreams[{index}].api_key_env names it ({})",
                        upstream.name
                    ),
                })?;
                upstream.api_key = Some(Secret::new((*value).to_owned()));
            }
        }
        if let (Some(key), Some(first)) =
            (env.get(ENV_UPSTREAM_API_KEY), self.upstreams.first_mut())
        {
            first.api_key = Some(Secret::new((*key).to_owned()));
        }
        Ok(())
    }

    /// Checks what types alone cannot; every message names its key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_protection()?;
        self.validate_exposure()?;
        self.telemetry.otlp.validate()?;
        if self.upstreams.is_empty() {
            return Err(ConfigError::key(
                "upstreams",
                "at least one upstream is required",
            ));
        }
        for (i, upstream) in self.upstreams.iter().enumerate() {
            // Metrics, logs and `/stats` name an upstream by its name: two of one
            // name would be one row for two providers.
            if let Some(first) = self.upstreams[..i]
                .iter()
                .position(|earlier| earlier.name == upstream.name)
            {
                return Err(ConfigError::key(
                    format!("upstreams[{i}].name"),
                    format!(
                        "`{}` names upstreams[{first}] too; every upstream needs a name of its own",
                        upstream.name
                    ),
                ));
            }
            let url = reqwest::Url::parse(&upstream.base_url).map_err(|err| {
                ConfigError::key(format!("upstreams[{i}].base_url"), err.to_string())
            })?;
            if !matches!(url.scheme(), "http" | "https") {
                return Err(ConfigError::key(
                    format!("upstreams[{i}].base_url"),
                    "must be an http or https URL",
                ));
            }
            // Anthropic's SDKs take the bare host as their base URL and add
            // `/v1/messages`; corral adds `/messages` to its base URL, so the
            // bare host would send every request to a path that does not exist.
            if upstream.api == Api::Anthropic && url.path().trim_end_matches('/').is_empty() {
                return Err(ConfigError::key(
                    format!("upstreams[{i}].base_url"),
                    "an Anthropic base URL ends in its version, e.g. https://api.anthropic.com/v1 (corral appends /messages)",
                ));
            }
            if upstream.models.is_empty() {
                return Err(ConfigError::key(
                    format!("upstreams[{i}].models"),
                    "needs at least one pattern (\"*\" matches every model)",
                ));
            }
            for (j, pattern) in upstream.models.iter().enumerate() {
                glob::Pattern::new(pattern).map_err(|err| {
                    ConfigError::key(format!("upstreams[{i}].models[{j}]"), err.to_string())
                })?;
            }
        }
        let cache = &self.cache;
        if cache.soft_ttl.is_zero() || cache.soft_ttl > cache.hard_ttl {
            return Err(ConfigError::key(
                "cache.soft_ttl",
                "must be above zero and at most cache.hard_ttl",
            ));
        }
        if !(0.0..1.0).contains(&cache.ttl_jitter) {
            return Err(ConfigError::key("cache.ttl_jitter", "must be in [0, 1)"));
        }
        if cache.max_bytes == 0 || cache.max_entry_bytes == 0 {
            return Err(ConfigError::key("cache.max_bytes", "must be above zero"));
        }
        if cache.max_entry_bytes > cache.max_bytes || cache.max_entry_bytes > u64::from(u32::MAX) {
            return Err(ConfigError::key(
                "cache.max_entry_bytes",
                "must be at most cache.max_bytes (and below 4 GiB)",
            ));
        }
        if !(cache.early_refresh_beta.is_finite() && cache.early_refresh_beta >= 0.0) {
            return Err(ConfigError::key(
                "cache.early_refresh_beta",
                "must be a number >= 0 (0 disables early refresh)",
            ));
        }
        if let Some(redis) = &self.redis {
            let urls = redis.node_urls();
            if urls.is_empty() {
                return Err(ConfigError::key(
                    "redis.url",
                    "set redis.url or redis.nodes",
                ));
            }
            for url in &urls {
                ::redis::parse_redis_url(url).ok_or_else(|| {
                    ConfigError::key("redis.url", format!("`{url}` is not a redis:// URL"))
                })?;
            }
            if redis.op_timeout.is_zero() {
                return Err(ConfigError::key("redis.op_timeout", "must be above zero"));
            }
            if redis.lock_ttl < Duration::from_millis(300) {
                return Err(ConfigError::key("redis.lock_ttl", "must be at least 300ms"));
            }
            if redis.poll_interval.is_zero() {
                return Err(ConfigError::key(
                    "redis.poll_interval",
                    "must be above zero",
                ));
            }
            if redis.breaker_failures == 0 {
                return Err(ConfigError::key(
                    "redis.breaker_failures",
                    "must be at least 1",
                ));
            }
        }
        for (name, price) in &self.pricing.models.0 {
            let key = format!("pricing.models.{name}");
            if name.is_empty() || name.eq_ignore_ascii_case(OTHER_MODEL) {
                return Err(ConfigError::key(
                    key,
                    format!("a model name must be non-empty and not `{OTHER_MODEL}`"),
                ));
            }
            glob::Pattern::new(name).map_err(|err| ConfigError::key(&key, err.to_string()))?;
            let fields = [
                ("input", Some(price.input)),
                ("output", Some(price.output)),
                ("cached_input", price.cached_input),
                ("cache_write", price.cache_write),
            ];
            for (field, value) in fields {
                if let Some(value) = value
                    && crate::pricing::picos_per_token(value).is_none()
                {
                    return Err(ConfigError::key(
                        format!("{key}.{field}"),
                        "must be a number >= 0 with at most 6 decimals (USD per million tokens)",
                    ));
                }
            }
        }
        if self.ledger.flush_interval.is_zero() || self.ledger.retention < Duration::from_secs(60) {
            return Err(ConfigError::key(
                "ledger.flush_interval",
                "flush_interval must be above zero and retention at least 1m",
            ));
        }
        if self.ledger.max_tenants == 0 || self.ledger.top_tenants == 0 {
            return Err(ConfigError::key(
                "ledger.max_tenants",
                "max_tenants and top_tenants must be at least 1",
            ));
        }
        if self.retry.max_attempts == 0 {
            return Err(ConfigError::key("retry.max_attempts", "must be at least 1"));
        }
        if !self.retry.dedup_window.is_zero() && self.retry.dedup_max_bytes == 0 {
            return Err(ConfigError::key(
                "retry.dedup_max_bytes",
                "must be at least 1 while retry.dedup_window is on (set the window to 0 to turn it off)",
            ));
        }
        if self.retry.base_delay > self.retry.max_delay {
            return Err(ConfigError::key(
                "retry.base_delay",
                "must be at most retry.max_delay",
            ));
        }
        if self.coalesce.max_waiters == 0 {
            return Err(ConfigError::key(
                "coalesce.max_waiters",
                "must be at least 1",
            ));
        }
        if self.coalesce.max_total_waiters < self.coalesce.max_waiters {
            return Err(ConfigError::key(
                "coalesce.max_total_waiters",
                "must be at least coalesce.max_waiters",
            ));
        }
        if self.coalesce.wait_timeout.is_zero() {
            return Err(ConfigError::key(
                "coalesce.wait_timeout",
                "must be above zero",
            ));
        }
        Ok(())
    }
}

/// Applies `CORRAL_A__B__0__C=value` as `a.b[0].c = value` (value read as a YAML
/// scalar, so numbers and booleans keep their type), plus the short aliases.
/// Only variables that name a setting apply: the others (Kubernetes injects
/// `CORRAL_PORT=tcp://...` and `CORRAL_SERVICE_HOST` beside a Service named
/// `corral`) are returned, to be ignored with a warning.
fn apply_env_overrides(
    tree: &mut Value,
    env: &BTreeMap<&str, &str>,
) -> Result<Vec<String>, ConfigError> {
    let schema = settings_schema();
    let mut ignored = Vec::new();
    for (var, value) in env {
        let path = match ENV_ALIASES.iter().find(|(alias, _)| alias == var) {
            Some((_, path)) => path.split('.').map(str::to_owned).collect::<Vec<_>>(),
            None => {
                let Some(rest) = var.strip_prefix(ENV_PREFIX) else {
                    continue;
                };
                if *var == ENV_UPSTREAM_API_KEY {
                    continue;
                }
                let path: Vec<String> = rest.split("__").map(str::to_ascii_lowercase).collect();
                if !is_setting(&schema, &path) {
                    ignored.push((*var).to_owned());
                    continue;
                }
                path
            }
        };
        let parsed: Value =
            serde_yaml_ng::from_str(value).unwrap_or(Value::String((*value).into()));
        set_path(tree, &path, parsed).map_err(|message| ConfigError::Env {
            var: (*var).to_owned(),
            message,
        })?;
    }
    Ok(ignored)
}

/// Every setting's path, as a tree: a configuration with every optional part
/// present and one element in every list, serialized. A map key `*` stands for
/// any key (`pricing.models` is keyed by model name).
fn settings_schema() -> Value {
    let mut sample: Config = serde_yaml_ng::from_str(
        "listen: 127.0.0.1:0\nupstreams: [{name: x, base_url: 'http://x/v1', api_key_env: X, rate: {rps: 1, burst: 1}, max_concurrency: 1}]\npricing: {as_of: x, models: {'*': {input: 1, cached_input: 1}}}\nauth: {keys: [x], keys_env: X, tenant_secret_env: X, admin_keys: [x], admin_keys_env: X}\nlimits: {per_tenant: {rps: 1, burst: 1, max_concurrent: 1, tokens_per_minute: 1}, max_concurrent_requests: 1}\npassthrough: {allow: [x], deny: [x]}\nbudgets: [{tenant: x, upstream: x, usd: 1, per: day}]\n",
    )
    .expect("the settings sample parses");
    sample.redis = Some(RedisConfig {
        url: Some("redis://x".into()),
        nodes: vec!["redis://x".into()],
        encryption_key_env: Some("X".into()),
        ..RedisConfig::default()
    });
    serde_yaml_ng::to_value(&sample).expect("the config serializes")
}

/// Whether `path` (lower-case keys, list indices as numbers) names a setting.
fn is_setting(schema: &Value, path: &[String]) -> bool {
    let Some((head, rest)) = path.split_first() else {
        return true;
    };
    match schema {
        Value::Mapping(map) => map
            .get(head.as_str())
            .or_else(|| map.get("*"))
            .is_some_and(|child| is_setting(child, rest)),
        Value::Sequence(items) => {
            head.parse::<usize>().is_ok()
                && items.first().is_some_and(|item| is_setting(item, rest))
        }
        _ => false,
    }
}

fn set_path(tree: &mut Value, path: &[String], value: Value) -> Result<(), String> {
    let Some((head, rest)) = path.split_first() else {
        *tree = value;
        return Ok(());
    };
    match tree {
        Value::Sequence(items) => {
            let index: usize = head
                .parse()
                .map_err(|_| format!("`{head}` must be a list index"))?;
            let item = items
                .get_mut(index)
                .ok_or_else(|| format!("list index {index} does not exist"))?;
            set_path(item, rest, value)
        }
        Value::Mapping(map) => {
            let key = Value::String(head.clone());
            let child = map.entry(key).or_insert(Value::Null);
            if child.is_null() && !rest.is_empty() {
                *child = Value::Mapping(Mapping::new());
            }
            set_path(child, rest, value)
        }
        Value::Null => {
            *tree = Value::Mapping(Mapping::new());
            set_path(tree, path, value)
        }
        _ => Err(format!(
            "`{head}` is under a value that is not a map or list"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str =
        "listen: 127.0.0.1:8080\nupstreams:\n  - name: a\n    base_url: http://127.0.0.1:9/v1\n";

    #[test]
    fn the_shipped_config_loads() {
        let config = Config::load(EMBEDDED_DEFAULT, []).unwrap();
        assert!(!config.upstreams.is_empty());
        assert!(
            !config.cache.sampled,
            "the shipped default must not cache sampled answers"
        );
    }

    #[test]
    fn env_overrides_listen_upstream_and_nested_keys() {
        let config = Config::load(
            BASE,
            [
                ("CORRAL_LISTEN", "0.0.0.0:9999"),
                ("CORRAL_UPSTREAM_BASE_URL", "http://127.0.0.1:7/v1"),
                ("CORRAL_UPSTREAM_API_KEY", "sk-test"),
                ("CORRAL_CACHE__SOFT_TTL", "10s"),
                ("CORRAL_CACHE__SAMPLED", "true"),
                // Listening on every interface with corral's own key is an explicit choice.
                ("CORRAL_AUTH__ALLOW_ANONYMOUS", "true"),
                ("UNRELATED", "x"),
            ],
        )
        .unwrap();
        assert_eq!(config.listen.port(), 9999);
        assert_eq!(config.upstreams[0].base_url, "http://127.0.0.1:7/v1");
        assert_eq!(
            config.upstreams[0].api_key.as_ref().unwrap().expose(),
            "sk-test"
        );
        assert_eq!(config.cache.soft_ttl, Duration::from_secs(10));
        assert!(config.cache.sampled);
    }

    #[test]
    fn an_upstream_names_the_api_it_speaks() {
        let config = Config::load(BASE, []).unwrap();
        assert_eq!(config.upstreams[0].api, Api::OpenAi, "the default");
        let yaml = format!(
            "{BASE}  - {{name: anthropic, api: anthropic, base_url: 'https://api.anthropic.com/v1', api_key_env: ANTHROPIC_API_KEY, models: ['claude-*']}}\n"
        );
        let config = Config::load(&yaml, [("ANTHROPIC_API_KEY", "sk-ant-1")]).unwrap();
        assert_eq!(config.upstreams[1].api, Api::Anthropic);
        assert_eq!(config.upstreams[1].api.as_str(), "anthropic");
        let config = Config::load(BASE, [("CORRAL_UPSTREAMS__0__API", "anthropic")]).unwrap();
        assert_eq!(
            config.upstreams[0].api,
            Api::Anthropic,
            "settable from the environment"
        );

        let err = Config::load(&format!("{BASE}    api: gemini\n"), [])
            .unwrap_err()
            .to_string();
        assert!(err.contains("upstreams[0].api"), "{err}");
        assert!(err.contains("openai") && err.contains("anthropic"), "{err}");
        let bare = "listen: 127.0.0.1:8080\nupstreams:\n  - {name: a, api: anthropic, base_url: 'https://api.anthropic.com'}\n";
        let err = Config::load(bare, []).unwrap_err().to_string();
        assert!(
            err.contains("upstreams[0].base_url") && err.contains("/v1"),
            "{err}"
        );
    }

    #[test]
    fn api_key_env_is_resolved_and_required() {
        let yaml = format!("{BASE}    api_key_env: MY_KEY\n");
        let config = Config::load(&yaml, [("MY_KEY", "sk-1")]).unwrap();
        assert_eq!(
            config.upstreams[0].api_key.as_ref().unwrap().expose(),
            "sk-1"
        );
        let err = Config::load(&yaml, []).unwrap_err().to_string();
        assert!(err.contains("MY_KEY"), "{err}");
    }

    #[test]
    fn errors_name_the_key() {
        let err = Config::load(&format!("{BASE}cache:\n  soft_ttl: soon\n"), [])
            .unwrap_err()
            .to_string();
        assert!(err.contains("cache.soft_ttl"), "{err}");
        let err = Config::load(&format!("{BASE}retry:\n  max_attempts: 0\n"), [])
            .unwrap_err()
            .to_string();
        assert!(err.contains("retry.max_attempts"), "{err}");
        let err = Config::load(&format!("{BASE}cache:\n  typo: 1\n"), [])
            .unwrap_err()
            .to_string();
        assert!(err.contains("typo"), "{err}");
        let err = Config::load(BASE, [("CORRAL_CACHE__HARD_TTL", "1s")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("cache.soft_ttl"), "{err}");
    }

    #[test]
    fn pricing_keeps_its_order_and_accepts_embeddings_without_output() {
        let yaml = format!(
            "{BASE}pricing:\n  as_of: 2025-08-15\n  models:\n    gpt-4o-mini: {{input: 0.15, output: 0.6, cached_input: 0.075}}\n    'claude-*': {{input: 3, output: 15}}\n    text-embedding-3-small: {{input: 0.02}}\n    '*': {{input: 1, output: 1}}\n"
        );
        let config = Config::load(&yaml, []).unwrap();
        let names: Vec<&str> = config
            .pricing
            .models
            .0
            .iter()
            .map(|(name, _)| name.as_str())
            .collect();
        assert_eq!(
            names,
            ["gpt-4o-mini", "claude-*", "text-embedding-3-small", "*"]
        );
        assert_eq!(config.pricing.as_of.as_deref(), Some("2025-08-15"));
        let embedding = config.pricing.models.0[2].1;
        assert_eq!((embedding.input, embedding.output), (0.02, 0.0));
        assert_eq!(config.pricing.models.0[0].1.cached_input, Some(0.075));
        // Serializing keeps the order too (the config round-trips).
        let text = serde_yaml_ng::to_string(&config.pricing).unwrap();
        assert!(text.find("gpt-4o-mini").unwrap() < text.find("claude-*").unwrap());
    }

    #[test]
    fn pricing_errors_name_the_model_and_field() {
        for (models, expected) in [
            (
                "gpt-4o: {input: -1, output: 1}",
                "pricing.models.gpt-4o.input",
            ),
            (
                "gpt-4o: {input: 1, output: .nan}",
                "pricing.models.gpt-4o.output",
            ),
            ("'gpt-[': {input: 1}", "pricing.models.gpt-["),
            ("other: {input: 1}", "pricing.models.other"),
            ("gpt-4o: {input: 1, outptu: 2}", "outptu"),
            ("gpt-4o: {input: 1}\n    GPT-4o: {input: 2}", "priced twice"),
        ] {
            let yaml = format!("{BASE}pricing:\n  models:\n    {models}\n");
            let err = Config::load(&yaml, []).unwrap_err().to_string();
            assert!(err.contains(expected), "{models}: {err}");
        }
    }

    #[test]
    fn prices_and_request_logging_can_be_set_from_the_environment() {
        let yaml = format!("{BASE}pricing:\n  models:\n    gpt-4o: {{input: 2.5, output: 10}}\n");
        let config = Config::load(
            &yaml,
            [
                ("CORRAL_PRICING__MODELS__GPT-4O__INPUT", "3"),
                ("CORRAL_LOG__REQUESTS", "false"),
                ("CORRAL_LOG__FORMAT", "json"),
            ],
        )
        .unwrap();
        assert_eq!(config.pricing.models.0[0].1.input, 3.0);
        assert!(!config.log.requests);
        assert_eq!(config.log.format, LogFormat::Json);
        let defaults = Config::load(BASE, []).unwrap();
        assert!(defaults.log.requests, "request lines are on by default");
        assert!(defaults.pricing.models.0.is_empty());
    }

    #[test]
    fn traces_are_off_unless_an_endpoint_is_configured() {
        let defaults = Config::load(BASE, []).unwrap();
        assert_eq!(defaults.telemetry.otlp.endpoint, None, "off by default");
        assert!(
            Config::load(EMBEDDED_DEFAULT, [])
                .unwrap()
                .telemetry
                .otlp
                .endpoint
                .is_none()
        );

        // The file's key, its CORRAL_ override, then the standard variable.
        let yaml = format!("{BASE}telemetry:\n  otlp:\n    endpoint: http://file:4318\n");
        let from_file = Config::load(&yaml, [(OTEL_ENDPOINT_ENV, "http://otel:4318")]).unwrap();
        assert_eq!(
            from_file.telemetry.otlp.endpoint.as_deref(),
            Some("http://file:4318")
        );
        let overridden = Config::load(
            &yaml,
            [("CORRAL_TELEMETRY__OTLP__ENDPOINT", "http://env:4318")],
        )
        .unwrap();
        assert_eq!(
            overridden.telemetry.otlp.endpoint.as_deref(),
            Some("http://env:4318")
        );
        let standard = Config::load(BASE, [(OTEL_ENDPOINT_ENV, "http://otel:4318")]).unwrap();
        assert_eq!(
            standard.telemetry.otlp.endpoint.as_deref(),
            Some("http://otel:4318")
        );
        assert!(standard.ignored_env.is_empty());

        let tuned = Config::load(
            BASE,
            [
                ("CORRAL_TELEMETRY__OTLP__ENDPOINT", "https://c:4318"),
                ("CORRAL_TELEMETRY__OTLP__SAMPLE_RATIO", "0.25"),
                ("CORRAL_TELEMETRY__OTLP__SERVICE_NAME", "corral-eu"),
            ],
        )
        .unwrap();
        assert_eq!(tuned.telemetry.otlp.sample_ratio, 0.25);
        assert_eq!(tuned.telemetry.otlp.service_name, "corral-eu");
    }

    #[test]
    fn trace_export_headers_come_from_their_variable_and_stay_secret() {
        let yaml = format!(
            "{BASE}telemetry:\n  otlp:\n    endpoint: http://c:4318\n    headers_env: OTLP_AUTH\n"
        );
        let config = Config::load(
            &yaml,
            [("OTLP_AUTH", "authorization=Bearer%20tok-123, x-team = a")],
        )
        .unwrap();
        let headers = config.telemetry.otlp.headers.as_ref().unwrap();
        assert_eq!(
            headers.expose(),
            &vec![
                ("authorization".to_owned(), "Bearer tok-123".to_owned()),
                ("x-team".to_owned(), "a".to_owned()),
            ]
        );
        assert!(
            !format!("{config:?}").contains("tok-123"),
            "redacted in Debug"
        );
        let missing = Config::load(&yaml, []).unwrap_err().to_string();
        assert!(missing.contains("OTLP_AUTH"), "{missing}");
        let bad = Config::load(&yaml, [("OTLP_AUTH", "no-equals-sign-tok-123")])
            .unwrap_err()
            .to_string();
        assert!(
            bad.contains("key=value") && !bad.contains("tok-123"),
            "{bad}"
        );
    }

    #[test]
    fn trace_settings_are_checked_by_path() {
        for (otlp, path) in [
            ("endpoint: ftp://c", "telemetry.otlp.endpoint"),
            (
                "{endpoint: 'http://c:4318', sample_ratio: 1.5}",
                "telemetry.otlp.sample_ratio",
            ),
            ("protocol: grpc", "telemetry.otlp.protocol"),
            ("max_queue_spans: 0", "telemetry.otlp.max_queue_spans"),
        ] {
            let otlp = if otlp.starts_with('{') {
                otlp.to_owned()
            } else {
                format!("{{{otlp}}}")
            };
            let yaml = format!("{BASE}telemetry:\n  otlp: {otlp}\n");
            let err = Config::load(&yaml, []).unwrap_err().to_string();
            assert!(err.contains(path), "{otlp}: {err}");
        }
    }

    #[test]
    fn the_shipped_config_prices_through_the_snapshot_and_names_the_ledger() {
        let config = Config::load(EMBEDDED_DEFAULT, []).unwrap();
        assert!(config.pricing.snapshot, "the snapshot prices by default");
        assert!(
            config.pricing.models.0.is_empty(),
            "no hand-typed table to rot"
        );
        assert_eq!(config.ledger.flush_interval, Duration::from_secs(1));
        assert_eq!(config.ledger.top_tenants, 10);
    }

    #[test]
    fn key_labels_name_tenants_and_are_checked() {
        let hash = "ab".repeat(32);
        let yaml = format!("{BASE}auth:\n  key_labels:\n    team-a: '{hash}'\n");
        let config = Config::load(&yaml, []).unwrap();
        assert_eq!(
            config.auth.labels_by_hash,
            vec![([0xab; 32], "team-a".to_owned())]
        );
        for (labels, expected) in [
            ("team-a: nothex", "auth.key_labels.team-a"),
            (&format!("other: '{hash}'") as &str, "auth.key_labels.other"),
        ] {
            let yaml = format!("{BASE}auth:\n  key_labels:\n    {labels}\n");
            let err = Config::load(&yaml, []).unwrap_err().to_string();
            assert!(err.contains(expected), "{labels}: {err}");
        }
        let err = Config::load(&format!("{BASE}ledger:\n  max_tenants: 0\n"), [])
            .unwrap_err()
            .to_string();
        assert!(err.contains("ledger.max_tenants"), "{err}");
    }

    #[test]
    fn protection_settings_load_from_yaml_and_env() {
        let yaml = format!(
            "{BASE}    api_key_env: PROVIDER_KEY\n    rate: {{rps: 50, burst: 100}}\n    max_concurrency: 8\n    first_byte_timeout: 5s\nlimits:\n  per_tenant: {{rps: 5, burst: 10}}\nauth:\n  keys: ['{}']\n  keys_env: GATEWAY_KEYS\n  tenant_secret_env: TENANT_SECRET\nserver:\n  header_read_timeout: 3s\nshutdown:\n  drain_timeout: 7s\nredis:\n  url: redis://127.0.0.1:6379\n  encryption_key_env: CACHE_KEY\n",
            "ab".repeat(32)
        );
        let config = Config::load(
            &yaml,
            [
                ("PROVIDER_KEY", "sk-provider"),
                ("GATEWAY_KEYS", "gw-1, gw-2"),
                ("TENANT_SECRET", "a-secret-of-sixteen+"),
                ("CACHE_KEY", &"cd".repeat(32)),
            ],
        )
        .unwrap();
        assert_eq!(
            config.limits.per_tenant.and_then(|limits| limits.rate()),
            Some(RateConfig { rps: 5, burst: 10 })
        );
        assert_eq!(config.upstreams[0].max_concurrency, Some(8));
        assert_eq!(config.auth.key_hashes.len(), 3);
        assert_eq!(config.auth.key_hashes[1], crate::tenant::key_hash(b"gw-1"));
        assert!(config.auth.tenant_secret.is_some());
        assert_eq!(
            config
                .redis
                .as_ref()
                .unwrap()
                .encryption_key
                .as_ref()
                .unwrap()
                .expose(),
            &[0xcd; 32]
        );
        assert_eq!(config.server.header_read_timeout, Duration::from_secs(3));
        assert_eq!(config.shutdown.drain_timeout, Duration::from_secs(7));
        assert!(!format!("{config:?}").contains("a-secret-of-sixteen"));
    }

    #[test]
    fn admin_keys_load_like_gateway_keys_and_are_never_gateway_keys() {
        let admin_hash = hex::encode(crate::tenant::key_hash(b"adm-1"));
        let yaml =
            format!("{BASE}auth:\n  admin_keys: ['{admin_hash}']\n  admin_keys_env: ADMIN_KEYS\n");
        let config = Config::load(&yaml, [("ADMIN_KEYS", " adm-2, adm-3 ,")]).unwrap();
        assert_eq!(
            config.auth.admin_key_hashes,
            [b"adm-1".as_slice(), b"adm-2", b"adm-3"].map(crate::tenant::key_hash)
        );
        assert!(
            config.auth.key_hashes.is_empty(),
            "admin keys admit no /v1 caller"
        );
        // From the environment alone, as a Secret would provide it.
        let config = Config::load(
            BASE,
            [
                ("CORRAL_AUTH__ADMIN_KEYS_ENV", "ADMIN_KEYS"),
                ("ADMIN_KEYS", "adm-4"),
            ],
        )
        .unwrap();
        assert_eq!(
            config.auth.admin_key_hashes,
            [crate::tenant::key_hash(b"adm-4")]
        );
        assert!(!format!("{config:?}").contains("adm-4"));
        let cases = [
            ("auth:\n  admin_keys: [nothex]\n", "auth.admin_keys[0]"),
            ("auth:\n  admin_keys_env: MISSING\n", "MISSING"),
            (
                "auth:\n  keys_env: SAME\n  admin_keys_env: SAME\n",
                "auth.admin_keys",
            ),
        ];
        for (extra, expected) in cases {
            let err = Config::load(&format!("{BASE}{extra}"), [("SAME", "k-1")])
                .unwrap_err()
                .to_string();
            assert!(err.contains(expected), "{extra}: {err}");
        }
    }

    #[test]
    fn a_tenants_rate_and_places_each_work_alone_and_burst_defaults_to_rps() {
        let places = Config::load(
            &format!("{BASE}limits:\n  per_tenant: {{max_concurrent: 4}}\n"),
            [],
        )
        .unwrap()
        .limits
        .per_tenant
        .unwrap();
        assert_eq!((places.rate(), places.max_concurrent), (None, Some(4)));
        let rate = Config::load(&format!("{BASE}limits:\n  per_tenant: {{rps: 5}}\n"), [])
            .unwrap()
            .limits
            .per_tenant
            .unwrap();
        assert_eq!(rate.rate(), Some(RateConfig { rps: 5, burst: 5 }));
        assert_eq!(rate.max_concurrent, None);
    }

    #[test]
    fn budgets_load_from_yaml_and_the_environment_and_name_what_is_wrong() {
        let yaml = format!(
            "{BASE}budgets:\n  - {{tenant: '*', usd: 10, per: day}}\n  - {{upstream: a, usd: 1000, per: month}}\n"
        );
        let config = Config::load(
            &yaml,
            [
                ("CORRAL_BUDGETS__0__USD", "2.5"),
                ("CORRAL_LIMITS__PER_TENANT__TOKENS_PER_MINUTE", "2000000"),
            ],
        )
        .unwrap();
        assert!(config.ignored_env.is_empty(), "{:?}", config.ignored_env);
        assert_eq!(config.budgets[0].usd, 2.5);
        assert_eq!(config.budgets[0].per, Period::Day);
        assert_eq!(config.budgets[1].upstream.as_deref(), Some("a"));
        assert_eq!(
            config.limits.per_tenant.unwrap().tokens_per_minute,
            Some(2_000_000)
        );
        let whole = Config::load(
            BASE,
            [("CORRAL_BUDGETS", "[{tenant: team-a, usd: 50, per: 30s}]")],
        )
        .unwrap();
        assert_eq!(whole.budgets[0].per, Period::Every(Duration::from_secs(30)));
        for (rules, expected) in [
            ("[{usd: 1, per: day}]", "budgets[0]"),
            ("[{tenant: a, upstream: a, usd: 1, per: day}]", "budgets[0]"),
            (
                "[{upstream: nowhere, usd: 1, per: day}]",
                "budgets[0].upstream",
            ),
            ("[{tenant: a, usd: -1, per: day}]", "budgets[0].usd"),
            ("[{tenant: a, usd: 1, per: week}]", "week"),
        ] {
            let err = Config::load(&format!("{BASE}budgets: {rules}\n"), [])
                .unwrap_err()
                .to_string();
            assert!(err.contains(expected), "{rules}: {err}");
        }
    }

    #[test]
    fn protection_errors_name_the_key() {
        let cases = [
            (
                "limits:\n  per_tenant: {rps: 0, burst: 1}\n",
                "limits.per_tenant",
            ),
            (
                "limits:\n  per_tenant: {max_concurrent: 0}\n",
                "limits.per_tenant.max_concurrent",
            ),
            ("limits:\n  per_tenant: {burst: 5}\n", "burst needs rps"),
            ("limits:\n  per_tenant: {}\n", "limits.per_tenant"),
            ("auth:\n  keys: [nothex]\n", "auth.keys[0]"),
            ("auth:\n  tenant_secret_env: MISSING\n", "MISSING"),
            ("shutdown:\n  drain_timeout: 0s\n", "shutdown.drain_timeout"),
            ("limits:\n  max_json_depth: 500\n", "limits.max_json_depth"),
            ("server:\n  typo: 1s\n", "typo"),
        ];
        for (extra, expected) in cases {
            let err = Config::load(&format!("{BASE}{extra}"), [])
                .unwrap_err()
                .to_string();
            assert!(err.contains(expected), "{extra}: {err}");
        }
        // A gateway key must never be forwarded as the provider key.
        let err = Config::load(
            &format!("{BASE}auth:\n  keys: ['{}']\n", "ab".repeat(32)),
            [],
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("upstreams[0].api_key_env"), "{err}");
        let err = Config::load(
            &format!("{BASE}redis:\n  url: redis://127.0.0.1:1\n  encryption_key_env: K\n"),
            [("K", "too-short")],
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("64 hex digits"), "{err}");
    }

    #[test]
    fn an_open_relay_is_refused_unless_anonymous_access_is_allowed() {
        let yaml = "listen: 0.0.0.0:8080\nupstreams:\n  - {name: a, base_url: 'http://127.0.0.1:9/v1', api_key_env: KEY}\n";
        let err = Config::load(yaml, [("KEY", "sk-1")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("auth.allow_anonymous"), "{err}");
        assert!(err.contains("open relay"), "{err}");
        let allowed = format!("{yaml}auth:\n  allow_anonymous: true\n");
        assert!(Config::load(&allowed, [("KEY", "sk-1")]).is_ok());
        // Gateway keys, a loopback address or the callers' own keys: no relay.
        let keyed = format!("{yaml}auth:\n  keys_env: GW\n");
        assert!(Config::load(&keyed, [("KEY", "sk-1"), ("GW", "gw-1")]).is_ok());
        let loopback = yaml.replace("0.0.0.0", "127.0.0.1");
        assert!(Config::load(&loopback, [("KEY", "sk-1")]).is_ok());
        let own_keys =
            "listen: '[::]:8080'\nupstreams:\n  - {name: a, base_url: 'http://127.0.0.1:9/v1'}\n";
        assert!(Config::load(own_keys, []).is_ok());
    }

    #[test]
    fn a_global_cache_is_refused_while_callers_pay_with_their_own_keys() {
        let err = Config::load(&format!("{BASE}cache:\n  scope: global\n"), [])
            .unwrap_err()
            .to_string();
        assert!(err.contains("cache.scope"), "{err}");
        assert!(err.contains("upstreams[0]"), "{err}");
        let shared_key = format!("{BASE}    api_key_env: KEY\ncache:\n  scope: global\n");
        assert!(Config::load(&shared_key, [("KEY", "sk-1")]).is_ok());
    }

    #[test]
    fn kubernetes_service_variables_are_ignored_and_named() {
        let config = Config::load(
            BASE,
            [
                ("CORRAL_PORT", "tcp://10.0.0.1:8080"),
                ("CORRAL_PORT_8080_TCP_ADDR", "10.0.0.1"),
                ("CORRAL_SERVICE_HOST", "10.0.0.1"),
                ("CORRAL_SERVICE_PORT", "8080"),
                ("CORRAL_BIN", "x"),
                ("CORRAL_CACHE__TYPO", "1"),
                ("CORRAL_CACHE__SOFT_TTL", "10s"),
                ("CORRAL_UPSTREAMS__0__MODELS", "['gpt-*']"),
                ("CORRAL_PRICING__MODELS__GPT-4O__INPUT", "3"),
                ("CORRAL_PASSTHROUGH__ALLOW", "['POST /v1/files']"),
            ],
        )
        .unwrap();
        assert_eq!(
            config.ignored_env,
            [
                "CORRAL_BIN",
                "CORRAL_CACHE__TYPO",
                "CORRAL_PORT",
                "CORRAL_PORT_8080_TCP_ADDR",
                "CORRAL_SERVICE_HOST",
                "CORRAL_SERVICE_PORT"
            ]
        );
        assert_eq!(config.cache.soft_ttl, Duration::from_secs(10));
        assert_eq!(config.upstreams[0].models, ["gpt-*"]);
        assert_eq!(config.pricing.models.0[0].0, "gpt-4o");
        assert_eq!(config.passthrough.allow, ["POST /v1/files"]);
        // A documented key with a bad value is still an error naming the variable.
        let err = Config::load(BASE, [("CORRAL_UPSTREAMS__3__NAME", "x")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("CORRAL_UPSTREAMS__3__NAME"), "{err}");
    }

    #[test]
    fn passthrough_rules_are_checked_at_load() {
        let err = Config::load(
            &format!("{BASE}passthrough:\n  deny: ['/v1/ok', 'GET files']\n"),
            [],
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("passthrough.deny[1]"), "{err}");
    }

    #[test]
    fn secrets_do_not_print() {
        let secret = Secret::new("sk-live-123".to_owned());
        assert!(!format!("{secret:?}").contains("sk-live"));
    }
}
