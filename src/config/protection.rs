//! `limits`, `auth`, `server` and `shutdown`: what protects the gateway and its callers.

use std::{collections::BTreeMap, time::Duration};

use serde::{Deserialize, Serialize};

use super::Secret;

#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RateConfig {
    pub rps: u32,
    pub burst: u32,
}

/// What one caller key may take of an instance: a request rate (`rps` with
/// `burst`, a token bucket) and requests at once (`max_concurrent`, each held
/// until its response body ends, so a long stream keeps its place). Either
/// half works alone.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
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
#[derive(Debug, Clone, Default, Deserialize, Serialize, schemars::JsonSchema)]
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
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// A request's head must arrive within this (idle keep-alive included).
    #[schemars(with = "String")]
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// A request's body must arrive within this (408 after).
    #[schemars(with = "String")]
    #[serde(with = "humantime_serde")]
    pub body_read_timeout: Duration,
    /// A client that accepts no byte of its response for this long is
    /// disconnected and what its response held is freed (a stalled reader).
    #[schemars(with = "String")]
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

#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ShutdownConfig {
    /// On SIGTERM/SIGINT, how long running requests and flights may finish
    /// before their upstream calls are cut.
    #[schemars(with = "String")]
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// On SIGTERM/SIGINT, how long corral goes on accepting and serving new
    /// requests while `/readyz` already answers 503, so a load balancer that
    /// polls it stops sending before the port closes. Then the drain begins.
    /// 0 behind Kubernetes with a `preStop` sleep (which does the same).
    #[schemars(with = "String")]
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
