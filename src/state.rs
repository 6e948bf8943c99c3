//! `AppState`: everything a request needs, built once at start-up and shared
//! by `Arc`. No globals.

use std::sync::Arc;

use tokio_util::{
    sync::{CancellationToken, DropGuard},
    task::TaskTracker,
};

use crate::{
    auth::Auth,
    budget::{self, BudgetStore, Budgets},
    cache::{CacheStore, MemoryStore, TtlPolicy},
    clock::{Clock, SystemClock},
    cluster::TieredStore,
    cluster::{Cluster, RedisBudgets, RedisLedger, RedisPurges},
    coalesce::{Coalescer, FailureMemory, FlightContext},
    config::Config,
    ledger::{self, LedgerStore},
    limits::Limits,
    metrics::Metrics,
    passthrough::Policy,
    purge::{PurgeStore, Purges},
    retry_window::RetryWindow,
    sse::LogLimits,
    traces::Traces,
    upstream::{Routes, Upstream},
};

fn stream_log_limits(config: &Config, metrics: &Metrics) -> LogLimits {
    LogLimits {
        max_bytes: config.limits.max_response_bytes,
        max_reader_lag: config.coalesce.max_reader_lag_bytes,
        tally: Some(metrics.stream_log_bytes()),
    }
}

#[derive(Debug)]
pub struct AppState {
    pub config: Config,
    pub routes: Routes,
    /// `config.upstreams[i].name`, indexed like the routes.
    pub upstream_names: Vec<String>,
    /// `config.upstreams[i].identity()`, what keys name an upstream by.
    pub upstream_keys: Vec<String>,
    pub cache: Arc<dyn CacheStore>,
    pub coalescer: Coalescer,
    pub upstream: Upstream,
    /// Requests, tokens and cost; this gateway's own registry.
    pub metrics: Metrics,
    pub clock: Arc<dyn Clock>,
    /// Redis coordination, when configured.
    pub cluster: Option<Arc<Cluster>>,
    /// Completed answers kept for the client's retries; `None` when off.
    pub retry_window: Option<Arc<RetryWindow>>,
    /// Detached work (flights, refreshes) that shutdown waits for.
    pub tasks: TaskTracker,
    /// Gateway keys and the keyed tenant scope.
    pub auth: Auth,
    /// Which pass-through endpoints are proxied (`passthrough/`).
    pub passthrough_policy: Policy,
    /// Per-tenant rate and the global cap on requests served at once.
    pub limits: Limits,
    /// Spend budgets and the per-tenant token rate, checked before a new upstream call.
    pub budgets: Arc<Budgets>,
    /// Cancelled when the shutdown drain times out: running upstream calls end.
    pub cut_upstream: CancellationToken,
    /// The cluster ledger `/stats` reads, when Redis is configured.
    pub ledger: Option<Arc<dyn LedgerStore>>,
    /// Purge generations: the key every answer is stored and read under.
    pub purges: Arc<Purges>,
    /// What requests seen before derive to, so their repeats skip the parse.
    pub memo: crate::memo::RequestMemo,
    /// Cancelled as soon as shutdown begins: `/readyz` answers 503 from then on.
    pub draining: CancellationToken,
    /// Trace export (`telemetry.otlp`); `None`: off, nothing built, nothing paid.
    pub traces: Option<Traces>,
    /// Stops the background loops (Redis subscriber, prober, ledger flusher) with the state.
    _background: DropGuard,
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl AppState {
    /// Adds this instance's pending counts into the cluster ledger now and
    /// reads the totals back (also done every `ledger.flush_interval`, and at
    /// shutdown). Without Redis there is nothing to flush.
    pub async fn flush_ledger(&self) -> Result<(), ledger::LedgerUnavailable> {
        match &self.ledger {
            Some(store) => self.metrics.books().flush(&**store, unix_ms()).await,
            None => Ok(()),
        }
    }

    /// The pass-through, with what it needs of this gateway.
    pub fn passthrough(&self) -> crate::passthrough::Passthrough<'_> {
        crate::passthrough::Passthrough {
            upstream: &self.upstream,
            routes: &self.routes,
            policy: &self.passthrough_policy,
            upstreams: &self.config.upstreams,
            stream_stall_timeout: self.config.coalesce.stream_stall_timeout,
            cut_upstream: &self.cut_upstream,
        }
    }

    /// Whether a new upstream call may start for `bill`'s tenant and upstream:
    /// 429 when a budget or the token rate is used up. Asked only where a call
    /// would start, never of an answer the cache or a flight already has.
    pub async fn may_call_upstream(
        &self,
        bill: &crate::metrics::Attribution,
    ) -> Result<(), crate::error::GatewayError> {
        self.budgets.admit(&bill.tenant, &bill.upstream).await
    }

    /// What one upstream call billed (`usage`; `None`: unknown), counted in
    /// the metrics and against the budgets, once per call.
    pub fn billed(&self, bill: &crate::metrics::Attribution, usage: Option<crate::usage::Usage>) {
        self.metrics.upstream_usage(bill, usage);
        if let Some(usage) = &usage
            && self.budgets.is_active()
        {
            let picos = bill.model.cost(usage).map(|cost| cost.0);
            self.budgets
                .spend(&bill.tenant, &bill.upstream, picos, usage.total());
        }
    }

    /// What `DedupRequest::parse` holds requests to: cache settings, input
    /// limits and the tenant key.
    pub fn request_rules(&self) -> crate::request::RequestRules<'_> {
        crate::request::RequestRules {
            cache: &self.config.cache,
            limits: crate::validate::InputLimits::from(&self.config.limits),
            tenant_key: self.auth.tenant_key(),
        }
    }

    /// How this gateway's stream logs are bounded and counted.
    pub fn stream_log_limits(&self) -> LogLimits {
        stream_log_limits(&self.config, &self.metrics)
    }

    pub fn build(config: Config) -> anyhow::Result<Self> {
        Self::build_with_clock(config, Arc::new(SystemClock))
    }

    /// As `build`, with the clock cache freshness is judged by (tests move it by hand).
    pub fn build_with_clock(config: Config, clock: Arc<dyn Clock>) -> anyhow::Result<Self> {
        let background = CancellationToken::new();
        let metrics = Metrics::new(&config);
        let cluster = config
            .redis
            .as_ref()
            .map(|redis| Cluster::start(redis, background.clone(), metrics.clone()));
        let ledger = cluster.as_ref().map(|cluster| {
            let store: Arc<dyn LedgerStore> = Arc::new(RedisLedger::new(
                cluster.clone(),
                config.ledger.retention,
                config.ledger.max_tenants,
            ));
            tokio::spawn(ledger::run_flusher(
                metrics.books().clone(),
                store.clone(),
                config.ledger.flush_interval,
                background.clone(),
                unix_ms,
            ));
            store
        });
        let budgets = Arc::new(Budgets::new(
            config.budgets.clone(),
            config
                .limits
                .per_tenant
                .and_then(|limits| limits.tokens_per_minute),
            config.ledger.max_tenants,
            clock.clone(),
            cluster.as_ref().map(|cluster| {
                let store: Arc<dyn BudgetStore> = Arc::new(RedisBudgets::new(cluster.clone()));
                store
            }),
        ));
        if cluster.is_some() && budgets.is_active() {
            tokio::spawn(budget::run_flusher(
                budgets.clone(),
                config.ledger.flush_interval,
                background.clone(),
            ));
        }
        let purges = Arc::new(Purges::new(
            &config,
            cluster.as_ref().map(|cluster| {
                let store: Arc<dyn PurgeStore> = Arc::new(RedisPurges::new(cluster.clone()));
                store
            }),
            clock.clone(),
        ));
        if cluster.is_some() {
            tokio::spawn(purges.clone().run_poller(background.clone()));
        }
        let cache: Arc<dyn CacheStore> = match (&cluster, &config.redis) {
            (Some(cluster), Some(redis)) => Arc::new(TieredStore::new(
                config.cache.max_bytes,
                redis.l1_ttl,
                cluster.clone(),
                clock.clone(),
            )),
            _ => Arc::new(MemoryStore::new(config.cache.max_bytes)),
        };
        let ttl = TtlPolicy {
            soft_ttl: config.cache.soft_ttl,
            hard_ttl: config.cache.hard_ttl,
            jitter: config.cache.ttl_jitter,
        };
        let retry_window =
            RetryWindow::new(&config.retry, cluster.clone(), clock.clone()).map(Arc::new);
        let tasks = TaskTracker::new();
        let cut_upstream = CancellationToken::new();
        let coalescer = Coalescer::new(
            FlightContext {
                cache: cache.clone(),
                clock: clock.clone(),
                ttl,
                cluster: cluster.clone(),
                error_ttl: config.cache.error_ttl,
                early_refresh_beta: config.cache.early_refresh_beta,
                wait_timeout: config.coalesce.wait_timeout,
                on_wait_timeout: config.coalesce.on_wait_timeout,
                stream_limits: stream_log_limits(&config, &metrics),
                stream_silence: stream_silence(&config.coalesce),
                max_entry_bytes: config.cache.max_entry_bytes,
                retry_window: retry_window.clone(),
                failures: FailureMemory::new(config.cache.error_ttl),
            },
            config.coalesce.clone(),
            tasks.clone(),
        );
        Ok(Self {
            routes: Routes::new(&config.upstreams),
            upstream_names: config.upstreams.iter().map(|u| u.name.clone()).collect(),
            upstream_keys: config.upstreams.iter().map(|u| u.identity()).collect(),
            upstream: Upstream::guarded(
                &config,
                metrics.clone(),
                clock.clone(),
                cut_upstream.clone(),
            )?,
            auth: Auth::new(&config),
            passthrough_policy: Policy::new(&config.passthrough),
            limits: Limits::new(&config, clock.clone()),
            budgets,
            cut_upstream,
            metrics,
            cache,
            coalescer,
            cluster,
            ledger,
            purges,
            memo: crate::memo::RequestMemo::default(),
            draining: CancellationToken::new(),
            retry_window,
            clock,
            tasks,
            traces: Traces::start(&config.telemetry.otlp)?,
            config,
            _background: background.drop_guard(),
        })
    }
}

/// How long a stream may be silent, before its first event and after.
pub fn stream_silence(coalesce: &crate::config::CoalesceConfig) -> crate::sse::Silence {
    crate::sse::Silence {
        first_event: coalesce.first_event_timeout,
        between_events: coalesce.stream_stall_timeout,
    }
}
