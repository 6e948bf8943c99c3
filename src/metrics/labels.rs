//! The label sets of corral's Prometheus families, and their histograms'
//! buckets. Every label is bounded: names from the config, short lists, the
//! model table's labels; never a tenant (`/stats` has those).

use std::sync::Arc;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RequestLabels {
    pub(super) endpoint: &'static str,
    pub(super) cache: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct UpstreamCallLabels {
    pub(super) upstream: String,
    /// The pool member of the call's last attempt (`-`: none was made).
    pub(super) member: Arc<str>,
    pub(super) model: Arc<str>,
    pub(super) status: String,
}

/// `corral_failovers_total`: a call moved from one member of `upstream`'s
/// pool to another after an attempt that ended in `reason` (`429`, `503`,
/// `unreachable`, `timeout`, ...). Members come from the config.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct FailoverLabels {
    pub(super) upstream: String,
    pub(super) from: Arc<str>,
    pub(super) to: Arc<str>,
    pub(super) reason: String,
}

/// One member of one pool (`corral_member_cooling`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct MemberLabels {
    pub(super) upstream: String,
    pub(super) member: Arc<str>,
}

/// A budget rule: whom it caps (`tenant team-a`, `upstream openai`, `every
/// tenant`) and its window; never a tenant a `*` rule counted.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct BudgetLabels {
    pub(super) budget: String,
    pub(super) per: String,
}

pub(super) type UsdGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct UpstreamLabels {
    pub(super) upstream: String,
    pub(super) member: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct TokenLabels {
    pub(super) model: Arc<str>,
    pub(super) kind: &'static str,
    pub(super) source: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct SourceLabels {
    pub(super) model: Arc<str>,
    pub(super) source: &'static str,
}

/// `gen_ai.client.token.usage` in Prometheus form (OpenTelemetry GenAI conventions).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
#[allow(clippy::struct_field_names)]
pub(super) struct GenAiLabels {
    pub(super) gen_ai_operation_name: &'static str,
    pub(super) gen_ai_request_model: Arc<str>,
    pub(super) gen_ai_token_type: &'static str,
}

/// `corral_usage_estimated_total`: bounded labels only (never a tenant).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct EstimatedLabels {
    pub(super) model: Arc<str>,
    pub(super) reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct SavedLabels {
    pub(super) model: Arc<str>,
    pub(super) via: &'static str,
}

pub(super) type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// 5 ms to ~80 s: a cache hit to a long completion.
pub(super) fn request_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

/// 25 ms to ~400 s: one upstream call, all attempts and backoff included.
pub(super) fn upstream_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.025, 2.0, 15))
}

/// `gen_ai.client.token.usage`'s advised buckets: 1 to 4^13 tokens.
pub(super) fn token_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 4.0, 14))
}
