//! `Coalescer::get_or_fetch`: cache, then flight, then upstream. The one place
//! that decides whether a caller is answered from the cache, shares another
//! caller's upstream call, or makes its own.

mod flight;

use std::{future::Future, pin::Pin, sync::Arc, time::Duration};

use tokio_util::task::TaskTracker;
use tracing::Instrument;

pub use flight::{FlightGuard, Flights, Outcome, Role, Waited, WaiterTicket};

use crate::{
    cache::{CacheStore, Entry, Freshness, StoredResponse, TtlPolicy},
    clock::Clock,
    config::CoalesceConfig,
    error::GatewayError,
    fingerprint::CacheKey,
    request::CachePolicy,
};

/// How many times waiters of abandoned flights elect a new owner before giving up.
const MAX_ELECTIONS: usize = 3;

/// What the loader (the upstream call) produced.
#[derive(Debug)]
pub struct Loaded {
    pub response: StoredResponse,
    /// Successful and complete (every choice finished): may be stored.
    pub cacheable: bool,
    pub compute_time: Duration,
}

/// Runs the upstream call for a flight. It may run more than once (a new owner
/// after an abandoned flight, a background refresh), always detached from any
/// caller's connection.
pub type Loader = Arc<
    dyn Fn() -> Pin<Box<dyn Future<Output = Result<Loaded, GatewayError>> + Send>> + Send + Sync,
>;

/// A flight's result as its waiters see it.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub response: Arc<StoredResponse>,
    /// The answer was written to the cache.
    pub stored: bool,
    /// The owner's double-check found a fresh entry; no upstream call was made.
    pub from_cache: bool,
}

/// How a caller was served; becomes `x-corral-cache` and `Cache-Status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheStatus {
    Hit,
    Stale,
    Miss,
    Coalesced,
    Bypass,
}

impl CacheStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hit => "HIT",
            Self::Stale => "STALE",
            Self::Miss => "MISS",
            Self::Coalesced => "COALESCED",
            Self::Bypass => "BYPASS",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Served {
    pub response: Arc<StoredResponse>,
    pub status: CacheStatus,
    /// For MISS and COALESCED: the answer was stored.
    pub stored: bool,
    /// For HIT and STALE: the entry's age.
    pub age: Option<Duration>,
}

#[derive(Debug)]
pub struct Coalescer {
    flights: Flights,
    cache: Arc<dyn CacheStore>,
    clock: Arc<dyn Clock>,
    ttl: TtlPolicy,
    config: CoalesceConfig,
    tasks: TaskTracker,
}

impl Coalescer {
    pub fn new(
        cache: Arc<dyn CacheStore>,
        clock: Arc<dyn Clock>,
        ttl: TtlPolicy,
        config: CoalesceConfig,
        tasks: TaskTracker,
    ) -> Self {
        Self {
            flights: Flights::default(),
            cache,
            clock,
            ttl,
            config,
            tasks,
        }
    }

    pub fn flights(&self) -> &Flights {
        &self.flights
    }

    /// Answers from the cache when it may, else shares or starts the flight for
    /// `fingerprint`. Every wait is bounded by `coalesce.wait_timeout`.
    pub async fn get_or_fetch(
        &self,
        key: CacheKey,
        policy: CachePolicy,
        loader: Loader,
    ) -> Result<Served, Arc<GatewayError>> {
        let fingerprint = key.fingerprint;
        if policy.read
            && let Some(entry) = self.cache.get(&key).await
        {
            let now = self.clock.now_ms();
            match Freshness::of(&entry, now, policy.max_age) {
                Freshness::Fresh => return Ok(served_from(&entry, CacheStatus::Hit, now)),
                Freshness::Stale => {
                    self.refresh_in_background(key, loader);
                    return Ok(served_from(&entry, CacheStatus::Stale, now));
                }
                Freshness::Unusable => {}
            }
        }

        let deadline = tokio::time::Instant::now() + self.config.wait_timeout;
        for _ in 0..MAX_ELECTIONS {
            let (ticket, owner) = match self.flights.join(fingerprint, self.config.max_waiters)? {
                Role::Owner(guard, ticket) => {
                    self.spawn_flight(guard, key.clone(), policy, loader.clone());
                    (ticket, true)
                }
                Role::Follower(ticket) => (ticket, false),
            };
            match ticket.wait(deadline).await {
                Waited::Done(Ok(fetched)) => {
                    let status = match (owner, fetched.from_cache) {
                        (_, true) => CacheStatus::Hit,
                        (true, false) => CacheStatus::Miss,
                        (false, false) => CacheStatus::Coalesced,
                    };
                    return Ok(Served {
                        response: fetched.response,
                        status,
                        stored: fetched.stored,
                        age: None,
                    });
                }
                Waited::Done(Err(error)) => return Err(error),
                Waited::TimedOut => return Err(Arc::new(GatewayError::WaitTimedOut)),
                Waited::Abandoned => {
                    tracing::warn!(fingerprint = ?fingerprint, "flight abandoned; electing a new owner");
                }
            }
        }
        Err(Arc::new(GatewayError::Internal(anyhow::anyhow!(
            "flight for {fingerprint:?} was abandoned {MAX_ELECTIONS} times"
        ))))
    }

    /// Starts one refresh of a stale entry, unless a flight for it runs already.
    fn refresh_in_background(&self, key: CacheKey, loader: Loader) {
        if let Some(guard) = self.flights.start_unattended(key.fingerprint) {
            let policy = CachePolicy {
                read: true,
                write: true,
                max_age: None,
                bypass: false,
                revalidate: false,
            };
            self.spawn_flight(guard, key, policy, loader);
        }
    }

    /// Runs the flight on its own task, so the upstream call and the cache
    /// write finish even when the owner's client disconnects.
    fn spawn_flight(&self, guard: FlightGuard, key: CacheKey, policy: CachePolicy, loader: Loader) {
        let cache = self.cache.clone();
        let clock = self.clock.clone();
        let ttl = self.ttl;
        let span = tracing::info_span!("flight", fingerprint = ?guard.fingerprint());
        self.tasks.spawn(
            async move {
                let outcome = run_flight(&key, policy, loader, cache, clock, ttl).await;
                guard.complete(outcome);
            }
            .instrument(span),
        );
    }
}

async fn run_flight(
    key: &CacheKey,
    policy: CachePolicy,
    loader: Loader,
    cache: Arc<dyn CacheStore>,
    clock: Arc<dyn Clock>,
    ttl: TtlPolicy,
) -> Outcome {
    // Double-check: another flight may have stored a fresh answer between the
    // caller's cache read and this flight's start.
    if policy.read
        && let Some(entry) = cache.get(key).await
        && Freshness::of(&entry, clock.now_ms(), policy.max_age) == Freshness::Fresh
    {
        return Ok(Fetched {
            response: entry.response.clone(),
            stored: false,
            from_cache: true,
        });
    }
    let loaded = loader().await.map_err(Arc::new)?;
    let response = Arc::new(loaded.response);
    let stored = policy.write && loaded.cacheable;
    if stored {
        let now = clock.now_ms();
        let (soft, hard) = ttl.expiries(now, &mut rand::rng());
        let entry = Entry {
            response: response.clone(),
            stored_at_ms: now,
            soft_expires_at_ms: soft,
            hard_expires_at_ms: hard,
            compute_time: loaded.compute_time,
        };
        cache.put(key, Arc::new(entry)).await;
    }
    Ok(Fetched {
        response,
        stored,
        from_cache: false,
    })
}

fn served_from(entry: &Entry, status: CacheStatus, now_ms: u64) -> Served {
    Served {
        response: entry.response.clone(),
        status,
        stored: true,
        age: Some(entry.age(now_ms)),
    }
}
