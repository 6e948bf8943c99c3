//! The series an upstream call adds to, found once per kind of call.
//!
//! A prometheus family lookup hashes its labels with SipHash under the
//! family's lock, and the labels are strings made for the lookup: an upstream
//! call made three of those lookups, a visible part of a miss's CPU
//! (BENCHMARKS.md, issue 41). The kinds of call are few (upstreams, members,
//! model labels and final statuses all come from the configuration or short
//! lists), so the handles of their series are kept here, found by the call's
//! borrowed labels, and a call only adds to them. A handle shares its series
//! with the family, so what `/metrics` shows is unchanged; one let go (the
//! memo is bounded) is looked up in the family again.

use std::{
    hash::{Hash, Hasher},
    sync::Arc,
};

use prometheus_client::metrics::{counter::Counter, histogram::Histogram};
use quick_cache::{Equivalent, UnitWeighter, sync::Cache};

/// Kinds of call kept at most; more only cost their family lookups.
const MAX_KINDS: usize = 4096;

/// What one kind of upstream call adds to.
#[derive(Debug, Clone)]
pub(super) struct CallSeries {
    /// `corral_upstream_requests_total`.
    pub requests: Counter,
    /// `corral_upstream_retries_total`.
    pub retries: Counter,
    /// `corral_upstream_request_duration_seconds`.
    pub duration: Histogram,
}

/// A kind of call: its labels, as the families have them.
pub(super) struct CallKind<'a> {
    pub upstream: &'a str,
    pub member: &'a str,
    pub model: &'a str,
    pub status: &'a str,
}

impl Hash for CallKind<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (self.upstream, self.member, self.model, self.status).hash(state);
    }
}

/// A [`CallKind`] kept.
#[derive(PartialEq, Eq)]
struct KeptKind {
    upstream: Box<str>,
    member: Box<str>,
    model: Box<str>,
    status: Box<str>,
}

impl KeptKind {
    fn borrowed(&self) -> CallKind<'_> {
        CallKind {
            upstream: &self.upstream,
            member: &self.member,
            model: &self.model,
            status: &self.status,
        }
    }
}

impl Hash for KeptKind {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.borrowed().hash(state);
    }
}

impl Equivalent<KeptKind> for CallKind<'_> {
    fn equivalent(&self, kept: &KeptKind) -> bool {
        let kept = kept.borrowed();
        (self.upstream, self.member, self.model, self.status)
            == (kept.upstream, kept.member, kept.model, kept.status)
    }
}

/// See the module documentation.
pub(super) struct CallSeriesMemo(
    Cache<KeptKind, Arc<CallSeries>, UnitWeighter, foldhash::fast::RandomState>,
);

impl Default for CallSeriesMemo {
    fn default() -> Self {
        Self(Cache::with(
            MAX_KINDS,
            MAX_KINDS as u64,
            UnitWeighter,
            foldhash::fast::RandomState::default(),
            Default::default(),
        ))
    }
}

impl CallSeriesMemo {
    /// The series of `kind`: kept, or `lookup`'s (then kept).
    pub fn series(
        &self,
        kind: &CallKind<'_>,
        lookup: impl FnOnce() -> CallSeries,
    ) -> Arc<CallSeries> {
        if let Some(series) = self.0.get(kind) {
            return series;
        }
        let series = Arc::new(lookup());
        let kept = KeptKind {
            upstream: kind.upstream.into(),
            member: kind.member.into(),
            model: kind.model.into(),
            status: kind.status.into(),
        };
        self.0.insert(kept, series.clone());
        series
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind<'a>(status: &'a str) -> CallKind<'a> {
        CallKind {
            upstream: "openai",
            member: "-",
            model: "gpt-4o",
            status,
        }
    }

    fn series() -> CallSeries {
        CallSeries {
            requests: Counter::default(),
            retries: Counter::default(),
            duration: Histogram::new([1.0]),
        }
    }

    /// A kind is looked up once; another status is another kind.
    #[test]
    fn a_kind_of_call_is_looked_up_once() {
        let memo = CallSeriesMemo::default();
        let mut lookups = 0;
        for status in ["200", "200", "429", "200"] {
            memo.series(&kind(status), || {
                lookups += 1;
                series()
            })
            .requests
            .inc();
        }
        assert_eq!(lookups, 2);
        let ok = memo.series(&kind("200"), || unreachable!("kept"));
        assert_eq!(ok.requests.get(), 3);
        // Labels are compared whole: a shifted boundary is another kind.
        let shifted = CallKind {
            upstream: "openaig",
            member: "-",
            model: "pt-4o",
            status: "200",
        };
        let other = memo.series(&shifted, series);
        assert_eq!(other.requests.get(), 0);
    }
}
