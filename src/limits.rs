//! Admission control in front of everything else: the per-tenant request rate
//! (governor, keyed by the tenant scope), caps on requests being served at
//! once (all of them, and each tenant's), and the rate type the per-upstream
//! caps reuse.
//!
//! A place among the requests served at once is [`Places`]: the pipeline
//! keeps it until the response *body* ends (`held_body`), because a stream, a
//! replay or a pass-through download is being served long after its handler
//! returned a head, and a cap that let those go would count nothing that
//! lasts.
//!
//! Limits are **per instance**. With N instances behind a balancer a tenant can
//! get up to N x `limits.per_tenant.rps` (and N x `burst` at once) across the
//! fleet; set the per-instance numbers to the fleet target divided by N. A
//! cluster-wide limiter would cost a Redis round trip on every request and make
//! Redis a dependency of admission, which the fail-open design avoids.
//!
//! Time comes from the app's [`Clock`] (its monotonic half), so tests decide
//! when tokens refill and a wall-clock step never does.

use std::{
    collections::HashMap,
    num::NonZeroU32,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use governor::{
    Quota, RateLimiter,
    middleware::NoOpMiddleware,
    nanos::Nanos,
    state::{InMemoryState, NotKeyed, keyed::DashMapStateStore},
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::{
    clock::{Clock, retry_after_secs},
    config::{Config, RateConfig, TenantLimitsConfig},
    error::GatewayError,
    tenant::TenantScope,
};

/// How many tenant checks pass between two sweeps of idle tenants' state.
const SWEEP_EVERY: u64 = 4096;

/// The app's monotonic clock as governor sees it: nanoseconds since the
/// limiter was made. Monotonic, so a wall-clock step never refills a bucket.
#[derive(Debug, Clone)]
pub struct AppClock {
    clock: Arc<dyn Clock>,
    origin: tokio::time::Instant,
}

impl AppClock {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        let origin = clock.instant();
        Self { clock, origin }
    }
}

impl governor::clock::Clock for AppClock {
    type Instant = Nanos;

    fn now(&self) -> Nanos {
        Nanos::from(self.clock.instant().saturating_duration_since(self.origin))
    }
}

fn quota(rate: &RateConfig) -> Quota {
    // `Config::validate` rejects zeros; `MIN` only guards a hand-built config.
    let rps = NonZeroU32::new(rate.rps).unwrap_or(NonZeroU32::MIN);
    let burst = NonZeroU32::new(rate.burst).unwrap_or(NonZeroU32::MIN);
    Quota::per_second(rps).allow_burst(burst)
}

/// One token bucket (GCRA): the per-upstream request rate.
#[derive(Debug)]
pub struct Rate {
    limiter: RateLimiter<NotKeyed, InMemoryState, AppClock, NoOpMiddleware<Nanos>>,
    clock: AppClock,
}

impl Rate {
    pub fn new(rate: &RateConfig, clock: Arc<dyn Clock>) -> Self {
        let clock = AppClock::new(clock);
        Self {
            limiter: RateLimiter::direct_with_clock(quota(rate), clock.clone()),
            clock,
        }
    }

    /// Takes one token, or says how long until one is available.
    pub fn check(&self) -> Result<(), Duration> {
        use governor::clock::Clock as _;
        self.limiter
            .check()
            .map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }
}

#[derive(Debug)]
pub struct Limits {
    per_tenant: Option<TenantRates>,
    /// Each tenant's requests being served at once.
    per_tenant_places: Option<Arc<TenantPlaces>>,
    /// Requests being served at once (each one waiting on a flight counts).
    in_progress: Option<Arc<Semaphore>>,
}

#[derive(Debug)]
struct TenantRates {
    limiter:
        RateLimiter<TenantScope, DashMapStateStore<TenantScope>, AppClock, NoOpMiddleware<Nanos>>,
    clock: AppClock,
    checks: AtomicU64,
}

/// How many requests each tenant has being served. Only tenants with one
/// under way have an entry (the last place given back removes it), so the map
/// is bounded by the requests in progress, not by every tenant ever seen.
#[derive(Debug)]
struct TenantPlaces {
    max: usize,
    taken: Mutex<HashMap<TenantScope, usize>>,
}

impl TenantPlaces {
    fn take(self: &Arc<Self>, tenant: &TenantScope) -> Option<TenantPlace> {
        let mut taken = self.taken.lock().unwrap_or_else(PoisonError::into_inner);
        let count = taken.entry(tenant.clone()).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(TenantPlace {
            places: self.clone(),
            tenant: tenant.clone(),
        })
    }
}

/// One of a tenant's places; given back when dropped.
#[derive(Debug)]
struct TenantPlace {
    places: Arc<TenantPlaces>,
    tenant: TenantScope,
}

impl Drop for TenantPlace {
    fn drop(&mut self) {
        let mut taken = self
            .places
            .taken
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = taken.get_mut(&self.tenant) {
            *count -= 1;
            if *count == 0 {
                taken.remove(&self.tenant);
            }
        }
    }
}

/// The places one request holds among those served at once: the instance's
/// and its tenant's (each only where a cap is set). Dropping it gives them
/// back; the pipeline keeps it until the response body ends.
#[derive(Debug, Default)]
#[must_use = "the places are given back when this is dropped"]
pub struct Places {
    instance: Option<OwnedSemaphorePermit>,
    tenant: Option<TenantPlace>,
}

impl Places {
    /// No cap applies: nothing to keep alive.
    pub fn is_empty(&self) -> bool {
        self.instance.is_none() && self.tenant.is_none()
    }
}

impl Limits {
    pub fn new(config: &Config, clock: Arc<dyn Clock>) -> Self {
        let tenant = config.limits.per_tenant.unwrap_or_default();
        let per_tenant = tenant.rate().map(|rate| {
            let clock = AppClock::new(clock);
            TenantRates {
                limiter: RateLimiter::dashmap_with_clock(quota(&rate), clock.clone()),
                clock,
                checks: AtomicU64::new(0),
            }
        });
        let TenantLimitsConfig { max_concurrent, .. } = tenant;
        Self {
            per_tenant,
            per_tenant_places: max_concurrent.map(|max| {
                Arc::new(TenantPlaces {
                    max,
                    taken: Mutex::new(HashMap::new()),
                })
            }),
            in_progress: config
                .limits
                .max_concurrent_requests
                .map(|n| Arc::new(Semaphore::new(n))),
        }
    }

    /// Spends one of `tenant`'s requests; 429 with the wait when none is left.
    /// Every request counts, cache hits included: the limit is on the caller,
    /// the upstream's own budget is spent only by real upstream calls.
    pub fn check_tenant(&self, tenant: &TenantScope) -> Result<(), GatewayError> {
        let Some(rates) = &self.per_tenant else {
            return Ok(());
        };
        if rates.checks.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
            // Forget tenants whose bucket is full again, so the map stays bounded.
            rates.limiter.retain_recent();
            rates.limiter.shrink_to_fit();
        }
        rates.limiter.check_key(tenant).map_err(|not_until| {
            use governor::clock::Clock as _;
            let wait = not_until.wait_time_from(rates.clock.now());
            GatewayError::RateLimited {
                retry_after: retry_after_secs(wait),
                reason: "this API key's request rate",
            }
        })
    }

    /// A place among the requests served at once; 503 + `Retry-After` when
    /// every place is taken. Checked before the caller is even authenticated:
    /// a full instance refuses cheaply.
    pub fn admit(&self) -> Result<Places, GatewayError> {
        let instance =
            match &self.in_progress {
                None => None,
                Some(places) => Some(places.clone().try_acquire_owned().map_err(|_| {
                    GatewayError::Overloaded {
                        retry_after: Duration::from_secs(1),
                    }
                })?),
            };
        Ok(Places {
            instance,
            tenant: None,
        })
    }

    /// A place among `tenant`'s requests served at once, then one of its
    /// requests per second: 429 + `Retry-After` when either is spent. The
    /// place is taken first, so a request refused for it spends no rate.
    pub fn admit_tenant(
        &self,
        tenant: &TenantScope,
        places: &mut Places,
    ) -> Result<(), GatewayError> {
        if let Some(tenant_places) = &self.per_tenant_places {
            places.tenant = Some(
                tenant_places
                    .take(tenant)
                    .ok_or(GatewayError::RateLimited {
                        retry_after: Duration::from_secs(1),
                        reason: "this API key's requests at once",
                    })?,
            );
        }
        self.check_tenant(tenant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn config(rps: u32, burst: u32) -> Config {
        let mut config = Config::for_tests("http://127.0.0.1:1/v1");
        config.limits.per_tenant = Some(TenantLimitsConfig {
            rps: Some(rps),
            burst: Some(burst),
            ..TenantLimitsConfig::default()
        });
        config
    }

    #[test]
    fn a_tenant_gets_its_burst_then_waits_and_others_are_unaffected() {
        let clock = Arc::new(ManualClock::new(1_700_000_000_000));
        let limits = Limits::new(&config(5, 5), clock.clone());
        let a = TenantScope::of_credential(None, Some(b"sk-a"));
        let b = TenantScope::of_credential(None, Some(b"sk-b"));
        for _ in 0..5 {
            limits.check_tenant(&a).unwrap();
        }
        match limits.check_tenant(&a) {
            Err(GatewayError::RateLimited { retry_after, .. }) => {
                assert_eq!(retry_after, Duration::from_secs(1));
            }
            other => panic!("expected 429, got {other:?}"),
        }
        limits.check_tenant(&b).unwrap();
        clock.advance(Duration::from_millis(200));
        limits.check_tenant(&a).expect("one token back after 1/rps");
        assert!(limits.check_tenant(&a).is_err());
    }

    #[test]
    fn the_global_cap_refuses_beyond_it_and_frees_on_drop() {
        let mut config = config(1, 1);
        config.limits.max_concurrent_requests = Some(2);
        let limits = Limits::new(&config, Arc::new(ManualClock::new(0)));
        let first = limits.admit().unwrap();
        let _second = limits.admit().unwrap();
        assert!(matches!(
            limits.admit(),
            Err(GatewayError::Overloaded { .. })
        ));
        drop(first);
        assert!(!limits.admit().unwrap().is_empty());
    }

    #[test]
    fn a_tenant_at_its_places_is_refused_others_are_served_and_the_map_empties() {
        let mut config = Config::for_tests("http://127.0.0.1:1/v1");
        config.limits.per_tenant = Some(TenantLimitsConfig {
            max_concurrent: Some(2),
            ..TenantLimitsConfig::default()
        });
        let limits = Limits::new(&config, Arc::new(ManualClock::new(0)));
        let a = TenantScope::of_credential(None, Some(b"sk-a"));
        let b = TenantScope::of_credential(None, Some(b"sk-b"));
        let admit = |tenant: &TenantScope| {
            let mut places = limits.admit()?;
            limits.admit_tenant(tenant, &mut places)?;
            Ok::<_, GatewayError>(places)
        };
        let first = admit(&a).unwrap();
        let second = admit(&a).unwrap();
        match admit(&a) {
            Err(GatewayError::RateLimited {
                retry_after,
                reason,
            }) => {
                assert_eq!(retry_after, Duration::from_secs(1));
                assert!(reason.contains("at once"), "{reason}");
            }
            other => panic!("expected 429, got {other:?}"),
        }
        let other = admit(&b).expect("another tenant has its own places");
        drop(first);
        let third = admit(&a).expect("a place given back is taken again");
        let places = limits.per_tenant_places.as_ref().unwrap();
        drop((second, third, other));
        assert!(
            places.taken.lock().unwrap().is_empty(),
            "no tenant without a request keeps an entry"
        );
        // No rate was set: the places alone limit.
        for _ in 0..100 {
            drop(admit(&b).unwrap());
        }
    }
}
