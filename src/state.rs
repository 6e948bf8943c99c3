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
    cluster::{Cluster, RedisBudgets, RedisCooldowns, RedisLedger, RedisPins, RedisPurges},
    coalesce::{Coalescer, FailureMemory, FlightContext},
    config::Config,
    dedup::{Dedup, DedupParts, stream_log_limits, stream_silence},
    ledger::{self, LedgerStore},
    limits::Limits,
    metrics::Metrics,
    passthrough::{self, Passthrough, Policy},
    pins::{PinStore, Pins},
    purge::{PurgeStore, Purges},
    retry_window::RetryWindow,
    traces::Traces,
    upstream::{Routes, Upstream},
};

/// See the module documentation. Its fields are its own: the edge, the
/// reports and the server take the parts they need through its methods.
#[derive(Debug)]
pub struct AppState {
    config: Config,
    /// The deduplicated endpoints' service.
    dedup: Arc<Dedup>,
    upstream: Arc<Upstream>,
    routes: Arc<Routes>,
    /// The answers' store (the reports read its size).
    cache: Arc<dyn CacheStore>,
    /// Requests, tokens and cost; this gateway's own registry.
    metrics: Metrics,
    /// Redis coordination, when configured.
    cluster: Option<Arc<Cluster>>,
    /// Detached work (flights, refreshes) that shutdown waits for.
    tasks: TaskTracker,
    /// Gateway keys and the keyed tenant scope.
    auth: Arc<Auth>,
    /// Which pass-through endpoints are proxied (`passthrough/`).
    passthrough_policy: Policy,
    /// Per-tenant rate and the global cap on requests served at once.
    limits: Limits,
    /// Spend budgets and the per-tenant token rate, checked before a new upstream call.
    budgets: Arc<Budgets>,
    /// Cancelled when the shutdown drain times out: running upstream calls end.
    cut_upstream: CancellationToken,
    /// The cluster ledger `/stats` reads, when Redis is configured.
    ledger: Option<Arc<dyn LedgerStore>>,
    /// Purge generations: the key every answer is stored and read under.
    purges: Arc<Purges>,
    /// Which pool member made each piece of provider state (`pins.rs`).
    pins: Arc<Pins>,
    /// Cancelled as soon as shutdown begins: `/readyz` answers 503 from then on.
    draining: CancellationToken,
    /// Trace export (`telemetry.otlp`); `None`: off, nothing built, nothing paid.
    traces: Option<Traces>,
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
    pub fn passthrough(&self) -> Passthrough<'_> {
        Passthrough::new(
            &self.upstream,
            &self.routes,
            &self.passthrough_policy,
            &self.config.upstreams,
            self.config.coalesce.stream_stall_timeout,
            &self.cut_upstream,
            &self.pins,
            passthrough::Billing {
                budgets: &self.budgets,
                metrics: &self.metrics,
            },
        )
    }

    /// The deduplicated endpoints' service.
    pub fn dedup(&self) -> &Arc<Dedup> {
        &self.dedup
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The upstream client: its circuits and names, for the health report.
    pub fn upstream(&self) -> &Upstream {
        &self.upstream
    }

    /// The answers' store, for the reports.
    pub fn cache(&self) -> &dyn CacheStore {
        &*self.cache
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Redis coordination, when configured.
    pub fn cluster(&self) -> Option<&Arc<Cluster>> {
        self.cluster.as_ref()
    }

    /// Detached work (flights, refreshes) that shutdown waits for.
    pub fn tasks(&self) -> &TaskTracker {
        &self.tasks
    }

    pub fn auth(&self) -> &Auth {
        &self.auth
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn budgets(&self) -> &Budgets {
        &self.budgets
    }

    pub fn purges(&self) -> &Purges {
        &self.purges
    }

    /// Cancelled when the shutdown drain times out: running upstream calls end.
    pub fn cut_upstream(&self) -> &CancellationToken {
        &self.cut_upstream
    }

    /// Cancelled as soon as shutdown begins.
    pub fn draining(&self) -> &CancellationToken {
        &self.draining
    }

    /// Trace export, when on.
    pub fn traces(&self) -> Option<&Traces> {
        self.traces.as_ref()
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
        let pins = Arc::new(Pins::new(cluster.as_ref().map(|cluster| {
            let store: Arc<dyn PinStore> = Arc::new(RedisPins::new(cluster.clone()));
            store
        })));
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
        let routes = Arc::new(Routes::new(&config.upstreams));
        let mut upstream = Upstream::guarded(
            &config,
            metrics.clone(),
            clock.clone(),
            cut_upstream.clone(),
        )?;
        // With Redis, a cooldown one instance learns holds on every instance.
        let cooldown_sharing = cluster.as_ref().and_then(|cluster| {
            upstream.share_cooldowns(Arc::new(RedisCooldowns::new(cluster.clone())))
        });
        let upstream = Arc::new(upstream);
        if let Some(sharing) = cooldown_sharing {
            tokio::spawn(sharing.run(upstream.clone(), background.clone()));
        }
        let auth = Arc::new(Auth::new(&config));
        let traces = Traces::start(&config.telemetry.otlp)?;
        let dedup = Arc::new(Dedup::new(
            &config,
            DedupParts {
                routes: routes.clone(),
                upstream: upstream.clone(),
                coalescer,
                purges: purges.clone(),
                retry_window,
                auth: auth.clone(),
                budgets: budgets.clone(),
                metrics: metrics.clone(),
                clock: clock.clone(),
                traced: traces.is_some(),
                cut_upstream: cut_upstream.clone(),
                pins: pins.clone(),
            },
        ));
        Ok(Self {
            dedup,
            cache,
            routes,
            upstream,
            auth,
            passthrough_policy: Policy::new(&config.passthrough),
            limits: Limits::new(&config, clock.clone()),
            budgets,
            cut_upstream,
            metrics,
            cluster,
            ledger,
            purges,
            pins,
            draining: CancellationToken::new(),
            tasks,
            traces,
            config,
            _background: background.drop_guard(),
        })
    }
}
