//! The Redis key layout of flights, entries and their companions.

use crate::fingerprint::{CacheKey, Fingerprint, IdempotencyKey};

/// The Redis key layout; every key of one fingerprint carries the hash tag
/// `{fp}`, so its entry, lock and record live in one cluster slot.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
        }
    }

    fn key(&self, key: &CacheKey, kind: &str) -> String {
        format!(
            "{}:v1:{}:{kind}:{{{}}}",
            self.prefix,
            key.scope.as_str(),
            key.fingerprint.hex()
        )
    }

    pub fn entry(&self, key: &CacheKey) -> String {
        self.key(key, "resp")
    }

    pub fn lock(&self, key: &CacheKey) -> String {
        self.key(key, "lock")
    }

    pub fn record(&self, key: &CacheKey) -> String {
        self.key(key, "flight")
    }

    /// A completed answer kept for the client's retries (`retry_window.rs`).
    pub fn retained(&self, key: &CacheKey) -> String {
        self.key(key, "retry")
    }

    /// The fingerprint an idempotency key is bound to; the key's hash is its hash tag.
    pub fn idempotency(&self, key: &IdempotencyKey) -> String {
        format!(
            "{}:v1:{}:idem:{{{}}}",
            self.prefix,
            key.tenant.as_str(),
            key.hex()
        )
    }

    /// The owner's live event log, mirrored for followers on other instances.
    pub fn events(&self, key: &CacheKey, token: &str) -> String {
        format!("{}:{token}", self.key(key, "events"))
    }

    /// The heartbeat of an owner's mirrored stream's readers on other
    /// instances, kept while any of them still reads it.
    pub fn readers(&self, key: &CacheKey, token: &str) -> String {
        format!("{}:{token}", self.key(key, "readers"))
    }

    /// The channel announcing that `fingerprint`'s flight is done. Its hash
    /// tag is the fingerprint's, so in Redis Cluster the sharded channel lives
    /// on the node that holds the flight's lock and record.
    pub fn done_channel(&self, fingerprint: &Fingerprint) -> String {
        format!("{}:v1:done:{{{}}}", self.prefix, fingerprint.hex())
    }

    /// The fingerprint a [`done_channel`](Self::done_channel) announces.
    pub fn fingerprint_of_channel(&self, channel: &[u8]) -> Option<Fingerprint> {
        let rest = channel.strip_prefix(self.prefix.as_bytes())?;
        let hex = rest.strip_prefix(b":v1:done:{")?.strip_suffix(b"}")?;
        Fingerprint::from_hex(std::str::from_utf8(hex).ok()?)
    }
}
