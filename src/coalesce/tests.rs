//! A caller's own request controls hold for it, whoever owns the flight: an
//! entry the owner's double-check found answers a follower only when the
//! follower's own `Cache-Control` allows it, and then with its age.

use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use axum::http::StatusCode;
use bytes::Bytes;
use tokio::sync::watch;

use super::*;
use crate::{
    cache::{CacheUsage, MemoryStore},
    clock::ManualClock,
    sse::LogLimits,
    tenant::TenantScope,
};

/// A store whose reads wait until the gate opens: callers gather on a flight
/// before its owner's double-check reads.
#[derive(Debug)]
struct GatedStore {
    inner: MemoryStore,
    open: watch::Sender<bool>,
}

#[async_trait]
impl CacheStore for GatedStore {
    async fn get(&self, key: &CacheKey) -> Option<Arc<Entry>> {
        let mut open = self.open.subscribe();
        let _ = open.wait_for(|open| *open).await;
        self.inner.get(key).await
    }

    async fn put(&self, key: &CacheKey, entry: Arc<Entry>) {
        self.inner.put(key, entry).await;
    }

    async fn usage(&self) -> Option<CacheUsage> {
        self.inner.usage().await
    }
}

const NOW_MS: u64 = 1_700_000_000_000;

fn coalescer(store: Arc<GatedStore>) -> Coalescer {
    let context = FlightContext {
        cache: store,
        clock: Arc::new(ManualClock::new(NOW_MS)),
        ttl: TtlPolicy {
            soft_ttl: Duration::from_secs(300),
            hard_ttl: Duration::from_secs(3600),
            jitter: 0.0,
        },
        cluster: None,
        error_ttl: Duration::from_secs(5),
        early_refresh_beta: 0.0,
        wait_timeout: Duration::from_secs(30),
        on_wait_timeout: OnWaitTimeout::Error,
        stream_limits: LogLimits {
            max_bytes: 1 << 20,
            max_reader_lag: 1 << 20,
            tally: None,
        },
        stream_silence: Duration::from_secs(30).into(),
        max_entry_bytes: 1 << 20,
        retry_window: None,
        failures: FailureMemory::new(Duration::from_secs(5)),
    };
    Coalescer::new(context, CoalesceConfig::default(), TaskTracker::new())
}

fn answer(text: &'static str) -> StoredResponse {
    StoredResponse {
        status: StatusCode::OK,
        headers: Vec::new(),
        body: Bytes::from_static(text.as_bytes()),
        usage: None,
    }
}

/// The loaders' answer: "fresh", cacheable.
fn fresh() -> Loaded {
    Loaded {
        response: answer("fresh"),
        cacheable: true,
        compute_time: Duration::from_millis(5),
        events: Vec::new(),
        retained_under: None,
        stored_under: None,
    }
}

/// A loader that answers "fresh" and counts its calls.
fn counting(calls: &Arc<AtomicUsize>) -> Loader {
    let calls = calls.clone();
    Loader::new(Sent::of(false, b"{}"), move |_call| {
        calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Ok(fresh()) })
    })
}

fn policy(read: bool, max_age: Option<Duration>) -> CachePolicy {
    CachePolicy {
        read,
        write: true,
        max_age,
        bypass: false,
        revalidate: !read,
        coalesce: true,
    }
}

/// The owner flies (its lookup missed, say, a moment before another flight
/// stored), the follower joins, then the owner's double-check finds the
/// entry stored 60 s ago. Returns (owner's answer, follower's answer, calls).
async fn owner_finds_an_entry(follower: CachePolicy) -> (Served, Served, usize) {
    let store = Arc::new(GatedStore {
        inner: MemoryStore::new(1 << 20),
        open: watch::Sender::new(false),
    });
    let key = CacheKey::for_tests(TenantScope::global(), b"{}");
    let stored_at_ms = NOW_MS - 60_000;
    store
        .inner
        .put(
            &key,
            Arc::new(Entry {
                response: Arc::new(answer("stored")),
                stored_at_ms,
                soft_expires_at_ms: NOW_MS + 240_000,
                hard_expires_at_ms: NOW_MS + 3_540_000,
                compute_time: Duration::from_millis(5),
            }),
        )
        .await;
    let coalescer = Arc::new(coalescer(store.clone()));
    let calls = Arc::new(AtomicUsize::new(0));
    let fly = |policy: CachePolicy| {
        let (coalescer, key, loader) = (coalescer.clone(), key.clone(), counting(&calls));
        tokio::spawn(async move { coalescer.fly(key, policy, loader, None).await })
    };
    let owner = fly(policy(true, None));
    let mut waiters = coalescer.flights().waiters();
    waiters.wait_for(|n| *n >= 1).await.unwrap();
    let follower = fly(follower);
    waiters.wait_for(|n| *n >= 2).await.unwrap();
    store.open.send_replace(true);
    let served = |answer: Result<Answer, Arc<GatewayError>>| match answer.unwrap() {
        Answer::Complete(served) => served,
        Answer::Live { .. } => panic!("no stream here"),
    };
    let owner = served(owner.await.unwrap());
    let follower = served(follower.await.unwrap());
    (owner, follower, calls.load(Ordering::SeqCst))
}

#[tokio::test]
async fn a_follower_without_its_own_controls_takes_the_entry_with_its_age() {
    let (owner, follower, calls) = owner_finds_an_entry(policy(true, None)).await;
    assert_eq!(calls, 0);
    for served in [&owner, &follower] {
        assert_eq!(served.status, CacheStatus::Hit);
        assert_eq!(&served.response.body[..], b"stored");
        assert_eq!(
            served.age,
            Some(Duration::from_secs(60)),
            "a HIT says its age"
        );
    }
}

#[tokio::test]
async fn a_no_cache_follower_gets_a_fresh_answer_not_the_owners_entry() {
    let (owner, follower, calls) = owner_finds_an_entry(policy(false, None)).await;
    assert_eq!(owner.status, CacheStatus::Hit);
    assert_eq!(calls, 1, "the follower's own call");
    assert_eq!(follower.status, CacheStatus::Miss);
    assert_eq!(&follower.response.body[..], b"fresh");
}

#[tokio::test]
async fn a_follower_whose_max_age_the_entry_exceeds_gets_a_fresh_answer() {
    let young = policy(true, Some(Duration::from_secs(30)));
    let (_, follower, calls) = owner_finds_an_entry(young).await;
    assert_eq!(calls, 1);
    assert_eq!(&follower.response.body[..], b"fresh");
    let old_enough = policy(true, Some(Duration::from_secs(120)));
    let (_, follower, calls) = owner_finds_an_entry(old_enough).await;
    assert_eq!(calls, 0);
    assert_eq!(&follower.response.body[..], b"stored");
}

/// A loader that answers "fresh" once `gate` opens, counting its calls.
fn gated(calls: &Arc<AtomicUsize>, gate: &watch::Sender<bool>) -> Loader {
    let (calls, gate) = (calls.clone(), gate.clone());
    Loader::new(Sent::of(false, b"{}"), move |_call| {
        calls.fetch_add(1, Ordering::SeqCst);
        let mut open = gate.subscribe();
        Box::pin(async move {
            let _ = open.wait_for(|open| *open).await;
            Ok(fresh())
        })
    })
}

/// The flight stored the loaders' answer under `key`.
async fn assert_stored_fresh(store: &GatedStore, key: &CacheKey) {
    let stored = store
        .inner
        .get(key)
        .await
        .expect("the flight stored its answer");
    assert_eq!(&stored.response.body[..], b"fresh");
}

fn open_store() -> Arc<GatedStore> {
    Arc::new(GatedStore {
        inner: MemoryStore::new(1 << 20),
        open: watch::Sender::new(true),
    })
}

/// The owner runs its flight on its own task (`owned.rs`); when the owner
/// goes away mid-call (its client hung up), the flight goes on on a task of
/// its own: the follower is answered by the one call, and the cache keeps it.
#[tokio::test]
async fn a_flight_outlives_its_owner_going_away() {
    let store = open_store();
    let coalescer = Arc::new(coalescer(store.clone()));
    let key = CacheKey::for_tests(TenantScope::global(), b"{}");
    let calls = Arc::new(AtomicUsize::new(0));
    let gate = watch::Sender::new(false);
    let fly = || {
        let (coalescer, key, loader) = (coalescer.clone(), key.clone(), gated(&calls, &gate));
        tokio::spawn(async move { coalescer.fly(key, policy(true, None), loader, None).await })
    };
    let owner = fly();
    let mut waiters = coalescer.flights().waiters();
    waiters.wait_for(|n| *n >= 1).await.unwrap();
    let follower = fly();
    waiters.wait_for(|n| *n >= 2).await.unwrap();
    owner.abort();
    assert!(owner.await.unwrap_err().is_cancelled());
    gate.send_replace(true);
    let Answer::Complete(served) = follower.await.unwrap().unwrap() else {
        panic!("no stream here");
    };
    assert_eq!(served.status, CacheStatus::Coalesced);
    assert_eq!(&served.response.body[..], b"fresh");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "one call for both");
    assert_stored_fresh(&store, &key).await;
    coalescer.flights().idle().await;
}

/// A flight that panics on its owner's task ends only the flight, as it
/// would end only a task of its own: the owner sees it abandoned, is elected
/// again, and its second call answers.
#[tokio::test]
async fn a_panicking_flight_is_abandoned_and_its_owner_elected_again() {
    let coalescer = coalescer(open_store());
    let key = CacheKey::for_tests(TenantScope::global(), b"{}");
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let loader = Loader::new(Sent::of(false, b"{}"), move |_call| {
        let first = counted.fetch_add(1, Ordering::SeqCst) == 0;
        Box::pin(async move {
            assert!(!first, "the first call panics");
            Ok(fresh())
        })
    });
    let Answer::Complete(served) = coalescer
        .fly(key, policy(true, None), loader, None)
        .await
        .unwrap()
    else {
        panic!("no stream here");
    };
    assert_eq!(served.status, CacheStatus::Miss);
    assert_eq!(&served.response.body[..], b"fresh");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(coalescer.flights().in_flight(), 0);
}

/// An owner whose wait runs out (`coalesce.wait_timeout`, answered 504 under
/// `on_wait_timeout: error`) stops waiting, not its flight: the call ends on
/// a task of its own and its answer is stored for the next caller.
#[tokio::test(start_paused = true)]
async fn an_owner_that_times_out_leaves_its_flight_to_store_the_answer() {
    let store = open_store();
    let coalescer = coalescer(store.clone());
    let key = CacheKey::for_tests(TenantScope::global(), b"{}");
    let calls = Arc::new(AtomicUsize::new(0));
    let gate = watch::Sender::new(false);
    let waited = coalescer
        .fly(key.clone(), policy(true, None), gated(&calls, &gate), None)
        .await;
    assert!(matches!(
        waited.as_ref().map_err(|error| &**error),
        Err(GatewayError::WaitTimedOut)
    ));
    assert_eq!(coalescer.flights().in_flight(), 1, "the flight still runs");
    gate.send_replace(true);
    coalescer.flights().idle().await;
    assert_stored_fresh(&store, &key).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
