//! `/stats`: the books summed into one JSON document, plus a short history of
//! spent vs saved for the chart.
//!
//! The counts are the cluster's totals (every instance sharing the Redis
//! ledger, since the ledger began) once this instance has read them, else its
//! own since start; `scope` says which. The live gauges (`in_flight`,
//! `waiters`, `cache_entries`) and `redis_errors` are always this instance's.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::{CACHE_LABELS, ENDPOINT_LABELS, Metrics, lock, unix_ms};
use crate::{
    config::ModelPrice,
    ledger::{Account, Measure, OTHER, Party, Scope, Side, Tally},
    pricing::{PICOS_PER_NANO, PicoUsd},
    usage::TokenKind,
};

#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    /// `cluster`: every instance sharing the Redis ledger, since the ledger
    /// began; `instance`: this instance since it started.
    pub scope: Scope,
    /// When this instance last read the cluster totals (Unix ms).
    pub ledger_read_at_ms: Option<u64>,
    /// The last attempt to reach the ledger failed: the cluster totals are
    /// those last read, plus what this instance counted since.
    pub ledger_stale: bool,
    pub started_at_ms: u64,
    pub uptime_seconds: f64,
    /// When the configured prices were taken, else the snapshot's date.
    pub pricing_as_of: Option<String>,
    pub pricing: PricingStats,
    pub requests: RequestStats,
    pub upstream: UpstreamStats,
    pub saved_responses: SavedStats,
    /// Share of answers that needed no upstream call of their own:
    /// saved / (saved + upstream calls); 0 before any.
    pub dedup_ratio: f64,
    pub tokens: TokenSides,
    pub cost_usd: CostSides,
    /// The same amounts, exact, in whole nanodollars.
    pub cost_nano_usd: NanoSides,
    pub usage_unknown: UsageUnknown,
    /// Tokens of models without a price: counted, but their cost is unknown.
    pub unpriced_tokens: UsageUnknown,
    /// Models with any activity, in pricing-table order.
    pub models: Vec<ModelStats>,
    /// Top tenants (`ledger.top_tenants`) by spend, then savings; the rest as `other`.
    pub tenants: Vec<PartyStats>,
    /// Every upstream with activity, by name.
    pub upstreams: Vec<PartyStats>,
    /// Every member of a pool (an upstream with `members`) with activity,
    /// by pool then member: its calls and the answers it was paid for.
    pub members: Vec<MemberStats>,
    pub in_flight: i64,
    pub waiters: i64,
    pub cache_entries: i64,
    /// Bytes the in-process cache holds, as `cache.max_bytes` weighs them.
    pub cache_bytes: i64,
    /// Bytes held by stream event logs: live streams, and finished ones that a
    /// reader still holds. Returns to zero once every stream and reader is gone.
    pub stream_log_bytes: i64,
    pub redis_errors: u64,
    /// Cumulative spent and saved USD over time, oldest first, ending now.
    pub history: Vec<Point>,
    /// Each budget's use in its current window (`budgets`); filled in by
    /// `/stats` from the budgets, empty when none is set.
    pub budgets: Vec<crate::budget::BudgetUse>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PricingStats {
    /// The embedded snapshot: source package, version, date, model count.
    pub snapshot: Option<SnapshotStats>,
    /// Entries of `pricing.models` (they override the snapshot).
    pub configured_models: usize,
    pub configured_as_of: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SnapshotStats {
    pub source: String,
    pub as_of: String,
    pub models: usize,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct RequestStats {
    pub total: u64,
    /// Every cache status, zeros included.
    pub by_cache: BTreeMap<String, u64>,
    pub by_endpoint: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct UpstreamStats {
    pub calls: u64,
    pub retries: u64,
    pub by_status: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SavedStats {
    pub total: u64,
    pub hit: u64,
    pub stale: u64,
    pub coalesced: u64,
    /// Client retries answered from the retry window ("retries absorbed").
    pub retry: u64,
}

/// Tokens of one side: the totals (`prompt`, `completion`) and the billed
/// kinds, which split them (`input + cached_input + cache_write = prompt`,
/// `output + reasoning = completion`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Tokens {
    pub prompt: u64,
    pub completion: u64,
    pub input: u64,
    pub cached_input: u64,
    pub cache_write: u64,
    pub output: u64,
    pub reasoning: u64,
}

impl Tokens {
    fn add(&mut self, kind: TokenKind, n: u64) {
        let slot = match kind {
            TokenKind::Input => &mut self.input,
            TokenKind::CachedInput => &mut self.cached_input,
            TokenKind::CacheWrite => &mut self.cache_write,
            TokenKind::Output => &mut self.output,
            TokenKind::Reasoning => &mut self.reasoning,
        };
        *slot += n;
        match kind {
            TokenKind::Input | TokenKind::CachedInput | TokenKind::CacheWrite => self.prompt += n,
            TokenKind::Output | TokenKind::Reasoning => self.completion += n,
        }
    }

    fn merge(&mut self, other: &Self) {
        self.prompt += other.prompt;
        self.completion += other.completion;
        self.input += other.input;
        self.cached_input += other.cached_input;
        self.cache_write += other.cache_write;
        self.output += other.output;
        self.reasoning += other.reasoning;
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TokenSides {
    pub upstream: Tokens,
    pub saved: Tokens,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CostSides {
    pub upstream: f64,
    pub saved: f64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct NanoSides {
    pub upstream: u64,
    pub saved: u64,
}

/// A count on each side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct UsageUnknown {
    pub upstream: u64,
    pub saved: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelStats {
    pub model: String,
    pub priced: bool,
    pub price: Option<ModelPrice>,
    pub upstream_calls: u64,
    pub saved_responses: SavedStats,
    pub tokens: TokenSides,
    /// Zero for a model without a price (its cost is unknown, see `priced`).
    pub cost_usd: CostSides,
    pub usage_unknown: UsageUnknown,
    pub unpriced_tokens: UsageUnknown,
}

/// What one tenant or upstream was answered, in tokens, and in money.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PartyStats {
    pub name: String,
    pub answers: UsageUnknown,
    pub tokens: UsageUnknown,
    pub cost_usd: CostSides,
    pub cost_nano_usd: NanoSides,
}

/// What one pool member was called and paid for (`upstream` side only: a
/// saved answer made no call, so it belongs to no member).
#[derive(Debug, Clone, Default, Serialize)]
pub struct MemberStats {
    /// The pool's (upstream's) name.
    pub upstream: String,
    pub member: String,
    /// Upstream calls whose last attempt went to this member, any status.
    pub calls: u64,
    /// Answers it was paid for, their tokens and their cost.
    pub answers: u64,
    pub tokens: u64,
    pub cost_usd: f64,
    pub cost_nano_usd: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Point {
    pub t_ms: u64,
    pub spent_usd: f64,
    pub saved_usd: f64,
}

/// Cumulative spent/saved samples, taken when `/stats` is read, at most one
/// per `STEP_MS`; past `MAX_POINTS` every other sample is dropped, so the
/// history always spans the whole uptime at a coarser step.
#[derive(Debug)]
pub struct History {
    points: Vec<Point>,
}

const STEP_MS: u64 = 5_000;
const MAX_POINTS: usize = 720;

impl History {
    pub fn new(started_at_ms: u64) -> Self {
        Self {
            points: vec![Point {
                t_ms: started_at_ms,
                spent_usd: 0.0,
                saved_usd: 0.0,
            }],
        }
    }

    /// Records `now` if a step has passed, and returns the history ending at `now`.
    pub fn sample(&mut self, now: Point) -> Vec<Point> {
        let due = self
            .points
            .last()
            .is_none_or(|last| now.t_ms >= last.t_ms.saturating_add(STEP_MS));
        if due {
            self.points.push(now);
            if self.points.len() > MAX_POINTS {
                let mut index = 0;
                self.points.retain(|_| {
                    index += 1;
                    index % 2 == 1
                });
            }
        }
        let mut points = self.points.clone();
        if points.last() != Some(&now) {
            points.push(now);
        }
        points
    }
}

/// One tenant's or upstream's sums, by side (upstream, saved).
#[derive(Debug, Default, Clone, Copy)]
struct PartySums {
    answers: [u64; 2],
    tokens: [u64; 2],
    picos: [u128; 2],
    /// A pool member's calls (`Measure::Calls`).
    calls: u64,
}

impl PartySums {
    fn merge(&mut self, other: &Self) {
        for i in 0..2 {
            self.answers[i] += other.answers[i];
            self.tokens[i] += other.tokens[i];
            self.picos[i] += other.picos[i];
        }
        self.calls += other.calls;
    }

    fn into_stats(self, name: String) -> PartyStats {
        PartyStats {
            name,
            answers: sides(self.answers),
            tokens: sides(self.tokens),
            cost_usd: usd(self.picos),
            cost_nano_usd: nanos(self.picos),
        }
    }
}

fn index(side: Side) -> usize {
    match side {
        Side::Upstream => 0,
        Side::Saved => 1,
    }
}

fn sides([upstream, saved]: [u64; 2]) -> UsageUnknown {
    UsageUnknown { upstream, saved }
}

fn usd([upstream, saved]: [u128; 2]) -> CostSides {
    CostSides {
        upstream: PicoUsd(upstream).as_usd(),
        saved: PicoUsd(saved).as_usd(),
    }
}

fn nanos([upstream, saved]: [u128; 2]) -> NanoSides {
    let nanos = |picos: u128| u64::try_from(picos / PICOS_PER_NANO).unwrap_or(u64::MAX);
    NanoSides {
        upstream: nanos(upstream),
        saved: nanos(saved),
    }
}

/// One model's sums while the tally is read.
#[derive(Debug, Default)]
struct ModelSums {
    calls: u64,
    saved: SavedStats,
    tokens: [Tokens; 2],
    picos: [u128; 2],
    unknown: [u64; 2],
    unpriced: [u64; 2],
}

impl ModelSums {
    fn active(&self) -> bool {
        self.calls > 0
            || self.saved.total > 0
            || self.tokens != [Tokens::default(); 2]
            || self.unknown != [0; 2]
    }
}

/// Sums the books into the `/stats` figures (everything but the live gauges).
#[derive(Debug, Default)]
struct Summary {
    requests: RequestStats,
    upstream: UpstreamStats,
    models: HashMap<String, ModelSums>,
    tenants: HashMap<String, PartySums>,
    upstreams: HashMap<String, PartySums>,
    /// Keyed `pool/member`.
    members: HashMap<String, PartySums>,
}

impl Summary {
    fn of(totals: &Tally) -> Self {
        let mut summary = Self::default();
        for cache in CACHE_LABELS {
            summary.requests.by_cache.insert(cache.to_owned(), 0);
        }
        for endpoint in ENDPOINT_LABELS {
            summary.requests.by_endpoint.insert(endpoint.to_owned(), 0);
        }
        for (account, amount) in totals {
            let n = u64::try_from(*amount).unwrap_or(u64::MAX);
            match account {
                Account::Requests { endpoint, cache } => {
                    *summary
                        .requests
                        .by_cache
                        .entry(cache.to_string())
                        .or_default() += n;
                    *summary
                        .requests
                        .by_endpoint
                        .entry(endpoint.to_string())
                        .or_default() += n;
                    summary.requests.total += n;
                }
                Account::Calls {
                    model: name,
                    status,
                    ..
                } => {
                    *summary
                        .upstream
                        .by_status
                        .entry(status.to_string())
                        .or_default() += n;
                    summary.upstream.calls += n;
                    summary.model(name).calls += n;
                }
                Account::Retries { .. } => summary.upstream.retries += n,
                Account::Saved { model: name, via } => {
                    let saved = &mut summary.model(name).saved;
                    saved.total += n;
                    match &**via {
                        "hit" => saved.hit += n,
                        "stale" => saved.stale += n,
                        "retry" => saved.retry += n,
                        _ => saved.coalesced += n,
                    }
                }
                Account::Tokens {
                    side,
                    kind,
                    model: name,
                } => summary.model(name).tokens[index(*side)].add(*kind, n),
                Account::Cost { side, model: name } => {
                    summary.model(name).picos[index(*side)] += amount;
                }
                Account::UsageUnknown { side, model: name } => {
                    summary.model(name).unknown[index(*side)] += n;
                }
                Account::Unpriced { side, model: name } => {
                    summary.model(name).unpriced[index(*side)] += n;
                }
                Account::By {
                    party,
                    side,
                    measure,
                    name,
                } => {
                    let parties = match party {
                        Party::Tenant => &mut summary.tenants,
                        Party::Upstream => &mut summary.upstreams,
                        Party::Member => &mut summary.members,
                    };
                    let sums = parties.entry(name.to_string()).or_default();
                    let i = index(*side);
                    match measure {
                        Measure::Answers => sums.answers[i] += n,
                        Measure::Tokens => sums.tokens[i] += n,
                        Measure::Cost => sums.picos[i] += amount,
                        Measure::Calls => sums.calls += n,
                    }
                }
            }
        }
        summary
    }

    fn model(&mut self, name: &str) -> &mut ModelSums {
        self.models.entry(name.to_owned()).or_default()
    }
}

/// The top `n` parties by spend, then savings, then answers; the rest summed as `other`.
fn top_parties(parties: HashMap<String, PartySums>, n: usize) -> Vec<PartyStats> {
    let mut parties: Vec<(String, PartySums)> = parties.into_iter().collect();
    parties.sort_by(|(a_name, a), (b_name, b)| {
        (b.picos[0], b.picos[1], b.answers[0] + b.answers[1])
            .cmp(&(a.picos[0], a.picos[1], a.answers[0] + a.answers[1]))
            .then_with(|| a_name.cmp(b_name))
    });
    let mut other: Option<PartySums> = None;
    let mut shown = Vec::new();
    for (name, sums) in parties {
        if name == OTHER || shown.len() >= n {
            other.get_or_insert_with(PartySums::default).merge(&sums);
        } else {
            shown.push(sums.into_stats(name));
        }
    }
    shown.extend(other.map(|sums| sums.into_stats(OTHER.to_owned())));
    shown
}

/// A member's line from its books' name (`ledger::member_name`).
fn member_stats(name: &str, sums: &PartySums) -> MemberStats {
    let (upstream, member) = crate::ledger::split_member_name(name);
    let picos = sums.picos[index(Side::Upstream)];
    MemberStats {
        upstream,
        member,
        calls: sums.calls,
        answers: sums.answers[index(Side::Upstream)],
        tokens: sums.tokens[index(Side::Upstream)],
        cost_usd: PicoUsd(picos).as_usd(),
        cost_nano_usd: u64::try_from(picos / PICOS_PER_NANO).unwrap_or(u64::MAX),
    }
}

impl Metrics {
    /// The books' totals (the cluster's, once read) as the `/stats` document.
    pub fn stats(&self) -> Stats {
        let inner = &*self.inner;
        let view = inner.books.view();
        let summary = Summary::of(&view.totals);

        let order: HashMap<&str, usize> = inner
            .models
            .all()
            .iter()
            .enumerate()
            .map(|(i, label)| (label.as_str(), i))
            .collect();
        let mut active: Vec<(&String, &ModelSums)> = summary
            .models
            .iter()
            .filter(|(_, sums)| sums.active())
            .collect();
        active.sort_by_key(|(name, _)| {
            (
                order.get(name.as_str()).copied().unwrap_or(usize::MAX),
                *name,
            )
        });

        let mut saved = SavedStats::default();
        let mut tokens = TokenSides::default();
        let mut picos = [0u128; 2];
        let mut unknown = [0u64; 2];
        let mut unpriced = [0u64; 2];
        let mut models = Vec::new();
        for (name, sums) in active {
            saved.total += sums.saved.total;
            saved.hit += sums.saved.hit;
            saved.stale += sums.saved.stale;
            saved.coalesced += sums.saved.coalesced;
            saved.retry += sums.saved.retry;
            for (side, totals) in [&mut tokens.upstream, &mut tokens.saved]
                .into_iter()
                .enumerate()
            {
                totals.merge(&sums.tokens[side]);
                picos[side] += sums.picos[side];
                unknown[side] += sums.unknown[side];
                unpriced[side] += sums.unpriced[side];
            }
            let price = order
                .get(name.as_str())
                .and_then(|i| inner.models.all()[*i].price());
            models.push(ModelStats {
                model: name.clone(),
                priced: price.is_some(),
                price,
                upstream_calls: sums.calls,
                saved_responses: sums.saved,
                tokens: TokenSides {
                    upstream: sums.tokens[0],
                    saved: sums.tokens[1],
                },
                cost_usd: usd(sums.picos),
                usage_unknown: sides(sums.unknown),
                unpriced_tokens: sides(sums.unpriced),
            });
        }

        let answered = saved.total + summary.upstream.calls;
        let dedup_ratio = if answered == 0 {
            0.0
        } else {
            saved.total as f64 / answered as f64
        };
        let cost_usd = usd(picos);
        let history = lock(&inner.history).sample(Point {
            t_ms: unix_ms().max(inner.started_at_ms),
            spent_usd: cost_usd.upstream,
            saved_usd: cost_usd.saved,
        });
        let mut upstreams = top_parties(summary.upstreams, usize::MAX);
        upstreams.sort_by(|a, b| a.name.cmp(&b.name));
        let mut members: Vec<MemberStats> = summary
            .members
            .into_iter()
            .map(|(name, sums)| member_stats(&name, &sums))
            .collect();
        members.sort_by(|a, b| (&a.upstream, &a.member).cmp(&(&b.upstream, &b.member)));
        Stats {
            scope: view.scope,
            ledger_read_at_ms: view.read_at_ms,
            ledger_stale: view.stale,
            started_at_ms: inner.started_at_ms,
            uptime_seconds: inner.started.elapsed().as_secs_f64(),
            pricing_as_of: inner
                .pricing_as_of
                .clone()
                .or_else(|| inner.snapshot.map(|s| s.as_of.clone())),
            pricing: PricingStats {
                snapshot: inner.snapshot.map(|s| SnapshotStats {
                    source: format!(
                        "{} {} ({})",
                        s.source.package, s.source.version, s.source.license
                    ),
                    as_of: s.as_of.clone(),
                    models: s.models.len(),
                }),
                configured_models: inner.configured_prices,
                configured_as_of: inner.pricing_as_of.clone(),
            },
            requests: summary.requests,
            upstream: summary.upstream,
            saved_responses: saved,
            dedup_ratio,
            tokens,
            cost_usd,
            cost_nano_usd: nanos(picos),
            usage_unknown: sides(unknown),
            unpriced_tokens: sides(unpriced),
            models,
            tenants: top_parties(summary.tenants, inner.top_tenants),
            upstreams,
            members,
            in_flight: inner.in_flight.get(),
            waiters: inner.waiters.get(),
            cache_entries: inner.cache_entries.get(),
            cache_bytes: inner.cache_bytes.get(),
            stream_log_bytes: inner.stream_log_bytes_gauge.get(),
            redis_errors: inner.redis_errors.get(),
            history,
            budgets: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spent(picos: u128, answers: u64) -> PartySums {
        PartySums {
            answers: [answers, 0],
            tokens: [answers * 10, 0],
            picos: [picos, 0],
            calls: 0,
        }
    }

    #[test]
    fn the_top_parties_are_named_and_the_rest_summed_as_other() {
        let parties: HashMap<String, PartySums> = [
            ("small".to_owned(), spent(1_000, 1)),
            ("big".to_owned(), spent(9_000_000, 5)),
            ("medium".to_owned(), spent(5_000, 2)),
            (OTHER.to_owned(), spent(7_000, 3)),
        ]
        .into();
        let top = top_parties(parties, 2);
        let names: Vec<&str> = top.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            ["big", "medium", "other"],
            "most spent first, then the rest"
        );
        let other = &top[2];
        assert_eq!(
            other.answers.upstream,
            1 + 3,
            "small and the tenants already folded"
        );
        assert_eq!(other.tokens.upstream, 40);
        assert_eq!(other.cost_nano_usd.upstream, 8);
        let total: u64 = top.iter().map(|p| p.answers.upstream).sum();
        assert_eq!(total, 11, "nothing dropped");
    }

    fn point(t_ms: u64, usd: f64) -> Point {
        Point {
            t_ms,
            spent_usd: usd,
            saved_usd: usd * 2.0,
        }
    }

    #[test]
    fn history_ends_now_and_keeps_one_sample_per_step() {
        let mut history = History::new(1_000);
        let points = history.sample(point(2_000, 1.0));
        assert_eq!(points, [point(1_000, 0.0), point(2_000, 1.0)]);
        assert_eq!(history.points.len(), 1, "within a step: not stored");
        let points = history.sample(point(6_000, 2.0));
        assert_eq!(points.len(), 2);
        assert_eq!(history.points.len(), 2);
        assert_eq!(points.last(), Some(&point(6_000, 2.0)));
    }

    #[test]
    fn history_is_bounded_and_still_spans_the_uptime() {
        let mut history = History::new(0);
        for step in 1..=10_000u64 {
            history.sample(point(step * STEP_MS, step as f64));
        }
        assert!(history.points.len() <= MAX_POINTS);
        assert_eq!(history.points[0].t_ms, 0, "the start stays");
        let points = history.sample(point(10_000 * STEP_MS + 1, 0.5));
        assert_eq!(points.last().unwrap().t_ms, 10_000 * STEP_MS + 1);
    }
}
