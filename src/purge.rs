//! Purges: making cached answers unreachable at once, cluster-wide, in O(1).
//!
//! Nothing is scanned or deleted. Every purge draws a fresh random
//! **generation** for its scope (everything, one model, one tenant, one
//! fingerprint), and the key an answer is stored and read under
//! ([`Purges::key`]) is the request's fingerprint with the generations that
//! apply to it ([`Fingerprint::with_generations`]). After a purge, requests it
//! covers compute another key: they miss the old entry in L1 and Redis, do not
//! join a flight that started before the purge (that flight stores its answer
//! under the old key, which nobody reads any more), and find nothing in the
//! retry window either, which is keyed the same way. Old entries age out by
//! their TTL (Redis) or the L1 bounds.
//!
//! With no purge on record the key is the fingerprint itself, so the
//! `x-corral-fingerprint` a response carries names the request whatever the
//! generations: a purge by fingerprint gives that fingerprint a generation
//! of its own. An embeddings response's fingerprint names its batch: a purge
//! by it re-keys the inputs of that same batch (the inputs are cached one by
//! one and other batches that share an input keep reading it; purge by model).
//!
//! With Redis the generations live in one small hash (`cluster/purge.rs`),
//! written by one script per purge; every instance polls its version every
//! [`POLL_INTERVAL`] and reloads the hash when it changed, so a purge takes
//! effect on every instance within that interval (and on the instance that
//! made it before it answers). A purge Redis cannot record is refused, not
//! applied on one instance only. Without Redis a purge holds on its instance.

use std::{
    collections::HashMap,
    fmt,
    sync::{
        Arc, PoisonError, RwLock,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::{
    clock::Clock,
    config::Config,
    fingerprint::{CacheKey, Fingerprint},
};

/// How often every instance reads the purge table's version: a purge made on
/// another instance takes effect here within this (plus one Redis round trip).
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// What a purge covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PurgeScope {
    /// Every entry.
    All,
    /// Entries of requests whose `model` field is exactly this.
    Model(String),
    /// Entries of one tenant, named as `/stats` names it: its gateway key's
    /// label, else the short form of its scope (13 characters).
    Tenant(String),
    /// The entry of requests with this fingerprint (`x-corral-fingerprint`).
    Fingerprint(Fingerprint),
}

impl PurgeScope {
    /// Its field in the generation table (and the Redis hash).
    pub fn field(&self) -> String {
        match self {
            Self::All => "all".to_owned(),
            Self::Model(model) => format!("model|{model}"),
            Self::Tenant(tenant) => format!("tenant|{tenant}"),
            Self::Fingerprint(fingerprint) => format!("fp|{}", fingerprint.hex()),
        }
    }

    fn from_field(field: &str) -> Option<Self> {
        if field == "all" {
            return Some(Self::All);
        }
        let (kind, name) = field.split_once('|')?;
        match kind {
            "model" => Some(Self::Model(name.to_owned())),
            "tenant" => Some(Self::Tenant(name.to_owned())),
            "fp" => Fingerprint::from_hex(name).map(Self::Fingerprint),
            _ => None,
        }
    }
}

/// The current generation of every purged scope (absent: never purged, 0).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Generations {
    all: u64,
    models: HashMap<Box<str>, u64>,
    tenants: HashMap<Box<str>, u64>,
    fingerprints: HashMap<Fingerprint, u64>,
}

impl Generations {
    fn is_empty(&self) -> bool {
        self.all == 0
            && self.models.is_empty()
            && self.tenants.is_empty()
            && self.fingerprints.is_empty()
    }

    fn set(&mut self, scope: &PurgeScope, generation: u64) {
        match scope {
            PurgeScope::All => self.all = generation,
            PurgeScope::Model(model) => {
                self.models.insert(model.as_str().into(), generation);
            }
            PurgeScope::Tenant(tenant) => {
                self.tenants.insert(tenant.as_str().into(), generation);
            }
            PurgeScope::Fingerprint(fingerprint) => {
                self.fingerprints.insert(*fingerprint, generation);
            }
        }
    }

    /// The table as stored: `(field, generation)` pairs; fields it does not
    /// know (the version, a later format) are skipped.
    pub fn from_fields<'a>(fields: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let mut generations = Self::default();
        for (field, value) in fields {
            if let (Some(scope), Ok(generation)) =
                (PurgeScope::from_field(field), value.parse::<u64>())
            {
                generations.set(&scope, generation);
            }
        }
        generations
    }

    fn lookup(&self, fingerprint: &Fingerprint, model: &str, tenant: Option<&str>) -> [u64; 4] {
        [
            self.all,
            self.models.get(model).copied().unwrap_or(0),
            tenant
                .and_then(|tenant| self.tenants.get(tenant).copied())
                .unwrap_or(0),
            self.fingerprints.get(fingerprint).copied().unwrap_or(0),
        ]
    }
}

/// Redis could not record the purge (down, slow, or its breaker open).
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the purge could not be recorded for the cluster")]
pub struct PurgeUnavailable;

/// Where the generation table is shared (`cluster/purge.rs` on Redis).
#[async_trait]
pub trait PurgeStore: Send + Sync + fmt::Debug {
    /// Records `generation` as `scope`'s and makes it the table's version;
    /// the table is kept for `retention` after this purge.
    async fn record(
        &self,
        scope: &PurgeScope,
        generation: u64,
        now_ms: u64,
        retention: Duration,
    ) -> Result<(), PurgeUnavailable>;

    /// The table's version (changes with every purge); `None` without a table.
    async fn version(&self) -> Result<Option<String>, PurgeUnavailable>;

    /// Every field of the table, the version included.
    async fn load(&self) -> Result<Vec<(String, String)>, PurgeUnavailable>;
}

/// How far a purge reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// Recorded in Redis: every instance applies it within [`POLL_INTERVAL`].
    Cluster,
    /// No Redis is configured: this instance is the cache.
    Instance,
}

impl Reach {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cluster => "cluster",
            Self::Instance => "instance",
        }
    }
}

#[derive(Debug)]
pub struct Purges {
    current: RwLock<Arc<Generations>>,
    /// False until the first purge: the hot path then skips the table.
    any: AtomicBool,
    store: Option<Arc<dyn PurgeStore>>,
    /// Held while the table is replaced from the store or a purge is
    /// recorded, so a reload that read the table before a purge cannot
    /// overwrite that purge here after it was applied.
    refresh: tokio::sync::Mutex<Option<String>>,
    /// `cache.scope: tenant`: tenant generations apply. Under `global` an
    /// entry belongs to no tenant, and a purge by tenant is refused.
    per_tenant: bool,
    retention: Duration,
    clock: Arc<dyn Clock>,
}

impl Purges {
    pub fn new(config: &Config, store: Option<Arc<dyn PurgeStore>>, clock: Arc<dyn Clock>) -> Self {
        Self {
            current: RwLock::default(),
            any: AtomicBool::new(false),
            store,
            refresh: tokio::sync::Mutex::new(None),
            per_tenant: config.cache.scope == crate::config::CacheScope::Tenant,
            retention: retention(config),
            clock,
        }
    }

    /// Whether entries belong to tenants (`cache.scope: tenant`).
    pub fn per_tenant(&self) -> bool {
        self.per_tenant
    }

    /// The key `key`'s answer is stored and read under now: `key` itself
    /// until a purge covers it, then its fingerprint with the generations
    /// that apply. `named` is the fingerprint the response carries (the
    /// request's; for an embeddings input, its batch's), `model` the request's
    /// `model`, `tenant` the caller's name on `/stats`.
    pub fn key(&self, key: CacheKey, named: &Fingerprint, model: &str, tenant: &str) -> CacheKey {
        if !self.any.load(Ordering::Acquire) {
            return key;
        }
        let tenant = self.per_tenant.then_some(tenant);
        let generations = {
            let current = self.current.read().unwrap_or_else(PoisonError::into_inner);
            current.lookup(named, model, tenant)
        };
        if generations == [0; 4] {
            return key;
        }
        CacheKey {
            fingerprint: key.fingerprint.with_generations(generations),
            scope: key.scope,
        }
    }

    /// Purges `scope`: recorded in Redis first (when configured), then
    /// applied here, so when this returns, this instance no longer serves
    /// what the purge covers and the others stop within [`POLL_INTERVAL`].
    pub async fn purge(&self, scope: &PurgeScope) -> Result<Reach, PurgeUnavailable> {
        let generation = loop {
            let generation = rand::random::<u64>();
            if generation != 0 {
                break generation;
            }
        };
        let _refresh = self.refresh.lock().await;
        let reach = match &self.store {
            Some(store) => {
                store
                    .record(scope, generation, self.clock.now_ms(), self.retention)
                    .await?;
                Reach::Cluster
            }
            None => Reach::Instance,
        };
        let mut next = (**self.current.read().unwrap_or_else(PoisonError::into_inner)).clone();
        next.set(scope, generation);
        self.replace(next);
        Ok(reach)
    }

    fn replace(&self, generations: Generations) {
        let any = !generations.is_empty();
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(generations);
        self.any.store(any, Ordering::Release);
    }

    /// Reads the table's version and reloads the table when it changed. A
    /// table that is gone (its retention passed, Redis lost it) empties this
    /// one: every entry stored under a generation then ages out with it.
    pub async fn refresh(&self) -> Result<(), PurgeUnavailable> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        let mut seen = self.refresh.lock().await;
        let version = store.version().await?;
        if version.is_some() && version == *seen {
            return Ok(());
        }
        let (generations, version) = match version {
            None => (Generations::default(), None),
            Some(_) => {
                let fields = store.load().await?;
                let version = fields
                    .iter()
                    .find(|(field, _)| field == VERSION_FIELD)
                    .map(|(_, value)| value.clone());
                let generations =
                    Generations::from_fields(fields.iter().map(|(f, v)| (f.as_str(), v.as_str())));
                (generations, version)
            }
        };
        self.replace(generations);
        *seen = version;
        Ok(())
    }

    /// Refreshes every [`POLL_INTERVAL`] until `stop`; Redis unavailable
    /// keeps the table this instance knows.
    pub async fn run_poller(self: Arc<Self>, stop: CancellationToken) {
        if self.store.is_none() {
            return;
        }
        let mut ticks = tokio::time::interval(POLL_INTERVAL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = ticks.tick() => {}
            }
            let _ = self.refresh().await;
        }
    }
}

/// The table field holding its version (the generation of its last purge).
pub const VERSION_FIELD: &str = "v";

/// How long the generation table outlives its last purge: every entry stored
/// under a generation must have expired before the generation is forgotten
/// (after which keys revert to the plain fingerprints, whose entries are
/// older still). Twice the longest a stored answer lives, plus an hour.
fn retention(config: &Config) -> Duration {
    let longest = config
        .cache
        .hard_ttl
        .mul_f64(1.0 + config.cache.ttl_jitter.max(0.0))
        .max(config.retry.dedup_window);
    longest * 2 + Duration::from_secs(3600)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{clock::ManualClock, tenant::TenantScope};

    fn fingerprint(n: u8) -> Fingerprint {
        Fingerprint::from_hex(&hex::encode([n; 32])).unwrap()
    }

    fn key(n: u8) -> CacheKey {
        CacheKey {
            scope: TenantScope::from_stored("t0123"),
            fingerprint: fingerprint(n),
        }
    }

    fn purges() -> Purges {
        Purges::new(
            &Config::for_tests("http://127.0.0.1:1/v1"),
            None,
            Arc::new(ManualClock::new(0)),
        )
    }

    fn stored(purges: &Purges, n: u8, model: &str, tenant: &str) -> Fingerprint {
        purges
            .key(key(n), &fingerprint(n), model, tenant)
            .fingerprint
    }

    #[tokio::test]
    async fn each_purge_re_keys_exactly_what_it_covers() {
        let purges = purges();
        assert_eq!(
            stored(&purges, 1, "m", "a"),
            fingerprint(1),
            "no purge: the fingerprint"
        );
        let before = [
            stored(&purges, 1, "m", "a"),
            stored(&purges, 2, "m", "b"),
            stored(&purges, 3, "n", "a"),
        ];

        purges.purge(&PurgeScope::Model("m".into())).await.unwrap();
        let after_model = [
            stored(&purges, 1, "m", "a"),
            stored(&purges, 2, "m", "b"),
            stored(&purges, 3, "n", "a"),
        ];
        assert_ne!(after_model[0], before[0]);
        assert_ne!(after_model[1], before[1]);
        assert_eq!(after_model[2], before[2], "another model keeps its key");

        purges.purge(&PurgeScope::Tenant("a".into())).await.unwrap();
        assert_ne!(stored(&purges, 1, "m", "a"), after_model[0]);
        assert_eq!(
            stored(&purges, 2, "m", "b"),
            after_model[1],
            "another tenant keeps it"
        );
        assert_ne!(stored(&purges, 3, "n", "a"), after_model[2]);

        let two = stored(&purges, 2, "m", "b");
        let three = stored(&purges, 3, "n", "a");
        purges
            .purge(&PurgeScope::Fingerprint(fingerprint(2)))
            .await
            .unwrap();
        assert_ne!(stored(&purges, 2, "m", "b"), two);
        assert_eq!(
            stored(&purges, 3, "n", "a"),
            three,
            "another fingerprint keeps it"
        );

        let keys: Vec<_> = (1..=3).map(|n| stored(&purges, n, "n", "c")).collect();
        purges.purge(&PurgeScope::All).await.unwrap();
        for (n, old) in (1..=3).zip(keys) {
            assert_ne!(stored(&purges, n, "n", "c"), old);
        }
    }

    #[tokio::test]
    async fn tenant_generations_do_not_apply_to_a_global_cache() {
        let mut config = Config::for_tests("http://127.0.0.1:1/v1");
        config.cache.scope = crate::config::CacheScope::Global;
        let purges = Purges::new(&config, None, Arc::new(ManualClock::new(0)));
        assert!(!purges.per_tenant());
        purges
            .purge(&PurgeScope::Model("other".into()))
            .await
            .unwrap();
        let before = stored(&purges, 1, "m", "a");
        purges.purge(&PurgeScope::Tenant("a".into())).await.unwrap();
        assert_eq!(stored(&purges, 1, "m", "a"), before);
    }

    #[test]
    fn batch_inputs_named_by_their_batch_never_take_a_plain_fingerprint_key() {
        let mut generations = Generations::default();
        generations.set(&PurgeScope::Fingerprint(fingerprint(9)), 7);
        let purges = purges();
        purges.replace(generations);
        let item = purges.key(key(1), &fingerprint(9), "m", "a");
        assert_ne!(item.fingerprint, fingerprint(1));
        assert_ne!(
            item.fingerprint,
            purges.key(key(9), &fingerprint(9), "m", "a").fingerprint,
            "the input's key is not its batch's"
        );
    }

    #[test]
    fn the_table_reads_back_what_it_stored_and_skips_what_it_does_not_know() {
        let scopes = [
            PurgeScope::All,
            PurgeScope::Model("org/model|x".into()),
            PurgeScope::Tenant("team-a".into()),
            PurgeScope::Fingerprint(fingerprint(3)),
        ];
        let fields: Vec<(String, String)> = scopes
            .iter()
            .enumerate()
            .map(|(i, scope)| (scope.field(), (i + 1).to_string()))
            .chain([
                (VERSION_FIELD.to_owned(), "42".to_owned()),
                ("fp|nothex".to_owned(), "5".to_owned()),
                ("model|m".to_owned(), "not a number".to_owned()),
            ])
            .collect();
        let read = Generations::from_fields(fields.iter().map(|(f, v)| (f.as_str(), v.as_str())));
        let mut expected = Generations::default();
        for (i, scope) in scopes.iter().enumerate() {
            expected.set(scope, i as u64 + 1);
        }
        assert_eq!(read, expected);
    }
}
