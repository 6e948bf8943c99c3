//! Tokens and cost, spent and saved: the Prometheus metrics of one gateway.
//!
//! [`Metrics`] owns its own `prometheus-client` registry (no global recorder),
//! so every `AppState` counts alone: the integration tests run many gateways in
//! one process and assert exact numbers. `/metrics` encodes the registry,
//! `/stats` reads the same counters back ([`Stats`]), so the two cannot disagree.
//!
//! Where the numbers come from:
//! - every upstream call, once per call (never per waiter): `upstream_call`
//!   (from the client: status, attempts, latency) and `upstream_usage` (from
//!   the response's `usage`: tokens and cost on the `upstream` side);
//! - every response served without its own upstream call (HIT, STALE,
//!   COALESCED): `served` adds that response's `usage` to the `saved` side;
//! - every request to a deduplicated endpoint: `request` (cache status, latency).
//!
//! A response without `usage` is counted in `corral_usage_unknown_total`, and
//! adds no tokens and no cost: nothing is invented. Labels are bounded: the
//! model label comes from [`ModelTable`], the upstream label from the config.

mod models;
mod stats;

use std::{
    fmt,
    sync::{Arc, Mutex, PoisonError, atomic::AtomicU64},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

pub use models::{ModelLabel, ModelTable};
pub use stats::{
    CostSides, History, ModelStats, Point, RequestStats, SavedStats, Stats, TokenSides, Tokens,
    UpstreamStats, UsageUnknown,
};

use crate::{cache::Usage, coalesce::CacheStatus, config::Config};

/// The Prometheus text format (0.0.4) content type `/metrics` answers with.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// `cache` label values of `corral_requests_total`: how a request was served,
/// or `ERROR` when it was not.
pub const CACHE_LABELS: [&str; 6] = ["HIT", "STALE", "MISS", "COALESCED", "BYPASS", "ERROR"];
/// `endpoint` label values (`Endpoint::label`).
pub const ENDPOINT_LABELS: [&str; 3] = ["chat", "completions", "embeddings"];
/// `via` label values of `corral_saved_responses_total`.
pub const VIA_LABELS: [&str; 3] = ["hit", "stale", "coalesced"];

const UPSTREAM: &str = "upstream";
const SAVED: &str = "saved";
const PROMPT: &str = "prompt";
const COMPLETION: &str = "completion";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    endpoint: &'static str,
    cache: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamCallLabels {
    upstream: String,
    model: Arc<str>,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamLabels {
    upstream: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabels {
    model: Arc<str>,
    kind: &'static str,
    source: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    model: Arc<str>,
    source: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SavedLabels {
    model: Arc<str>,
    via: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// 5 ms to ~80 s: a cache hit to a long completion.
fn request_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

/// 25 ms to ~400 s: one upstream call, all attempts and backoff included.
fn upstream_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.025, 2.0, 15))
}

/// What the scrape reads from the running gateway (the flights, the cache)
/// rather than counting itself.
#[derive(Debug, Clone, Copy, Default)]
pub struct Live {
    pub in_flight: usize,
    pub waiters: usize,
    pub cache_entries: Option<u64>,
}

/// The gateway's metrics. Cheap to clone (an `Arc` inside); every clone counts
/// into the same registry.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

struct Inner {
    registry: Registry,
    models: ModelTable,
    upstreams: Vec<String>,
    pricing_as_of: Option<String>,
    started: Instant,
    started_at_ms: u64,
    requests: Family<RequestLabels, Counter>,
    request_duration: HistogramFamily<RequestLabels>,
    upstream_requests: Family<UpstreamCallLabels, Counter>,
    /// The label sets `upstream_requests` has, for `/stats` (the family cannot
    /// be walked). Bounded like the labels themselves.
    upstream_seen: Mutex<Vec<UpstreamCallLabels>>,
    upstream_retries: Family<UpstreamLabels, Counter>,
    upstream_duration: HistogramFamily<UpstreamLabels>,
    tokens: Family<TokenLabels, Counter>,
    cost: Family<SourceLabels, Counter<f64, AtomicU64>>,
    usage_unknown: Family<SourceLabels, Counter>,
    saved_responses: Family<SavedLabels, Counter>,
    in_flight: Gauge,
    waiters: Gauge,
    cache_entries: Gauge,
    redis_errors: Counter,
    history: Mutex<History>,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or_default()
}

impl Metrics {
    pub fn new(config: &Config) -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "corral_requests",
            "Requests to the deduplicated endpoints, by how they were served (cache status, or ERROR)",
            requests.clone(),
        );
        let request_duration: HistogramFamily<RequestLabels> =
            Family::new_with_constructor(request_histogram);
        registry.register(
            "corral_request_duration_seconds",
            "Time from request to response headers, by endpoint and cache status",
            request_duration.clone(),
        );
        let upstream_requests = Family::<UpstreamCallLabels, Counter>::default();
        registry.register(
            "corral_upstream_requests",
            "Calls to a provider (all attempts of one call count once), by final status",
            upstream_requests.clone(),
        );
        let upstream_retries = Family::<UpstreamLabels, Counter>::default();
        registry.register(
            "corral_upstream_retries",
            "Attempts beyond the first made by upstream calls",
            upstream_retries.clone(),
        );
        let upstream_duration: HistogramFamily<UpstreamLabels> =
            Family::new_with_constructor(upstream_histogram);
        registry.register(
            "corral_upstream_duration_seconds",
            "Duration of one upstream call, every attempt and backoff included",
            upstream_duration.clone(),
        );
        let tokens = Family::<TokenLabels, Counter>::default();
        registry.register(
            "corral_tokens",
            "Tokens from the provider's usage: source=upstream were paid for, source=saved were served without a call",
            tokens.clone(),
        );
        let cost = Family::<SourceLabels, Counter<f64, AtomicU64>>::default();
        registry.register(
            "corral_cost_usd",
            "USD at the configured prices: source=upstream spent, source=saved not spent",
            cost.clone(),
        );
        let usage_unknown = Family::<SourceLabels, Counter>::default();
        registry.register(
            "corral_usage_unknown",
            "Responses that carried no usage: their tokens and cost are unknown and not counted",
            usage_unknown.clone(),
        );
        let saved_responses = Family::<SavedLabels, Counter>::default();
        registry.register(
            "corral_saved_responses",
            "Responses served without their own upstream call, by how (hit, stale, coalesced)",
            saved_responses.clone(),
        );
        let in_flight = Gauge::default();
        registry.register(
            "corral_inflight_flights",
            "Upstream calls in flight on this instance, background refreshes included",
            in_flight.clone(),
        );
        let waiters = Gauge::default();
        registry.register(
            "corral_waiters",
            "Callers waiting on an in-flight upstream call",
            waiters.clone(),
        );
        let cache_entries = Gauge::default();
        registry.register(
            "corral_cache_entries",
            "Entries in the in-process cache (approximate)",
            cache_entries.clone(),
        );
        let redis_errors = Counter::default();
        registry.register(
            "corral_redis_errors",
            "Redis operations that failed or timed out (the request went on without Redis)",
            redis_errors.clone(),
        );

        let upstreams: Vec<String> = config.upstreams.iter().map(|u| u.name.clone()).collect();
        // Series that exist from the start, so rates and ratios are defined
        // before the first request of each kind.
        for endpoint in ENDPOINT_LABELS {
            for cache in CACHE_LABELS {
                drop(requests.get_or_create(&RequestLabels { endpoint, cache }));
            }
        }
        for upstream in &upstreams {
            drop(upstream_retries.get_or_create(&UpstreamLabels {
                upstream: upstream.clone(),
            }));
        }
        let started_at_ms = unix_ms();
        Self {
            inner: Arc::new(Inner {
                registry,
                models: ModelTable::new(&config.pricing, &config.upstreams),
                upstreams,
                pricing_as_of: config.pricing.as_of.clone(),
                started: Instant::now(),
                started_at_ms,
                requests,
                request_duration,
                upstream_requests,
                upstream_seen: Mutex::default(),
                upstream_retries,
                upstream_duration,
                tokens,
                cost,
                usage_unknown,
                saved_responses,
                in_flight,
                waiters,
                cache_entries,
                redis_errors,
                history: Mutex::new(History::new(started_at_ms)),
            }),
        }
    }

    /// The bounded label for a request's `model`, with its price.
    pub fn model(&self, model: &str) -> ModelLabel {
        self.inner.models.label(model)
    }

    /// A finished request to a deduplicated endpoint. `cache` is one of
    /// [`CACHE_LABELS`]; anything else counts as `ERROR`.
    pub fn request(&self, endpoint: &'static str, cache: &str, elapsed: Duration) {
        let cache = CACHE_LABELS
            .into_iter()
            .find(|known| *known == cache)
            .unwrap_or("ERROR");
        let labels = RequestLabels { endpoint, cache };
        self.inner.requests.get_or_create(&labels).inc();
        self.inner
            .request_duration
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
    }

    /// One upstream call, all its attempts together: `status` is the final
    /// HTTP status, or a word for a call that got none (`timeout`, `unreachable`, ...).
    pub fn upstream_call(
        &self,
        upstream: &str,
        model: &ModelLabel,
        status: &str,
        attempts: usize,
        elapsed: Duration,
    ) {
        let labels = UpstreamCallLabels {
            upstream: upstream.to_owned(),
            model: model.shared_name(),
            status: status.to_owned(),
        };
        if self.inner.upstream_requests.get(&labels).is_none() {
            let mut seen = lock(&self.inner.upstream_seen);
            if !seen.contains(&labels) {
                seen.push(labels.clone());
            }
        }
        self.inner.upstream_requests.get_or_create(&labels).inc();
        let upstream = UpstreamLabels {
            upstream: upstream.to_owned(),
        };
        let retries = u64::try_from(attempts.saturating_sub(1)).unwrap_or(u64::MAX);
        self.inner
            .upstream_retries
            .get_or_create(&upstream)
            .inc_by(retries);
        self.inner
            .upstream_duration
            .get_or_create(&upstream)
            .observe(elapsed.as_secs_f64());
    }

    /// The usage of one upstream response (`None`: the provider sent none).
    pub fn upstream_usage(&self, model: &ModelLabel, usage: Option<Usage>) {
        self.add_usage(model, UPSTREAM, usage);
    }

    /// A response served to a caller. HIT, STALE and COALESCED were served
    /// without this caller's own upstream call: their usage is saved. MISS and
    /// BYPASS were paid for where the upstream call was made, so add nothing here.
    pub fn served(&self, model: &ModelLabel, status: CacheStatus, usage: Option<Usage>) {
        let via = match status {
            CacheStatus::Hit => "hit",
            CacheStatus::Stale => "stale",
            CacheStatus::Coalesced => "coalesced",
            CacheStatus::Miss | CacheStatus::Bypass => return,
        };
        self.inner
            .saved_responses
            .get_or_create(&SavedLabels {
                model: model.shared_name(),
                via,
            })
            .inc();
        self.add_usage(model, SAVED, usage);
    }

    /// A Redis operation failed or timed out.
    pub fn redis_error(&self) {
        self.inner.redis_errors.inc();
    }

    fn add_usage(&self, model: &ModelLabel, source: &'static str, usage: Option<Usage>) {
        let name = model.shared_name();
        let Some(usage) = usage else {
            self.inner
                .usage_unknown
                .get_or_create(&SourceLabels {
                    model: name,
                    source,
                })
                .inc();
            return;
        };
        for (kind, count) in [
            (PROMPT, usage.prompt_tokens),
            (COMPLETION, usage.completion_tokens),
        ] {
            self.inner
                .tokens
                .get_or_create(&TokenLabels {
                    model: name.clone(),
                    kind,
                    source,
                })
                .inc_by(count);
        }
        if let Some(cost) = model.cost_usd(usage) {
            self.inner
                .cost
                .get_or_create(&SourceLabels {
                    model: name,
                    source,
                })
                .inc_by(cost);
        }
    }

    /// Sets the gauges read from the running gateway; call before `encode`/`stats`.
    pub fn set_live(&self, live: Live) {
        let to_i64 = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.inner.in_flight.set(to_i64(live.in_flight as u64));
        self.inner.waiters.set(to_i64(live.waiters as u64));
        if let Some(entries) = live.cache_entries {
            self.inner.cache_entries.set(to_i64(entries));
        }
    }

    /// The registry in the Prometheus text format (0.0.4).
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ =
            prometheus_client::encoding::prometheus_text::encode(&mut text, &self.inner.registry);
        text
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The guarded data stays consistent at every step, so a panic elsewhere
    // does not make it unusable.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ModelPrice, PriceTable};

    fn metrics() -> Metrics {
        let mut config = Config::for_tests("http://127.0.0.1:1/v1");
        config.pricing.models = PriceTable(vec![(
            "gpt-4o-mini".into(),
            ModelPrice {
                input: 0.15,
                output: 0.6,
                cached_input: None,
            },
        )]);
        Metrics::new(&config)
    }

    const USAGE: Usage = Usage {
        prompt_tokens: 8,
        completion_tokens: 7,
    };

    #[test]
    fn each_gateway_counts_alone() {
        let (a, b) = (metrics(), metrics());
        let model = a.model("gpt-4o-mini");
        a.served(&model, CacheStatus::Hit, Some(USAGE));
        assert_eq!(a.stats().saved_responses.total, 1);
        assert_eq!(b.stats().saved_responses.total, 0);
    }

    #[test]
    fn miss_and_bypass_add_nothing_to_the_saved_side() {
        let metrics = metrics();
        let model = metrics.model("gpt-4o-mini");
        metrics.served(&model, CacheStatus::Miss, Some(USAGE));
        metrics.served(&model, CacheStatus::Bypass, Some(USAGE));
        metrics.served(&model, CacheStatus::Coalesced, Some(USAGE));
        metrics.served(&model, CacheStatus::Stale, None);
        let stats = metrics.stats();
        assert_eq!(stats.saved_responses.total, 2);
        assert_eq!(stats.saved_responses.coalesced, 1);
        assert_eq!(stats.saved_responses.stale, 1);
        assert_eq!(
            stats.tokens.saved,
            Tokens {
                prompt: 8,
                completion: 7
            }
        );
        assert_eq!(
            stats.usage_unknown.saved, 1,
            "no usage: unknown, not invented"
        );
        let expected = (8.0 * 0.15 + 7.0 * 0.6) / 1e6;
        assert!((stats.cost_usd.saved - expected).abs() < 1e-15);
    }

    #[test]
    fn unpriced_models_count_tokens_but_no_cost() {
        let metrics = metrics();
        let model = metrics.model("some-model-nobody-priced");
        assert_eq!(model.as_str(), "other");
        metrics.upstream_usage(&model, Some(USAGE));
        let stats = metrics.stats();
        assert_eq!(
            stats.tokens.upstream,
            Tokens {
                prompt: 8,
                completion: 7
            }
        );
        assert_eq!(stats.cost_usd.upstream, 0.0);
        let other = stats.models.iter().find(|m| m.model == "other").unwrap();
        assert!(!other.priced);
        assert!(!metrics.encode().contains("corral_cost_usd_total{"));
    }

    #[test]
    fn retries_are_attempts_beyond_the_first() {
        let metrics = metrics();
        let model = metrics.model("gpt-4o-mini");
        metrics.upstream_call("mock", &model, "200", 3, Duration::from_millis(5));
        metrics.upstream_call("mock", &model, "200", 1, Duration::from_millis(5));
        metrics.upstream_call("mock", &model, "timeout", 1, Duration::from_millis(5));
        let stats = metrics.stats();
        assert_eq!(stats.upstream.calls, 3);
        assert_eq!(stats.upstream.retries, 2);
        assert_eq!(stats.upstream.by_status["200"], 2);
        assert_eq!(stats.upstream.by_status["timeout"], 1);
    }
}
