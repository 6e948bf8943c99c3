//! Cluster-wide coordination through Redis: the shared L2 cache, the owner
//! lock (`SET NX PX` + token, compare-and-delete, compare-and-extend), flight
//! records for followers on other instances, and completion announcements.
//!
//! Every operation runs under a short application deadline (`redis.op_timeout`)
//! and a breaker: when Redis is slow or gone, callers get `Unavailable` at
//! once and degrade to local singleflight + L1. Redis is an optimisation here,
//! never a dependency of an answer.

mod announce;
mod budget;
mod connection;
mod cooldown;
mod keys;
mod ledger;
mod lock;
mod mirror;
mod pins;
mod purge;
mod tiered;

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::{
    FutureExt as _,
    future::{BoxFuture, Shared},
};
use rand::Rng;
use redis::AsyncCommands;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use announce::{AnnounceCounts, Interest};
use announce::{Dispatch, Target, Wake, run_subscriber};
pub use budget::{RedisBudgets, budget_key_prefix};
use connection::LazyConn;
pub use cooldown::{RedisCooldowns, cooldown_key};
pub use keys::Keys;
pub use ledger::{RedisLedger, ledger_key};
pub use lock::{Lease, LockAttempt};
pub use pins::{RedisPins, pin_key};
pub use purge::{RedisPurges, purge_key};
pub use tiered::TieredStore;

use bytes::Bytes;

use crate::{
    breaker::{Breaker, BreakerState},
    cache::{
        Entry, StoredResponse,
        codec::{self, FlightRecord},
    },
    clock::SystemClock,
    config::RedisConfig,
    crypto::Sealer,
    fingerprint::{CacheKey, Fingerprint, IdempotencyKey},
    metrics::Metrics,
};

/// How long a successful flight's record stays readable for followers.
const SUCCESS_RECORD_TTL: Duration = Duration::from_secs(10);

/// Redis could not be used for this operation (down, slow, or breaker open).
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("redis unavailable")]
pub struct Unavailable;

/// A Redis read of an entry that several callers await.
type SharedRead = Shared<BoxFuture<'static, Result<Option<Arc<Entry>>, Unavailable>>>;

/// How a remote follow ended.
pub enum Follow {
    /// The owner's record.
    Done(FlightRecord),
    /// No owner and no record: contend for the lock again.
    Vacant,
    Unavailable,
    TimedOut,
}

/// One instance's Redis: a connection under a deadline and a breaker (fail
/// open), the key layout, the subscriber that wakes remote followers, and the
/// sealing of values. Its owner lock is `lock.rs`, its key layout `keys.rs`.
#[derive(Debug)]
pub struct Cluster {
    conn: LazyConn,
    config: RedisConfig,
    keys: Keys,
    breaker: Breaker,
    dispatch: Arc<Dispatch>,
    /// Unique per process, so lock tokens of two instances never collide.
    instance: String,
    errors: AtomicU64,
    /// `corral_redis_errors_total`, next to `errors`.
    metrics: Metrics,
    rejected_values: AtomicU64,
    /// Reads of entries in progress on this instance, by fingerprint.
    entry_reads: Mutex<HashMap<Fingerprint, SharedRead>>,
    /// Callers that joined another caller's read instead of sending their own.
    shared_reads: AtomicU64,
    /// Encrypts values at rest (`redis.encryption_key_env`), bound to their key.
    sealer: Option<Sealer>,
    /// Announcements published, and the subscribers Redis said they reached.
    published: AtomicU64,
    delivered: AtomicU64,
    /// Places for a relay's own connection (`redis.max_relay_connections`).
    relay_connections: Arc<tokio::sync::Semaphore>,
}

impl Cluster {
    /// Builds the client (no connection yet) and starts the announcement
    /// subscriber and the recovery prober, which run until `stop`.
    pub fn start(config: &RedisConfig, stop: CancellationToken, metrics: Metrics) -> Arc<Self> {
        let dispatch = Arc::new(Dispatch::default());
        let cluster = Arc::new(Self {
            conn: LazyConn::start(config.clone(), stop.clone()),
            config: config.clone(),
            keys: Keys::new(&config.key_prefix),
            // Tokio's monotonic clock: paused in tests, immune to wall-clock steps.
            breaker: Breaker::new(
                config.breaker_failures,
                config.breaker_cool_down,
                Arc::new(SystemClock),
            ),
            dispatch: dispatch.clone(),
            instance: format!("{:016x}", rand::rng().random::<u64>()),
            errors: AtomicU64::new(0),
            metrics,
            rejected_values: AtomicU64::new(0),
            entry_reads: Mutex::default(),
            shared_reads: AtomicU64::new(0),
            sealer: config
                .encryption_key
                .as_ref()
                .map(|key| Sealer::new(key.expose())),
            published: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            relay_connections: Arc::new(tokio::sync::Semaphore::new(config.max_relay_connections)),
        });
        let target = match config.is_cluster() {
            true => Target::Cluster(config.node_urls()),
            false => Target::Single(config.node_urls()[0].clone()),
        };
        tokio::spawn(run_subscriber(
            target,
            cluster.keys.clone(),
            dispatch,
            config.op_timeout,
            stop.clone(),
        ));
        tokio::spawn(probe_while_open(Arc::downgrade(&cluster), stop));
        cluster
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    pub fn breaker(&self) -> &Breaker {
        &self.breaker
    }

    pub fn subscribed(&self) -> tokio::sync::watch::Receiver<bool> {
        self.dispatch.subscribed()
    }

    /// The number of announcement channels this instance is subscribed to.
    pub fn announcement_channels(&self) -> tokio::sync::watch::Receiver<usize> {
        self.dispatch.channels()
    }

    /// The number of remote followers on this instance parked in their
    /// wait (past their reads) right now.
    pub fn followers_parked(&self) -> tokio::sync::watch::Receiver<usize> {
        self.dispatch.parked()
    }

    /// What this instance published, heard and woke up for since start.
    pub fn announce_counts(&self) -> AnnounceCounts {
        AnnounceCounts {
            published: self.published.load(Ordering::Relaxed),
            delivered: self.delivered.load(Ordering::Relaxed),
            ..self.dispatch.counts()
        }
    }

    /// Resolves once the first connection to Redis is up (and subscribed).
    pub async fn connected(&self) {
        let mut conn = self.conn.connected();
        let _ = conn.wait_for(Option::is_some).await;
        let mut subscribed = self.dispatch.subscribed();
        let _ = subscribed.wait_for(|s| *s).await;
    }

    fn count_error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        self.metrics.redis_error();
    }

    /// Redis operations that failed or timed out since start.
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// Values read from Redis that did not match their key (never served).
    pub fn rejected_values(&self) -> u64 {
        self.rejected_values.load(Ordering::Relaxed)
    }

    pub fn status(&self) -> &'static str {
        if self.conn.get().is_none() {
            return "connecting";
        }
        match self.breaker.state() {
            BreakerState::Closed => "up",
            BreakerState::Open | BreakerState::HalfOpen => "degraded",
        }
    }

    /// Runs one Redis operation under the breaker and the op deadline.
    async fn run<T, F, Fut>(&self, what: &'static str, op: F) -> Result<T, Unavailable>
    where
        F: FnOnce(connection::Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        // Not connected yet: no wait, no breaker failure; the connector keeps trying.
        let Some(conn) = self.conn.get() else {
            return Err(Unavailable);
        };
        // A dropped permit (this future was cancelled mid-operation) frees a
        // half-open probe's slot: the breaker cannot stick half-open.
        let Ok(permit) = self.breaker.admit() else {
            return Err(Unavailable);
        };
        let result = tokio::time::timeout(self.config.op_timeout, op(conn)).await;
        match result {
            Ok(Ok(value)) => {
                permit.success();
                Ok(value)
            }
            Ok(Err(err)) if !is_connectivity(&err) => {
                // Redis answered (OOM, a script error): it is up, this write is skipped.
                permit.success();
                self.count_error();
                tracing::warn!(op = what, error = %err, "redis refused an operation; continuing without it");
                Err(Unavailable)
            }
            failed => {
                self.count_error();
                let reason = match failed {
                    Ok(Err(err)) => err.to_string(),
                    _ => format!("no answer within {:?}", self.config.op_timeout),
                };
                if permit.failure() {
                    tracing::warn!(op = what, %reason, "redis breaker opened; serving from local singleflight and L1");
                } else {
                    tracing::debug!(op = what, %reason, "redis operation failed");
                }
                Err(Unavailable)
            }
        }
    }

    /// Encrypts a value for Redis key `name` (the associated data), when on.
    fn seal(&self, name: &str, plain: Vec<u8>) -> Vec<u8> {
        match &self.sealer {
            Some(sealer) => sealer.seal(name.as_bytes(), &plain),
            None => plain,
        }
    }

    /// Decrypts a value read from Redis key `name`; one that does not open
    /// (plaintext from before, a rotated key, moved or tampered) is a counted miss.
    fn open(&self, name: &str, bytes: Vec<u8>) -> Option<Vec<u8>> {
        let Some(sealer) = &self.sealer else {
            return Some(bytes);
        };
        match sealer.open(name.as_bytes(), &bytes) {
            Ok(plain) => Some(plain),
            Err(err) => {
                self.rejected_values.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %err, "rejected a Redis value that does not decrypt");
                None
            }
        }
    }

    /// Reads an entry. Callers of one key on this instance share one Redis
    /// read: in a stampede every caller misses L1 at once, and N reads of one
    /// key would queue on the connection (past `op_timeout`, opening the
    /// breaker) to fetch one value.
    pub async fn get_entry(
        self: &Arc<Self>,
        key: &CacheKey,
    ) -> Result<Option<Arc<Entry>>, Unavailable> {
        let read = {
            let mut reads = self
                .entry_reads
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(read) = reads.get(&key.fingerprint) {
                self.shared_reads.fetch_add(1, Ordering::Relaxed);
                read.clone()
            } else {
                let cluster = self.clone();
                let owned = key.clone();
                // Its own task, so the read ends (and leaves the map) even when
                // every caller awaiting it has gone; `op_timeout` bounds it.
                let task = tokio::spawn(async move {
                    let entry = cluster
                        .get_value("get entry", cluster.keys.entry(&owned), |bytes| {
                            codec::decode_entry(bytes, &owned)
                        })
                        .await
                        .map(|entry| entry.map(Arc::new));
                    cluster
                        .entry_reads
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remove(&owned.fingerprint);
                    entry
                });
                let read = async move { task.await.unwrap_or(Err(Unavailable)) }
                    .boxed()
                    .shared();
                reads.insert(key.fingerprint, read.clone());
                read
            }
        };
        read.await
    }

    /// Callers whose entry read was answered by another caller's read in progress.
    pub fn shared_reads(&self) -> u64 {
        self.shared_reads.load(Ordering::Relaxed)
    }

    /// Stores an entry; its Redis expiry is its hard TTL, measured from now.
    pub async fn put_entry(
        &self,
        key: &CacheKey,
        entry: &Entry,
        now_ms: u64,
    ) -> Result<(), Unavailable> {
        let ttl_ms = entry.hard_expires_at_ms.saturating_sub(now_ms).max(1);
        let value = codec::encode_entry(key, entry);
        self.put_value("put entry", self.keys.entry(key), value, ttl_ms)
            .await
    }

    pub async fn get_record(&self, key: &CacheKey) -> Result<Option<FlightRecord>, Unavailable> {
        self.get_value("get record", self.keys.record(key), |bytes| {
            codec::decode_record(bytes, key)
        })
        .await
    }

    /// Records how a flight ended: errors for `error_ttl` (negative caching),
    /// successes briefly, for followers.
    pub async fn put_record(
        &self,
        key: &CacheKey,
        record: &FlightRecord,
        error_ttl: Duration,
    ) -> Result<(), Unavailable> {
        let ttl = if record.failed && !error_ttl.is_zero() {
            error_ttl
        } else {
            SUCCESS_RECORD_TTL
        };
        let value = codec::encode_record(key, record);
        self.put_value(
            "put record",
            self.keys.record(key),
            value,
            ttl.as_millis() as u64,
        )
        .await
    }

    /// A retained answer: the response, a streamed flight's events, when stored.
    pub async fn get_retained(
        &self,
        key: &CacheKey,
    ) -> Result<Option<(Arc<StoredResponse>, Vec<Bytes>, u64)>, Unavailable> {
        self.get_value("get retained", self.keys.retained(key), |bytes| {
            codec::decode_retained(bytes, key)
        })
        .await
    }

    pub async fn put_retained(
        &self,
        key: &CacheKey,
        response: &StoredResponse,
        events: &[Bytes],
        stored_at_ms: u64,
        ttl: Duration,
    ) -> Result<(), Unavailable> {
        let value = codec::encode_retained(key, response, events, stored_at_ms);
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        self.put_value("put retained", self.keys.retained(key), value, ttl_ms)
            .await
    }

    /// Binds `key` to `fingerprint` for `ttl` unless it is bound already:
    /// `None` when this call bound it, else the fingerprint it was bound to.
    /// One script (GET, else SET PX), so two instances never both bind.
    pub async fn bind_idempotency_key(
        &self,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        ttl: Duration,
    ) -> Result<Option<Fingerprint>, Unavailable> {
        let name = self.keys.idempotency(key);
        let value = self.seal(&name, fingerprint.hex().into_bytes());
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let query = name.clone();
        let bound: Option<Vec<u8>> = self
            .run("bind idempotency key", |mut conn| async move {
                lock::TRY_LOCK_SCRIPT
                    .key(query)
                    .arg(value)
                    .arg(ttl_ms)
                    .invoke_async(&mut conn)
                    .await
            })
            .await?;
        let Some(bound) = bound else {
            return Ok(None);
        };
        let found = self
            .open(&name, bound)
            .and_then(|plain| Fingerprint::from_hex(std::str::from_utf8(&plain).ok()?));
        if found.is_none() {
            // Not ours to judge by: the request goes on as a first attempt.
            self.rejected_values.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("rejected an idempotency binding that does not decode");
        }
        Ok(found)
    }

    /// Unbinds `key` if it is bound to `fingerprint`: the request it was
    /// bound to failed, so the client may send a corrected one under it. (A
    /// sealed value differs per write, so this reads, opens and compares
    /// before it deletes; a binding to another request is left alone.)
    pub async fn release_idempotency_key(
        &self,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
    ) -> Result<(), Unavailable> {
        let name = self.keys.idempotency(key);
        let bound = self
            .get_value("get idempotency key", name.clone(), |plain| {
                std::str::from_utf8(plain)
                    .ok()
                    .and_then(Fingerprint::from_hex)
                    .ok_or(codec::DecodeError::Header("not a fingerprint".into()))
            })
            .await?;
        if bound == Some(*fingerprint) {
            self.run("release idempotency key", |mut conn| async move {
                redis::cmd("DEL")
                    .arg(name)
                    .query_async::<()>(&mut conn)
                    .await
            })
            .await?;
        }
        Ok(())
    }

    /// Reads key `name`, decrypts and decodes it. A value that does not
    /// decrypt or does not belong to its key is a counted miss, never served.
    async fn get_value<T>(
        &self,
        what: &'static str,
        name: String,
        decode: impl FnOnce(&[u8]) -> Result<T, codec::DecodeError>,
    ) -> Result<Option<T>, Unavailable> {
        let query = name.clone();
        let bytes: Option<Vec<u8>> = self
            .run(what, |mut conn| async move { conn.get(query).await })
            .await?;
        let Some(plain) = bytes.and_then(|bytes| self.open(&name, bytes)) else {
            return Ok(None);
        };
        match decode(&plain) {
            Ok(value) => Ok(Some(value)),
            Err(err) => {
                self.rejected_values.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(op = what, error = %err, "rejected a Redis value that does not match its key");
                Ok(None)
            }
        }
    }

    /// Encrypts (when on) and writes `value` under `name` with a TTL.
    async fn put_value(
        &self,
        what: &'static str,
        name: String,
        value: Vec<u8>,
        ttl_ms: u64,
    ) -> Result<(), Unavailable> {
        let bytes = self.seal(&name, value);
        self.run(what, |mut conn| async move {
            conn.pset_ex::<_, _, ()>(name, bytes, ttl_ms).await
        })
        .await
    }

    /// Announces that `key`'s flight is done, on the fingerprint's own
    /// channel: only instances whose followers wait on it hear it. Sharded
    /// (`SPUBLISH`) in Redis Cluster, so the message stays on one shard.
    pub async fn announce(&self, key: &CacheKey) -> Result<(), Unavailable> {
        let channel = self.keys.done_channel(&key.fingerprint);
        let publish = match self.config.is_cluster() {
            true => "SPUBLISH",
            false => "PUBLISH",
        };
        // The channel names the flight; the message needs no body.
        let receivers: u64 = self
            .run("announce", |mut conn| async move {
                redis::cmd(publish)
                    .arg(channel)
                    .arg("")
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        self.published.fetch_add(1, Ordering::Relaxed);
        self.delivered.fetch_add(receivers, Ordering::Relaxed);
        Ok(())
    }

    /// Waits as a remote follower for the flight of the owner holding
    /// `token`: announcements, with a backstop poll every `redis.poll_interval`
    /// (jittered); while the subscription is not confirmed, the poll starts at
    /// 20 ms and backs off up to that interval.
    pub async fn follow(&self, key: &CacheKey, mut token: String, deadline: Instant) -> Follow {
        // Subscribed (confirmed by Redis) before the first read, so an
        // announcement in between is kept; bounded, and skipped while the
        // subscriber is down.
        let mut interest = self.dispatch.register(key.fingerprint);
        let bound = self
            .config
            .op_timeout
            .min(deadline.saturating_duration_since(Instant::now()));
        let mut delay = match interest.live(bound).await {
            true => self.config.poll_interval,
            false => Duration::from_millis(20).min(self.config.poll_interval),
        };
        loop {
            match self.get_record(key).await {
                Ok(Some(record)) if record.token == token => return Follow::Done(record),
                Ok(_) => {}
                Err(Unavailable) => return Follow::Unavailable,
            }
            match self.lock_holder(key).await {
                Ok(Some(holder)) => token = holder,
                Ok(None) => {
                    // The owner may have recorded and released between our reads.
                    return match self.get_record(key).await {
                        Ok(Some(record)) if record.token == token => Follow::Done(record),
                        Ok(_) => Follow::Vacant,
                        Err(Unavailable) => Follow::Unavailable,
                    };
                }
                Err(Unavailable) => return Follow::Unavailable,
            }
            if Instant::now() >= deadline {
                return Follow::TimedOut;
            }
            let jittered = delay.mul_f64(rand::rng().random_range(0.5..=1.0));
            let _parked = self.dispatch.park();
            tokio::select! {
                _ = interest.notified() => self.dispatch.count_wake(Wake::Announcement),
                _ = tokio::time::sleep(jittered) => self.dispatch.count_wake(Wake::Poll),
                _ = tokio::time::sleep_until(deadline) => {}
            }
            delay = (delay * 2).min(self.config.poll_interval);
        }
    }

    /// PING, to see whether Redis is back.
    async fn ping(&self) -> Result<(), Unavailable> {
        self.run("ping", |mut conn| async move {
            redis::cmd("PING").query_async::<()>(&mut conn).await
        })
        .await
    }
}

/// While the breaker is open, probes Redis after each cool-down so the
/// cluster mode returns by itself when Redis recovers, traffic or not.
async fn probe_while_open(cluster: std::sync::Weak<Cluster>, stop: CancellationToken) {
    let Some(strong) = cluster.upgrade() else {
        return;
    };
    let mut state = strong.breaker.watch();
    let cool_down = strong.config.breaker_cool_down;
    drop(strong);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            changed = state.wait_for(|s| *s != BreakerState::Closed) => if changed.is_err() { return },
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(cool_down) => {}
        }
        let Some(cluster) = cluster.upgrade() else {
            return;
        };
        let _ = cluster.ping().await;
    }
}

fn is_connectivity(err: &redis::RedisError) -> bool {
    err.is_io_error()
        || err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_unrecoverable_error()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenant::TenantScope;

    #[test]
    fn keys_carry_the_tenant_and_one_hash_tag() {
        let scope = TenantScope::of_credential(None, Some(b"sk-secret"));
        let key = CacheKey::for_tests(scope.clone(), b"{}");
        let fingerprint = key.fingerprint;
        let keys = Keys::new("corral");
        let entry = keys.entry(&key);
        assert!(entry.starts_with(&format!("corral:v1:{}:resp:{{", scope.as_str())));
        assert!(entry.ends_with(&format!("{{{}}}", fingerprint.hex())));
        assert!(!entry.contains("sk-secret"));
        for name in [
            keys.entry(&key),
            keys.lock(&key),
            keys.record(&key),
            keys.done_channel(&fingerprint),
        ] {
            let tag = &name[name.find('{').unwrap()..=name.find('}').unwrap()];
            assert_eq!(tag, format!("{{{}}}", fingerprint.hex()));
        }
    }

    #[test]
    fn a_done_channel_names_its_fingerprint_and_nothing_else_does() {
        let key = CacheKey::for_tests(TenantScope::of_credential(None, Some(b"k")), b"{}");
        let keys = Keys::new("corral");
        let channel = keys.done_channel(&key.fingerprint);
        assert_eq!(
            keys.fingerprint_of_channel(channel.as_bytes()),
            Some(key.fingerprint)
        );
        for other in [
            "corral:v1:done".to_owned(),
            keys.entry(&key),
            channel.replace("corral", "other"),
            channel.trim_end_matches('}').to_owned(),
            format!("{channel}x"),
        ] {
            assert_eq!(
                keys.fingerprint_of_channel(other.as_bytes()),
                None,
                "{other}"
            );
        }
    }
}
