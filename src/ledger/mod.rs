//! The books: exact counts of what corral served, spent and saved, kept per
//! instance and added into one cluster-wide ledger in Redis.
//!
//! Every counted event is *posted* to [`Books`] as integers (money in
//! picodollars). An answer is one post into a front buffer keyed by side,
//! model, tenant and upstream (one lookup on the hot path); the buffer is
//! folded into per-counter [`Account`]s whenever they are read. Each instance keeps:
//! - `local`: everything since it started (what `/metrics` reports: Prometheus
//!   sums instances itself);
//! - `pending`: what it has not yet added to the cluster ledger.
//!
//! With Redis, [`Books::flush`] (once a second, and once more at shutdown) sends
//! `pending` as one [`Batch`] that the store adds exactly once (its id marks it
//! applied, so a batch whose reply was lost is resent, never counted twice), and
//! reads back the cluster's totals in the same step. `/stats` then shows those
//! totals plus what this instance has not sent yet: the whole cluster, surviving
//! restarts. While Redis is away nothing is lost: `pending` keeps growing and the
//! next flush that gets through adds it all. Money goes to Redis in whole
//! nanodollars (`HINCRBY` holds 2^63 of them, $9.2 billion); the sub-nanodollar
//! rest stays pending (shown by this instance only) until it adds up.
//!
//! Tenants are bounded: an instance tracks at most `ledger.max_tenants`
//! distinct tenants and the cluster ledger as many (the store folds later ones
//! into `other`); `/stats` shows the top few and sums the rest into `other`.

use std::{
    collections::{HashMap, HashSet},
    fmt,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::{pricing::PICOS_PER_NANO, usage::TokenKind};

/// The name every tenant or upstream beyond the tracked ones is counted under.
pub const OTHER: &str = "other";

/// The tenant the gateway's own calls are booked to: a background refresh
/// (STALE's, or XFetch's early one) that no caller's request made. No key
/// label may take the name, and no tenant scope is spelled so.
pub const GATEWAY: &str = "gateway";

mod account;

pub use account::{Account, Measure, Party, Side, member_name, split_member_name};

/// Counts by account; money in picodollars. A fast hasher: accounts are
/// bounded labels, never attacker-chosen keys, and one answer posts a dozen.
pub type Tally = HashMap<Account, u128, foldhash::fast::RandomState>;

/// One account's amounts on this instance.
#[derive(Debug, Clone, Copy, Default)]
struct Amounts {
    /// Since start.
    local: u128,
    /// Not yet added to the cluster ledger.
    pending: u128,
}

/// One addition to the cluster ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchLine {
    /// The hash field; for a tenant's line, the part before the tenant's name.
    pub field: String,
    /// The tenant's name, for the store to append (or to fold into `other`).
    pub tenant: Option<String>,
    /// Count, or nanodollars for money.
    pub delta: u64,
}

/// What one flush adds, applied at most once: `id` is unique per instance and flush.
#[derive(Debug, Clone)]
pub struct Batch {
    pub id: String,
    pub lines: Vec<BatchLine>,
    /// The same amounts as `lines`, as accounts (money in picodollars).
    tally: Tally,
}

impl Batch {
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }
}

/// Where the cluster ledger lives (Redis, through `Cluster`).
#[async_trait]
pub trait LedgerStore: Send + Sync + fmt::Debug {
    /// Adds `batch` unless a batch with its id was added before, and returns
    /// every field of the ledger with its cluster total.
    async fn add(&self, batch: &Batch) -> Result<Vec<(String, i64)>, LedgerUnavailable>;
}

/// The ledger could not be reached; the batch stays pending.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the cluster ledger is unavailable")]
pub struct LedgerUnavailable;

/// Whose totals a [`View`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Every instance that shares the Redis ledger, since it was created.
    Cluster,
    /// This instance since it started (no Redis, or not read yet).
    Instance,
}

/// Totals to report, and where they come from.
#[derive(Debug, Clone)]
pub struct View {
    pub scope: Scope,
    pub totals: Tally,
    /// When the cluster totals were read (Unix ms); `None` for an instance view.
    pub read_at_ms: Option<u64>,
    /// Whether the last attempt to reach the ledger failed (the view is then
    /// the last cluster totals read, plus everything counted here since).
    pub stale: bool,
}

/// Who one answer is counted for: the key of the per-answer front buffer.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AnswerKey {
    pub side: Side,
    /// How a saved answer was served (`hit`, `stale`, `coalesced`); `None` upstream.
    pub via: Option<&'static str>,
    pub model: Arc<str>,
    pub tenant: Arc<str>,
    pub upstream: Arc<str>,
    /// The pool member that answered (`pool/member`), for a pool's upstream
    /// answer; `None` for a saved answer or an upstream without members.
    pub member: Option<Arc<str>>,
}

/// What answers under one [`AnswerKey`] add up to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AnswerAmounts {
    pub answers: u64,
    /// Answers that carried no usage.
    pub unknown: u64,
    /// By [`TokenKind::ALL`] order.
    pub tokens: [u64; 5],
    pub picos: u128,
    /// Tokens of answers without a price.
    pub unpriced: u64,
}

impl AnswerAmounts {
    fn add(&mut self, other: &Self) {
        self.answers += other.answers;
        self.unknown += other.unknown;
        for (mine, theirs) in self.tokens.iter_mut().zip(other.tokens) {
            *mine += theirs;
        }
        self.picos += other.picos;
        self.unpriced += other.unpriced;
    }

    /// The accounts these answers add to.
    fn accounts(&self, key: &AnswerKey) -> Vec<(Account, u128)> {
        let side = key.side;
        let by = |party: Party, name: &Arc<str>, measure: Measure, amount: u128| {
            (
                Account::By {
                    party,
                    side,
                    measure,
                    name: name.clone(),
                },
                amount,
            )
        };
        let tokens: u64 = self.tokens.iter().sum();
        let mut lines = vec![
            by(
                Party::Tenant,
                &key.tenant,
                Measure::Answers,
                self.answers.into(),
            ),
            by(
                Party::Upstream,
                &key.upstream,
                Measure::Answers,
                self.answers.into(),
            ),
            by(Party::Tenant, &key.tenant, Measure::Tokens, tokens.into()),
            by(
                Party::Upstream,
                &key.upstream,
                Measure::Tokens,
                tokens.into(),
            ),
            by(Party::Tenant, &key.tenant, Measure::Cost, self.picos),
            by(Party::Upstream, &key.upstream, Measure::Cost, self.picos),
            (
                Account::Cost {
                    side,
                    model: key.model.clone(),
                },
                self.picos,
            ),
            (
                Account::UsageUnknown {
                    side,
                    model: key.model.clone(),
                },
                self.unknown.into(),
            ),
            (
                Account::Unpriced {
                    side,
                    model: key.model.clone(),
                },
                self.unpriced.into(),
            ),
        ];
        if let Some(member) = &key.member {
            lines.extend([
                by(Party::Member, member, Measure::Answers, self.answers.into()),
                by(Party::Member, member, Measure::Tokens, tokens.into()),
                by(Party::Member, member, Measure::Cost, self.picos),
            ]);
        }
        if let Some(via) = key.via {
            lines.push((
                Account::Saved {
                    model: key.model.clone(),
                    via: via.into(),
                },
                self.answers.into(),
            ));
        }
        for (kind, n) in TokenKind::ALL.into_iter().zip(self.tokens) {
            lines.push((
                Account::Tokens {
                    side,
                    kind,
                    model: key.model.clone(),
                },
                n.into(),
            ));
        }
        lines
    }
}

type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

#[derive(Debug, Default)]
struct State {
    /// Every account this instance counted, with what it has not sent yet.
    accounts: FastMap<Account, Amounts>,
    /// Answers posted since the last fold into `accounts`: one entry per
    /// answer key instead of a dozen account lines per answer, so counting an
    /// answer costs one lookup.
    answers: FastMap<AnswerKey, AnswerAmounts>,
    /// Counts kept outside the lock ([`Books::counter`]), folded into
    /// `accounts` like `answers`.
    counters: Vec<(Account, Arc<AtomicU64>)>,
    /// Sent, outcome unknown: resent as is until it is known to be applied.
    in_doubt: Option<Batch>,
    cluster: Option<Tally>,
    read_at_ms: Option<u64>,
    stale: bool,
    tenants: HashSet<Arc<str>, foldhash::fast::RandomState>,
    flushes: u64,
}

impl State {
    /// Moves the buffered answers into their accounts.
    fn fold(&mut self) {
        for (account, count) in &self.counters {
            let amount = count.swap(0, Ordering::Relaxed);
            if amount > 0 {
                let slot = self.accounts.entry(account.clone()).or_default();
                slot.local += u128::from(amount);
                slot.pending += u128::from(amount);
            }
        }
        let answers = std::mem::take(&mut self.answers);
        for (key, amounts) in &answers {
            for (account, amount) in amounts.accounts(key) {
                if amount > 0 {
                    let slot = self.accounts.entry(account).or_default();
                    slot.local += amount;
                    slot.pending += amount;
                }
            }
        }
    }

    /// `name` if it is a tracked tenant or there is room to track it, else `other`.
    fn bounded_tenant(&mut self, name: &Arc<str>, max: usize, other: &Arc<str>) -> Arc<str> {
        if self.tenants.contains(name) {
            return name.clone();
        }
        if self.tenants.len() < max {
            self.tenants.insert(name.clone());
            return name.clone();
        }
        other.clone()
    }
}

/// A count in the books, added to without their lock ([`Books::counter`]).
#[derive(Debug, Clone)]
pub struct LedgerCounter(Arc<AtomicU64>);

impl LedgerCounter {
    pub fn add(&self, amount: u64) {
        self.0.fetch_add(amount, Ordering::Relaxed);
    }
}

/// The instance's books; posting never waits on Redis.
#[derive(Debug)]
pub struct Books {
    state: Mutex<State>,
    /// One flush at a time: totals read by an older flush never replace newer ones.
    flushing: tokio::sync::Mutex<()>,
    max_tenants: usize,
    /// Unique per process: batch ids of two instances never collide.
    instance: String,
    other: Arc<str>,
}

impl Books {
    pub fn new(max_tenants: usize) -> Self {
        Self {
            state: Mutex::default(),
            flushing: tokio::sync::Mutex::new(()),
            max_tenants,
            instance: format!("{:016x}", rand::random::<u64>()),
            other: OTHER.into(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Every step leaves the state consistent; a panic elsewhere does not poison it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds `amounts` to the books (one lock for the lot). A tenant beyond the
    /// first `max_tenants` this instance has seen is counted as `other`.
    pub fn post(&self, amounts: impl IntoIterator<Item = (Account, u128)>) {
        let mut state = self.lock();
        for (mut account, amount) in amounts {
            if amount == 0 {
                continue;
            }
            if let Account::By {
                party: Party::Tenant,
                name,
                ..
            } = &mut account
            {
                *name = state.bounded_tenant(name, self.max_tenants, &self.other);
            }
            let amounts = state.accounts.entry(account).or_default();
            amounts.local += amount;
            amounts.pending += amount;
        }
    }

    /// A count of `account` that is added to without the books' lock (one
    /// atomic add), for the counts every request makes; the books fold it in
    /// whenever they are read or flushed. `account` names no tenant (tenants
    /// are bounded when posted), and each call registers a counter of its
    /// own, so callers make one per account and keep it.
    pub fn counter(&self, account: Account) -> LedgerCounter {
        debug_assert!(
            !matches!(
                account,
                Account::By {
                    party: Party::Tenant,
                    ..
                }
            ),
            "tenant accounts are bounded in `post`"
        );
        let count = Arc::new(AtomicU64::new(0));
        self.lock().counters.push((account, count.clone()));
        LedgerCounter(count)
    }

    /// Adds one answer (or several under one key): the hot path, one lookup.
    pub fn post_answer(&self, mut key: AnswerKey, amounts: &AnswerAmounts) {
        let mut state = self.lock();
        key.tenant = state.bounded_tenant(&key.tenant, self.max_tenants, &self.other);
        state.answers.entry(key).or_default().add(amounts);
    }

    /// Everything this instance counted since it started.
    pub fn local(&self) -> Tally {
        let mut state = self.lock();
        state.fold();
        let local = state
            .accounts
            .iter()
            .map(|(account, amounts)| (account.clone(), amounts.local));
        local.collect()
    }

    /// Visits every local account (for `/metrics`).
    pub fn for_each_local(&self, mut visit: impl FnMut(&Account, u128)) {
        let mut state = self.lock();
        state.fold();
        for (account, amounts) in &state.accounts {
            visit(account, amounts.local);
        }
    }

    /// The totals `/stats` reports: the cluster's when they have been read,
    /// else this instance's.
    pub fn view(&self) -> View {
        let mut state = self.lock();
        state.fold();
        let Some(cluster) = &state.cluster else {
            let local = state
                .accounts
                .iter()
                .map(|(account, amounts)| (account.clone(), amounts.local));
            return View {
                scope: Scope::Instance,
                totals: local.collect(),
                read_at_ms: None,
                stale: state.stale,
            };
        };
        let mut totals = cluster.clone();
        let in_doubt = state.in_doubt.iter().flat_map(|batch| &batch.tally);
        let pending = state
            .accounts
            .iter()
            .map(|(account, amounts)| (account, &amounts.pending));
        for (account, amount) in in_doubt.chain(pending) {
            if *amount > 0 {
                *totals.entry(account.clone()).or_default() += amount;
            }
        }
        View {
            scope: Scope::Cluster,
            totals,
            read_at_ms: state.read_at_ms,
            stale: state.stale,
        }
    }

    /// The next batch: the one in doubt, else everything pending (money in
    /// whole nanodollars; the rest stays pending).
    fn next_batch(&self) -> (Batch, bool) {
        let mut state = self.lock();
        if let Some(batch) = &state.in_doubt {
            return (batch.clone(), true);
        }
        state.fold();
        state.flushes += 1;
        let id = format!("{}:{}", self.instance, state.flushes);
        let mut lines = Vec::new();
        let mut tally = Tally::default();
        for (
            account,
            Amounts {
                pending: amount, ..
            },
        ) in &mut state.accounts
        {
            let whole = if account.is_money() {
                *amount / PICOS_PER_NANO
            } else {
                *amount
            };
            // One HINCRBY takes at most i64::MAX; a larger rest waits for the next batch.
            let delta = u64::try_from(whole.min(i64::MAX as u128)).unwrap_or(0);
            if delta == 0 {
                continue;
            }
            let sent = if account.is_money() {
                u128::from(delta) * PICOS_PER_NANO
            } else {
                u128::from(delta)
            };
            let (field, tenant) = account.field();
            lines.push(BatchLine {
                field,
                tenant: tenant.map(str::to_owned),
                delta,
            });
            tally.insert(account.clone(), sent);
            *amount -= sent;
        }
        (Batch { id, lines, tally }, false)
    }

    /// Adds what is pending to the cluster ledger and reads its totals back.
    /// A batch left in doubt by an earlier flush goes first, then the rest. On
    /// failure the batch is kept and resent as is by the next flush.
    pub async fn flush(
        &self,
        store: &dyn LedgerStore,
        now_ms: u64,
    ) -> Result<(), LedgerUnavailable> {
        let _one_at_a_time = self.flushing.lock().await;
        loop {
            let (batch, resent) = self.next_batch();
            let result = store.add(&batch).await;
            let mut state = self.lock();
            match result {
                Ok(fields) => {
                    state.cluster = Some(parse_totals(fields));
                    state.read_at_ms = Some(now_ms);
                    state.in_doubt = None;
                    state.stale = false;
                    if !resent {
                        return Ok(());
                    }
                }
                Err(err) => {
                    state.in_doubt = Some(batch);
                    state.stale = true;
                    return Err(err);
                }
            }
        }
    }
}

/// The ledger's fields as accounts (money from nanodollars to picodollars);
/// a field this version cannot read is left out.
fn parse_totals(fields: Vec<(String, i64)>) -> Tally {
    let mut totals = Tally::default();
    for (field, value) in fields {
        let (Some(account), Ok(value)) = (Account::parse(&field), u128::try_from(value)) else {
            continue;
        };
        let value = if account.is_money() {
            value * PICOS_PER_NANO
        } else {
            value
        };
        *totals.entry(account).or_default() += value;
    }
    totals
}

/// Flushes `books` into `store` every `interval` until `stop` (the last flush,
/// after the drain, is `serve`'s).
pub async fn run_flusher(
    books: Arc<Books>,
    store: Arc<dyn LedgerStore>,
    interval: Duration,
    stop: CancellationToken,
    now_ms: impl Fn() -> u64 + Send + 'static,
) {
    crate::clock::every(interval, stop, || async {
        // A failure is logged by the store and retried on the next tick.
        let _ = books.flush(&*store, now_ms()).await;
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::account::escape;
    use super::*;

    /// The Redis semantics the cluster store implements, in memory.
    #[derive(Debug, Default)]
    struct FakeStore {
        fields: Mutex<HashMap<String, i64>>,
        applied: Mutex<HashSet<String>>,
        tenants: Mutex<HashSet<String>>,
        max_tenants: usize,
        down: std::sync::atomic::AtomicBool,
        /// Applies the batch but reports failure (a reply lost after a timeout).
        lose_reply: std::sync::atomic::AtomicBool,
    }

    #[async_trait]
    impl LedgerStore for FakeStore {
        async fn add(&self, batch: &Batch) -> Result<Vec<(String, i64)>, LedgerUnavailable> {
            use std::sync::atomic::Ordering::SeqCst;
            if self.down.load(SeqCst) {
                return Err(LedgerUnavailable);
            }
            let mut fields = self.fields.lock().unwrap();
            if self.applied.lock().unwrap().insert(batch.id.clone()) {
                for line in &batch.lines {
                    let mut field = line.field.clone();
                    if let Some(tenant) = &line.tenant {
                        let mut tenants = self.tenants.lock().unwrap();
                        if tenant != OTHER
                            && (tenants.contains(tenant) || tenants.len() < self.max_tenants)
                        {
                            tenants.insert(tenant.clone());
                            field += &escape(tenant);
                        } else {
                            field += OTHER;
                        }
                    }
                    *fields.entry(field).or_default() += line.delta as i64;
                }
            }
            if self.lose_reply.swap(false, SeqCst) {
                return Err(LedgerUnavailable);
            }
            Ok(fields.iter().map(|(k, v)| (k.clone(), *v)).collect())
        }
    }

    fn cost(model: &str) -> Account {
        Account::Cost {
            side: Side::Saved,
            model: model.into(),
        }
    }

    fn tenant(name: &str) -> Account {
        Account::By {
            party: Party::Tenant,
            side: Side::Upstream,
            measure: Measure::Answers,
            name: name.into(),
        }
    }

    #[test]
    fn fields_round_trip_whatever_the_names_hold() {
        let accounts = [
            Account::Calls {
                upstream: "open|ai".into(),
                model: "a%7Cb|c".into(),
                status: "200".into(),
            },
            Account::Tokens {
                side: Side::Saved,
                kind: TokenKind::CachedInput,
                model: "anthropic.claude-v2:1".into(),
            },
            tenant("team|a"),
            Account::By {
                party: Party::Upstream,
                side: Side::Saved,
                measure: Measure::Cost,
                name: "openai".into(),
            },
            Account::Requests {
                endpoint: "chat".into(),
                cache: "HIT".into(),
            },
            Account::By {
                party: Party::Member,
                side: Side::Upstream,
                measure: Measure::Calls,
                name: member_name("gpt/pool|1", "key/a"),
            },
        ];
        for account in accounts {
            assert_eq!(
                Account::parse(&account.redis_field()),
                Some(account.clone()),
                "{}",
                account.redis_field()
            );
        }
        assert_eq!(
            split_member_name(&member_name("gpt/pool%2F", "key/a")),
            ("gpt/pool%2F".to_owned(), "key/a".to_owned()),
            "a member's books name reads back whatever either name holds"
        );
        assert_eq!(Account::parse("future|thing"), None);
        assert_eq!(Account::parse("tok|sideways|input|m"), None);
    }

    #[tokio::test]
    async fn two_instances_see_the_sum_and_money_stays_exact() {
        let store = FakeStore {
            max_tenants: 10,
            ..FakeStore::default()
        };
        let (a, b) = (Books::new(10), Books::new(10));
        // $0.00000315 is 3150 nanodollars, 3.15e6 picodollars; add a sub-nano rest too.
        for _ in 0..1000 {
            a.post([(cost("m"), 3_150_000)]);
        }
        b.post([(cost("m"), 1_500)]);
        assert_eq!(a.view().scope, Scope::Instance);
        a.flush(&store, 1).await.unwrap();
        b.flush(&store, 2).await.unwrap();
        a.flush(&store, 3).await.unwrap();
        // Each instance sees the cluster's whole nanodollars plus its own unsent rest.
        for (books, expected) in [(&a, 3_150_001_000), (&b, 3_150_001_500)] {
            let view = books.view();
            assert_eq!(view.scope, Scope::Cluster);
            assert_eq!(view.totals[&cost("m")], expected);
        }
        // The half nanodollar b could not send stays pending, and is still shown.
        assert_eq!(store.fields.lock().unwrap()["usd|saved|m"], 3_150_001);
        assert_eq!(a.local()[&cost("m")], 3_150_000_000);
    }

    #[tokio::test]
    async fn a_counter_is_folded_into_its_account_and_flushed_once() {
        let store = FakeStore {
            max_tenants: 10,
            ..FakeStore::default()
        };
        let books = Books::new(10);
        let hits = Account::requests("chat", "HIT");
        let counter = books.counter(hits.clone());
        counter.add(2);
        counter.clone().add(3);
        assert_eq!(books.local()[&hits], 5);
        books.flush(&store, 1).await.unwrap();
        counter.add(1);
        books.flush(&store, 2).await.unwrap();
        assert_eq!(store.fields.lock().unwrap()[&hits.redis_field()], 6);
        assert_eq!(books.view().totals[&hits], 6);
        assert_eq!(books.local()[&hits], 6);
    }

    #[tokio::test]
    async fn a_lost_reply_is_resent_and_counted_once_and_a_dead_store_loses_nothing() {
        use std::sync::atomic::Ordering::SeqCst;
        let store = FakeStore {
            max_tenants: 10,
            ..FakeStore::default()
        };
        let books = Books::new(10);
        books.post([(tenant("t1"), 5)]);
        store.lose_reply.store(true, SeqCst);
        assert!(books.flush(&store, 1).await.is_err());
        books.post([(tenant("t1"), 1)]);
        store.down.store(true, SeqCst);
        assert!(books.flush(&store, 2).await.is_err());
        assert!(books.view().stale || books.view().scope == Scope::Instance);
        store.down.store(false, SeqCst);
        books.flush(&store, 3).await.unwrap();
        books.flush(&store, 4).await.unwrap();
        assert_eq!(
            store.fields.lock().unwrap()["tenant|upstream|answers|t1"],
            6
        );
        assert_eq!(books.view().totals[&tenant("t1")], 6);
    }

    #[tokio::test]
    async fn tenants_are_bounded_here_and_in_the_store() {
        let store = FakeStore {
            max_tenants: 2,
            ..FakeStore::default()
        };
        let books = Books::new(3);
        for name in ["a", "b", "c", "d", "e"] {
            books.post([(tenant(name), 1)]);
        }
        let local = books.local();
        assert_eq!(local.len(), 4, "three tenants and other: {local:?}");
        assert_eq!(local[&tenant(OTHER)], 2);
        books.flush(&store, 1).await.unwrap();
        let totals = books.view().totals;
        assert_eq!(totals.values().sum::<u128>(), 5, "nothing dropped");
        assert_eq!(totals.len(), 3, "two tenants and other: {totals:?}");
    }
}
