//! Flights by the item: a request made of independent items (an embeddings
//! batch) whose items each have their own key, entry and flight, while the
//! items nobody has yet go upstream together, in one call.
//!
//! A caller's items are first read from the cache; each miss then joins the
//! [`Flights`] table under its own fingerprint. Items whose flight this caller
//! starts make one *batch flight*: a detached task that (with Redis) contends
//! for each item's cluster lock, follows the items another instance is
//! embedding, calls the loader once for the rest, stores every item, records
//! and announces it for remote followers, and completes each item's local
//! flight. Items whose flight another caller started are waited on like any
//! follower's. So `[a, b]` and `[b, c]` sent together cost `a`, `b` and `c`
//! once each, on one instance or several.
//!
//! A failed batch caches nothing and records nothing: its owner's caller gets
//! the error, and its items' flights are abandoned, so a caller that merely
//! shared an item (its own batch may be fine) elects a new owner and embeds it
//! in a batch of its own, bounded by [`MAX_ELECTIONS`].

use std::{
    collections::{HashMap, HashSet},
    pin::pin,
    sync::Arc,
    time::Duration,
};

use futures::{
    StreamExt as _,
    future::{BoxFuture, Either},
    stream,
};
use tokio::{sync::oneshot, time::Instant};
use tracing::Instrument as _;

use super::{
    CacheStatus, Coalescer, Fetched, FlightContext, FlightGuard, MAX_ELECTIONS, Role, Source,
    Waited, fresh_entry,
};
use crate::{
    cache::{Entry, Freshness, StoredResponse, codec::FlightRecord},
    cluster::{Cluster, Follow, Lease, LockAttempt},
    error::GatewayError,
    fingerprint::CacheKey,
    request::CachePolicy,
    usage::Usage,
};

/// Cache reads, lock attempts, records and follows of one batch in progress at
/// once: enough to keep a connection busy, few enough that a 2,048-item batch
/// does not queue its operations past `redis.op_timeout` and open the breaker.
const PARALLELISM: usize = 32;

/// What a batch loader produced: one response per item asked for, in the order
/// asked, and what the one upstream call cost.
#[derive(Debug)]
pub struct ItemsLoaded {
    pub items: Vec<StoredResponse>,
    /// The call's `usage` (`None`: the provider sent none).
    pub usage: Option<Usage>,
    pub compute_time: Duration,
}

/// Makes one upstream call for the items at the given positions of the
/// caller's key list. A partial answer is the loader's error, never a short list.
pub type BatchLoader =
    Arc<dyn Fn(BatchCall) -> BoxFuture<'static, Result<ItemsLoaded, GatewayError>> + Send + Sync>;

/// What a batch flight asks its loader for.
#[derive(Debug, Clone)]
pub struct BatchCall {
    /// The items' positions in the caller's key list.
    pub items: Vec<usize>,
    /// The call refreshes stale items in the background: the gateway's own
    /// (see `FlightCall::background`).
    pub background: bool,
}

/// How one item reached its caller.
#[derive(Debug, Clone)]
pub struct ItemServed {
    pub response: Arc<StoredResponse>,
    pub status: CacheStatus,
}

/// Every item of a caller's batch, in the order of its keys.
#[derive(Debug)]
pub struct ItemsServed {
    pub items: Vec<ItemServed>,
    /// The upstream calls made for this caller's own flights, summed (what it
    /// was billed): `None` when there were none; `Some` with `unknown` when a
    /// call reported no usage.
    pub billed: Option<Billed>,
}

/// Usage of the upstream calls a caller's batch made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Billed {
    pub usage: Usage,
    pub calls: u64,
    /// Calls whose usage the provider did not report (not counted in `usage`).
    pub unknown: u64,
}

impl Billed {
    fn add(&mut self, usage: Option<Usage>) {
        self.calls += 1;
        match usage {
            Some(usage) => {
                self.usage.prompt_tokens += usage.prompt_tokens;
                self.usage.completion_tokens += usage.completion_tokens;
            }
            None => self.unknown += 1,
        }
    }

    fn merge(&mut self, other: Billed) {
        self.usage.prompt_tokens += other.usage.prompt_tokens;
        self.usage.completion_tokens += other.usage.completion_tokens;
        self.calls += other.calls;
        self.unknown += other.unknown;
    }
}

/// What a batch flight hands its owner: every owned item's result, and the
/// usage of the calls it made.
#[derive(Debug)]
struct BatchOutcome {
    items: Vec<(usize, Fetched)>,
    billed: Billed,
}

type BatchResult = Result<BatchOutcome, Arc<GatewayError>>;

impl Coalescer {
    /// Answers every item of `keys` (distinct keys) from the cache where it
    /// may, joins the flights already running for others, and sends the rest
    /// upstream in one call through `loader`. Every wait is bounded by
    /// `coalesce.wait_timeout`.
    pub async fn get_or_fetch_items(
        &self,
        keys: Arc<[CacheKey]>,
        policy: CachePolicy,
        loader: BatchLoader,
    ) -> Result<ItemsServed, Arc<GatewayError>> {
        let mut served: Vec<Option<ItemServed>> = vec![None; keys.len()];
        let mut pending: Vec<usize> = Vec::new();
        if policy.read {
            let entries: Vec<Option<Arc<Entry>>> = stream::iter(0..keys.len())
                .map(|i| {
                    let (cache, keys) = (self.context.cache.clone(), keys.clone());
                    async move { cache.get(&keys[i]).await }
                })
                .buffered(PARALLELISM)
                .collect()
                .await;
            let now = self.context.clock.now_ms();
            let mut stale = Vec::new();
            for (i, entry) in entries.into_iter().enumerate() {
                let Some(entry) = entry else {
                    pending.push(i);
                    continue;
                };
                let status = match Freshness::of(&entry, now, policy.max_age) {
                    Freshness::Fresh => CacheStatus::Hit,
                    Freshness::Stale => {
                        stale.push(i);
                        CacheStatus::Stale
                    }
                    Freshness::Unusable => {
                        pending.push(i);
                        continue;
                    }
                };
                served[i] = Some(ItemServed {
                    response: entry.response.clone(),
                    status,
                });
            }
            if !stale.is_empty() {
                self.refresh_items_in_background(&keys, &stale, loader.clone());
            }
        } else {
            pending.extend(0..keys.len());
        }

        let deadline = Instant::now() + self.config.wait_timeout;
        let mut billed: Option<Billed> = None;
        for _ in 0..MAX_ELECTIONS {
            if pending.is_empty() {
                break;
            }
            let mut owned = Vec::new();
            let mut followed = Vec::new();
            for &i in &pending {
                match self
                    .flights
                    .join(
                        keys[i].fingerprint,
                        self.config.max_waiters,
                        self.config.max_total_waiters,
                    )
                    .map_err(Arc::new)?
                {
                    Role::Owner(guard, ticket) => owned.push((i, guard, ticket)),
                    Role::Follower(ticket) => followed.push((i, ticket)),
                }
            }
            let owned_items: Vec<usize> = owned.iter().map(|(i, ..)| *i).collect();
            // The owner's tickets stay alive (counted as waiters) until its batch ends.
            let (guards, _owner_tickets): (Vec<_>, Vec<_>) = owned
                .into_iter()
                .map(|(i, guard, ticket)| ((i, guard), ticket))
                .unzip();
            let batch = (!guards.is_empty())
                .then(|| self.spawn_batch(keys.clone(), guards, policy, loader.clone()));
            let batch_wait = async move {
                match batch {
                    Some(receiver) => Some(tokio::time::timeout_at(deadline, receiver).await),
                    None => None,
                }
            };
            let follower_waits = futures::future::join_all(
                followed
                    .iter()
                    .map(|(i, ticket)| async move { (*i, ticket.wait(deadline).await) }),
            );
            let (batch, waited) = futures::future::join(batch_wait, follower_waits).await;

            let mut next = Vec::new();
            match batch {
                None => {}
                Some(Err(_elapsed)) => return Err(Arc::new(GatewayError::WaitTimedOut)),
                // The batch task ended without a word (it panicked): elect again.
                Some(Ok(Err(_closed))) => next.extend(owned_items),
                Some(Ok(Ok(Err(error)))) => return Err(error),
                Some(Ok(Ok(Ok(outcome)))) => {
                    billed.get_or_insert_default().merge(outcome.billed);
                    for (i, fetched) in outcome.items {
                        served[i] = Some(item_served(fetched, true));
                    }
                }
            }
            for (i, waited) in waited {
                match waited {
                    Waited::Done(Ok(fetched)) => served[i] = Some(item_served(fetched, false)),
                    Waited::Done(Err(error)) => return Err(error),
                    Waited::TimedOut => return Err(Arc::new(GatewayError::WaitTimedOut)),
                    // Its batch failed or vanished: this caller's own batch embeds it.
                    Waited::Abandoned | Waited::Live(_) => next.push(i),
                }
            }
            drop(followed);
            pending = next;
        }
        if !pending.is_empty() {
            return Err(Arc::new(GatewayError::Internal(anyhow::anyhow!(
                "{} items were abandoned {MAX_ELECTIONS} times",
                pending.len()
            ))));
        }
        let items = served
            .into_iter()
            .map(|item| item.expect("every item is served or the request failed"))
            .collect();
        Ok(ItemsServed { items, billed })
    }

    /// One background refresh for the stale items nobody refreshes yet, as one batch.
    fn refresh_items_in_background(
        &self,
        keys: &Arc<[CacheKey]>,
        stale: &[usize],
        loader: BatchLoader,
    ) {
        let guards: Vec<(usize, FlightGuard)> = stale
            .iter()
            .filter_map(|&i| {
                self.flights
                    .start_unattended(keys[i].fingerprint)
                    .map(|guard| (i, guard))
            })
            .collect();
        if guards.is_empty() {
            return;
        }
        // Nobody's request: the gateway's own call.
        let loader: BatchLoader = Arc::new(move |call: BatchCall| {
            loader(BatchCall {
                background: true,
                ..call
            })
        });
        // Stale entries are not fresh, so the double-check lets the refresh through.
        let policy = CachePolicy {
            read: true,
            write: true,
            max_age: None,
            bypass: false,
            revalidate: false,
            coalesce: true,
        };
        drop(self.spawn_batch(keys.clone(), guards, policy, loader));
    }

    /// Runs a batch flight on its own task, so the upstream call and the
    /// cache writes finish even when the caller that started it disconnects.
    fn spawn_batch(
        &self,
        keys: Arc<[CacheKey]>,
        guards: Vec<(usize, FlightGuard)>,
        policy: CachePolicy,
        loader: BatchLoader,
    ) -> oneshot::Receiver<BatchResult> {
        let (sender, receiver) = oneshot::channel();
        let context = self.context.clone();
        let span = tracing::info_span!("flight", items = guards.len());
        let traced = crate::traces::batch_context(guards.len());
        let batch = async move {
            let owned: Vec<usize> = guards.iter().map(|(i, _)| *i).collect();
            let result = run_batch(context, keys, owned, policy, loader).await;
            match &result {
                Ok(outcome) => {
                    let mut guards: HashMap<usize, FlightGuard> = guards.into_iter().collect();
                    for (i, fetched) in &outcome.items {
                        if let Some(guard) = guards.remove(i) {
                            guard.complete(Ok(fetched.clone()));
                        }
                    }
                }
                // Nothing recorded, nothing stored: other callers' items elect anew.
                Err(_) => drop(guards),
            }
            let _ = sender.send(result);
        }
        .instrument(span);
        match traced {
            None => self.tasks.spawn(batch),
            Some(cx) => self
                .tasks
                .spawn(opentelemetry::context::FutureExt::with_context(batch, cx)),
        };
        receiver
    }
}

fn item_served(fetched: Fetched, owner: bool) -> ItemServed {
    let status = match (owner, fetched.source) {
        (_, Source::Cache { .. }) => CacheStatus::Hit,
        (true, Source::Upstream) => CacheStatus::Miss,
        (false, Source::Upstream) | (_, Source::OtherInstance) => CacheStatus::Coalesced,
    };
    ItemServed {
        response: fetched.response,
        status,
    }
}

/// The batch flight: double-check, contend per item (with Redis), follow the
/// items other instances embed, load the rest in one call, store and record.
///
/// Everything it hands to concurrent Redis operations is owned (`Arc`s), so
/// the flight is a `'static` task whatever the combinators' lifetimes.
async fn run_batch(
    context: Arc<FlightContext>,
    keys: Arc<[CacheKey]>,
    owned: Vec<usize>,
    policy: CachePolicy,
    loader: BatchLoader,
) -> BatchResult {
    let mut outcome = BatchOutcome {
        items: Vec::with_capacity(owned.len()),
        billed: Billed::default(),
    };
    let mut pending = owned;
    let deadline = Instant::now() + context.wait_timeout;
    let Some(cluster) = context.cluster.clone() else {
        // Double-check: another flight may have stored an item since the caller's read.
        let pending = double_check(&context, &keys, pending, policy, &mut outcome).await;
        let loaded = load_items(&context, &keys, pending, policy, &loader).await?;
        outcome.absorb(loaded);
        return Ok(outcome);
    };
    for _ in 0..MAX_ELECTIONS {
        if pending.is_empty() {
            return Ok(outcome);
        }
        let contended = contend(&cluster, &keys, pending).await;
        // Double-check what is now ours: the previous owner may have just stored it.
        let locked: Vec<usize> = contended.leases.iter().map(|(i, _)| *i).collect();
        let missing: HashSet<usize> = double_check(&context, &keys, locked, policy, &mut outcome)
            .await
            .into_iter()
            .collect();
        let (leases, found): (Vec<_>, Vec<_>) = contended
            .leases
            .into_iter()
            .partition(|(i, _)| missing.contains(i));
        release_all(
            &cluster,
            found.into_iter().map(|(_, lease)| lease).collect(),
        )
        .await;
        let mut load = contended.unlocked;
        load.extend(leases.iter().map(|(i, _)| *i));
        load.sort_unstable();

        // Our items are recorded and released as soon as they are loaded,
        // never after the follows: two instances following each other's
        // items must not wait on each other's records.
        let loading = pin!(async {
            let lease_list: Vec<Lease> = leases.iter().map(|(_, lease)| lease.clone()).collect();
            let loaded = cluster
                .holding_all(
                    &lease_list,
                    load_items(&context, &keys, load, policy, &loader),
                )
                .await;
            match &loaded {
                Ok(loaded) => record_all(&context, &cluster, &keys, leases, &loaded.items).await,
                // No record: remote followers see the locks go and contend again.
                Err(_) => release_all(&cluster, lease_list).await,
            }
            loaded
        });
        let following = pin!(follow_all(&cluster, &keys, contended.held, deadline));
        let (loaded, followed) = match futures::future::select(loading, following).await {
            // A failed call fails the batch at once, whatever it still follows.
            Either::Left((Err(error), _)) => return Err(error),
            Either::Left((Ok(loaded), following)) => (loaded, following.await),
            Either::Right((followed, loading)) => (loading.await?, followed),
        };
        outcome.absorb(loaded);
        outcome.items.extend(followed.done);
        if followed.timed_out {
            return Err(Arc::new(GatewayError::WaitTimedOut));
        }
        pending = followed.vacant;
        if followed.unavailable {
            // Redis failed under us: embed the rest here (fail open).
            break;
        }
    }
    let loaded = load_items(&context, &keys, pending, policy, &loader).await?;
    outcome.absorb(loaded);
    Ok(outcome)
}

impl BatchOutcome {
    fn absorb(&mut self, loaded: LoadedItems) {
        self.billed.merge(loaded.billed);
        self.items.extend(loaded.items);
    }
}

/// Moves the items with a fresh entry into `outcome`; returns the others.
async fn double_check(
    context: &Arc<FlightContext>,
    keys: &Arc<[CacheKey]>,
    items: Vec<usize>,
    policy: CachePolicy,
    outcome: &mut BatchOutcome,
) -> Vec<usize> {
    if !policy.read || items.is_empty() {
        return items;
    }
    let entries: Vec<(usize, Option<Arc<Entry>>)> = stream::iter(items)
        .map(|i| {
            let (context, keys) = (context.clone(), keys.clone());
            async move { (i, fresh_entry(&context, &keys[i], policy).await) }
        })
        .buffered(PARALLELISM)
        .collect()
        .await;
    let mut rest = Vec::new();
    for (i, entry) in entries {
        match entry {
            Some(entry) => outcome.items.push((
                i,
                Fetched {
                    response: entry.response.clone(),
                    stored: false,
                    source: Source::Cache {
                        stored_at_ms: entry.stored_at_ms,
                    },
                },
            )),
            None => rest.push(i),
        }
    }
    rest
}

/// What a batch's items loaded, with the usage of the call.
struct LoadedItems {
    items: Vec<(usize, Fetched)>,
    billed: Billed,
}

/// One upstream call for `items` (none when empty), then every item stored
/// (when the policy allows) before anyone is told.
async fn load_items(
    context: &Arc<FlightContext>,
    keys: &Arc<[CacheKey]>,
    items: Vec<usize>,
    policy: CachePolicy,
    loader: &BatchLoader,
) -> Result<LoadedItems, Arc<GatewayError>> {
    if items.is_empty() {
        return Ok(LoadedItems {
            items: Vec::new(),
            billed: Billed::default(),
        });
    }
    let loaded = loader(BatchCall {
        items: items.clone(),
        background: false,
    })
    .await
    .map_err(Arc::new)?;
    if loaded.items.len() != items.len() {
        return Err(Arc::new(GatewayError::Internal(anyhow::anyhow!(
            "the batch loader answered {} items for {}",
            loaded.items.len(),
            items.len()
        ))));
    }
    let mut billed = Billed::default();
    billed.add(loaded.usage);
    let now = context.clock.now_ms();
    let fetched: Vec<(usize, Fetched)> = items
        .into_iter()
        .zip(loaded.items)
        .map(|(i, response)| {
            (
                i,
                Fetched {
                    response: Arc::new(response),
                    stored: policy.write,
                    source: Source::Upstream,
                },
            )
        })
        .collect();
    if policy.write {
        let compute_time = loaded.compute_time;
        let writes: Vec<(usize, Arc<StoredResponse>)> = fetched
            .iter()
            .map(|(i, item)| (*i, item.response.clone()))
            .collect();
        stream::iter(writes)
            .for_each_concurrent(PARALLELISM, |(i, response)| {
                let (context, keys) = (context.clone(), keys.clone());
                async move {
                    let (soft, hard) = context.ttl.expiries(now, &mut rand::rng());
                    let entry = Entry {
                        response,
                        stored_at_ms: now,
                        soft_expires_at_ms: soft,
                        hard_expires_at_ms: hard,
                        compute_time,
                    };
                    context.cache.put(&keys[i], Arc::new(entry)).await;
                }
            })
            .await;
    }
    Ok(LoadedItems {
        items: fetched,
        billed,
    })
}

/// How a batch's items fared at the cluster locks.
struct Contended {
    leases: Vec<(usize, Lease)>,
    /// Held by another instance's flight: item and holder token.
    held: Vec<(usize, String)>,
    /// Redis unavailable for these: embedded here without a lock (fail open).
    unlocked: Vec<usize>,
}

async fn contend(cluster: &Arc<Cluster>, keys: &Arc<[CacheKey]>, items: Vec<usize>) -> Contended {
    let attempts: Vec<_> = stream::iter(items)
        .map(|i| {
            let (cluster, keys) = (cluster.clone(), keys.clone());
            async move { (i, cluster.try_lock(&keys[i]).await) }
        })
        .buffer_unordered(PARALLELISM)
        .collect()
        .await;
    let mut contended = Contended {
        leases: Vec::new(),
        held: Vec::new(),
        unlocked: Vec::new(),
    };
    for (i, attempt) in attempts {
        match attempt {
            Ok(LockAttempt::Acquired(lease)) => contended.leases.push((i, lease)),
            Ok(LockAttempt::Held(token)) => contended.held.push((i, token)),
            Err(_unavailable) => contended.unlocked.push(i),
        }
    }
    contended.leases.sort_unstable_by_key(|(i, _)| *i);
    contended
}

/// How following other instances' items ended.
#[derive(Default)]
struct Followed {
    done: Vec<(usize, Fetched)>,
    /// No owner and no record (the owner's batch failed or it died): contend again.
    vacant: Vec<usize>,
    unavailable: bool,
    timed_out: bool,
}

async fn follow_all(
    cluster: &Arc<Cluster>,
    keys: &Arc<[CacheKey]>,
    held: Vec<(usize, String)>,
    deadline: Instant,
) -> Followed {
    let follows: Vec<(usize, Follow)> = stream::iter(held)
        .map(|(i, token)| {
            let (cluster, keys) = (cluster.clone(), keys.clone());
            async move { (i, cluster.follow(&keys[i], token, deadline).await) }
        })
        .buffer_unordered(PARALLELISM)
        .collect()
        .await;
    let mut followed = Followed::default();
    for (i, follow) in follows {
        match follow {
            Follow::Done(record) if !record.failed => followed.done.push((
                i,
                Fetched {
                    response: record.response,
                    stored: false,
                    source: Source::OtherInstance,
                },
            )),
            Follow::Done(_) | Follow::Vacant => followed.vacant.push(i),
            Follow::Unavailable => {
                followed.vacant.push(i);
                followed.unavailable = true;
            }
            Follow::TimedOut => followed.timed_out = true,
        }
    }
    followed.vacant.sort_unstable();
    followed
}

/// For each item embedded under a lease: the record remote followers read,
/// the announcement that wakes them, then the lease released. Best effort, as
/// for single flights: a follower that misses them sees the lock go.
async fn record_all(
    context: &Arc<FlightContext>,
    cluster: &Arc<Cluster>,
    keys: &Arc<[CacheKey]>,
    leases: Vec<(usize, Lease)>,
    items: &[(usize, Fetched)],
) {
    let responses: HashMap<usize, Arc<StoredResponse>> = items
        .iter()
        .map(|(i, fetched)| (*i, fetched.response.clone()))
        .collect();
    let now = context.clock.now_ms();
    let error_ttl = context.error_ttl;
    let work: Vec<(usize, Lease, Option<Arc<StoredResponse>>)> = leases
        .into_iter()
        .map(|(i, lease)| {
            let response = responses.get(&i).cloned();
            (i, lease, response)
        })
        .collect();
    stream::iter(work)
        .for_each_concurrent(PARALLELISM, |(i, lease, response)| {
            let (cluster, keys) = (cluster.clone(), keys.clone());
            async move {
                let key = &keys[i];
                if let Some(response) = response {
                    let record = FlightRecord {
                        token: lease.token.clone(),
                        failed: false,
                        response,
                        recorded_at_ms: now,
                        sends: None,
                    };
                    let _ = cluster.put_record(key, &record, error_ttl).await;
                    let _ = cluster.announce(key).await;
                }
                let _ = cluster.release(&lease).await;
            }
        })
        .await;
}

async fn release_all(cluster: &Arc<Cluster>, leases: Vec<Lease>) {
    stream::iter(leases)
        .for_each_concurrent(PARALLELISM, |lease| {
            let cluster = cluster.clone();
            async move {
                let _ = cluster.release(&lease).await;
            }
        })
        .await;
}
