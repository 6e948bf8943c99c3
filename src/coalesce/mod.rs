//! `Coalescer::get_or_fetch`: cache, then flight, then upstream. The one place
//! that decides whether a caller is answered from the cache, shares another
//! caller's upstream call, or makes its own.

mod batch;
mod cluster;
mod failures;
mod flight;
mod owned;

use std::{future::Future, pin::Pin, sync::Arc, time::Duration};

use opentelemetry::context::FutureExt as _;
use rand::Rng;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

pub use batch::{BatchCall, BatchLoader, Billed, ItemServed, ItemsLoaded, ItemsServed};
pub use failures::FailureMemory;
use failures::Recall;
pub use flight::{
    FlightGuard, Flights, LiveLog, Mirror, Outcome, RemoteReaders, Role, StreamPublisher, Waited,
    WaiterTicket,
};
use owned::{FlightFuture, OwnedFlight};

use crate::cache_status::CacheStatus;
use crate::{
    cache::{
        CacheStore, Entry, Freshness, StoredResponse, TtlPolicy, entry_weight, should_refresh_early,
    },
    clock::Clock,
    cluster::Cluster,
    config::{CoalesceConfig, OnWaitTimeout},
    error::GatewayError,
    fingerprint::{CacheKey, Sent},
    request::CachePolicy,
    retry_window::RetryWindow,
    sse::{Format, StreamLog},
    traces::{self, FlightRole},
};

/// A backstop on waiting for one's own call, which the call's own bounds
/// (upstream timeouts, `retry.deadline`) end long before.
const OWN_CALL_BOUND: Duration = Duration::from_secs(24 * 3600);

/// How many times waiters of abandoned flights elect a new owner before giving up.
const MAX_ELECTIONS: usize = 3;

/// What the loader (the upstream call) produced.
#[derive(Debug)]
pub struct Loaded {
    pub response: StoredResponse,
    /// Successful and complete (every choice finished): may be stored.
    pub cacheable: bool,
    pub compute_time: Duration,
    /// A streamed call's SSE events as callers received them, kept in the
    /// retry window for a streaming retry's replay; empty when buffered.
    pub events: Vec<bytes::Bytes>,
    /// Where the retry window keeps the answer when it is not the flight's
    /// key: under a cache every tenant shares, the owner's own key (another
    /// tenant's retry never receives this tenant's sample).
    pub retained_under: Option<CacheKey>,
    /// Where the cache stores the answer when it is not under the flight's
    /// key: a fallback model's answer (`upstreams[].fallback`) lives only
    /// under the key a request naming that model has, never the primary's.
    pub stored_under: Option<CacheKey>,
}

/// Runs the upstream call for a flight. It may run more than once (a new owner
/// after an abandoned flight, a background refresh), always detached from any
/// caller's connection. A streaming loader publishes its live log through the
/// call's `StreamPublisher` as soon as the upstream stream begins; a buffered
/// one ignores it.
#[derive(Clone)]
pub struct Loader {
    /// What this caller's call sends: a follower whose bytes differ from the
    /// owner's is not answered by a refusal of the owner's bytes.
    pub sends: Sent,
    call: Arc<LoadFn>,
}

type LoadFn = dyn Fn(FlightCall) -> Pin<Box<dyn Future<Output = Result<Loaded, GatewayError>> + Send>>
    + Send
    + Sync;

impl Loader {
    pub fn new(
        sends: Sent,
        call: impl Fn(FlightCall) -> Pin<Box<dyn Future<Output = Result<Loaded, GatewayError>> + Send>>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        Self {
            sends,
            call: Arc::new(call),
        }
    }

    fn call(
        &self,
        call: FlightCall,
    ) -> Pin<Box<dyn Future<Output = Result<Loaded, GatewayError>> + Send>> {
        (self.call)(call)
    }

    /// The same loader, its calls marked as a background refresh
    /// ([`FlightCall::background`]), whichever flight or instance runs them.
    fn in_background(self) -> Self {
        let call = self.call;
        Self {
            sends: self.sends,
            call: Arc::new(move |flight: FlightCall| {
                call(FlightCall {
                    background: true,
                    ..flight
                })
            }),
        }
    }
}

/// What a flight hands its loader for one upstream call.
#[derive(Debug, Clone)]
pub struct FlightCall {
    /// Where a streamed call shows its live log to the flight's waiters.
    pub publisher: StreamPublisher,
    /// The most attempts the call may make: one for a key whose last call
    /// failed (`FailureMemory`); `None`: `retry.max_attempts`.
    pub max_attempts: Option<usize>,
    /// The call refreshes a cached entry in the background (STALE, or
    /// XFetch's early refresh): the caller whose hit started it was answered
    /// from the cache and asked for no call, so it is the gateway's own.
    pub background: bool,
}

/// A flight's result as its waiters see it.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub response: Arc<StoredResponse>,
    /// The answer was written to the cache.
    pub stored: bool,
    pub source: Source,
}

/// Where a flight's answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// This instance's upstream call.
    Upstream,
    /// The owner's double-check found a fresh entry (stored then); no
    /// upstream call was made.
    Cache { stored_at_ms: u64 },
    /// Another instance's flight, through Redis.
    OtherInstance,
}

/// What a caller gets: a complete response, or (for a streaming caller
/// joining a streamed flight) the flight's live event log.
#[derive(Debug, Clone)]
pub enum Answer {
    Complete(Served),
    Live { log: StreamLog, status: CacheStatus },
}

/// What the cache holds for a request (`Coalescer::lookup`).
#[derive(Debug)]
pub enum Lookup {
    /// A fresh entry: serve it.
    Fresh(Served),
    /// Serve it, and refresh it in the background: stale, or fresh but
    /// chosen for an early refresh (XFetch).
    Refresh(Served),
    /// Nothing usable: the request needs a flight.
    Absent,
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
    context: Arc<FlightContext>,
    config: CoalesceConfig,
    tasks: TaskTracker,
}

/// What a detached flight needs, shared by every flight.
#[derive(Debug)]
pub struct FlightContext {
    pub cache: Arc<dyn CacheStore>,
    pub clock: Arc<dyn Clock>,
    pub ttl: TtlPolicy,
    /// Redis, when configured: cluster-wide owner election and fan-out.
    pub cluster: Option<Arc<Cluster>>,
    /// Negative caching of failed flights, cluster-wide.
    pub error_ttl: Duration,
    /// XFetch's beta; 0 disables early refresh.
    pub early_refresh_beta: f64,
    pub wait_timeout: Duration,
    /// What a caller does when its wait runs out, on this instance's flight
    /// or another instance's: 504, or its own call.
    pub on_wait_timeout: OnWaitTimeout,
    /// Bounds of a relayed stream's log, and how long it may go without an event.
    pub stream_limits: crate::sse::LogLimits,
    pub stream_silence: crate::sse::Silence,
    /// Answers larger than this are served but never stored.
    pub max_entry_bytes: u64,
    /// Where completed answers wait for the client's retries; `None`: off.
    pub retry_window: Option<Arc<RetryWindow>>,
    /// Transient failures by key: one client call never multiplies.
    pub failures: FailureMemory,
}

impl Coalescer {
    pub fn new(context: FlightContext, config: CoalesceConfig, tasks: TaskTracker) -> Self {
        Self {
            flights: Flights::default(),
            context: Arc::new(context),
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
        match self.answer(key, policy, loader, None).await? {
            Answer::Complete(served) => Ok(served),
            Answer::Live { .. } => unreachable!("a live log is only handed to callers that ask"),
        }
    }

    /// As `get_or_fetch`; with `live` (the caller's stream format), a caller
    /// joining a streamed flight gets its live log instead of waiting for the
    /// end (streaming callers).
    pub async fn answer(
        &self,
        key: CacheKey,
        policy: CachePolicy,
        loader: Loader,
        live: Option<Format>,
    ) -> Result<Answer, Arc<GatewayError>> {
        if policy.read {
            match self.lookup(&key, policy).await {
                Lookup::Fresh(served) => return Ok(Answer::Complete(served)),
                Lookup::Refresh(served) => {
                    let age = served.age.unwrap_or_default();
                    self.refresh_in_background(key, loader, age);
                    return Ok(Answer::Complete(served));
                }
                Lookup::Absent => {}
            }
        }
        self.fly(key, policy, loader, live).await
    }

    /// The cache's answer for `key` under `policy`, without a flight: what
    /// `answer` serves before it looks for one. The caller of a `Refresh`
    /// starts the refresh (`refresh_in_background`), so a caller that has no
    /// loader at hand yet builds one only then.
    pub async fn lookup(&self, key: &CacheKey, policy: CachePolicy) -> Lookup {
        let Some(entry) = self.context.cache.get(key).await else {
            return Lookup::Absent;
        };
        let now = self.context.clock.now_ms();
        match Freshness::of(&entry, now, policy.max_age) {
            Freshness::Fresh => {
                let served = served_from(&entry, CacheStatus::Hit, now);
                // XFetch: near the soft expiry, refresh early with rising probability.
                let beta = self.context.early_refresh_beta;
                if should_refresh_early(&entry, now, beta, rand::rng().random_range(0.0..1.0)) {
                    Lookup::Refresh(served)
                } else {
                    Lookup::Fresh(served)
                }
            }
            Freshness::Stale => Lookup::Refresh(served_from(&entry, CacheStatus::Stale, now)),
            Freshness::Unusable => Lookup::Absent,
        }
    }

    /// Shares or starts the flight for `key`, without reading the cache
    /// first (the caller did: `lookup`). Every wait is bounded by
    /// `coalesce.wait_timeout`.
    pub async fn fly(
        &self,
        key: CacheKey,
        policy: CachePolicy,
        loader: Loader,
        live: Option<Format>,
    ) -> Result<Answer, Arc<GatewayError>> {
        let mut policy = policy;
        let deadline = tokio::time::Instant::now() + self.config.wait_timeout;
        for _ in 0..MAX_ELECTIONS {
            // A caller that opted out of sharing (`X-Corral-Coalesce: off`),
            // or whose own bytes the provider has not judged yet, flies under
            // a name of its own: nobody joins it, and it joins nobody.
            let fingerprint = if policy.coalesce {
                key.fingerprint
            } else {
                key.fingerprint.unshared(rand::rng().random())
            };
            let joined = self.flights.join(
                fingerprint,
                self.config.max_waiters,
                self.config.max_total_waiters,
            )?;
            // A buffered owner runs its flight on its own task (`owned.rs`);
            // a streamed one spawns it, to read the live log it writes.
            let (ticket, owner, mut owned) = match joined {
                Role::Owner(guard, ticket) => {
                    guard.set_sends(loader.sends);
                    let start = match live {
                        None => Start::Owner,
                        Some(_) => Start::Streamed,
                    };
                    let flight =
                        self.flight(guard, key.clone(), policy, loader.clone(), live, start);
                    let owned = match start {
                        Start::Owner => Some(OwnedFlight::new(flight, self.tasks.clone())),
                        _ => {
                            self.tasks.spawn(flight);
                            None
                        }
                    };
                    (ticket, true, owned)
                }
                Role::Follower(ticket) => (ticket, false, None),
            };
            let mut waited = wait_until(owned.as_mut(), &ticket, deadline, live.is_some()).await;
            if matches!(waited, Waited::TimedOut)
                && owner
                && self.config.on_wait_timeout == OnWaitTimeout::OwnCall
            {
                // The owner's flight is its own call, as a local follower's
                // own call is (`on_wait_timeout`): it waits for it to end,
                // which the call's own bounds see to (the upstream's
                // timeouts, `retry.deadline`; a flight that followed another
                // instance's is making its own call now, `cluster.rs`).
                let ended = tokio::time::Instant::now() + OWN_CALL_BOUND;
                waited = wait_until(owned.as_mut(), &ticket, ended, live.is_some()).await;
            }
            // An owner that stops waiting lets its flight finish on a task of
            // its own, for the followers and the cache.
            drop(owned);
            if !owner && let Some(flight) = ticket.flight_trace() {
                traces::link_flight(flight);
            }
            match waited {
                Waited::Live(live) => {
                    traces::set_flight_role(flight_role(owner, live.remote));
                    let status = if owner && !live.remote {
                        CacheStatus::Miss
                    } else {
                        CacheStatus::Coalesced
                    };
                    return Ok(Answer::Live {
                        log: live.log,
                        status,
                    });
                }
                Waited::Done(Ok(fetched)) if !owner && !self.holds_for(policy, fetched.source) => {
                    // The owner's double-check found an entry this caller's
                    // own `Cache-Control` refuses (`no-cache`, too old for
                    // its `max-age`): its own request controls hold for it.
                    policy.coalesce = false;
                }
                Waited::Done(Ok(fetched)) => {
                    traces::set_flight_role(flight_role(
                        owner,
                        fetched.source == Source::OtherInstance,
                    ));
                    let status = match (owner, fetched.source) {
                        (_, Source::Cache { .. }) => CacheStatus::Hit,
                        (true, Source::Upstream) => CacheStatus::Miss,
                        (false, Source::Upstream) | (_, Source::OtherInstance) => {
                            CacheStatus::Coalesced
                        }
                    };
                    // A stored entry is answered with its age, as a HIT is.
                    let age = match fetched.source {
                        Source::Cache { stored_at_ms } => Some(Duration::from_millis(
                            self.context.clock.now_ms().saturating_sub(stored_at_ms),
                        )),
                        _ => None,
                    };
                    return Ok(Answer::Complete(Served {
                        response: fetched.response,
                        status,
                        stored: fetched.stored,
                        age,
                    }));
                }
                Waited::Done(Err(error)) if !owner && error.is_callers_own() => {
                    // The owner's budget refused its call, not this caller's:
                    // its own budget decides (under a cache every tenant
                    // shares, the owner may be another tenant).
                    policy.coalesce = false;
                }
                Waited::Done(Err(error))
                    if !owner
                        && error.refuses_the_bytes_sent()
                        && ticket.owner_sends() != Some(loader.sends) =>
                {
                    // The provider refused the owner's bytes (or mode), not
                    // this caller's: its own call answers it.
                    tracing::debug!(fingerprint = ?key.fingerprint, "the owner's request was refused; calling with this caller's own");
                    policy.coalesce = false;
                }
                Waited::Done(Err(error)) => {
                    traces::set_flight_role(flight_role(owner, false));
                    return Err(error);
                }
                Waited::TimedOut => {
                    drop(ticket);
                    return self.on_wait_timeout(&key, policy, &loader, owner).await;
                }
                Waited::Abandoned => {
                    tracing::warn!(fingerprint = ?fingerprint, "flight abandoned; electing a new owner");
                }
            }
        }
        Err(Arc::new(GatewayError::Internal(anyhow::anyhow!(
            "flight for {:?} was abandoned {MAX_ELECTIONS} times",
            key.fingerprint
        ))))
    }

    /// Whether an answer of another caller's flight may answer a caller of
    /// `policy`: a stored entry only when the caller's own `Cache-Control`
    /// allows it (no `no-cache`, young enough for its `max-age`).
    fn holds_for(&self, policy: CachePolicy, source: Source) -> bool {
        let Source::Cache { stored_at_ms } = source else {
            return true;
        };
        let age = Duration::from_millis(self.context.clock.now_ms().saturating_sub(stored_at_ms));
        policy.read && policy.max_age.is_none_or(|max_age| age <= max_age)
    }

    /// A follower whose wait ran out: 504, or (`coalesce.on_wait_timeout:
    /// own_call`) its own upstream call, outside the flight it gave up on.
    async fn on_wait_timeout(
        &self,
        key: &CacheKey,
        policy: CachePolicy,
        loader: &Loader,
        owner: bool,
    ) -> Result<Answer, Arc<GatewayError>> {
        // The owner's own flight is the call; a second one would not be faster.
        if owner || self.config.on_wait_timeout == OnWaitTimeout::Error {
            return Err(Arc::new(GatewayError::WaitTimedOut));
        }
        tracing::warn!(fingerprint = ?key.fingerprint, "wait for the owner timed out; calling upstream directly");
        let fetched = load_and_store(
            &self.context,
            key,
            policy,
            loader,
            &StreamPublisher::detached(),
        )
        .await?;
        Ok(Answer::Complete(Served {
            response: fetched.response,
            status: CacheStatus::Miss,
            stored: fetched.stored,
            age: None,
        }))
    }

    /// Starts one refresh of an entry `age` old, unless a flight for it runs
    /// already. The flight's double-check accepts only a younger entry (one
    /// another instance refreshed meanwhile), never the one being replaced.
    pub fn refresh_in_background(&self, key: CacheKey, loader: Loader, age: Duration) {
        if let Some(guard) = self.flights.start_unattended(key.fingerprint) {
            // Nobody's request: the gateway's own call.
            let loader = loader.in_background();
            let policy = CachePolicy {
                read: true,
                write: true,
                max_age: Some(age.saturating_sub(Duration::from_millis(1))),
                bypass: false,
                revalidate: false,
                coalesce: true,
            };
            self.tasks
                .spawn(self.flight(guard, key, policy, loader, None, Start::Refresh));
        }
    }

    /// The flight for `key`: the upstream call, the cache write, and its
    /// outcome published to its waiters through `guard`. Spawned, or run by
    /// its owner (`start`, see `owned.rs`); either way it finishes when
    /// every caller has gone.
    fn flight(
        &self,
        guard: FlightGuard,
        key: CacheKey,
        policy: CachePolicy,
        loader: Loader,
        live: Option<Format>,
        start: Start,
    ) -> FlightFuture {
        let context = self.context.clone();
        // A span of its own at DEBUG (making and closing one is a visible
        // part of a miss's CPU); at INFO the flight runs in its caller's
        // request span (where its owner runs it, it is in that span already;
        // handed to a task of its own when the owner leaves, it goes on
        // without it), and its warning names the key itself.
        let span = match tracing::debug_span!("flight", fingerprint = %guard.fingerprint().short_hex())
        {
            span if !span.is_disabled() => Some(span),
            _ if start == Start::Owner => None,
            _ => Some(tracing::Span::current()),
        };
        // With traces, the flight's span is a child of the request that
        // started it (the owner, or the hit that triggered a refresh).
        let kind = match start {
            Start::Refresh => "refresh",
            Start::Owner | Start::Streamed => "request",
        };
        let traced = traces::flight_context(&guard.fingerprint(), kind).map(|(cx, name)| {
            guard.set_trace(name);
            cx
        });
        let publisher = guard.stream_publisher().with_live(live);
        let flight = async move {
            // Boxed when it starts: the flight's own future stays small, and
            // moving it to a task moves a few words, not its kilobytes.
            let outcome = Box::pin(run_flight(&context, &key, policy, loader, publisher)).await;
            // Once a flight, however many callers its error answers.
            if let Err(error) = &outcome
                && error.status().is_server_error()
            {
                tracing::warn!(fingerprint = %guard.fingerprint().short_hex(), error = %error, source = ?std::error::Error::source(&**error), "flight failed");
            }
            guard.complete(outcome);
        };
        match (span, traced) {
            (None, None) => Box::pin(flight),
            (Some(span), None) => Box::pin(flight.instrument(span)),
            (None, Some(cx)) => Box::pin(flight.with_context(cx)),
            (Some(span), Some(cx)) => Box::pin(flight.instrument(span).with_context(cx)),
        }
    }
}

/// A caller's wait for its flight's outcome until `deadline`: an owner that
/// holds its flight runs it meanwhile (`owned.rs`); anyone else waits on
/// the ticket (`live`: for the flight's live log, when it streams).
async fn wait_until(
    owned: Option<&mut OwnedFlight>,
    ticket: &WaiterTicket,
    deadline: tokio::time::Instant,
    live: bool,
) -> Waited {
    match owned {
        Some(flight) => flight.run_until(deadline, ticket).await,
        None => ticket.wait_for(deadline, live).await,
    }
}

/// Who starts a flight, and where it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// A caller's buffered request, run on its owner's own task (`owned.rs`).
    Owner,
    /// A caller's streamed request, on a task of its own: its owner reads
    /// the live log the flight writes.
    Streamed,
    /// A background refresh of a cached entry, on a task of its own.
    Refresh,
}

async fn run_flight(
    context: &FlightContext,
    key: &CacheKey,
    policy: CachePolicy,
    loader: Loader,
    publisher: StreamPublisher,
) -> Outcome {
    // Double-check: another flight may have stored a fresh answer between the
    // caller's cache read and this flight's start.
    if policy.read
        && let Some(entry) = fresh_entry(context, key, policy).await
    {
        return Ok(Fetched {
            response: entry.response.clone(),
            stored: false,
            source: Source::Cache {
                stored_at_ms: entry.stored_at_ms,
            },
        });
    }
    if let Some(cluster) = &context.cluster
        && policy.coalesce
        // Boxed: Redis's election and fan-out are kilobytes of future that
        // every flight would otherwise carry, and move, with Redis or without.
        && let Some(outcome) =
            Box::pin(cluster::cluster_flight(context, cluster, key, policy, &loader, &publisher)).await
    {
        return outcome;
    }
    // No Redis, or Redis unavailable: this instance's flight is the only one we can share.
    load_and_store(context, key, policy, &loader, &publisher).await
}

async fn fresh_entry(
    context: &FlightContext,
    key: &CacheKey,
    policy: CachePolicy,
) -> Option<Arc<Entry>> {
    let entry = context.cache.get(key).await?;
    (Freshness::of(&entry, context.clock.now_ms(), policy.max_age) == Freshness::Fresh)
        .then_some(entry)
}

/// Calls upstream and stores a complete answer the policy allows storing.
async fn load_and_store(
    context: &FlightContext,
    key: &CacheKey,
    policy: CachePolicy,
    loader: &Loader,
    publisher: &StreamPublisher,
) -> Outcome {
    // A key that failed moments ago answers with that failure, and one that
    // failed before gets one attempt, until a call succeeds.
    let max_attempts = match context.failures.recall(&key.fingerprint, loader.sends) {
        Recall::Quiet(error) => return Err(error),
        Recall::Failing => Some(1),
        Recall::Clear => None,
    };
    let call = FlightCall {
        publisher: publisher.clone(),
        max_attempts,
        background: false,
    };
    let loaded = loader.call(call).await.map_err(Arc::new);
    context
        .failures
        .settle(&key.fingerprint, loader.sends, &loaded);
    let loaded = loaded?;
    let response = Arc::new(loaded.response);
    let mut stored = false;
    let (cacheable, compute_time, events) = (loaded.cacheable, loaded.compute_time, loaded.events);
    let stored_under = loaded.stored_under.as_ref().unwrap_or(key);
    if policy.write && cacheable {
        let now = context.clock.now_ms();
        let (soft, hard) = context.ttl.expiries(now, &mut rand::rng());
        let entry = Entry {
            response: response.clone(),
            stored_at_ms: now,
            soft_expires_at_ms: soft,
            hard_expires_at_ms: hard,
            compute_time,
        };
        // One huge answer must not evict thousands of ordinary ones.
        if entry_weight(&entry) <= context.max_entry_bytes {
            context.cache.put(stored_under, Arc::new(entry)).await;
            stored = true;
        } else {
            tracing::info!(
                bytes = response.body.len(),
                max_entry_bytes = context.max_entry_bytes,
                "answer served but not stored: larger than cache.max_entry_bytes"
            );
        }
    }
    // Every other complete answer (sampled, or not stored by policy) waits
    // for the client's retries, before the outcome is published. One the
    // cache stored answers them from there (a HIT), so it is not kept twice.
    // A fallback model's answer is kept under no key of the primary's.
    if let Some(window) = &context.retry_window
        && cacheable
        && !stored
        && loaded.stored_under.is_none()
        && response.status.is_success()
    {
        let retained_under = loaded.retained_under.as_ref().unwrap_or(key);
        window
            .remember(retained_under, response.clone(), events)
            .await;
    }
    Ok(Fetched {
        response,
        stored,
        source: Source::Upstream,
    })
}

/// A caller's part in the flight it waited on, for its trace.
fn flight_role(owner: bool, from_other_instance: bool) -> FlightRole {
    match (owner, from_other_instance) {
        (_, true) => FlightRole::RemoteFollower,
        (true, false) => FlightRole::Owner,
        (false, false) => FlightRole::Follower,
    }
}

fn served_from(entry: &Entry, status: CacheStatus, now_ms: u64) -> Served {
    Served {
        response: entry.response.clone(),
        status,
        stored: true,
        age: Some(entry.age(now_ms)),
    }
}

#[cfg(test)]
mod tests;
