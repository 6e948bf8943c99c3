//! [`Dedup`], the deduplicated endpoints' service: the parts of the gateway
//! those endpoints use, and nothing else. Built once by `AppState`, which
//! hands it to the edge; the strategies (`buffered.rs`, `stream.rs`, ...)
//! read its fields, the rest of the gateway sees its methods.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::{
    auth::Auth,
    budget::Budgets,
    clock::Clock,
    coalesce::Coalescer,
    config::{CacheConfig, CoalesceConfig, Config},
    error::GatewayError,
    memo::RequestMemo,
    metrics::{Attribution, Metrics},
    purge::Purges,
    request::RequestRules,
    retry_window::RetryWindow,
    sse::{LogLimits, Silence},
    upstream::{Routes, Upstream},
    usage::{Estimated, Usage},
    validate::InputLimits,
};

use super::embeddings::wire::ItemLimits;

/// See the module documentation. Every field is the dedup module's own.
#[derive(Debug)]
pub struct Dedup {
    /// `cache.*`: the scope, and the request rules' cache settings.
    pub(super) cache: CacheConfig,
    /// `coalesce.*`: keep-alives, stream silences, abandoned streams.
    pub(super) coalesce: CoalesceConfig,
    pub(super) input_limits: InputLimits,
    pub(super) item_limits: ItemLimits,
    pub(super) routes: Arc<Routes>,
    /// `config.upstreams[i].name`, indexed like the routes.
    pub(super) upstream_names: Vec<String>,
    /// `config.upstreams[i].identity()`, what keys name an upstream by.
    pub(super) upstream_keys: Vec<String>,
    /// `config.upstreams[i].fallback`: the models a call goes on to when
    /// none of the pool's members could answer it (`fallback.rs`).
    pub(super) fallbacks: Vec<Arc<[String]>>,
    pub(super) upstream: Arc<Upstream>,
    pub(super) coalescer: Coalescer,
    /// What requests seen before derive to, so their repeats skip the parse.
    pub(super) memo: RequestMemo,
    /// Purge generations: the key every answer is stored and read under.
    pub(super) purges: Arc<Purges>,
    /// Completed answers kept for the client's retries; `None` when off.
    pub(super) retry_window: Option<Arc<RetryWindow>>,
    /// The tenant key and tenant labels.
    pub(super) auth: Arc<Auth>,
    pub(super) budgets: Arc<Budgets>,
    pub(super) metrics: Metrics,
    pub(super) clock: Arc<dyn Clock>,
    /// Trace export is on: a request's model and answer go on its span.
    pub(super) traced: bool,
    /// Cancelled when the shutdown drain times out: running upstream calls end.
    pub(super) cut_upstream: CancellationToken,
    pub(super) stream_limits: LogLimits,
    /// Which pool member made each stored response (`pins.rs`).
    pub(super) pins: Arc<crate::pins::Pins>,
}

/// What `AppState` shares with the service: the parts other rooms use too.
pub struct DedupParts {
    pub routes: Arc<Routes>,
    pub upstream: Arc<Upstream>,
    pub coalescer: Coalescer,
    pub purges: Arc<Purges>,
    pub retry_window: Option<Arc<RetryWindow>>,
    pub auth: Arc<Auth>,
    pub budgets: Arc<Budgets>,
    pub metrics: Metrics,
    pub clock: Arc<dyn Clock>,
    pub traced: bool,
    pub cut_upstream: CancellationToken,
    /// Which pool member made each stored response (`pins.rs`).
    pub pins: Arc<crate::pins::Pins>,
}

impl Dedup {
    pub fn new(config: &Config, parts: DedupParts) -> Self {
        Self {
            cache: config.cache.clone(),
            coalesce: config.coalesce.clone(),
            input_limits: InputLimits::from(&config.limits),
            item_limits: ItemLimits::from(&config.limits),
            upstream_names: config.upstreams.iter().map(|u| u.name.clone()).collect(),
            upstream_keys: config.upstreams.iter().map(|u| u.identity()).collect(),
            fallbacks: config
                .upstreams
                .iter()
                .map(|u| u.fallback.as_slice().into())
                .collect(),
            stream_limits: stream_log_limits(config, &parts.metrics),
            routes: parts.routes,
            upstream: parts.upstream,
            coalescer: parts.coalescer,
            memo: RequestMemo::default(),
            purges: parts.purges,
            retry_window: parts.retry_window,
            auth: parts.auth,
            budgets: parts.budgets,
            metrics: parts.metrics,
            clock: parts.clock,
            traced: parts.traced,
            cut_upstream: parts.cut_upstream,
            pins: parts.pins,
        }
    }

    /// The flights, for the health and metrics reports.
    pub fn coalescer(&self) -> &Coalescer {
        &self.coalescer
    }

    /// The request memo, for the reports and tests that look into it.
    pub fn memo(&self) -> &RequestMemo {
        &self.memo
    }

    /// What `DedupRequest::parse` holds requests to: cache settings, input
    /// limits and the tenant key.
    pub(super) fn request_rules(&self) -> RequestRules<'_> {
        RequestRules {
            cache: &self.cache,
            limits: self.input_limits,
            tenant_key: self.auth.tenant_key(),
            caller: None,
        }
    }

    /// Whether a new upstream call may start for `bill`'s tenant and upstream:
    /// 429 when a budget or the token rate is used up. Asked only where a call
    /// would start, never of an answer the cache or a flight already has.
    /// The gateway's own call (`Attribution::gateways_own`) is checked
    /// against the upstream's caps only.
    pub(super) async fn may_call_upstream(&self, bill: &Attribution) -> Result<(), GatewayError> {
        self.budgets
            .admit_for(bill.budget_tenant(), &bill.upstream)
            .await
    }

    /// What one upstream call billed (`usage`; `None`: unknown), counted in
    /// the metrics and against the budgets, once per call.
    pub(super) fn billed(&self, bill: &Attribution, usage: Option<Usage>) {
        self.metrics.upstream_usage(bill, usage);
        if let Some(usage) = &usage {
            bill.spend(&self.budgets, usage);
        }
    }

    /// What one upstream call billed where its usage may be unknown: the
    /// reported `usage`, else `estimate` (what is known of the call:
    /// [`Usage::estimate`]), counted as estimated for `reason` on `/metrics`.
    /// Either way the call spends against the budgets, so no path is free.
    pub(super) fn billed_or_estimated(
        &self,
        bill: &Attribution,
        usage: Option<Usage>,
        estimate: impl FnOnce() -> Usage,
        reason: Estimated,
    ) {
        let usage = usage.unwrap_or_else(|| {
            self.metrics.usage_estimated(&bill.model, reason);
            estimate()
        });
        self.billed(bill, Some(usage));
    }

    /// How long a stream may be silent, before its first event and after.
    pub(super) fn stream_silence(&self) -> Silence {
        stream_silence(&self.coalesce)
    }
}

/// How this gateway's stream logs are bounded and counted.
pub fn stream_log_limits(config: &Config, metrics: &Metrics) -> LogLimits {
    LogLimits {
        max_bytes: config.limits.max_response_bytes,
        max_reader_lag: config.coalesce.max_reader_lag_bytes,
        tally: Some(metrics.stream_log_bytes()),
    }
}

/// How long a stream may be silent, before its first event and after.
pub fn stream_silence(coalesce: &CoalesceConfig) -> Silence {
    Silence {
        first_event: coalesce.first_event_timeout,
        between_events: coalesce.stream_stall_timeout,
    }
}
