//! `/stats`: the same counters `/metrics` exposes, summed into one JSON
//! document since start, plus a short history of spent vs saved for the chart.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{
    CACHE_LABELS, COMPLETION, ENDPOINT_LABELS, Metrics, PROMPT, RequestLabels, SAVED, SavedLabels,
    SourceLabels, TokenLabels, UPSTREAM, UpstreamLabels, VIA_LABELS, lock, unix_ms,
};
use crate::config::ModelPrice;

#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    pub started_at_ms: u64,
    pub uptime_seconds: f64,
    /// When the configured prices were taken.
    pub pricing_as_of: Option<String>,
    pub requests: RequestStats,
    pub upstream: UpstreamStats,
    pub saved_responses: SavedStats,
    /// Share of answers that needed no upstream call of their own:
    /// saved / (saved + upstream calls); 0 before any.
    pub dedup_ratio: f64,
    pub tokens: TokenSides,
    pub cost_usd: CostSides,
    pub usage_unknown: UsageUnknown,
    /// Models with any activity, in pricing-table order.
    pub models: Vec<ModelStats>,
    pub in_flight: i64,
    pub waiters: i64,
    pub cache_entries: i64,
    pub redis_errors: u64,
    /// Cumulative spent and saved USD over time, oldest first, ending now.
    pub history: Vec<Point>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RequestStats {
    pub total: u64,
    /// Every cache status, zeros included.
    pub by_cache: BTreeMap<&'static str, u64>,
    pub by_endpoint: BTreeMap<&'static str, u64>,
}

#[derive(Debug, Clone, Serialize)]
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
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Tokens {
    pub prompt: u64,
    pub completion: u64,
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

impl Metrics {
    /// Everything since start, read from the registry's counters.
    pub fn stats(&self) -> Stats {
        let inner = &*self.inner;
        let count = |value: Option<u64>| value.unwrap_or(0);

        let mut by_cache = BTreeMap::new();
        let mut by_endpoint = BTreeMap::new();
        for endpoint in ENDPOINT_LABELS {
            for cache in CACHE_LABELS {
                let n = count(
                    inner
                        .requests
                        .get(&RequestLabels { endpoint, cache })
                        .map(|c| c.get()),
                );
                *by_cache.entry(cache).or_insert(0) += n;
                *by_endpoint.entry(endpoint).or_insert(0) += n;
            }
        }
        let requests = RequestStats {
            total: by_cache.values().sum(),
            by_cache,
            by_endpoint,
        };

        let seen = lock(&inner.upstream_seen).clone();
        let mut by_status = BTreeMap::new();
        let mut calls_by_model: BTreeMap<&str, u64> = BTreeMap::new();
        for labels in &seen {
            let n = count(inner.upstream_requests.get(labels).map(|c| c.get()));
            *by_status.entry(labels.status.clone()).or_insert(0) += n;
            *calls_by_model.entry(&*labels.model).or_insert(0) += n;
        }
        let retries = inner
            .upstreams
            .iter()
            .map(|upstream| {
                count(
                    inner
                        .upstream_retries
                        .get(&UpstreamLabels {
                            upstream: upstream.clone(),
                        })
                        .map(|c| c.get()),
                )
            })
            .sum();
        let upstream = UpstreamStats {
            calls: by_status.values().sum(),
            retries,
            by_status,
        };

        let mut models = Vec::new();
        let mut saved = SavedStats::default();
        let mut tokens = TokenSides::default();
        let mut cost = CostSides::default();
        let mut unknown = UsageUnknown::default();
        for label in inner.models.all() {
            let model = label.shared_name();
            let via = |via: &'static str| {
                count(
                    inner
                        .saved_responses
                        .get(&SavedLabels {
                            model: model.clone(),
                            via,
                        })
                        .map(|c| c.get()),
                )
            };
            let [hit, stale, coalesced] = VIA_LABELS.map(via);
            let model_saved = SavedStats {
                total: hit + stale + coalesced,
                hit,
                stale,
                coalesced,
            };
            let token = |kind: &'static str, source: &'static str| {
                count(
                    inner
                        .tokens
                        .get(&TokenLabels {
                            model: model.clone(),
                            kind,
                            source,
                        })
                        .map(|c| c.get()),
                )
            };
            let side = |source| Tokens {
                prompt: token(PROMPT, source),
                completion: token(COMPLETION, source),
            };
            let model_tokens = TokenSides {
                upstream: side(UPSTREAM),
                saved: side(SAVED),
            };
            let source = |source: &'static str| SourceLabels {
                model: model.clone(),
                source,
            };
            let usd = |s| inner.cost.get(&source(s)).map_or(0.0, |c| c.get());
            let model_cost = CostSides {
                upstream: usd(UPSTREAM),
                saved: usd(SAVED),
            };
            let unknown_of = |s| count(inner.usage_unknown.get(&source(s)).map(|c| c.get()));
            let model_unknown = UsageUnknown {
                upstream: unknown_of(UPSTREAM),
                saved: unknown_of(SAVED),
            };
            let upstream_calls = calls_by_model.get(&*model).copied().unwrap_or(0);
            let active = upstream_calls > 0
                || model_saved.total > 0
                || model_tokens != TokenSides::default()
                || model_unknown != UsageUnknown::default();
            if !active {
                continue;
            }
            saved.total += model_saved.total;
            saved.hit += hit;
            saved.stale += stale;
            saved.coalesced += coalesced;
            tokens.upstream.prompt += model_tokens.upstream.prompt;
            tokens.upstream.completion += model_tokens.upstream.completion;
            tokens.saved.prompt += model_tokens.saved.prompt;
            tokens.saved.completion += model_tokens.saved.completion;
            cost.upstream += model_cost.upstream;
            cost.saved += model_cost.saved;
            unknown.upstream += model_unknown.upstream;
            unknown.saved += model_unknown.saved;
            models.push(ModelStats {
                model: model.to_string(),
                priced: label.price().is_some(),
                price: label.price(),
                upstream_calls,
                saved_responses: model_saved,
                tokens: model_tokens,
                cost_usd: model_cost,
                usage_unknown: model_unknown,
            });
        }

        let answered = saved.total + upstream.calls;
        let dedup_ratio = if answered == 0 {
            0.0
        } else {
            saved.total as f64 / answered as f64
        };
        let history = lock(&inner.history).sample(Point {
            t_ms: unix_ms().max(inner.started_at_ms),
            spent_usd: cost.upstream,
            saved_usd: cost.saved,
        });
        Stats {
            started_at_ms: inner.started_at_ms,
            uptime_seconds: inner.started.elapsed().as_secs_f64(),
            pricing_as_of: inner.pricing_as_of.clone(),
            requests,
            upstream,
            saved_responses: saved,
            dedup_ratio,
            tokens,
            cost_usd: cost,
            usage_unknown: unknown,
            models,
            in_flight: inner.in_flight.get(),
            waiters: inner.waiters.get(),
            cache_entries: inner.cache_entries.get(),
            redis_errors: inner.redis_errors.get(),
            history,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
