//! Completion announcements, one channel per fingerprint: an instance
//! subscribes to `…:done:{fp}` when the first of its followers starts waiting
//! on a flight another instance owns, and unsubscribes when the last one
//! leaves, so it hears only about the flights it waits on. (One channel that
//! every instance heard made announcement traffic grow with instances ×
//! completions; ARCHITECTURE.md has the arithmetic.) In Redis Cluster mode
//! the channels are sharded (`SSUBSCRIBE`/`SPUBLISH`, Redis 7): the channel's
//! hash tag is the fingerprint's, so an announcement stays on the shard that
//! holds the flight's lock and record instead of crossing the cluster bus to
//! every node.
//!
//! Pub/sub loses messages, so: a follower registers interest and waits until
//! Redis confirmed the subscription *before* it reads the flight record (an
//! announcement can then not fall between the read and the subscription); one
//! subscriber task per process owns the connection, subscribes and
//! unsubscribes as interests come and go, reconnects by itself, and after a
//! reconnect (or a subscription the server dropped, when a slot moves) wakes
//! every follower of a resubscribed fingerprint to re-read. Followers keep a
//! backstop poll (in `Cluster::follow`). A lost announcement costs at most one
//! poll interval.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::{FutureExt as _, StreamExt, future::BoxFuture, stream::FuturesUnordered};
use redis::{PushInfo, PushKind, Value, cluster::ClusterClient, cluster_async::ClusterConnection};
use tokio::sync::{Notify, mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::{
    Keys,
    connection::{reconnect_delays, wait_to_reconnect},
};
use crate::fingerprint::Fingerprint;

/// The local followers' interests, by fingerprint, and what the subscriber
/// has made of them.
#[derive(Debug)]
pub struct Dispatch {
    state: Mutex<State>,
    /// Wakes the subscriber: a fingerprint's first interest came or its last one left.
    changed: Notify,
    /// Whether the subscriber's connection is up right now.
    subscribed: watch::Sender<bool>,
    /// Channels subscribed right now (tests wait on it).
    channels: watch::Sender<usize>,
    /// Followers parked in their wait right now, past their reads (tests wait on it).
    parked: watch::Sender<usize>,
    counts: Counts,
}

#[derive(Debug, Default)]
struct State {
    slots: HashMap<Fingerprint, Slot>,
    /// Fingerprints whose wish changed since the subscriber last looked.
    dirty: HashSet<Fingerprint>,
}

#[derive(Debug)]
struct Slot {
    /// One per registered interest (several followers of one fingerprint may wait).
    waiters: Vec<Arc<Notify>>,
    /// Whether Redis confirmed the subscription to this fingerprint's channel.
    live: watch::Sender<bool>,
}

#[derive(Debug, Default)]
struct Counts {
    received: AtomicU64,
    subscribes: AtomicU64,
    unsubscribes: AtomicU64,
    woken_by_announcement: AtomicU64,
    woken_by_poll: AtomicU64,
}

/// What this instance's announcement machinery did since start: what the
/// scale model (ARCHITECTURE.md) counts, and what the tests assert.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AnnounceCounts {
    /// Announcements this instance's subscriber received.
    pub received: u64,
    /// `SUBSCRIBE`/`SSUBSCRIBE` commands confirmed by Redis.
    pub subscribes: u64,
    /// `UNSUBSCRIBE`/`SUNSUBSCRIBE` commands confirmed by Redis.
    pub unsubscribes: u64,
    /// Follower waits ended by an announcement (or a resubscription).
    pub woken_by_announcement: u64,
    /// Follower waits ended by the backstop poll.
    pub woken_by_poll: u64,
    /// Announcements this instance published (as a flight's cluster owner).
    pub published: u64,
    /// Subscribers those announcements reached, as Redis counted them.
    pub delivered: u64,
}

/// A registered wish to hear about one fingerprint; unregisters on drop.
pub struct Interest {
    dispatch: Arc<Dispatch>,
    fingerprint: Fingerprint,
    notify: Arc<Notify>,
    live: watch::Receiver<bool>,
}

impl Interest {
    /// Resolves on an announcement for the fingerprint, or a resubscription.
    /// A notification that came before this call is not lost (`Notify` keeps a permit).
    pub async fn notified(&self) {
        self.notify.notified().await;
    }

    /// Waits until Redis confirmed the subscription to the fingerprint's
    /// channel, at most `bound`, and at once while the subscriber is not
    /// connected (the backstop poll covers that). Whether it is confirmed.
    pub async fn live(&mut self, bound: Duration) -> bool {
        if *self.live.borrow() {
            return true;
        }
        let mut connection = self.dispatch.subscribed.subscribe();
        if !*connection.borrow() {
            return false;
        }
        let confirmed = async {
            tokio::select! {
                live = self.live.wait_for(|live| *live) => live.is_ok(),
                _ = connection.wait_for(|up| !*up) => false,
            }
        };
        tokio::time::timeout(bound, confirmed)
            .await
            .unwrap_or(false)
    }
}

impl Drop for Interest {
    fn drop(&mut self) {
        let mut state = self.dispatch.lock();
        let Some(slot) = state.slots.get_mut(&self.fingerprint) else {
            return;
        };
        slot.waiters.retain(|n| !Arc::ptr_eq(n, &self.notify));
        if slot.waiters.is_empty() {
            state.slots.remove(&self.fingerprint);
            state.dirty.insert(self.fingerprint);
            self.dispatch.changed.notify_one();
        }
    }
}

/// A follower parked in its wait (see [`Dispatch::park`]).
pub struct Parked(Arc<Dispatch>);

impl Drop for Parked {
    fn drop(&mut self) {
        self.0.parked.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// Why a follower's wait ended.
#[derive(Debug, Clone, Copy)]
pub enum Wake {
    Announcement,
    Poll,
}

impl Default for Dispatch {
    fn default() -> Self {
        Self {
            state: Mutex::default(),
            changed: Notify::new(),
            subscribed: watch::Sender::new(false),
            channels: watch::Sender::new(0),
            parked: watch::Sender::new(0),
            counts: Counts::default(),
        }
    }
}

impl Dispatch {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers interest in `fingerprint`; the first interest of a
    /// fingerprint asks the subscriber to subscribe to its channel.
    pub fn register(self: &Arc<Self>, fingerprint: Fingerprint) -> Interest {
        let notify = Arc::new(Notify::new());
        let live = {
            let mut state = self.lock();
            let State { slots, dirty } = &mut *state;
            let slot = slots.entry(fingerprint).or_insert_with(|| {
                dirty.insert(fingerprint);
                self.changed.notify_one();
                Slot {
                    waiters: Vec::new(),
                    live: watch::Sender::new(false),
                }
            });
            slot.waiters.push(notify.clone());
            slot.live.subscribe()
        };
        Interest {
            dispatch: self.clone(),
            fingerprint,
            notify,
            live,
        }
    }

    fn announce(&self, fingerprint: &Fingerprint) {
        self.counts.received.fetch_add(1, Ordering::Relaxed);
        if let Some(slot) = self.lock().slots.get(fingerprint) {
            for notify in &slot.waiters {
                notify.notify_one();
            }
        }
    }

    fn take_dirty(&self) -> Vec<Fingerprint> {
        self.lock().dirty.drain().collect()
    }

    fn wants(&self, fingerprint: &Fingerprint) -> bool {
        self.lock().slots.contains_key(fingerprint)
    }

    fn wanted(&self) -> Vec<Fingerprint> {
        let mut state = self.lock();
        state.dirty.clear();
        state.slots.keys().copied().collect()
    }

    /// The channel is subscribed; `wake` its followers when announcements
    /// may have been lost before (a resubscription).
    fn set_live(&self, fingerprint: &Fingerprint, live: bool, wake: bool) {
        if let Some(slot) = self.lock().slots.get(fingerprint) {
            slot.live.send_replace(live);
            if wake {
                for notify in &slot.waiters {
                    notify.notify_one();
                }
            }
        }
    }

    fn all_down(&self) {
        for slot in self.lock().slots.values() {
            slot.live.send_replace(false);
        }
    }

    pub fn subscribed(&self) -> watch::Receiver<bool> {
        self.subscribed.subscribe()
    }

    /// The number of channels subscribed right now.
    pub fn channels(&self) -> watch::Receiver<usize> {
        self.channels.subscribe()
    }

    /// Marks a follower parked in its wait until the guard drops.
    pub fn park(self: &Arc<Self>) -> Parked {
        self.parked.send_modify(|n| *n += 1);
        Parked(self.clone())
    }

    /// The number of followers parked in their wait right now.
    pub fn parked(&self) -> watch::Receiver<usize> {
        self.parked.subscribe()
    }

    pub fn count_wake(&self, wake: Wake) {
        let counter = match wake {
            Wake::Announcement => &self.counts.woken_by_announcement,
            Wake::Poll => &self.counts.woken_by_poll,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn counts(&self) -> AnnounceCounts {
        let c = &self.counts;
        AnnounceCounts {
            received: c.received.load(Ordering::Relaxed),
            subscribes: c.subscribes.load(Ordering::Relaxed),
            unsubscribes: c.unsubscribes.load(Ordering::Relaxed),
            woken_by_announcement: c.woken_by_announcement.load(Ordering::Relaxed),
            woken_by_poll: c.woken_by_poll.load(Ordering::Relaxed),
            published: 0,
            delivered: 0,
        }
    }
}

/// Where the subscriber connects.
#[derive(Debug, Clone)]
pub enum Target {
    /// One Redis: a RESP2 pub/sub connection, plain `SUBSCRIBE` per channel.
    Single(String),
    /// Redis Cluster: a RESP3 cluster connection, `SSUBSCRIBE` per channel,
    /// routed to the node that owns the channel's slot.
    Cluster(Vec<String>),
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Subscribe,
    Unsubscribe,
}

/// What the connection reports.
enum Event {
    Message(Fingerprint),
    /// The server ended a subscription (a sharded channel's slot moved).
    Dropped(Fingerprint),
    /// The connection (or one node's, in a cluster) is gone.
    Lost,
}

/// The subscriber's connection: commands on one side, events on the other.
enum Link {
    Single(redis::aio::PubSubSink),
    Cluster(ClusterConnection),
}

impl Link {
    async fn connect(
        target: &Target,
        keys: &Keys,
        timeout: Duration,
    ) -> redis::RedisResult<(Self, mpsc::UnboundedReceiver<Event>)> {
        // Unbounded, as the client library's own message queue is: the server
        // bounds what it buffers for a subscriber (client-output-buffer-limit
        // pubsub), and each event costs one map lookup here.
        let (events, receiver) = mpsc::unbounded_channel();
        match target {
            Target::Single(url) => {
                let client = redis::Client::open(url.as_str())?;
                let (sink, mut stream) = client.get_async_pubsub().await?.split();
                let keys = keys.clone();
                tokio::spawn(async move {
                    // Ends with the connection, or when the subscriber moved on
                    // to a new one (the receiver is gone): the old connection closes.
                    loop {
                        let message = tokio::select! {
                            message = stream.next() => message,
                            _ = events.closed() => return,
                        };
                        let Some(message) = message else { break };
                        if let Some(fingerprint) =
                            keys.fingerprint_of_channel(message.get_channel_name().as_bytes())
                        {
                            if events.send(Event::Message(fingerprint)).is_err() {
                                return;
                            }
                        }
                    }
                    let _ = events.send(Event::Lost);
                });
                Ok((Self::Single(sink), receiver))
            }
            Target::Cluster(urls) => {
                let keys = keys.clone();
                let client = ClusterClient::builder(urls.clone())
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    .retries(1)
                    .use_protocol(redis::ProtocolVersion::RESP3)
                    .push_sender(move |push: PushInfo| {
                        let event = match push.kind {
                            PushKind::SMessage => channel_of(&push)
                                .and_then(|c| keys.fingerprint_of_channel(c))
                                .map(Event::Message),
                            PushKind::SUnsubscribe => channel_of(&push)
                                .and_then(|c| keys.fingerprint_of_channel(c))
                                .map(Event::Dropped),
                            PushKind::Disconnection => Some(Event::Lost),
                            _ => None,
                        };
                        match event {
                            Some(event) => events.send(event).map_err(|_| redis::aio::SendError),
                            None => Ok(()),
                        }
                    })
                    .build()?;
                Ok((
                    Self::Cluster(client.get_async_connection().await?),
                    receiver,
                ))
            }
        }
    }

    /// One channel per command: the pub/sub sink pairs each reply with one
    /// request, and `SUBSCRIBE a b` answers twice.
    fn run(&self, op: Op, channel: String) -> BoxFuture<'static, redis::RedisResult<()>> {
        match (self, op) {
            (Self::Single(sink), Op::Subscribe) => {
                let mut sink = sink.clone();
                async move { sink.subscribe(channel).await }.boxed()
            }
            (Self::Single(sink), Op::Unsubscribe) => {
                let mut sink = sink.clone();
                async move { sink.unsubscribe(channel).await }.boxed()
            }
            (Self::Cluster(conn), Op::Subscribe) => {
                let mut conn = conn.clone();
                async move { conn.ssubscribe(channel).await }.boxed()
            }
            (Self::Cluster(conn), Op::Unsubscribe) => {
                let mut conn = conn.clone();
                async move { conn.sunsubscribe(channel).await }.boxed()
            }
        }
    }
}

fn channel_of(push: &PushInfo) -> Option<&[u8]> {
    match push.data.first() {
        Some(Value::BulkString(channel)) => Some(channel),
        _ => None,
    }
}

/// Runs the subscriber until `stop`: connect, keep the subscriptions equal to
/// the interests, dispatch announcements, and on any loss reconnect with
/// backoff and jitter.
pub async fn run_subscriber(
    target: Target,
    keys: Keys,
    dispatch: Arc<Dispatch>,
    op_timeout: Duration,
    stop: CancellationToken,
) {
    let timeout = op_timeout.max(Duration::from_millis(500));
    let mut delays = reconnect_delays();
    loop {
        let connected = tokio::select! {
            _ = stop.cancelled() => return,
            connected = tokio::time::timeout(timeout, Link::connect(&target, &keys, timeout)) => connected,
        };
        if let Ok(Ok((link, events))) = connected {
            delays = reconnect_delays();
            dispatch.subscribed.send_replace(true);
            tracing::debug!("announcement subscriber connected");
            if serve(&link, events, &keys, &dispatch, timeout, &stop)
                .await
                .is_break()
            {
                return;
            }
            dispatch.subscribed.send_replace(false);
            dispatch.all_down();
            dispatch.channels.send_replace(0);
            tracing::warn!("announcement subscriber lost its connection; reconnecting");
        }
        // What changed meanwhile is read afresh from the interests on the next connection.
        let _ = dispatch.take_dirty();
        if !wait_to_reconnect(&mut delays, &stop).await {
            return;
        }
    }
}

/// One connection's life. `Break` when stopped, `Continue` when the
/// connection is lost (reconnect).
async fn serve(
    link: &Link,
    mut events: mpsc::UnboundedReceiver<Event>,
    keys: &Keys,
    dispatch: &Dispatch,
    timeout: Duration,
    stop: &CancellationToken,
) -> std::ops::ControlFlow<()> {
    use std::ops::ControlFlow::{Break, Continue};
    // Subscribed channels, and those with a command under way (at most one
    // per channel, so a subscribe and an unsubscribe never race).
    let mut actual: HashSet<Fingerprint> = HashSet::new();
    let mut in_flight: HashSet<Fingerprint> = HashSet::new();
    let mut pending = FuturesUnordered::new();
    // Everything wanted now is subscribed anew, and its followers re-read once
    // it is: announcements sent while no subscriber was connected are lost.
    let mut rewake: HashSet<Fingerprint> = dispatch.wanted().into_iter().collect();
    let mut todo: Vec<Fingerprint> = rewake.iter().copied().collect();
    loop {
        for fingerprint in todo.drain(..) {
            if in_flight.contains(&fingerprint) {
                continue; // looked at again when that command ends
            }
            let op = match (dispatch.wants(&fingerprint), actual.contains(&fingerprint)) {
                (true, false) => Op::Subscribe,
                (false, true) => Op::Unsubscribe,
                (true, true) => continue,
                (false, false) => {
                    rewake.remove(&fingerprint);
                    continue;
                }
            };
            in_flight.insert(fingerprint);
            let command = link.run(op, keys.done_channel(&fingerprint));
            pending.push(async move {
                let result = tokio::time::timeout(timeout, command).await;
                (fingerprint, op, result)
            });
        }
        tokio::select! {
            _ = stop.cancelled() => return Break(()),
            _ = dispatch.changed.notified() => todo.extend(dispatch.take_dirty()),
            Some((fingerprint, op, result)) = pending.next(), if !pending.is_empty() => {
                in_flight.remove(&fingerprint);
                match result {
                    Ok(Ok(())) => match op {
                        Op::Subscribe => {
                            dispatch.counts.subscribes.fetch_add(1, Ordering::Relaxed);
                            actual.insert(fingerprint);
                            dispatch.set_live(&fingerprint, true, rewake.remove(&fingerprint));
                        }
                        Op::Unsubscribe => {
                            dispatch.counts.unsubscribes.fetch_add(1, Ordering::Relaxed);
                            actual.remove(&fingerprint);
                        }
                    },
                    Ok(Err(err)) => {
                        tracing::warn!(error = %err, "announcement subscription failed");
                        return Continue(());
                    }
                    Err(_) => {
                        tracing::warn!("announcement subscription unanswered");
                        return Continue(());
                    }
                }
                dispatch.channels.send_replace(actual.len());
                // The wish may have changed while the command ran.
                todo.push(fingerprint);
            }
            event = events.recv() => match event {
                Some(Event::Message(fingerprint)) => dispatch.announce(&fingerprint),
                // Our own unsubscribe's reply comes this way too: only a
                // subscription we hold and did not end was dropped by the server.
                Some(Event::Dropped(fingerprint)) => {
                    if actual.contains(&fingerprint) && !in_flight.contains(&fingerprint) {
                        actual.remove(&fingerprint);
                        dispatch.set_live(&fingerprint, false, false);
                        dispatch.channels.send_replace(actual.len());
                        rewake.insert(fingerprint);
                        todo.push(fingerprint);
                    }
                }
                Some(Event::Lost) | None => return Continue(()),
            },
        }
    }
}
