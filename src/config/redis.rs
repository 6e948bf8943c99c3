//! `redis`: the shared L2 cache, cluster-wide owner lock and completion announcements.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Secret;

/// The shared L2 cache, cluster-wide owner lock and completion announcements.
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
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
    #[schemars(with = "String")]
    #[serde(with = "humantime_serde")]
    pub op_timeout: Duration,
    /// Lease of the cluster owner lock; the owner extends it every third of it
    /// while the upstream call runs, so a slow provider never lets a second owner in.
    #[schemars(with = "String")]
    #[serde(with = "humantime_serde")]
    pub lock_ttl: Duration,
    /// Upper bound of a remote follower's backstop poll (announcements can be lost).
    #[schemars(with = "String")]
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
    /// Lifetime of the in-process L1 copy of a Redis entry.
    #[schemars(with = "String")]
    #[serde(with = "humantime_serde")]
    pub l1_ttl: Duration,
    /// Consecutive Redis failures that open the breaker (Redis skipped entirely).
    pub breaker_failures: u32,
    /// How long the breaker stays open before one probe is let through.
    #[schemars(with = "String")]
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
