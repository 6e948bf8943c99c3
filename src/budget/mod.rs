//! Budgets: caps on what the provider bills, per tenant and per upstream, in
//! windows every instance agrees on (`window.rs`), and a per-tenant token rate.
//!
//! Only what a provider bills is spent: an upstream call's cost (at the price
//! table's prices, cached input and reasoning tokens included) is added to
//! every counter it belongs to when the call is counted. A HIT, STALE,
//! COALESCED or retry-window answer spends nothing, and is served whatever the
//! budget says: the check stands only in front of a new upstream call
//! ([`Budgets::admit`]). A call already under way finishes and is billed, so a
//! tenant can overshoot by the calls it has in flight.
//!
//! Across the fleet (with Redis) every instance adds what it spent into one
//! hash per window ([`BudgetStore`]) and reads the totals back, every
//! `ledger.flush_interval`: an instance sees its own spend at once and the
//! others' within one interval. A window's hash outlives its window by an
//! hour, so a restart within the window reads its spend back, and the first
//! check after a start waits for that read. Without Redis the counts are the
//! instance's own.
//!
//! Money is counted in whole nanodollars, each call's cost rounded up: a
//! budget is never under-counted.

mod window;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fmt,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

pub use window::{Period, Window};

use crate::{
    clock::{Clock, retry_after_secs},
    error::GatewayError,
};

/// A `tenant` that stands for every tenant no other rule names.
pub const EVERY_TENANT: &str = "*";

/// Picodollars in a nanodollar (prices are counted in picodollars).
const PICOS_PER_NANO: u128 = 1000;

/// One budget rule from config: exactly one of `tenant` and `upstream`, a
/// sum in USD and the window it is spent over.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetRule {
    /// An `auth.key_labels` label, a short scope as `/stats` names it, or
    /// `"*"`: every tenant no other rule names, each with a budget of its own.
    #[serde(default)]
    pub tenant: Option<String>,
    /// An upstream's name: a cap on its spend over every tenant.
    #[serde(default)]
    pub upstream: Option<String>,
    pub usd: f64,
    /// `hour`, `day`, `month` or a duration such as `30s`.
    #[schemars(with = "String")]
    pub per: Period,
}

impl BudgetRule {
    /// What the rule caps, as `/stats` and messages name it.
    pub fn subject(&self) -> String {
        match (&self.tenant, &self.upstream) {
            (Some(tenant), _) if tenant == EVERY_TENANT => "every tenant".to_owned(),
            (Some(tenant), _) => format!("tenant {tenant}"),
            (None, Some(upstream)) => format!("upstream {upstream}"),
            (None, None) => "nothing".to_owned(),
        }
    }

    /// The sum in whole nanodollars, if it is a sum (finite, not negative,
    /// below $18 billion).
    pub fn limit_nanos(&self) -> Option<u64> {
        let nanos = self.usd * 1e9;
        (self.usd.is_finite() && self.usd >= 0.0 && nanos < u64::MAX as f64)
            .then(|| nanos.round() as u64)
    }
}

/// Whom a counter counts.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Subject {
    Tenant(Arc<str>),
    Upstream(Arc<str>),
}

/// What a counter counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Measure {
    Nanodollars,
    Tokens,
}

/// One counter: a measure of a subject in one window of one period.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Counter {
    pub period: Period,
    pub window: Window,
    pub subject: Subject,
    pub measure: Measure,
}

impl Counter {
    /// The counter of `measure` for `subject` in `period`'s window at `now_ms`.
    fn at(now_ms: u64, period: Period, subject: Subject, measure: Measure) -> Self {
        Self {
            period,
            window: period.window(now_ms),
            subject,
            measure,
        }
    }

    /// The window's name in the store: period and start.
    pub fn window_id(period: Period, window: Window) -> String {
        format!("{period}:{}", window.start_ms)
    }

    /// The counter's field in its window's hash: `t|usd|name`.
    fn field(&self) -> String {
        let (who, name) = match &self.subject {
            Subject::Tenant(name) => ("t", name),
            Subject::Upstream(name) => ("u", name),
        };
        let measure = match self.measure {
            Measure::Nanodollars => "usd",
            Measure::Tokens => "tok",
        };
        format!("{who}|{measure}|{name}")
    }

    fn parse_field(period: Period, window: Window, field: &str) -> Option<Self> {
        let mut parts = field.splitn(3, '|');
        let subject = match (parts.next()?, parts.next()?, parts.next()?) {
            ("t", measure, name) => (Subject::Tenant(name.into()), measure),
            ("u", measure, name) => (Subject::Upstream(name.into()), measure),
            _ => return None,
        };
        let measure = match subject.1 {
            "usd" => Measure::Nanodollars,
            "tok" => Measure::Tokens,
            _ => return None,
        };
        Some(Self {
            period,
            window,
            subject: subject.0,
            measure,
        })
    }
}

/// What one flush adds to the store, applied at most once (its id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetBatch {
    pub id: String,
    pub lines: Vec<BatchLine>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchLine {
    pub window_id: String,
    /// How long the window's hash is kept from now: an hour past the
    /// window's end (relative, so Redis' clock and ours need not agree).
    pub keep_ms: u64,
    pub field: String,
    pub delta: u64,
}

/// The budget store could not be reached; what was not sent stays pending.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the budget store is unavailable")]
pub struct BudgetsUnavailable;

/// Where the fleet's spend per window lives (Redis, through `Cluster`).
#[async_trait]
pub trait BudgetStore: Send + Sync + fmt::Debug {
    /// Adds `batch` unless a batch of its id was added before, and returns
    /// every field of each window in `read` (by window id).
    async fn apply(
        &self,
        batch: &BudgetBatch,
        read: &[String],
    ) -> Result<Vec<(String, Vec<(String, i64)>)>, BudgetsUnavailable>;
}

/// A counter's amounts on this instance.
#[derive(Debug, Clone, Copy, Default)]
struct Count {
    /// The fleet's total as last read (this instance's flushed spend included).
    read: u64,
    /// Sent in a batch whose outcome is not known yet.
    sent: u64,
    /// Counted here, not sent yet.
    pending: u64,
}

impl Count {
    fn total(&self) -> u64 {
        self.read
            .saturating_add(self.sent)
            .saturating_add(self.pending)
    }
}

#[derive(Debug, Default)]
struct State {
    counts: HashMap<Counter, Count>,
    /// The batch sent and not known to be applied: resent as is.
    in_doubt: Option<BudgetBatch>,
    batches: u64,
}

/// One budget's use in its current window, for `/stats` and `/metrics`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BudgetUse {
    /// `tenant team-a`, `upstream openai`; a `*` rule is shown once per tenant it counted.
    pub subject: String,
    pub per: String,
    pub window_start_ms: u64,
    pub window_end_ms: u64,
    pub usd: f64,
    pub spent_usd: f64,
    pub remaining_usd: f64,
}

/// The budgets and token rate of one gateway, with what each has spent.
#[derive(Debug)]
pub struct Budgets {
    rules: Vec<BudgetRule>,
    tokens_per_minute: Option<u64>,
    /// The periods of tenant rules, each once.
    tenant_periods: Vec<Period>,
    /// Upstream name -> the periods of its rules.
    upstream_periods: BTreeMap<String, Vec<Period>>,
    /// Tenants counted per window at most (`ledger.max_tenants`): a tenant
    /// beyond them is not counted, so not limited.
    max_tenants: usize,
    state: Mutex<State>,
    clock: Arc<dyn Clock>,
    store: Option<Arc<dyn BudgetStore>>,
    /// Whether the fleet's spend was read since the start: until it is, each
    /// check tries to read it first (no wait while Redis is not connected or
    /// its breaker is open: the check then fails open).
    read_once: AtomicBool,
    /// One flush at a time.
    flushing: tokio::sync::Mutex<()>,
    /// Unique per process: batch ids of two instances never collide.
    instance: String,
}

/// The token rate's period.
const MINUTE: Period = Period::Every(Duration::from_secs(60));

impl Budgets {
    pub fn new(
        rules: Vec<BudgetRule>,
        tokens_per_minute: Option<u64>,
        max_tenants: usize,
        clock: Arc<dyn Clock>,
        store: Option<Arc<dyn BudgetStore>>,
    ) -> Self {
        let mut tenant_periods = Vec::new();
        let mut upstream_periods: BTreeMap<String, Vec<Period>> = BTreeMap::new();
        for rule in &rules {
            let periods = match (&rule.tenant, &rule.upstream) {
                (Some(_), _) => &mut tenant_periods,
                (None, Some(upstream)) => upstream_periods.entry(upstream.clone()).or_default(),
                (None, None) => continue,
            };
            if !periods.contains(&rule.per) {
                periods.push(rule.per);
            }
        }
        Self {
            rules,
            tokens_per_minute,
            tenant_periods,
            upstream_periods,
            max_tenants,
            state: Mutex::default(),
            clock,
            store,
            read_once: AtomicBool::new(false),
            flushing: tokio::sync::Mutex::new(()),
            instance: format!("{:016x}", rand::random::<u64>()),
        }
    }

    /// Whether anything is limited: without rules nothing is counted.
    pub fn is_active(&self) -> bool {
        !self.rules.is_empty() || self.tokens_per_minute.is_some()
    }

    /// The rules that cap `tenant`: the ones naming it, else the `*` ones.
    fn tenant_rules<'a>(&'a self, tenant: &'a str) -> impl Iterator<Item = &'a BudgetRule> + 'a {
        let named = self
            .rules
            .iter()
            .any(|rule| rule.tenant.as_deref() == Some(tenant));
        let wanted = if named { tenant } else { EVERY_TENANT };
        self.rules
            .iter()
            .filter(move |rule| rule.tenant.as_deref() == Some(wanted))
    }

    fn upstream_rules<'a>(&'a self, upstream: &'a str) -> impl Iterator<Item = &'a BudgetRule> {
        self.rules
            .iter()
            .filter(move |rule| rule.upstream.as_deref() == Some(upstream))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// May a new upstream call start for `tenant` on `upstream`? 429 in
    /// [`GatewayError::BudgetExceeded`] when a budget that covers either is
    /// used up, or the tenant's token rate is. The first check after a start
    /// waits for the fleet's spend to be read (bounded by Redis' own
    /// deadline; without Redis it fails open).
    pub async fn admit(&self, tenant: &Arc<str>, upstream: &Arc<str>) -> Result<(), GatewayError> {
        self.admit_for(Some(tenant), upstream).await
    }

    /// As [`admit`](Self::admit), for a call billed to `tenant` or, when
    /// `None`, to the gateway itself (a background refresh): then only the
    /// upstream's caps (the provider account's) are checked, no tenant's.
    pub async fn admit_for(
        &self,
        tenant: Option<&Arc<str>>,
        upstream: &Arc<str>,
    ) -> Result<(), GatewayError> {
        if !self.is_active() {
            return Ok(());
        }
        if self.store.is_some() && !self.read_once.load(Ordering::Acquire) {
            let _ = self.flush().await;
        }
        self.check(tenant, upstream)
    }

    fn check(&self, tenant: Option<&Arc<str>>, upstream: &Arc<str>) -> Result<(), GatewayError> {
        let now = self.clock.now_ms();
        let state = self.lock();
        let spent = |period: Period, subject: Subject, measure: Measure| {
            let counter = Counter::at(now, period, subject, measure);
            let used = state.counts.get(&counter).map_or(0, Count::total);
            (used, counter.window)
        };
        // The names are the attribution's own `Arc`s: a counter key costs a count, not a copy.
        let upstream_name = upstream.clone();
        let rules = tenant
            .into_iter()
            .flat_map(|tenant| {
                self.tenant_rules(tenant)
                    .map(|rule| (rule, Subject::Tenant(tenant.clone())))
            })
            .chain(
                self.upstream_rules(upstream)
                    .map(|rule| (rule, Subject::Upstream(upstream_name.clone()))),
            );
        for (rule, subject) in rules {
            let limit = rule.limit_nanos().unwrap_or(u64::MAX);
            let (used, window) = spent(rule.per, subject, Measure::Nanodollars);
            if used >= limit {
                return Err(GatewayError::BudgetExceeded {
                    retry_after: retry_after_secs(window.left(now)),
                    what: format!(
                        "the budget of {} (${} per {})",
                        rule.subject(),
                        rule.usd,
                        rule.per
                    ),
                    code: "budget_exceeded",
                });
            }
        }
        if let Some(limit) = self.tokens_per_minute
            && let Some(tenant) = tenant
        {
            let (used, window) = spent(MINUTE, Subject::Tenant(tenant.clone()), Measure::Tokens);
            if used >= limit {
                return Err(GatewayError::BudgetExceeded {
                    retry_after: retry_after_secs(window.left(now)),
                    what: format!("this API key's token rate ({limit} tokens per minute)"),
                    code: "token_rate_exceeded",
                });
            }
        }
        Ok(())
    }

    /// Counts what one upstream call billed: `picos` at the price table's
    /// prices (unknown: nothing) and its `tokens`.
    pub fn spend(&self, tenant: &Arc<str>, upstream: &Arc<str>, picos: Option<u128>, tokens: u64) {
        self.spend_for(Some(tenant), upstream, picos, tokens);
    }

    /// As [`spend`](Self::spend), for a call billed to `tenant` or, when
    /// `None`, to the gateway itself: then only the upstream's counters
    /// count it (its account caps), no tenant's budget or token rate.
    pub fn spend_for(
        &self,
        tenant: Option<&Arc<str>>,
        upstream: &Arc<str>,
        picos: Option<u128>,
        tokens: u64,
    ) {
        if !self.is_active() {
            return;
        }
        let nanos = picos.map_or(0, |picos| {
            u64::try_from(picos.div_ceil(PICOS_PER_NANO)).unwrap_or(u64::MAX)
        });
        let now = self.clock.now_ms();
        let mut additions = Vec::new();
        if nanos > 0 {
            for (period, tenant) in self
                .tenant_periods
                .iter()
                .flat_map(|period| tenant.map(|tenant| (period, tenant)))
            {
                additions.push((
                    *period,
                    Subject::Tenant(tenant.clone()),
                    Measure::Nanodollars,
                    nanos,
                ));
            }
            for period in self.upstream_periods.get(&**upstream).into_iter().flatten() {
                additions.push((
                    *period,
                    Subject::Upstream(upstream.clone()),
                    Measure::Nanodollars,
                    nanos,
                ));
            }
        }
        if let Some(tenant) = tenant
            && self.tokens_per_minute.is_some()
            && tokens > 0
        {
            additions.push((
                MINUTE,
                Subject::Tenant(tenant.clone()),
                Measure::Tokens,
                tokens,
            ));
        }
        let mut state = self.lock();
        for (period, subject, measure, amount) in additions {
            let counter = Counter::at(now, period, subject, measure);
            if !state.counts.contains_key(&counter) {
                // A new counter (a new tenant, or a new window): the ended
                // windows go first, with or without a store to flush to.
                state
                    .counts
                    .retain(|counter, _| counter.window.end_ms > now);
                if matches!(counter.subject, Subject::Tenant(_))
                    && tenants_in(&state, period, counter.window) >= self.max_tenants
                {
                    continue;
                }
            }
            let count = state.counts.entry(counter).or_default();
            count.pending = count.pending.saturating_add(amount);
        }
    }

    /// What is left of `tenant`'s own budgets (the rules naming it, else the
    /// `*` ones, each its own), in USD: the least of them, never below 0;
    /// `None` when none covers it. An upstream's cap is every tenant's, so
    /// what is left of it would tell one tenant the others' spend: it is not
    /// counted here.
    pub fn remaining_usd(&self, tenant: &Arc<str>) -> Option<f64> {
        if self.rules.is_empty() {
            return None;
        }
        let now = self.clock.now_ms();
        let state = self.lock();
        self.tenant_rules(tenant)
            .map(|rule| {
                // The name is the attribution's own `Arc`: a counter key costs a count, not a copy.
                let subject = Subject::Tenant(tenant.clone());
                let counter = Counter::at(now, rule.per, subject, Measure::Nanodollars);
                let used = state.counts.get(&counter).map_or(0, Count::total);
                rule.limit_nanos().unwrap_or(u64::MAX).saturating_sub(used) as f64 / 1e9
            })
            .reduce(f64::min)
    }

    /// Each rule's use in its current window, once per rule, for `/metrics`,
    /// whose labels are never tenants: a `*` rule's spend is the most any one
    /// tenant spent under it (the one nearest its cap). `/stats` shows each
    /// tenant's ([`uses`](Self::uses)).
    pub fn rule_uses(&self) -> Vec<BudgetUse> {
        let now = self.clock.now_ms();
        let state = self.lock();
        let named = self.named_tenants();
        let mut uses = Vec::new();
        for rule in &self.rules {
            let window = rule.per.window(now);
            let used = match (&rule.tenant, &rule.upstream) {
                (Some(every), _) if every == EVERY_TENANT => {
                    counted_under_every(&state, rule.per, window, &named)
                        .map(|(_, used)| used)
                        .max()
                        .unwrap_or(0)
                }
                (Some(tenant), _) => used_in(
                    &state,
                    rule,
                    window,
                    Subject::Tenant(tenant.as_str().into()),
                ),
                (None, Some(upstream)) => used_in(
                    &state,
                    rule,
                    window,
                    Subject::Upstream(upstream.as_str().into()),
                ),
                (None, None) => continue,
            };
            uses.push(BudgetUse::of(rule, window, rule.subject(), used));
        }
        uses
    }

    /// The tenants rules name (a `*` rule counts every other).
    fn named_tenants(&self) -> HashSet<&str> {
        self.rules
            .iter()
            .filter_map(|rule| rule.tenant.as_deref())
            .filter(|tenant| *tenant != EVERY_TENANT)
            .collect()
    }

    /// Each budget's use in its current window: a named rule once, a `*` rule
    /// once per tenant it counted there, an upstream rule once.
    pub fn uses(&self) -> Vec<BudgetUse> {
        let now = self.clock.now_ms();
        let state = self.lock();
        let named = self.named_tenants();
        let mut uses = Vec::new();
        for rule in &self.rules {
            let window = rule.per.window(now);
            match (&rule.tenant, &rule.upstream) {
                (Some(every), _) if every == EVERY_TENANT => {
                    let mut tenants: Vec<(&Arc<str>, u64)> =
                        counted_under_every(&state, rule.per, window, &named).collect();
                    tenants.sort();
                    for (name, used) in tenants {
                        uses.push(BudgetUse::of(rule, window, format!("tenant {name}"), used));
                    }
                }
                (Some(tenant), _) => {
                    let used = used_in(
                        &state,
                        rule,
                        window,
                        Subject::Tenant(tenant.as_str().into()),
                    );
                    uses.push(BudgetUse::of(rule, window, rule.subject(), used));
                }
                (None, Some(upstream)) => {
                    let used = used_in(
                        &state,
                        rule,
                        window,
                        Subject::Upstream(upstream.as_str().into()),
                    );
                    uses.push(BudgetUse::of(rule, window, rule.subject(), used));
                }
                (None, None) => {}
            }
        }
        uses
    }

    /// Sends what this instance spent since the last flush to the store and
    /// reads the fleet's totals of the current windows back. Without a store
    /// there is nothing to do.
    pub async fn flush(&self) -> Result<(), BudgetsUnavailable> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        let _one_at_a_time = self.flushing.lock().await;
        let now = self.clock.now_ms();
        let (batch, read) = {
            let mut state = self.lock();
            // Ended windows are of no more use to anyone.
            state
                .counts
                .retain(|counter, _| counter.window.end_ms > now);
            let batch = match state.in_doubt.clone() {
                Some(batch) => batch,
                None => {
                    state.batches += 1;
                    let id = format!("{}-{}", self.instance, state.batches);
                    let mut lines = Vec::new();
                    for (counter, count) in &mut state.counts {
                        if count.pending > 0 {
                            lines.push(BatchLine {
                                window_id: Counter::window_id(counter.period, counter.window),
                                keep_ms: counter
                                    .window
                                    .end_ms
                                    .saturating_sub(now)
                                    .saturating_add(3_600_000),
                                field: counter.field(),
                                delta: count.pending,
                            });
                            count.sent = count.sent.saturating_add(count.pending);
                            count.pending = 0;
                        }
                    }
                    BudgetBatch { id, lines }
                }
            };
            state.in_doubt = Some(batch.clone());
            (batch, self.current_windows(now))
        };
        let ids: Vec<String> = read
            .iter()
            .map(|(period, window)| Counter::window_id(*period, *window))
            .collect();
        let totals = store.apply(&batch, &ids).await?;
        self.read_once.store(true, Ordering::Release);
        let mut state = self.lock();
        state.in_doubt = None;
        for count in state.counts.values_mut() {
            count.sent = 0;
        }
        for ((period, window), (_, fields)) in read.into_iter().zip(totals) {
            for count in state
                .counts
                .iter_mut()
                .filter(|(counter, _)| counter.period == period && counter.window == window)
            {
                count.1.read = 0;
            }
            for (field, total) in fields {
                if let Some(counter) = Counter::parse_field(period, window, &field) {
                    let count = state.counts.entry(counter).or_default();
                    count.read = u64::try_from(total).unwrap_or(0);
                }
            }
        }
        Ok(())
    }

    /// Every period's window at `now_ms`, each once.
    fn current_windows(&self, now_ms: u64) -> Vec<(Period, Window)> {
        let mut periods: Vec<Period> = self.tenant_periods.clone();
        for upstream in self.upstream_periods.values() {
            periods.extend(upstream);
        }
        if self.tokens_per_minute.is_some() {
            periods.push(MINUTE);
        }
        let mut windows: Vec<(Period, Window)> = Vec::new();
        for period in periods {
            let window = (period, period.window(now_ms));
            if !windows.contains(&window) {
                windows.push(window);
            }
        }
        windows
    }
}

impl BudgetUse {
    /// `rule`'s use by `subject`, `used` nanodollars in `window`.
    fn of(rule: &BudgetRule, window: Window, subject: String, used: u64) -> Self {
        let limit = rule.limit_nanos().unwrap_or(u64::MAX);
        Self {
            subject,
            per: rule.per.to_string(),
            window_start_ms: window.start_ms,
            window_end_ms: window.end_ms,
            usd: rule.usd,
            spent_usd: used as f64 / 1e9,
            remaining_usd: limit.saturating_sub(used) as f64 / 1e9,
        }
    }
}

/// What `subject` spent against `rule` in `window`, in nanodollars.
fn used_in(state: &State, rule: &BudgetRule, window: Window, subject: Subject) -> u64 {
    let counter = Counter {
        period: rule.per,
        window,
        subject,
        measure: Measure::Nanodollars,
    };
    state.counts.get(&counter).map_or(0, Count::total)
}

/// The tenants a `*` rule of `period` counted in `window` (every tenant no
/// rule names), with what each spent.
fn counted_under_every<'a>(
    state: &'a State,
    period: Period,
    window: Window,
    named: &'a HashSet<&str>,
) -> impl Iterator<Item = (&'a Arc<str>, u64)> + 'a {
    state
        .counts
        .iter()
        .filter_map(move |(counter, count)| match &counter.subject {
            Subject::Tenant(name)
                if counter.period == period
                    && counter.window == window
                    && counter.measure == Measure::Nanodollars
                    && !named.contains(&**name) =>
            {
                Some((name, count.total()))
            }
            _ => None,
        })
}

fn tenants_in(state: &State, period: Period, window: Window) -> usize {
    state
        .counts
        .keys()
        .filter(|counter| {
            counter.period == period
                && counter.window == window
                && matches!(counter.subject, Subject::Tenant(_))
        })
        .count()
}

/// Flushes `budgets` every `interval` until `stop`.
pub async fn run_flusher(budgets: Arc<Budgets>, interval: Duration, stop: CancellationToken) {
    crate::clock::every(interval, stop, || async {
        // A failure is retried on the next tick (the batch stays in doubt).
        let _ = budgets.flush().await;
    })
    .await;
}

#[cfg(test)]
mod tests;
