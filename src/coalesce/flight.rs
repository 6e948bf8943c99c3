//! In-process singleflight: at most one [`Flight`] per fingerprint, the
//! [`FlightGuard`] held by its owner, and a [`WaiterTicket`] per caller.
//!
//! "The flight always ends" is a property of the types: the guard's `Drop`
//! removes the flight from the map on every exit path (success, error, panic,
//! cancellation), and a guard dropped without a result closes the channel, which
//! tells the waiters the flight was abandoned so they elect a new owner.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, MutexGuard, OnceLock,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::future::BoxFuture;
use tokio::sync::{Notify, watch};

use super::Fetched;
use crate::{
    error::GatewayError,
    fingerprint::{Fingerprint, Sent},
    sse::{Format, StreamLog},
    traces::FlightTrace,
};

/// What a flight ends with, shared by every waiter: both sides are `Arc`s, so
/// relaying it to a thousand callers copies no body.
pub type Outcome = Result<Fetched, Arc<GatewayError>>;

#[derive(Debug)]
struct Flight {
    result: watch::Receiver<Option<Outcome>>,
    /// The live event log, once a streamed flight's upstream stream has begun.
    stream: watch::Receiver<Option<LiveLog>>,
    waiters: AtomicUsize,
    /// The flight's span, when traced: followers link to it.
    trace: OnceLock<FlightTrace>,
    /// What the owner's call sends (`Loader::sends`).
    sends: OnceLock<Sent>,
}

type FlightMap = HashMap<Fingerprint, Arc<Flight>, foldhash::fast::RandomState>;

#[derive(Debug, Default)]
struct FlightTable {
    /// foldhash, not SipHash: every miss looks its key up three times.
    map: Mutex<FlightMap>,
    /// Callers waiting on any flight, observable (gauges, tests awaiting a herd).
    waiters: watch::Sender<usize>,
    /// Signalled whenever the last flight ends.
    idle: Notify,
}

impl FlightTable {
    fn map(&self) -> MutexGuard<'_, FlightMap> {
        // A panic while holding this lock cannot leave the map inconsistent
        // (every critical section is a single insert, get or remove).
        self.map
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The table of flights in this process.
#[derive(Debug, Clone, Default)]
pub struct Flights {
    shared: Arc<FlightTable>,
}

/// How a caller takes part in the flight for its fingerprint.
pub enum Role {
    /// Started the flight: must run it (or drop the guard, abandoning it).
    Owner(FlightGuard, WaiterTicket),
    /// Joined a running flight.
    Follower(WaiterTicket),
}

impl Flights {
    /// Joins the flight for `fingerprint`, starting it if there is none.
    /// `max_waiters` bounds one flight's waiters, `max_total` all flights'.
    pub fn join(
        &self,
        fingerprint: Fingerprint,
        max_waiters: usize,
        max_total: usize,
    ) -> Result<Role, GatewayError> {
        if *self.shared.waiters.borrow() >= max_total {
            return Err(GatewayError::TooManyWaiters {
                retry_after: Duration::from_secs(1),
            });
        }
        let mut map = self.shared.map();
        if let Some(flight) = map.get(&fingerprint) {
            if flight.waiters.load(Ordering::Acquire) >= max_waiters {
                return Err(GatewayError::TooManyWaiters {
                    retry_after: Duration::from_secs(1),
                });
            }
            let ticket = WaiterTicket::new(&self.shared, flight.clone());
            return Ok(Role::Follower(ticket));
        }
        let (guard, flight) = self.start_locked(&mut map, fingerprint);
        drop(map);
        let ticket = WaiterTicket::new(&self.shared, flight);
        Ok(Role::Owner(guard, ticket))
    }

    /// Starts a flight nobody waits on (a background refresh), unless one runs already.
    pub fn start_unattended(&self, fingerprint: Fingerprint) -> Option<FlightGuard> {
        let mut map = self.shared.map();
        if map.contains_key(&fingerprint) {
            return None;
        }
        Some(self.start_locked(&mut map, fingerprint).0)
    }

    fn start_locked(
        &self,
        map: &mut FlightMap,
        fingerprint: Fingerprint,
    ) -> (FlightGuard, Arc<Flight>) {
        let (sender, result) = watch::channel(None);
        let (stream_sender, stream) = watch::channel(None::<LiveLog>);
        let flight = Arc::new(Flight {
            result,
            stream,
            waiters: AtomicUsize::new(0),
            trace: OnceLock::new(),
            sends: OnceLock::new(),
        });
        map.insert(fingerprint, flight.clone());
        let guard = FlightGuard {
            shared: self.shared.clone(),
            fingerprint,
            flight: flight.clone(),
            sender,
            stream: StreamPublisher {
                sender: stream_sender,
                flight: Some(flight.clone()),
                live: None,
                mirror: None,
                remote_readers: None,
            },
        };
        (guard, flight)
    }

    /// Flights running now.
    pub fn in_flight(&self) -> usize {
        self.shared.map().len()
    }

    /// Callers waiting on any flight now.
    pub fn waiters(&self) -> watch::Receiver<usize> {
        self.shared.waiters.subscribe()
    }

    /// Resolves once no flight is running.
    pub async fn idle(&self) {
        loop {
            let notified = self.shared.idle.notified();
            if self.in_flight() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// Held by whoever runs a flight. Completing it publishes the outcome; dropping
/// it, completed or not, removes the flight.
#[derive(Debug)]
pub struct FlightGuard {
    shared: Arc<FlightTable>,
    fingerprint: Fingerprint,
    flight: Arc<Flight>,
    sender: watch::Sender<Option<Outcome>>,
    stream: StreamPublisher,
}

/// A flight's live log, and whether it is relayed from another instance's flight.
#[derive(Debug, Clone)]
pub struct LiveLog {
    pub log: StreamLog,
    pub remote: bool,
}

/// Also receives a published log (the cluster owner mirrors it into Redis).
pub type Mirror = Arc<dyn Fn(StreamLog) + Send + Sync>;

/// Whether callers on other instances still read a mirrored stream (they
/// keep a heartbeat in Redis while they do). `true` when it cannot be known.
pub type RemoteReaders = Arc<dyn Fn() -> BoxFuture<'static, bool> + Send + Sync>;

/// Lets a streamed flight's loader show its live log to the flight's waiters.
#[derive(Clone)]
pub struct StreamPublisher {
    sender: watch::Sender<Option<LiveLog>>,
    flight: Option<Arc<Flight>>,
    /// The flight was started by a streaming caller (worth relaying live), of this format.
    live: Option<Format>,
    mirror: Option<Mirror>,
    remote_readers: Option<RemoteReaders>,
}

impl std::fmt::Debug for StreamPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamPublisher")
            .field("live", &self.live.is_some())
            .field("mirrored", &self.mirror.is_some())
            .finish()
    }
}

impl StreamPublisher {
    /// A publisher nobody listens to (flights whose waiters are elsewhere).
    pub fn detached() -> Self {
        Self {
            sender: watch::Sender::new(None),
            flight: None,
            live: None,
            mirror: None,
            remote_readers: None,
        }
    }

    /// Publishes this instance's own upstream stream.
    pub fn publish(&self, log: StreamLog) {
        if let Some(mirror) = &self.mirror {
            mirror(log.clone());
        }
        self.sender
            .send_replace(Some(LiveLog { log, remote: false }));
    }

    /// Publishes a stream relayed from another instance's flight.
    pub fn publish_remote(&self, log: StreamLog) {
        self.sender
            .send_replace(Some(LiveLog { log, remote: true }));
    }

    /// Whether a live log has been published.
    pub fn published(&self) -> bool {
        self.sender.borrow().is_some()
    }

    /// Whether the flight's owner is a streaming caller.
    pub fn is_live(&self) -> bool {
        self.live.is_some()
    }

    /// The stream format of a streaming owner's flight.
    pub fn live_format(&self) -> Option<Format> {
        self.live
    }

    pub(super) fn with_live(mut self, live: Option<Format>) -> Self {
        self.live = live;
        self
    }

    /// The same publisher, also handing the log to `mirror`, whose readers
    /// elsewhere `remote_readers` tells of.
    pub fn mirrored(&self, mirror: Mirror, remote_readers: RemoteReaders) -> Self {
        Self {
            mirror: Some(mirror),
            remote_readers: Some(remote_readers),
            ..self.clone()
        }
    }

    /// Whether callers on other instances still read the mirrored stream;
    /// `false` for a stream nobody mirrors.
    pub async fn remote_readers(&self) -> bool {
        match &self.remote_readers {
            Some(remote_readers) => remote_readers().await,
            None => false,
        }
    }

    /// Callers still waiting for the flight's complete outcome.
    pub fn waiters(&self) -> usize {
        self.flight
            .as_ref()
            .map_or(0, |flight| flight.waiters.load(Ordering::Acquire))
    }
}

impl FlightGuard {
    /// Records what the owner's call sends, for followers to compare theirs with.
    pub fn set_sends(&self, sends: Sent) {
        let _ = self.flight.sends.set(sends);
    }

    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    /// Names the flight's span, for its followers' traces to link to.
    pub fn set_trace(&self, trace: FlightTrace) {
        let _ = self.flight.trace.set(trace);
    }

    pub fn stream_publisher(&self) -> StreamPublisher {
        self.stream.clone()
    }

    /// Ends the flight, then hands the outcome to every waiter. Callers must
    /// have written the cache first, so that whoever arrives after the flight
    /// is gone finds the entry. The flight leaves the table before any waiter
    /// wakes: a caller that starts once the owner has answered (a client's
    /// next request) never joins an ended flight and takes its answer (one
    /// not stored, a filtered or sampled one, is its own call again).
    pub fn complete(self, outcome: Outcome) {
        self.leave_table();
        self.sender.send_replace(Some(outcome));
    }

    /// Removes the flight from the table, if it is still there under its
    /// key (a new one may already stand there if waiters of an abandoned
    /// flight elected a new owner).
    fn leave_table(&self) {
        let mut map = self.shared.map();
        let removed = map
            .get(&self.fingerprint)
            .is_some_and(|flight| Arc::ptr_eq(flight, &self.flight))
            && map.remove(&self.fingerprint).is_some();
        let now_idle = removed && map.is_empty();
        drop(map);
        if now_idle {
            self.shared.idle.notify_waiters();
        }
    }
}

impl Drop for FlightGuard {
    fn drop(&mut self) {
        self.leave_table();
        // The sender drops after this: if no outcome was sent, waiters see the
        // channel close and compete to own a new flight.
    }
}

/// One caller's place in a flight; counted while it exists.
#[derive(Debug)]
pub struct WaiterTicket {
    shared: Arc<FlightTable>,
    flight: Arc<Flight>,
}

/// How a wait ended.
pub enum Waited {
    Done(Outcome),
    /// The flight streams: here is its live log (only for waiters that asked).
    Live(LiveLog),
    /// The owner went away without an outcome.
    Abandoned,
    TimedOut,
}

impl WaiterTicket {
    fn new(shared: &Arc<FlightTable>, flight: Arc<Flight>) -> Self {
        flight.waiters.fetch_add(1, Ordering::AcqRel);
        shared.waiters.send_modify(|n| *n += 1);
        Self {
            shared: shared.clone(),
            flight,
        }
    }

    /// Waits for the outcome, at most until `deadline`.
    pub async fn wait(&self, deadline: tokio::time::Instant) -> Waited {
        self.wait_for(deadline, false).await
    }

    /// The flight's span, when the flight is traced.
    pub fn flight_trace(&self) -> Option<&FlightTrace> {
        self.flight.trace.get()
    }

    /// What the flight's owner sends, once it said.
    pub fn owner_sends(&self) -> Option<Sent> {
        self.flight.sends.get().copied()
    }

    /// Waits for the outcome or, when `live` and the flight streams, its log:
    /// a streaming caller relays the stream as it arrives instead of waiting for its end.
    pub async fn wait_for(&self, deadline: tokio::time::Instant, live: bool) -> Waited {
        let mut result = self.flight.result.clone();
        let mut stream = self.flight.stream.clone();
        let log = async {
            // Bound first: a `watch::Ref` must not live across the await below.
            let found = stream
                .wait_for(Option::is_some)
                .await
                .map(|log| log.clone());
            match found {
                Ok(log) => log,
                // The flight ended without streaming: only the outcome will come.
                Err(_) => std::future::pending().await,
            }
        };
        let outcome = async { result.wait_for(Option::is_some).await.map(|_| ()) };
        let waited = tokio::time::timeout_at(deadline, async {
            tokio::select! {
                biased;
                log = log, if live => Ok(Some(log)),
                outcome = outcome => outcome.map(|_| None),
            }
        })
        .await;
        let waited = match waited {
            Ok(Ok(Some(log))) => return Waited::Live(log.expect("waited for Some")),
            Ok(Ok(None)) => Ok(Ok(self.flight.result.borrow().clone())),
            Ok(Err(closed)) => Ok(Err(closed)),
            Err(elapsed) => Err(elapsed),
        };
        match waited {
            Err(_) => Waited::TimedOut,
            Ok(Err(_closed)) => Waited::Abandoned,
            Ok(Ok(Some(outcome))) => Waited::Done(outcome),
            Ok(Ok(None)) => Waited::Abandoned,
        }
    }
}

impl Drop for WaiterTicket {
    fn drop(&mut self) {
        self.flight.waiters.fetch_sub(1, Ordering::AcqRel);
        self.shared
            .waiters
            .send_modify(|n| *n = n.saturating_sub(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        fingerprint::{Endpoint, KeyInput},
        tenant::TenantScope,
    };

    fn fingerprint(n: u8) -> Fingerprint {
        Fingerprint::of(&KeyInput {
            endpoint: Endpoint::ChatCompletions,
            upstream: "u",
            scope: &TenantScope::global(),
            headers: &[],
            query: &[],
            body: &[n],
        })
    }

    fn far() -> tokio::time::Instant {
        tokio::time::Instant::now() + Duration::from_secs(60)
    }

    #[tokio::test]
    async fn first_caller_owns_the_rest_follow_and_the_flight_ends() {
        let flights = Flights::default();
        let Role::Owner(guard, _owner) = flights.join(fingerprint(1), 10, 100).unwrap() else {
            panic!("first caller must own");
        };
        let Role::Follower(follower) = flights.join(fingerprint(1), 10, 100).unwrap() else {
            panic!("second caller must follow");
        };
        assert_eq!(*flights.waiters().borrow(), 2);
        guard.complete(Err(Arc::new(GatewayError::WaitTimedOut)));
        assert_eq!(flights.in_flight(), 0);
        assert!(matches!(follower.wait(far()).await, Waited::Done(Err(_))));
        // The next caller starts afresh.
        assert!(matches!(
            flights.join(fingerprint(1), 10, 100).unwrap(),
            Role::Owner(..)
        ));
    }

    #[tokio::test]
    async fn a_dropped_guard_abandons_the_flight() {
        let flights = Flights::default();
        let Role::Owner(guard, _owner) = flights.join(fingerprint(2), 10, 100).unwrap() else {
            panic!("first caller must own");
        };
        let Role::Follower(follower) = flights.join(fingerprint(2), 10, 100).unwrap() else {
            panic!("second caller must follow");
        };
        drop(guard);
        assert!(matches!(follower.wait(far()).await, Waited::Abandoned));
        assert_eq!(flights.in_flight(), 0);
        flights.idle().await;
    }

    #[tokio::test]
    async fn waiters_beyond_the_cap_are_refused() {
        let flights = Flights::default();
        let _owner = flights.join(fingerprint(3), 2, 100).unwrap();
        let _second = flights.join(fingerprint(3), 2, 100).unwrap();
        assert!(matches!(
            flights.join(fingerprint(3), 2, 100),
            Err(GatewayError::TooManyWaiters { .. })
        ));
    }

    #[tokio::test]
    async fn waiters_beyond_the_global_cap_are_refused() {
        let flights = Flights::default();
        let _a = flights.join(fingerprint(5), 10, 2).unwrap();
        let _b = flights.join(fingerprint(6), 10, 2).unwrap();
        assert!(matches!(
            flights.join(fingerprint(7), 10, 2),
            Err(GatewayError::TooManyWaiters { .. })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn waits_are_bounded() {
        let flights = Flights::default();
        let Role::Owner(_guard, ticket) = flights.join(fingerprint(4), 10, 100).unwrap() else {
            panic!("first caller must own");
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        assert!(matches!(ticket.wait(deadline).await, Waited::TimedOut));
    }
}
