//! A pool: the equivalent accounts (members) that serve one upstream's
//! models, as the client calls them. Each member is a [`Target`] of its own
//! (its base URL, key, timeouts, breaker and caps); the pool keeps what they
//! share: the retry budget, the order a call tries them in, and the
//! cooldowns a provider's 429 or overload asks for.
//!
//! A call walks its pool ([`Walk`]): the members in the order the routing
//! gives for its affinity key (`routing::pick`), skipping those cooling and
//! those that failed it already, so a 429, 529, 5xx, connect error or
//! first-byte timeout moves it to the next member before anything reached a
//! caller. A pool of one is today's upstream: it never cools (its caller
//! meets the provider's own 429, as before) and a retry goes to it again.

use std::{num::NonZeroU32, sync::Arc, time::Duration};

use super::{
    breaker::{RetryBudget, UpstreamGuard},
    shared_cooldowns::{Cooled, Publisher},
    transport::Transport,
};
use axum::http::HeaderValue;

use crate::{
    auth::{Provider, bearer_token},
    breaker::BreakerState,
    clock::Clock,
    config::{Affinity, Api, Config, Member, UpstreamConfig},
    error::GatewayError,
    provider::Adapter,
    routing::{self, Admission, AffinityKey, LONGEST_COOLDOWN, MemberSpec, SharedCooldown},
};

/// One member as the client calls it.
#[derive(Debug)]
pub(super) struct Target {
    /// What errors name: the pool's name for a pool of one, else
    /// `pool/member`.
    pub(super) name: String,
    /// The member's own name (`x-corral-member`).
    pub(super) member: Arc<str>,
    /// Which errors it retries (its wire's).
    pub(super) api: Api,
    /// Its provider: paths, auth and quirks (`provider::Adapter`).
    pub(super) adapter: Box<dyn Adapter>,
    pub(super) request_timeout: Duration,
    /// How long a read's response head may take (a pass-through `GET`).
    pub(super) first_byte_timeout: Duration,
    /// How long a deduplicated stream's response head may take: as long as
    /// its first event may (`coalesce.first_event_timeout`), since some
    /// providers send the head only with the first token; at least
    /// `first_byte_timeout`, at most `request_timeout`.
    pub(super) stream_head_timeout: Duration,
    /// Per member, so each has its own connect timeout.
    pub(super) transport: Transport,
    pub(super) guard: UpstreamGuard,
}

impl Target {
    /// Refuses (401) a caller's credential that this member would be sent
    /// (it has no key of its own) when it has the form of another
    /// provider's key.
    pub(super) fn check_credential(
        &self,
        authorization: Option<&HeaderValue>,
    ) -> Result<(), GatewayError> {
        let Some(caller) = authorization.filter(|_| !self.adapter.has_own_credential()) else {
            return Ok(());
        };
        match Provider::of_key(bearer_token(caller.as_bytes())) {
            Some(owner) if owner != self.adapter.owner() => Err(GatewayError::ForeignCredential {
                owner: owner.name(),
                upstream: self.name.clone(),
            }),
            _ => Ok(()),
        }
    }

    fn new(
        pool: &UpstreamConfig,
        member: &Member,
        config: &Config,
        clock: Arc<dyn Clock>,
    ) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder()
            .use_rustls_tls()
            // A redirect could lead a request (and the provider key)
            // anywhere; the caller gets the 3xx as the provider sent it.
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(member.connect_timeout)
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(256)
            .tcp_nodelay(true)
            .build()?;
        let adapter = crate::provider::adapter(member, &client)?;
        let transport = Transport::new(member.connect_timeout, &client)?;
        let name = if pool.members.is_empty() {
            pool.name.clone()
        } else {
            format!("{}/{}", pool.name, member.name)
        };
        Ok(Self {
            guard: UpstreamGuard::new(&name, member, clock),
            name,
            member: member.name.as_str().into(),
            api: member.api,
            adapter,
            request_timeout: member.request_timeout,
            first_byte_timeout: member.first_byte_timeout.min(member.request_timeout),
            stream_head_timeout: member
                .first_byte_timeout
                .max(config.coalesce.first_event_timeout)
                .min(member.request_timeout),
            transport,
        })
    }
}

/// One upstream's members and what they share.
#[derive(Debug)]
pub(super) struct Pool {
    pub(super) name: String,
    pub(super) api: Api,
    pub(super) members: Vec<Target>,
    /// Retries to the pool (failovers included) are at most a share of its
    /// first attempts.
    pub(super) budget: RetryBudget,
    /// The pick and the quota buckets' cooldowns.
    routing: routing::Pool,
    affinity: Affinity,
    /// A member's pause after a 429 or overload that names no time.
    pub(super) cooldown: Duration,
    /// Each quota bucket's name, as the fleet knows it (`routing::shared`).
    buckets: Box<[Arc<str>]>,
    /// Where this pool's cooldowns go for the rest of the fleet (Redis, a
    /// pool of several); `None`: they stay here.
    publisher: Option<Publisher>,
    clock: Arc<dyn Clock>,
}

impl Pool {
    pub(super) fn new(
        upstream: &UpstreamConfig,
        config: &Config,
        clock: Arc<dyn Clock>,
    ) -> anyhow::Result<Self> {
        let members = upstream.effective_members();
        // Members naming one quota bucket cool down together.
        let mut quotas: Vec<&str> = Vec::new();
        let specs = members
            .iter()
            .map(|member| MemberSpec {
                weight: NonZeroU32::new(member.weight).unwrap_or(NonZeroU32::MIN),
                priority: member.priority,
                quota: member.quota.as_deref().map(|quota| {
                    quotas
                        .iter()
                        .position(|known| *known == quota)
                        .unwrap_or_else(|| {
                            quotas.push(quota);
                            quotas.len() - 1
                        })
                }),
                ..MemberSpec::named(&member.name)
            })
            .collect();
        let targets = members
            .iter()
            .map(|member| Target::new(upstream, member, config, clock.clone()))
            .collect::<anyhow::Result<_>>()?;
        let routing = routing::Pool::new(specs, clock.clone());
        // Named by quota, or by the member that has a bucket of its own.
        let mut buckets: Vec<Arc<str>> = Vec::new();
        for (index, member) in members.iter().enumerate() {
            let Some(bucket) = routing.bucket_of(index) else {
                continue;
            };
            if buckets.len() <= bucket {
                buckets.resize(bucket + 1, Arc::from(""));
            }
            buckets[bucket] = match &member.quota {
                Some(quota) => format!("quota:{quota}").into(),
                None => format!("member:{}", member.name).into(),
            };
        }
        Ok(Self {
            name: upstream.name.clone(),
            api: upstream.api,
            members: targets,
            budget: RetryBudget::new(
                config.retry.budget_ratio,
                config.retry.budget_min_per_sec,
                clock.clone(),
            ),
            routing,
            affinity: upstream.affinity,
            cooldown: upstream.cooldown,
            buckets: buckets.into(),
            publisher: None,
            clock,
        })
    }

    /// Whether the pool has members to fail over between (a pool of one
    /// neither cools nor fails over: it is retried, as an upstream always was).
    pub(super) fn is_shared(&self) -> bool {
        self.members.len() > 1
    }

    /// The members a call with `affinity` tries, in order (those whose
    /// circuit is open or that are cooling last); a call `pin`ned to a member
    /// tries that member alone (a name no member has pins nothing).
    pub(super) fn walk(&self, affinity: Option<u64>, pin: Option<&str>) -> Walk {
        if let Some(member) = pin.and_then(|pin| self.member_named(pin)) {
            return Walk {
                order: vec![member],
                failed: vec![false; self.members.len()],
                pinned: true,
            };
        }
        let key = match (self.affinity, affinity) {
            (Affinity::Session, Some(key)) => AffinityKey(key),
            _ => AffinityKey::random(),
        };
        let mut order = Vec::with_capacity(self.members.len());
        self.routing.order(
            key,
            |member| self.members[member].guard.breaker.state() == BreakerState::Open,
            &mut order,
        );
        Walk {
            order,
            failed: vec![false; self.members.len()],
            pinned: false,
        }
    }

    /// The index of the member named `name`.
    pub(super) fn member_named(&self, name: &str) -> Option<usize> {
        self.members
            .iter()
            .position(|target| &*target.member == name)
    }

    /// Asks to send to `member` now: in a pool of one, always; else free,
    /// its one probe after a cooldown, or cooling (try the next).
    pub(super) fn admit(&self, member: usize) -> Admission<'_> {
        if self.is_shared() {
            self.routing.admit(member)
        } else {
            Admission::Free
        }
    }

    /// Whether `member` is cooling now (never in a pool of one).
    pub(super) fn is_cooling(&self, member: usize) -> bool {
        self.is_shared() && self.routing.is_cooling(member)
    }

    /// `member` pauses for `wait`, its quota bucket with it (only in a pool
    /// of several: a pool of one's callers meet the provider's 429 as before).
    /// With Redis, the rest of the fleet learns it within a poll.
    pub(super) fn cool(&self, member: usize, wait: Duration) {
        if !self.is_shared() {
            return;
        }
        self.routing.cool(member, wait);
        if let (Some(publisher), Some(bucket)) = (&self.publisher, self.routing.bucket_of(member)) {
            let wait_ms = u64::try_from(wait.min(LONGEST_COOLDOWN).as_millis()).unwrap_or(0);
            publisher.publish(Cooled {
                bucket,
                until_ms: self.clock.now_ms().saturating_add(wait_ms),
            });
        }
    }

    /// Wall-clock milliseconds now, by the pool's clock.
    pub(super) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Its cooldowns go to `publisher` from now on.
    pub(super) fn publish_to(&mut self, publisher: Publisher) {
        self.publisher = Some(publisher);
    }

    /// The name the fleet knows `bucket` by.
    pub(super) fn bucket_name(&self, bucket: usize) -> Option<&str> {
        self.buckets.get(bucket).map(|name| &**name)
    }

    /// Applies the deadlines another instance learned: a bucket still
    /// cooling (by this instance's wall clock) cools here until then, and a
    /// later deadline this instance knows stands. An unknown bucket (another
    /// instance's config) is skipped.
    pub(super) fn apply_shared(&self, cooldowns: &[SharedCooldown]) {
        let now_ms = self.clock.now_ms();
        for cooldown in cooldowns {
            let Some(bucket) = self
                .buckets
                .iter()
                .position(|name| **name == *cooldown.bucket)
            else {
                continue;
            };
            let left = cooldown.until_ms.saturating_sub(now_ms);
            if left > 0 {
                self.routing
                    .cool_bucket(bucket, Duration::from_millis(left));
            }
        }
    }
}

/// One call's way through its pool.
#[derive(Debug)]
pub(super) struct Walk {
    order: Vec<usize>,
    /// Members that failed this call: tried again only once every member has.
    failed: Vec<bool>,
    /// The call goes to its one member or nowhere.
    pinned: bool,
}

impl Walk {
    /// The members this call may try next, in order: those that have not
    /// failed it (all of them again once every member has).
    pub(super) fn candidates(&mut self) -> impl Iterator<Item = usize> + '_ {
        if self.pinned || self.failed.iter().all(|failed| *failed) {
            self.failed.iter_mut().for_each(|failed| *failed = false);
        }
        self.order
            .iter()
            .copied()
            .filter(|&member| !self.failed[member])
    }

    /// `member` failed this call; whether another member may take it now.
    pub(super) fn failed(&mut self, pool: &Pool, member: usize) -> bool {
        self.failed[member] = true;
        !self.pinned && pool.is_shared() && self.failed.iter().any(|failed| !failed)
    }
}
