//! Pins: which member of a pool made a piece of provider state (a stored
//! response, a file, a batch, an upload, a vector store), so every later
//! request naming it goes to that member and no other. The members of a
//! pool are equivalent for a stateless call, but an account's state lives
//! in that account: another member would answer "not found", or worse, find
//! a different object under the same id.
//!
//! A pin is `id -> member`, scoped by tenant and pool: a tenant never
//! follows another tenant's pin, and a pool's ids never pin another pool's
//! call. Pins live in an in-process cache (bounded in entries, each kept
//! [`PIN_TTL`]) and, with Redis, in one key per pin ([`PinStore`],
//! `cluster/pins.rs`) so a pin made on one instance is honoured by every
//! other. Redis is an optimisation here as everywhere: down, the
//! in-process cache still answers for what this instance made.
//!
//! Ids are not secrets, but they name a tenant's objects: they reach Redis
//! and the cache only hashed with their pool ([`pin_hash`]). No credential
//! is ever part of a pin.

use std::{fmt, sync::Arc, time::Duration};

use async_trait::async_trait;
use moka::sync::Cache;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// How long a pin is kept. Providers keep stored responses 30 days; files
/// and vector stores may live longer, but a pin older than this falls back
/// to the routing (the provider's own "not found" tells the caller).
pub const PIN_TTL: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// Most pins this instance keeps in process (the oldest go first).
const MAX_LOCAL_PINS: u64 = 200_000;

/// Longest id pinned or looked up: provider ids are tens of bytes; a longer
/// one is no id anyone made.
const MAX_ID_BYTES: usize = 256;

/// Longest member name a pin store may answer with (a longer one is not a
/// member's: configured names are short).
pub const MAX_MEMBER_BYTES: usize = 256;

/// The pin store could not be used for this operation.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("pin store unavailable")]
pub struct PinsUnavailable;

/// Where pins are shared between instances (Redis: `cluster::RedisPins`).
#[async_trait]
pub trait PinStore: Send + Sync + fmt::Debug {
    /// Records that `member` made the state hashed as `hash`, for `ttl`.
    async fn record(
        &self,
        tenant: &str,
        hash: &str,
        member: &str,
        ttl: Duration,
    ) -> Result<(), PinsUnavailable>;

    /// The member that made the state hashed as `hash`, if one is known.
    async fn member(&self, tenant: &str, hash: &str) -> Result<Option<String>, PinsUnavailable>;
}

/// The hash a pin is kept under: its pool and the id, never the id alone
/// (and never in clear).
pub fn pin_hash(pool: &str, id: &str) -> String {
    let digest = Sha256::new()
        .chain_update(b"corral-pin-v1\0")
        .chain_update(pool.as_bytes())
        .chain_update(b"\0")
        .chain_update(id.as_bytes())
        .finalize();
    hex::encode(digest)
}

/// The pins of this instance, and the store it shares them through.
pub struct Pins {
    /// `(tenant, pin_hash) -> member`.
    local: Cache<(Arc<str>, String), Arc<str>>,
    shared: Option<Arc<dyn PinStore>>,
}

impl fmt::Debug for Pins {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pins")
            .field("local", &self.local.entry_count())
            .field("shared", &self.shared.is_some())
            .finish()
    }
}

impl Pins {
    pub fn new(shared: Option<Arc<dyn PinStore>>) -> Self {
        Self {
            local: Cache::builder()
                .max_capacity(MAX_LOCAL_PINS)
                .time_to_live(PIN_TTL)
                .build(),
            shared,
        }
    }

    /// Records that `member` of `pool` made `id` for `tenant`: here at once,
    /// then in the shared store (awaited, so a follow-up sent to another
    /// instance as soon as the caller has the id finds it; a store that is
    /// down leaves the pin local).
    pub async fn record(&self, tenant: &str, pool: &str, id: &str, member: &str) {
        if id.is_empty() || id.len() > MAX_ID_BYTES {
            return;
        }
        let hash = pin_hash(pool, id);
        self.local
            .insert((tenant.into(), hash.clone()), member.into());
        if let Some(shared) = &self.shared
            && shared.record(tenant, &hash, member, PIN_TTL).await.is_err()
        {
            tracing::debug!(pool, "a pin stays local: its store is unavailable");
        }
    }

    /// The member of `pool` that made `id` for `tenant`: this instance's
    /// pin, else the shared store's (kept here once read).
    pub async fn member(&self, tenant: &str, pool: &str, id: &str) -> Option<Arc<str>> {
        if id.is_empty() || id.len() > MAX_ID_BYTES {
            return None;
        }
        let key = (Arc::<str>::from(tenant), pin_hash(pool, id));
        if let Some(member) = self.local.get(&key) {
            return Some(member);
        }
        let shared = self.shared.as_ref()?;
        let member: Arc<str> = shared
            .member(tenant, &key.1)
            .await
            .ok()
            .flatten()
            .filter(|member| !member.is_empty() && member.len() <= MAX_MEMBER_BYTES)?
            .into();
        self.local.insert(key, member.clone());
        Some(member)
    }
}

/// The kinds of provider state a pass-through path names by id, below `/v1/`.
const STATEFUL_COLLECTIONS: &[&str] =
    &["responses", "files", "batches", "uploads", "vector_stores"];

/// The id a pass-through path names (`/v1/files/{id}`,
/// `/v1/responses/{id}/input_items`, ...), if it names one.
pub fn id_in_path(path: &str) -> Option<&str> {
    let mut segments = path.strip_prefix("/v1/")?.split('/');
    let collection = segments.next()?;
    let id = segments.next()?;
    (STATEFUL_COLLECTIONS.contains(&collection) && !id.is_empty()).then_some(id)
}

/// Whether a pass-through `POST` to `path` creates state whose answer's
/// `id` names it (`POST /v1/files`, `/v1/batches`, `/v1/uploads`,
/// `/v1/vector_stores`).
pub fn creates_state(path: &str) -> bool {
    path.strip_prefix("/v1/")
        .is_some_and(|collection| STATEFUL_COLLECTIONS.contains(&collection))
}

/// The file a JSON request body names at its top level (a batch's
/// `input_file_id`, a vector store file's `file_id`, the first of
/// `file_ids`), if any.
pub fn id_in_body(body: &Value) -> Option<&str> {
    ["input_file_id", "file_id", "previous_response_id"]
        .iter()
        .find_map(|field| body.get(field).and_then(Value::as_str))
        .or_else(|| {
            body.get("file_ids")
                .and_then(Value::as_array)
                .and_then(|ids| ids.first())
                .and_then(Value::as_str)
        })
}

/// Longest answer read for the `id` of the state it created: a file,
/// batch, upload or vector store object is a few hundred bytes.
pub const MAX_CREATED_ANSWER_BYTES: usize = 64 * 1024;

/// Reads the top-level `id` of a created object's JSON answer as it passes,
/// keeping at most [`MAX_CREATED_ANSWER_BYTES`]: a longer answer is not one
/// of those objects, and is relayed without a pin.
#[derive(Debug, Default)]
pub struct CreatedId {
    kept: Vec<u8>,
    too_long: bool,
}

impl CreatedId {
    pub fn feed(&mut self, chunk: &[u8]) {
        if self.too_long {
            return;
        }
        if self.kept.len() + chunk.len() > MAX_CREATED_ANSWER_BYTES {
            self.too_long = true;
            self.kept = Vec::new();
        } else {
            self.kept.extend_from_slice(chunk);
        }
    }

    /// The answer's `id`, once it is whole.
    pub fn id(&self) -> Option<String> {
        if self.too_long {
            return None;
        }
        let value: Value = serde_json::from_slice(&self.kept).ok()?;
        value.get("id")?.as_str().map(str::to_owned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_pin_is_found_by_its_tenant_and_pool_only() {
        let pins = Pins::new(None);
        pins.record("t1", "gpt", "resp_1", "a").await;
        assert_eq!(
            pins.member("t1", "gpt", "resp_1").await.as_deref(),
            Some("a")
        );
        assert_eq!(
            pins.member("t2", "gpt", "resp_1").await,
            None,
            "another tenant"
        );
        assert_eq!(
            pins.member("t1", "other", "resp_1").await,
            None,
            "another pool"
        );
        assert_eq!(pins.member("t1", "gpt", "resp_2").await, None);
        let long = "x".repeat(MAX_ID_BYTES + 1);
        pins.record("t1", "gpt", &long, "a").await;
        assert_eq!(pins.member("t1", "gpt", &long).await, None, "bounded");
    }

    #[test]
    fn paths_and_bodies_name_their_ids() {
        assert_eq!(id_in_path("/v1/responses/resp_1"), Some("resp_1"));
        assert_eq!(
            id_in_path("/v1/responses/resp_1/input_items"),
            Some("resp_1")
        );
        assert_eq!(id_in_path("/v1/files/file-1/content"), Some("file-1"));
        assert_eq!(id_in_path("/v1/vector_stores/vs_1/files"), Some("vs_1"));
        assert_eq!(id_in_path("/v1/files"), None);
        assert_eq!(id_in_path("/v1/models/gpt-4o"), None);
        assert!(creates_state("/v1/files") && creates_state("/v1/batches"));
        assert!(!creates_state("/v1/files/file-1") && !creates_state("/v1/images/generations"));
        let batch =
            serde_json::json!({"input_file_id": "file-9", "endpoint": "/v1/chat/completions"});
        assert_eq!(id_in_body(&batch), Some("file-9"));
        assert_eq!(
            id_in_body(&serde_json::json!({"file_ids": ["file-3"]})),
            Some("file-3")
        );
        assert_eq!(id_in_body(&serde_json::json!({"model": "m"})), None);
    }

    #[test]
    fn a_created_objects_id_is_read_whole_and_bounded() {
        let mut created = CreatedId::default();
        created.feed(br#"{"id":"file-"#);
        created.feed(br#"abc","object":"file"}"#);
        assert_eq!(created.id().as_deref(), Some("file-abc"));
        let mut huge = CreatedId::default();
        huge.feed(br#"{"id":"file-abc","pad":""#);
        huge.feed(&vec![b'x'; MAX_CREATED_ANSWER_BYTES]);
        huge.feed(br#""}"#);
        assert_eq!(huge.id(), None);
    }
}
