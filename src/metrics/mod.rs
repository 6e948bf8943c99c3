//! Tokens and cost, spent and saved: the Prometheus metrics of one gateway,
//! and the books (`ledger.rs`) `/stats` reads.
//!
//! [`Metrics`] owns its own `prometheus-client` registry (no global recorder),
//! so every `AppState` counts alone: the integration tests run many gateways in
//! one process and assert exact numbers. Every event is counted once, here,
//! into both the registry (`/metrics`: this instance) and the [`Books`]
//! (`/stats`: the cluster's totals when the ledger is in Redis, else this
//! instance's). Money is counted in integer picodollars by the books, and
//! `corral_cost_usd_total` is encoded from them at scrape time, so it never
//! accumulates float error.
//!
//! Where the numbers come from:
//! - every upstream call, once per call (never per waiter): `upstream_call`
//!   (from the client: status, attempts, latency) and `upstream_usage` (from
//!   the response's `usage`: tokens and cost on the `upstream` side);
//! - every response served without its own upstream call (HIT, STALE,
//!   COALESCED): `served` adds that response's `usage` to the `saved` side;
//! - every request to a deduplicated endpoint: `request` (cache status, latency).
//!
//! A call whose usage stays unknown is billed an estimate from what is known
//! (its request's size, the text it relayed), counted in
//! `corral_usage_estimated_total` by reason; an answer without `usage` that
//! nothing estimates (a saving) is counted in `corral_usage_unknown_total` and
//! adds no tokens and no cost. Tokens of a model without a
//! price are counted, and also on `corral_unpriced_tokens_total`. Labels are
//! bounded: the model label comes from [`ModelTable`], the upstream label from
//! the config; tenants are never a Prometheus label (they are on `/stats`).

mod attribution;
mod books;
mod calls;
mod labels;
mod models;
mod stats;

use std::{
    fmt,
    sync::{Arc, Mutex, OnceLock, PoisonError},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

pub use attribution::Attribution;
use books::BooksCollector;
use calls::{CallKind, CallSeries, CallSeriesMemo};
use labels::{
    BudgetLabels, EstimatedLabels, FailoverLabels, GenAiLabels, HistogramFamily, MemberLabels,
    RequestLabels, SavedLabels, SourceLabels, TokenLabels, UpstreamCallLabels, UpstreamLabels,
    UsdGauge, request_histogram, token_histogram, upstream_histogram,
};
pub use models::{ModelLabel, ModelTable};
pub use stats::{
    CostSides, History, MemberStats, ModelStats, NanoSides, PartyStats, Point, PricingStats,
    RequestStats, SavedStats, SnapshotStats, Stats, TokenSides, Tokens, UpstreamStats,
    UsageUnknown,
};

use crate::{
    budget::BudgetUse,
    cache::CacheUsage,
    cache_status::CacheStatus,
    config::Config,
    ledger::{Account, AnswerAmounts, AnswerKey, Books, LedgerCounter, Measure, Party, Side},
    pricing::{PicoUsd, Snapshot},
    sse::LogBytes,
    usage::{Estimated, Usage},
};

/// The Prometheus text format (0.0.4) content type `/metrics` answers with.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// `cache` label values of `corral_requests_total`: how a request was served,
/// or `ERROR` when it was not.
pub const CACHE_LABELS: [&str; 6] = ["HIT", "STALE", "MISS", "COALESCED", "BYPASS", "ERROR"];
/// `endpoint` label values (`Endpoint::label`).
pub const ENDPOINT_LABELS: [&str; 7] = [
    "chat",
    "completions",
    "embeddings",
    "responses",
    "messages",
    "gemini",
    "gemini_embeddings",
];
/// `via` label values of `corral_saved_responses_total`.
pub const VIA_LABELS: [&str; 4] = ["hit", "stale", "coalesced", "retry"];

/// What the `member` label says of a call that made no attempt (every member
/// cooling or refused by its breaker or caps).
pub const NO_MEMBER: &str = "-";

/// One endpoint and cache status's request counter, latency histogram and
/// ledger account (clones that count into the families' own series).
struct RequestSeries {
    count: Counter,
    duration: Histogram,
    /// The same count in the books (`/stats` and the cluster ledger).
    booked: LedgerCounter,
}

/// What the scrape reads from the running gateway (the flights, the cache)
/// rather than counting itself.
#[derive(Debug, Clone, Copy, Default)]
pub struct Live {
    pub in_flight: usize,
    pub waiters: usize,
    pub cache: Option<CacheUsage>,
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
    pricing_as_of: Option<String>,
    snapshot: Option<&'static Snapshot>,
    /// Entries of `pricing.models`.
    configured_prices: usize,
    /// Tenants `/stats` names; the rest are summed as `other`.
    top_tenants: usize,
    books: Arc<Books>,
    started: Instant,
    started_at_ms: u64,
    requests: Family<RequestLabels, Counter>,
    request_duration: HistogramFamily<RequestLabels>,
    /// Per endpoint and cache status (`ENDPOINT_LABELS` x `CACHE_LABELS`):
    /// the series a finished request counts into, found once. A family
    /// lookup hashes its labels under a lock on every request.
    request_series: Box<[OnceLock<RequestSeries>]>,
    upstream_requests: Family<UpstreamCallLabels, Counter>,
    upstream_retries: Family<UpstreamLabels, Counter>,
    upstream_duration: HistogramFamily<UpstreamLabels>,
    /// The three above, per kind of call, found once (`calls.rs`).
    call_series: CallSeriesMemo,
    failovers: Family<FailoverLabels, Counter>,
    member_cooling: Family<MemberLabels, Gauge>,
    /// Upstreams configured with `members`: their calls and spend are
    /// booked by member too (`/stats`); a plain upstream's member is itself.
    pools: Vec<String>,
    gen_ai_tokens: HistogramFamily<GenAiLabels>,
    embedding_inputs: Family<SavedLabels, Counter>,
    in_flight: Gauge,
    waiters: Gauge,
    cache_entries: Gauge,
    cache_bytes: Gauge,
    /// Counted by the stream logs themselves; copied into `stream_log_bytes_gauge` on scrape.
    stream_log_bytes: LogBytes,
    stream_log_bytes_gauge: Gauge,
    redis_errors: Counter,
    budget_usd: Family<BudgetLabels, UsdGauge>,
    budget_spent_usd: Family<BudgetLabels, UsdGauge>,
    usage_estimated: Family<EstimatedLabels, Counter>,
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
        let snapshot = config.pricing.snapshot.then(crate::pricing::snapshot);
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
        let failovers = Family::<FailoverLabels, Counter>::default();
        registry.register(
            "corral_failovers",
            "Calls moved on before any byte reached a caller: from one member of a pool to another, by the failed attempt's outcome, or (reason=fallback) from a pool none of whose members could answer to its fallback model's upstream",
            failovers.clone(),
        );
        let member_cooling = Family::<MemberLabels, Gauge>::default();
        registry.register(
            "corral_member_cooling",
            "1 while a pool member is cooling down after the provider's 429 or overload (its quota bucket with it), else 0",
            member_cooling.clone(),
        );
        let gen_ai_tokens: HistogramFamily<GenAiLabels> =
            Family::new_with_constructor(token_histogram);
        registry.register(
            "gen_ai_client_token_usage",
            "OpenTelemetry GenAI gen_ai.client.token.usage: tokens per upstream answer, by gen_ai.token.type (input includes cached input, output includes reasoning)",
            gen_ai_tokens.clone(),
        );
        let embedding_inputs = Family::<SavedLabels, Counter>::default();
        registry.register(
            "corral_embedding_inputs",
            "Embeddings inputs served, by how (hit, stale, coalesced: saved; miss: sent upstream)",
            embedding_inputs.clone(),
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
        let cache_bytes = Gauge::default();
        registry.register(
            "corral_cache_bytes",
            "Bytes held by the in-process cache, as cache.max_bytes weighs them",
            cache_bytes.clone(),
        );
        let stream_log_bytes_gauge = Gauge::default();
        registry.register(
            "corral_stream_log_bytes",
            "Bytes held by stream event logs (live streams, and finished ones a reader still holds)",
            stream_log_bytes_gauge.clone(),
        );
        let budget_usd = Family::<BudgetLabels, UsdGauge>::default();
        registry.register(
            "corral_budget_usd",
            "Each spend budget (budgets), in USD per window; one series per rule (a `*` rule's is each tenant's)",
            budget_usd.clone(),
        );
        let budget_spent_usd = Family::<BudgetLabels, UsdGauge>::default();
        registry.register(
            "corral_budget_spent_usd",
            "What the provider billed against each budget in its current window, in USD (the fleet's, with Redis); a `*` rule's: the most one tenant spent",
            budget_spent_usd.clone(),
        );
        let usage_estimated = Family::<EstimatedLabels, Counter>::default();
        registry.register(
            "corral_usage_estimated",
            "Upstream calls billed an estimate because their usage stayed unknown (a broken or abandoned stream, an answer without usage): request bytes / 4 as input, relayed text bytes / 4 as output",
            usage_estimated.clone(),
        );
        let redis_errors = Counter::default();
        registry.register(
            "corral_redis_errors",
            "Redis operations that failed or timed out (the request went on without Redis)",
            redis_errors.clone(),
        );

        let books = Arc::new(Books::new(config.ledger.max_tenants));
        registry.register_collector(Box::new(BooksCollector(books.clone())));

        // Series that exist from the start, so rates and ratios are defined
        // before the first request of each kind.
        for endpoint in ENDPOINT_LABELS {
            for cache in CACHE_LABELS {
                drop(requests.get_or_create(&RequestLabels { endpoint, cache }));
            }
        }
        for upstream in &config.upstreams {
            for member in upstream.effective_members() {
                let member: Arc<str> = member.name.into();
                drop(upstream_retries.get_or_create(&UpstreamLabels {
                    upstream: upstream.name.clone(),
                    member: member.clone(),
                }));
                if upstream.members.len() > 1 {
                    drop(member_cooling.get_or_create(&MemberLabels {
                        upstream: upstream.name.clone(),
                        member,
                    }));
                }
            }
        }
        let pools = config
            .upstreams
            .iter()
            .filter(|upstream| !upstream.members.is_empty())
            .map(|upstream| upstream.name.clone())
            .collect();
        let started_at_ms = unix_ms();
        Self {
            inner: Arc::new(Inner {
                registry,
                models: ModelTable::new(&config.pricing, snapshot, &config.upstreams),
                pricing_as_of: config.pricing.as_of.clone(),
                snapshot,
                configured_prices: config.pricing.models.0.len(),
                top_tenants: config.ledger.top_tenants,
                books,
                started: Instant::now(),
                started_at_ms,
                requests,
                request_duration,
                request_series: (0..ENDPOINT_LABELS.len() * CACHE_LABELS.len())
                    .map(|_| OnceLock::new())
                    .collect(),
                upstream_requests,
                upstream_retries,
                upstream_duration,
                call_series: CallSeriesMemo::default(),
                failovers,
                member_cooling,
                pools,
                gen_ai_tokens,
                embedding_inputs,
                in_flight,
                waiters,
                cache_entries,
                cache_bytes,
                stream_log_bytes: LogBytes::default(),
                stream_log_bytes_gauge,
                redis_errors,
                budget_usd,
                budget_spent_usd,
                usage_estimated,
                history: Mutex::new(History::new(started_at_ms)),
            }),
        }
    }

    /// The bounded label for a request's `model`, with its price.
    pub fn model(&self, model: &str) -> ModelLabel {
        self.inner.models.label(model)
    }

    /// The books `/stats` reads and the ledger flusher sends to Redis.
    pub fn books(&self) -> &Arc<Books> {
        &self.inner.books
    }

    /// A finished request to a deduplicated endpoint. `cache` is one of
    /// [`CACHE_LABELS`]; anything else counts as `ERROR`.
    pub fn request(&self, endpoint: &'static str, cache: &str, elapsed: Duration) {
        let cache = CACHE_LABELS
            .into_iter()
            .find(|known| *known == cache)
            .unwrap_or("ERROR");
        let labels = RequestLabels { endpoint, cache };
        let at = ENDPOINT_LABELS
            .iter()
            .position(|known| *known == endpoint)
            .zip(CACHE_LABELS.iter().position(|known| *known == cache))
            .map(|(e, c)| e * CACHE_LABELS.len() + c);
        let Some(at) = at else {
            // An endpoint outside `ENDPOINT_LABELS` (none today): looked up each time.
            self.inner.requests.get_or_create(&labels).inc();
            self.inner
                .request_duration
                .get_or_create(&labels)
                .observe(elapsed.as_secs_f64());
            self.inner
                .books
                .post([(Account::requests(endpoint, cache), 1)]);
            return;
        };
        let series = self.inner.request_series[at].get_or_init(|| RequestSeries {
            count: self.inner.requests.get_or_create(&labels).clone(),
            duration: self.inner.request_duration.get_or_create(&labels).clone(),
            booked: self.inner.books.counter(Account::requests(endpoint, cache)),
        });
        series.count.inc();
        series.duration.observe(elapsed.as_secs_f64());
        series.booked.add(1);
    }

    /// Whether `upstream` is configured with `members` (booked by member).
    fn is_pool(&self, upstream: &str) -> bool {
        self.inner.pools.iter().any(|pool| pool == upstream)
    }

    /// One upstream call, all its attempts together: `status` is the final
    /// HTTP status, or a word for a call that got none (`timeout`, `unreachable`, ...);
    /// `member` the pool member of its last attempt (`None`: it made none).
    pub fn upstream_call(
        &self,
        upstream: &str,
        member: Option<&str>,
        model: &ModelLabel,
        status: &str,
        attempts: usize,
        elapsed: Duration,
    ) {
        let member_label = member.unwrap_or(NO_MEMBER);
        let model_name = model.shared_name();
        let kind = CallKind {
            upstream,
            member: member_label,
            model: &model_name,
            status,
        };
        let series = self.inner.call_series.series(&kind, || {
            let member: Arc<str> = member_label.into();
            let labels = UpstreamLabels {
                upstream: upstream.to_owned(),
                member: member.clone(),
            };
            CallSeries {
                requests: self
                    .inner
                    .upstream_requests
                    .get_or_create(&UpstreamCallLabels {
                        upstream: upstream.to_owned(),
                        member,
                        model: model_name.clone(),
                        status: status.to_owned(),
                    })
                    .clone(),
                retries: self.inner.upstream_retries.get_or_create(&labels).clone(),
                duration: self.inner.upstream_duration.get_or_create(&labels).clone(),
            }
        });
        series.requests.inc();
        let retries = u64::try_from(attempts.saturating_sub(1)).unwrap_or(u64::MAX);
        let upstream_name: Arc<str> = upstream.into();
        self.inner.books.post([
            (
                Account::Calls {
                    upstream: upstream_name.clone(),
                    model: model_name.clone(),
                    status: status.into(),
                },
                1,
            ),
            (
                Account::Retries {
                    upstream: upstream_name,
                },
                u128::from(retries),
            ),
        ]);
        if let Some(member) = member.filter(|_| self.is_pool(upstream)) {
            self.inner.books.post([(
                Account::By {
                    party: Party::Member,
                    side: Side::Upstream,
                    measure: Measure::Calls,
                    name: crate::ledger::member_name(upstream, member),
                },
                1,
            )]);
        }
        series.retries.inc_by(retries);
        series.duration.observe(elapsed.as_secs_f64());
    }

    /// A call moved from pool member `from` to `to` of `upstream` after an
    /// attempt that ended in `reason` (its status, or `timeout`, `unreachable`,
    /// ...); `fallback`: from the pool `upstream` to its fallback's upstream.
    pub fn failover(&self, upstream: &str, from: &str, to: &str, reason: &str) {
        self.inner
            .failovers
            .get_or_create(&FailoverLabels {
                upstream: upstream.to_owned(),
                from: from.into(),
                to: to.into(),
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Sets `corral_member_cooling` from the pools (each `(pool, member,
    /// cooling)`); call before `encode`.
    pub fn set_cooling<'a>(
        &self,
        members: impl IntoIterator<Item = (&'a str, &'a Arc<str>, bool)>,
    ) {
        for (upstream, member, cooling) in members {
            self.inner
                .member_cooling
                .get_or_create(&MemberLabels {
                    upstream: upstream.to_owned(),
                    member: member.clone(),
                })
                .set(i64::from(cooling));
        }
    }

    /// The usage of one upstream response (`None`: the provider sent none).
    pub fn upstream_usage(&self, who: &Attribution, usage: Option<Usage>) {
        if let Some(usage) = &usage {
            let operation = gen_ai_operation(who.endpoint);
            for (token_type, tokens) in [
                ("input", usage.prompt_tokens),
                ("output", usage.completion_tokens),
            ] {
                self.inner
                    .gen_ai_tokens
                    .get_or_create(&GenAiLabels {
                        gen_ai_operation_name: operation,
                        gen_ai_request_model: who.model.shared_name(),
                        gen_ai_token_type: token_type,
                    })
                    .observe(tokens as f64);
            }
        }
        self.add_usage(who, Side::Upstream, None, usage);
    }

    /// An upstream call of `model` billed an estimate, for `reason` (its
    /// tokens and cost go through [`upstream_usage`](Self::upstream_usage)).
    pub fn usage_estimated(&self, model: &ModelLabel, reason: Estimated) {
        self.inner
            .usage_estimated
            .get_or_create(&EstimatedLabels {
                model: model.shared_name(),
                reason: reason.label(),
            })
            .inc();
    }

    /// A response served to a caller. HIT, STALE, COALESCED and a retry
    /// answered from the retry window were served without this caller's own
    /// upstream call: their usage is saved. MISS and
    /// BYPASS were paid for where the upstream call was made, so add nothing here.
    pub fn served(&self, who: &Attribution, status: CacheStatus, usage: Option<Usage>) {
        let via = match status {
            CacheStatus::Hit => "hit",
            CacheStatus::Stale => "stale",
            CacheStatus::Coalesced => "coalesced",
            CacheStatus::Retry => "retry",
            CacheStatus::Miss | CacheStatus::Bypass => return,
        };
        self.add_usage(who, Side::Saved, Some(via), usage);
    }

    /// `count` inputs of embeddings batches served as `status`. Their saved
    /// tokens go through [`served`](Self::served), one input at a time.
    pub fn embedding_inputs(&self, model: &ModelLabel, status: CacheStatus, count: u64) {
        let via = match status {
            CacheStatus::Hit | CacheStatus::Retry => "hit",
            CacheStatus::Stale => "stale",
            CacheStatus::Coalesced => "coalesced",
            CacheStatus::Miss | CacheStatus::Bypass => "miss",
        };
        if count == 0 {
            return;
        }
        self.inner
            .embedding_inputs
            .get_or_create(&SavedLabels {
                model: model.shared_name(),
                via,
            })
            .inc_by(count);
    }

    /// A Redis operation failed or timed out.
    pub fn redis_error(&self) {
        self.inner.redis_errors.inc();
    }

    /// One answer's tokens, cost and attribution, into the books: one post,
    /// which `/metrics` and `/stats` both read.
    fn add_usage(
        &self,
        who: &Attribution,
        side: Side,
        via: Option<&'static str>,
        usage: Option<Usage>,
    ) {
        let mut amounts = AnswerAmounts {
            answers: 1,
            ..AnswerAmounts::default()
        };
        match usage {
            None => amounts.unknown = 1,
            Some(usage) => {
                for (slot, (_, tokens)) in amounts.tokens.iter_mut().zip(usage.billed()) {
                    *slot = tokens;
                }
                match who.model.cost(&usage) {
                    Some(PicoUsd(picos)) => amounts.picos = picos,
                    None => amounts.unpriced = usage.total(),
                }
            }
        }
        let key = AnswerKey {
            side,
            via,
            model: who.model.shared_name(),
            tenant: who.tenant.clone(),
            upstream: who.upstream.clone(),
            member: who
                .member
                .as_deref()
                .filter(|_| side == Side::Upstream && self.is_pool(&who.upstream))
                .map(|member| crate::ledger::member_name(&who.upstream, member)),
        };
        self.inner.books.post_answer(key, &amounts);
    }

    /// Sets the gauges read from the running gateway; call before `encode`/`stats`.
    pub fn set_live(&self, live: Live) {
        let to_i64 = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.inner.in_flight.set(to_i64(live.in_flight as u64));
        self.inner.waiters.set(to_i64(live.waiters as u64));
        if let Some(cache) = live.cache {
            self.inner.cache_entries.set(to_i64(cache.entries));
            self.inner.cache_bytes.set(to_i64(cache.bytes));
        }
        let stream_bytes = self.inner.stream_log_bytes.get() as u64;
        self.inner.stream_log_bytes_gauge.set(to_i64(stream_bytes));
    }

    /// Sets the budget gauges to `uses` (each budget's current window); call
    /// before `encode`. A budget no longer listed (a tenant whose window
    /// ended) leaves the gauges.
    pub fn set_budgets(&self, uses: &[BudgetUse]) {
        self.inner.budget_usd.clear();
        self.inner.budget_spent_usd.clear();
        for used in uses {
            let labels = BudgetLabels {
                budget: used.subject.clone(),
                per: used.per.clone(),
            };
            self.inner.budget_usd.get_or_create(&labels).set(used.usd);
            self.inner
                .budget_spent_usd
                .get_or_create(&labels)
                .set(used.spent_usd);
        }
    }

    /// The tally every stream log of this gateway counts its bytes into.
    pub fn stream_log_bytes(&self) -> LogBytes {
        self.inner.stream_log_bytes.clone()
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

/// `gen_ai.operation.name` of an endpoint.
fn gen_ai_operation(endpoint: &str) -> &'static str {
    match endpoint {
        "chat" => "chat",
        "completions" => "text_completion",
        "embeddings" => "embeddings",
        // Both generate a model turn from a conversation, as chat does.
        "responses" | "messages" => "chat",
        _ => "other",
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
                cache_write: None,
            },
        )]);
        config.pricing.snapshot = false;
        Metrics::new(&config)
    }

    fn bill(metrics: &Metrics, model: &str) -> Attribution {
        Attribution {
            model: metrics.model(model),
            tenant: "team-a".into(),
            upstream: "mock".into(),
            endpoint: "chat",
            member: None,
        }
    }

    const USAGE: Usage = Usage {
        prompt_tokens: 8,
        completion_tokens: 7,
        cached_tokens: 0,
        cache_write_tokens: 0,
        reasoning_tokens: 0,
        audio_input_tokens: 0,
        audio_output_tokens: 0,
    };

    #[test]
    fn each_gateway_counts_alone() {
        let (a, b) = (metrics(), metrics());
        a.served(&bill(&a, "gpt-4o-mini"), CacheStatus::Hit, Some(USAGE));
        assert_eq!(a.stats().saved_responses.total, 1);
        assert_eq!(b.stats().saved_responses.total, 0);
    }

    #[test]
    fn miss_and_bypass_add_nothing_to_the_saved_side() {
        let metrics = metrics();
        let who = bill(&metrics, "gpt-4o-mini");
        metrics.served(&who, CacheStatus::Miss, Some(USAGE));
        metrics.served(&who, CacheStatus::Bypass, Some(USAGE));
        metrics.served(&who, CacheStatus::Coalesced, Some(USAGE));
        metrics.served(&who, CacheStatus::Stale, None);
        metrics.served(&who, CacheStatus::Retry, None);
        let stats = metrics.stats();
        assert_eq!(stats.scope, crate::ledger::Scope::Instance);
        assert_eq!(stats.saved_responses.total, 3);
        assert_eq!(stats.saved_responses.retry, 1);
        assert_eq!(stats.saved_responses.coalesced, 1);
        assert_eq!(stats.saved_responses.stale, 1);
        assert_eq!(
            (stats.tokens.saved.prompt, stats.tokens.saved.completion),
            (8, 7)
        );
        assert_eq!(
            stats.usage_unknown.saved, 2,
            "no usage: unknown, not invented"
        );
        // 8 x 0.15 + 7 x 0.6 per million, exactly.
        assert_eq!(stats.cost_nano_usd.saved, 5_400);
        assert_eq!(stats.cost_usd.saved, 0.0000054);
        let tenant = &stats.tenants[0];
        assert_eq!(tenant.name, "team-a");
        assert_eq!(
            tenant.answers.saved, 3,
            "a saved answer without usage is still one"
        );
        assert_eq!(tenant.cost_nano_usd.saved, 5_400);
        assert_eq!(stats.upstreams[0].name, "mock");
    }

    #[test]
    fn unpriced_models_count_tokens_but_no_cost() {
        let metrics = metrics();
        let who = bill(&metrics, "some-model-nobody-priced");
        assert_eq!(who.model.as_str(), "other");
        metrics.upstream_usage(&who, Some(USAGE));
        let stats = metrics.stats();
        assert_eq!(
            (
                stats.tokens.upstream.prompt,
                stats.tokens.upstream.completion
            ),
            (8, 7)
        );
        assert_eq!(stats.cost_usd.upstream, 0.0);
        assert_eq!(stats.unpriced_tokens.upstream, 15);
        let other = stats.models.iter().find(|m| m.model == "other").unwrap();
        assert!(!other.priced);
        assert_eq!(other.unpriced_tokens.upstream, 15);
        let text = metrics.encode();
        assert!(!text.contains("corral_cost_usd_total{"), "{text}");
        assert!(
            text.contains(r#"corral_unpriced_tokens_total{model="other",source="upstream"} 15"#),
            "{text}"
        );
    }

    #[test]
    fn retries_are_attempts_beyond_the_first() {
        let metrics = metrics();
        let model = metrics.model("gpt-4o-mini");
        metrics.upstream_call(
            "mock",
            Some("mock"),
            &model,
            "200",
            3,
            Duration::from_millis(5),
        );
        metrics.upstream_call(
            "mock",
            Some("mock"),
            &model,
            "200",
            1,
            Duration::from_millis(5),
        );
        metrics.upstream_call(
            "mock",
            Some("mock"),
            &model,
            "timeout",
            1,
            Duration::from_millis(5),
        );
        let stats = metrics.stats();
        assert_eq!(stats.upstream.calls, 3);
        assert_eq!(stats.upstream.retries, 2);
        assert_eq!(stats.upstream.by_status["200"], 2);
        assert_eq!(stats.upstream.by_status["timeout"], 1);
    }

    /// Done when: 1,000,000 counted answers of $0.00000315 each total exactly $3.15.
    #[test]
    fn a_million_answers_of_315_microcents_total_exactly_315_dollars() {
        let metrics = metrics();
        let who = bill(&metrics, "gpt-4o-mini");
        // 5 x 0.15 + 4 x 0.6 per million = $0.00000315.
        let usage = Usage {
            prompt_tokens: 5,
            completion_tokens: 4,
            ..Usage::default()
        };
        assert_eq!(who.model.cost(&usage).unwrap().to_string(), "$0.00000315");
        for _ in 0..1_000_000 {
            metrics.served(&who, CacheStatus::Hit, Some(usage));
        }
        let stats = metrics.stats();
        assert_eq!(stats.cost_nano_usd.saved, 3_150_000_000);
        assert_eq!(stats.cost_usd.saved, 3.15);
        let text = metrics.encode();
        assert!(
            text.contains(r#"corral_cost_usd_total{model="gpt-4o-mini",source="saved"} 3.15"#),
            "{text}"
        );
    }

    /// Done when: the Anthropic shape (cache reads and writes outside
    /// `input_tokens`) is billed kind by kind, exactly, and 9 repeats save 9x.
    #[test]
    fn an_anthropic_answer_bills_cache_reads_and_writes_at_their_prices() {
        let mut config = Config::for_tests("http://127.0.0.1:1/v1");
        config.pricing.snapshot = true;
        let metrics = Metrics::new(&config);
        let who = bill(&metrics, "claude-sonnet-4-5-20250929");
        assert_eq!(
            who.model.as_str(),
            "claude-sonnet-4-5",
            "priced by the snapshot"
        );
        let answer = br#"{"id":"msg_01","type":"message","role":"assistant",
            "model":"claude-sonnet-4-5-20250929","content":[{"type":"text","text":"42"}],
            "stop_reason":"end_turn","stop_sequence":null,
            "usage":{"input_tokens":100,"cache_creation_input_tokens":300,
                     "cache_read_input_tokens":2000,"output_tokens":50}}"#;
        let usage = Usage::from_body(answer).expect("Anthropic usage parses");
        metrics.upstream_usage(&who, Some(usage));
        for _ in 0..9 {
            metrics.served(&who, CacheStatus::Hit, Some(usage));
        }
        // 100 x 3 + 2000 x 0.30 + 300 x 3.75 + 50 x 15 per million = $0.002775.
        let one: u64 = 2_775_000;
        let stats = metrics.stats();
        assert_eq!(stats.cost_nano_usd.upstream, one);
        assert_eq!(stats.cost_nano_usd.saved, 9 * one);
        assert_eq!(stats.tokens.upstream.input, 100);
        assert_eq!(stats.tokens.upstream.cached_input, 2000);
        assert_eq!(stats.tokens.upstream.cache_write, 300);
        assert_eq!(stats.tokens.upstream.prompt, 2400);
        let text = metrics.encode();
        for line in [
            r#"corral_cost_usd_total{model="claude-sonnet-4-5",source="upstream"} 0.002775"#,
            r#"corral_cost_usd_total{model="claude-sonnet-4-5",source="saved"} 0.024975"#,
            r#"corral_tokens_total{model="claude-sonnet-4-5",kind="cache_write",source="upstream"} 300"#,
            r#"corral_tokens_total{model="claude-sonnet-4-5",kind="cached_input",source="saved"} 18000"#,
        ] {
            assert!(text.contains(line), "{line} missing:\n{text}");
        }
    }

    #[test]
    fn gen_ai_token_usage_counts_input_and_output_per_upstream_answer() {
        let metrics = metrics();
        let who = bill(&metrics, "gpt-4o-mini");
        metrics.upstream_usage(&who, Some(USAGE));
        metrics.served(&who, CacheStatus::Hit, Some(USAGE));
        let text = metrics.encode();
        for (token_type, sum) in [("input", 8), ("output", 7)] {
            let line = format!(
                r#"gen_ai_client_token_usage_sum{{gen_ai_operation_name="chat",gen_ai_request_model="gpt-4o-mini",gen_ai_token_type="{token_type}"}} {sum}"#
            );
            assert!(text.contains(&line), "{line} missing:\n{text}");
        }
        assert!(text.contains(
            r#"gen_ai_client_token_usage_count{gen_ai_operation_name="chat",gen_ai_request_model="gpt-4o-mini",gen_ai_token_type="input"} 1"#
        ), "a saved answer is no client call");
    }
}
