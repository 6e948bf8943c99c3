//! `cache`, `coalesce` and `retry`: how answers are stored, shared and retried.

use std::time::Duration;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CacheScope {
    /// Entries are scoped to a hash of the caller's bearer token.
    Tenant,
    /// Every caller shares every entry (one trusted application behind corral).
    Global,
}

#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    #[schemars(with = "String")]
    #[serde(with = "humantime_serde")]
    pub soft_ttl: Duration,
    #[schemars(with = "String")]
    #[serde(with = "humantime_serde")]
    pub hard_ttl: Duration,
    /// Each TTL is stretched by a random factor in `[1, 1 + ttl_jitter]` so keys
    /// written together do not expire together.
    pub ttl_jitter: f64,
    /// Bound on the in-process cache, in bytes (each entry weighed by its
    /// body, headers and a fixed overhead); least valuable entries go first.
    pub max_bytes: u64,
    /// An answer larger than this is served but not stored (neither in
    /// process nor in Redis), so one huge answer cannot evict thousands.
    pub max_entry_bytes: u64,
    /// Whether responses to sampled requests (temperature > 0 or absent, no seed)
    /// are stored. Concurrent identical requests are coalesced either way.
    pub sampled: bool,
    pub scope: CacheScope,
    /// Opt-in normalization level: fold message text to lower case before hashing.
    pub case_fold: bool,
    /// Leave each API's label fields (`user`, `safety_identifier`,
    /// `prompt_cache_key`, `metadata`, Responses `client_metadata` and inline
    /// input item ids, Messages tools' `eager_input_streaming`; README lists
    /// them) out of the key: they name, track or route a request without
    /// changing what the model generates. `false` keys them like any field.
    pub ignore_label_fields: bool,
    /// How long a failed upstream call is remembered (negative caching), so
    /// followers everywhere get the error at once and a failing provider is
    /// not hammered by each replica in turn. Zero disables it.
    #[schemars(with = "String")]
    #[serde(with = "humantime_serde")]
    pub error_ttl: Duration,
    /// XFetch: refresh early with probability `exp(-(soft_expiry - now) / (delta * beta))`,
    /// delta being the upstream compute time. 0 disables early refresh.
    pub early_refresh_beta: f64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            soft_ttl: Duration::from_secs(300),
            hard_ttl: Duration::from_secs(3600),
            ttl_jitter: 0.1,
            max_bytes: 256 * 1024 * 1024,
            max_entry_bytes: 8 * 1024 * 1024,
            sampled: false,
            scope: CacheScope::Tenant,
            case_fold: false,
            ignore_label_fields: true,
            error_ttl: Duration::from_secs(5),
            early_refresh_beta: 1.0,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CoalesceConfig {
    /// Callers allowed to wait on one flight; beyond it they get 503 + Retry-After.
    pub max_waiters: usize,
    /// How long a follower waits for the owner's result before giving up (504).
    #[schemars(with = "String")]
    #[serde(with = "humantime_serde")]
    pub wait_timeout: Duration,
    /// A streamed upstream response that sends no event for this long after
    /// its first one is broken: every reader gets an error event, nothing is
    /// cached.
    #[schemars(with = "String")]
    #[serde(with = "humantime_serde")]
    pub stream_stall_timeout: Duration,
    /// The longest silence before a stream's first event: long enough for a
    /// reasoning model that thinks for minutes before it says anything.
    #[schemars(with = "String")]
    #[serde(with = "humantime_serde")]
    pub first_event_timeout: Duration,
    /// While a stream is silent (a model thinking), each reader receives an
    /// SSE comment this often (a blank line on Gemini's streams, which
    /// Google's SDKs skip), so proxies and load balancers with idle timeouts
    /// do not cut it; the SDKs ignore them, and they are never stored or
    /// replayed. Zero: none.
    #[schemars(with = "String")]
    #[serde(with = "humantime_serde")]
    pub keepalive_interval: Duration,
    /// A streaming caller that falls further behind the live stream than this
    /// (bytes written since it joined that it has not read) gets an error event
    /// and is cut, instead of pinning the stream while it dawdles.
    pub max_reader_lag_bytes: usize,
    /// Cancel a streamed upstream call once every caller reading it has gone
    /// (stops the spend; the answer is then not cached). Off: it completes and is cached.
    pub cancel_when_abandoned: bool,
    /// Callers waiting on all flights together; beyond it, 503 + Retry-After.
    pub max_total_waiters: usize,
    /// What a follower does when `wait_timeout` passes: `error` (504) or
    /// `own_call` (make its own upstream call, outside the flight).
    pub on_wait_timeout: OnWaitTimeout,
}

/// A follower's choice when its wait for the owner runs out.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum OnWaitTimeout {
    /// Answer 504: the provider is not asked twice for one answer.
    #[default]
    Error,
    /// Call upstream itself: the caller gets an answer, at the price of a second call.
    OwnCall,
}

impl Default for CoalesceConfig {
    fn default() -> Self {
        Self {
            max_waiters: 10_000,
            // Past the upstreams' `request_timeout` (10 minutes): a follower
            // never gives up on a call that is still within its time.
            wait_timeout: Duration::from_secs(900),
            stream_stall_timeout: Duration::from_secs(60),
            first_event_timeout: Duration::from_secs(600),
            keepalive_interval: Duration::from_secs(15),
            max_reader_lag_bytes: 8 * 1024 * 1024,
            cancel_when_abandoned: false,
            max_total_waiters: 100_000,
            on_wait_timeout: OnWaitTimeout::Error,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Attempts in all, the first included.
    pub max_attempts: usize,
    #[schemars(with = "String")]
    #[serde(with = "humantime_serde")]
    pub base_delay: Duration,
    #[schemars(with = "String")]
    #[serde(with = "humantime_serde")]
    pub max_delay: Duration,
    /// After this long from a call's start, no retry starts (and no wait for
    /// one): it bounds the retries, not an attempt under way, which runs to
    /// its upstream's `request_timeout`.
    #[schemars(with = "String")]
    #[serde(with = "humantime_serde")]
    pub deadline: Duration,
    /// Retries per upstream are at most this fraction of first attempts
    /// (over 10 s), plus `budget_min_per_sec`.
    pub budget_ratio: f64,
    /// Retries per second always allowed, so a quiet upstream can still retry.
    pub budget_min_per_sec: f64,
    /// Resend a request the provider may already have (an attempt that timed
    /// out or lost its connection after the request was sent). Off: the
    /// provider may be generating it, and bills it; connect errors and
    /// retryable statuses are retried either way.
    pub resend_sent_requests: bool,
    /// How long the answer of a completed flight (sampled or not) stays
    /// readable by the client's own retries (`X-Stainless-Retry-Count` > 0, or
    /// a repeated `Idempotency-Key`), and how long an idempotency key stays
    /// bound to its request. 0 turns the retry window off.
    #[schemars(with = "String")]
    #[serde(with = "humantime_serde")]
    pub dedup_window: Duration,
    /// Bytes of answers the retry window keeps in this process (bodies and
    /// stream events); the least recently used go first.
    pub dedup_max_bytes: u64,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            base_delay: Duration::from_millis(250),
            max_delay: Duration::from_secs(8),
            deadline: Duration::from_secs(150),
            budget_ratio: 0.2,
            budget_min_per_sec: 1.0,
            resend_sent_requests: false,
            dedup_window: Duration::from_secs(300),
            dedup_max_bytes: 64 * 1024 * 1024,
        }
    }
}
