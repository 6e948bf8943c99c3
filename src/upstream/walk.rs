//! One call's walk through its pool, the one retry loop around the
//! upstream client's attempts: each attempt goes to the next member the
//! routing orders and that member's guard admits; a failed attempt's verdict
//! goes to the member that failed; a retryable failure in a pool of several
//! moves the call on at once, and a 429 or overload cools the member.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use opentelemetry::context::FutureExt as _;

use super::{
    breaker::is_upstream_failure,
    client::{Outbound, Upstream, outcome_label},
    pool::{Pool, Target, Walk},
    retry::{self, AttemptError},
};
use crate::{
    breaker::Permit,
    clock::retry_after_secs,
    error::GatewayError,
    routing::{Admission, Probe},
    traces,
};

impl Upstream {
    /// `retry::with_retries` over the upstream's pool: each attempt goes to
    /// the next member of the call's [`Walk`] that its guard lets through
    /// (circuit breaker, rate cap, concurrency cap), and a retry happens only
    /// while the pool's retry budget allows. In a pool of several, a failed
    /// attempt (429, 529, 5xx, connect error, first-byte timeout) moves the
    /// call to the next member at once, and a 429 or overload cools the member
    /// (the provider's wait, else the pool's `cooldown`); a caller's own 4xx
    /// never moves it. The breaker counts calls, not attempts: a failed
    /// attempt's verdict waits until the call goes on (to the same member:
    /// released without one; to another: that member failed the call) or
    /// ends (then it is the call's failure), so one call of three failed
    /// attempts is one failure, and a call that failed once then answered is
    /// a success. The shutdown cut ends it at once.
    ///
    /// With traces, each attempt is a client span under the current span, and
    /// the request it sends carries that span's `traceparent`.
    pub(super) async fn protected<'s, T, F, Fut>(
        &'s self,
        outbound: &Outbound,
        counted: Counted,
        attempt: F,
    ) -> (Result<T, GatewayError>, usize, Option<Arc<str>>)
    where
        F: Fn(&'s Target) -> Fut,
        Fut: Future<Output = Result<T, AttemptError>>,
    {
        let pool = &self.pools[outbound.upstream];
        let max_attempts = retry::max_attempts(&self.retry);
        let made = AtomicUsize::new(0);
        let walk = std::sync::Mutex::new(pool.walk(outbound.affinity, outbound.pin.as_deref()));
        // The member of the last attempt, and its permit if it failed (its
        // verdict not given yet).
        let last: std::sync::Mutex<Option<(usize, Option<Permit<'s>>)>> =
            std::sync::Mutex::new(None);
        // The member an attempt just failed over from, and that attempt's
        // outcome: a failover once the next attempt goes to another member.
        let moved: std::sync::Mutex<Option<(usize, String)>> = std::sync::Mutex::new(None);
        let run = retry::with_retries(&self.retry, || {
            let n = made.fetch_add(1, Ordering::Relaxed) + 1;
            if n == 1 {
                pool.budget.record_first();
            }
            let chosen = choose(pool, &mut lock(&walk));
            if let Some((from, reason)) = lock(&moved).take()
                && let Ok((to, _, _)) = &chosen
                && *to != from
            {
                let (from, to) = (&pool.members[from].member, &pool.members[*to].member);
                self.metrics.failover(&pool.name, from, to, &reason);
            }
            // The call goes on: the earlier attempt's failure is the verdict
            // of the member it failed on only if the call moves away from it.
            if let Some((earlier, Some(permit))) = lock(&last).take() {
                match &chosen {
                    Ok((member, _, _)) if *member == earlier => permit.release(),
                    _ => {
                        permit.failure();
                    }
                }
            }
            let call = chosen.map(|(member, ticket, probe)| {
                let target = &pool.members[member];
                *lock(&last) = Some((member, None));
                (member, target, ticket, probe, attempt(target))
            });
            let (last, walk, moved) = (&last, &walk, &moved);
            async move {
                let (member, target, ticket, probe, call) = call.map_err(AttemptError::fatal)?;
                let _place = target.guard.acquire().await;
                // Only an attempt that goes out is a span (not one the
                // circuit or a cap refused).
                let traced = traces::attempt_context(
                    n,
                    &outbound.method,
                    target.adapter.base(),
                    &target.name,
                );
                let result = match &traced {
                    None => call.await,
                    Some(cx) => call.with_context(cx.clone()).await,
                };
                if let Some(cx) = &traced {
                    traces::end_attempt(
                        cx,
                        result.as_ref().err().map(|err| outcome_label(&err.error)),
                    );
                }
                match &result {
                    Err(err) if counted.is_failure(&err.error) => {
                        *lock(last) = Some((member, Some(ticket)));
                    }
                    _ => ticket.success(),
                }
                let overloaded = result.as_ref().err().filter(|err| is_overload(&err.error));
                let wait = overloaded.map(|err| err.cooldown.unwrap_or(pool.cooldown));
                match (probe, &result, wait) {
                    (Some(probe), Ok(_), _) => probe.success(),
                    (Some(probe), Err(_), Some(wait)) => probe.failure(wait),
                    // Any other outcome says nothing of the quota: the next caller probes.
                    _ => {}
                }
                if let Some(wait) = wait {
                    pool.cool(member, wait);
                }
                result.map_err(|mut err| {
                    if err.retryable {
                        // Another member takes the call now: the provider's
                        // wait is this member's, not the next one's.
                        if lock(walk).failed(pool, member) {
                            err.retry_after = Some(Duration::ZERO);
                            *lock(moved) = Some((member, outcome_label(&err.error).to_owned()));
                        }
                    }
                    if err.retryable && n < max_attempts && !pool.budget.try_retry() {
                        tracing::info!(error = %err.error, "retry budget spent; not retrying");
                        err.retryable = false;
                    }
                    err
                })
            }
        });
        let outcome = tokio::select! {
            outcome = run => outcome,
            () = self.cut.cancelled() => (Err(GatewayError::ShuttingDown), made.load(Ordering::Relaxed)),
        };
        let last = lock(&last).take();
        let member = last
            .as_ref()
            .map(|(member, _)| pool.members[*member].member.clone());
        // The call ended on a failed attempt: that is the call's failure
        // (none when shutdown cut it: the provider was not at fault).
        if let Some((_, Some(permit))) = last {
            match &outcome.0 {
                Err(GatewayError::ShuttingDown) => permit.release(),
                _ => {
                    permit.failure();
                }
            }
        }
        (outcome.0, outcome.1, member)
    }
}

/// The member a call's next attempt goes to, its breaker permit, and its
/// cooldown probe if it is one: the first of the walk's candidates that is
/// not cooling and whose guard lets it through (an open circuit or a spent
/// rate cap passes the call on to the next). Every member cooling: 429 with
/// the pool's cooldown; every member refusing: the last refusal.
fn choose<'p>(
    pool: &'p Pool,
    walk: &mut Walk,
) -> Result<(usize, Permit<'p>, Option<Probe<'p>>), GatewayError> {
    let mut refused = None;
    for member in walk.candidates() {
        let probe = match pool.admit(member) {
            Admission::Free => None,
            Admission::Probe(probe) => Some(probe),
            Admission::Cooling => continue,
        };
        match pool.members[member].guard.admit() {
            Ok(permit) => return Ok((member, permit, probe)),
            // A probe dropped unused goes to the next caller.
            Err(refusal) => refused = Some(refusal),
        }
    }
    Err(refused.unwrap_or_else(|| GatewayError::RateLimited {
        retry_after: retry_after_secs(pool.cooldown),
        reason: "every account of the upstream's pool (cooling down after the provider's 429)",
    }))
}

/// A failed attempt that says the member is overloaded or out of quota for
/// now (429, 529 `overloaded_error`, 503), which cools it in a pool.
fn is_overload(error: &GatewayError) -> bool {
    matches!(error, GatewayError::Upstream { status, .. } if matches!(status.as_u16(), 429 | 503 | 529))
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Which failed attempts are the provider's failure, counted against the
/// upstream's breaker that every tenant shares.
#[derive(Debug, Clone, Copy)]
pub(super) enum Counted {
    /// Every provider failure ([`is_upstream_failure`]).
    Failures,
    /// As `Failures`, but not an attempt that ran out of time: a
    /// pass-through job (an image, a transcription) takes as long as its
    /// caller asked for, which says nothing of the provider's health.
    FailuresButSlowness,
}

impl Counted {
    pub(super) fn is_failure(self, error: &GatewayError) -> bool {
        match self {
            Self::Failures => is_upstream_failure(error),
            Self::FailuresButSlowness => {
                !matches!(error, GatewayError::UpstreamTimeout { .. }) && is_upstream_failure(error)
            }
        }
    }
}
