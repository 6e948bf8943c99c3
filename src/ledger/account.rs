//! What the books count: an [`Account`], the side of the savings it is on,
//! whom it is by (a tenant, an upstream, a pool member) and what it measures,
//! and the one spelling of each as a field of the cluster ledger's hash.

use std::sync::Arc;

use crate::usage::TokenKind;

/// Which side of the savings an amount is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Side {
    /// Paid for: an upstream call was made.
    Upstream,
    /// Served without an upstream call of its own (hit, stale, coalesced).
    Saved,
}

impl Side {
    pub fn label(self) -> &'static str {
        match self {
            Self::Upstream => "upstream",
            Self::Saved => "saved",
        }
    }

    fn from_label(label: &str) -> Option<Self> {
        [Self::Upstream, Self::Saved]
            .into_iter()
            .find(|side| side.label() == label)
    }
}

/// What a per-tenant or per-upstream line counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Measure {
    Answers,
    Tokens,
    /// Picodollars.
    Cost,
    /// Upstream calls (a pool member's, whatever their status).
    Calls,
}

impl Measure {
    fn label(self) -> &'static str {
        match self {
            Self::Answers => "answers",
            Self::Tokens => "tokens",
            Self::Cost => "usd",
            Self::Calls => "calls",
        }
    }

    fn from_label(label: &str) -> Option<Self> {
        [Self::Answers, Self::Tokens, Self::Cost, Self::Calls]
            .into_iter()
            .find(|measure| measure.label() == label)
    }
}

/// Whom a per-party line is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Party {
    /// A tenant: its configured label, or its scope's short hash.
    Tenant,
    /// A configured upstream.
    Upstream,
    /// A member of a configured pool, named `pool/member` (both from the config).
    Member,
}

impl Party {
    fn label(self) -> &'static str {
        match self {
            Self::Tenant => "tenant",
            Self::Upstream => "upstream",
            Self::Member => "member",
        }
    }
}

/// One line of the books. Every name in it is bounded: endpoint, cache status,
/// status and via are fixed sets, models come from the model table, upstreams
/// from the config, tenants are capped.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Account {
    /// Requests to the deduplicated endpoints, by how they were served.
    Requests { endpoint: Arc<str>, cache: Arc<str> },
    /// Upstream calls (all attempts of one call count once), by final status.
    Calls {
        upstream: Arc<str>,
        model: Arc<str>,
        status: Arc<str>,
    },
    /// Attempts beyond the first.
    Retries { upstream: Arc<str> },
    /// Answers served without their own upstream call, by how.
    Saved { model: Arc<str>, via: Arc<str> },
    Tokens {
        side: Side,
        kind: TokenKind,
        model: Arc<str>,
    },
    /// Picodollars at the model's price.
    Cost { side: Side, model: Arc<str> },
    /// Answers that carried no usage.
    UsageUnknown { side: Side, model: Arc<str> },
    /// Tokens of answers from a model without a price (their cost is unknown).
    Unpriced { side: Side, model: Arc<str> },
    /// Attribution to a tenant or an upstream.
    By {
        party: Party,
        side: Side,
        measure: Measure,
        name: Arc<str>,
    },
}

impl Account {
    pub fn requests(endpoint: &str, cache: &str) -> Self {
        Self::Requests {
            endpoint: endpoint.into(),
            cache: cache.into(),
        }
    }

    /// Money accounts hold picodollars (nanodollars in Redis).
    pub fn is_money(&self) -> bool {
        matches!(
            self,
            Self::Cost { .. }
                | Self::By {
                    measure: Measure::Cost,
                    ..
                }
        )
    }

    /// The Redis hash field: `|`-separated parts, each escaped, the free-form
    /// name last. A tenant's name is left off (the store appends it, or
    /// `other` once the cluster tracks enough tenants), see [`BatchLine`].
    pub(super) fn field(&self) -> (String, Option<&str>) {
        let join = |parts: &[&str]| {
            parts
                .iter()
                .map(|part| escape(part))
                .collect::<Vec<_>>()
                .join("|")
        };
        match self {
            Self::Requests { endpoint, cache } => (join(&["req", endpoint, cache]), None),
            Self::Calls {
                upstream,
                model,
                status,
            } => (join(&["call", upstream, status, model]), None),
            Self::Retries { upstream } => (join(&["retry", upstream]), None),
            Self::Saved { model, via } => (join(&["saved", via, model]), None),
            Self::Tokens { side, kind, model } => {
                (join(&["tok", side.label(), kind.label(), model]), None)
            }
            Self::Cost { side, model } => (join(&["usd", side.label(), model]), None),
            Self::UsageUnknown { side, model } => (join(&["unknown", side.label(), model]), None),
            Self::Unpriced { side, model } => (join(&["unpriced", side.label(), model]), None),
            Self::By {
                party,
                side,
                measure,
                name,
            } => {
                let head = join(&[party.label(), side.label(), measure.label()]);
                match party {
                    Party::Tenant => (head + "|", Some(name)),
                    Party::Upstream | Party::Member => (format!("{head}|{}", escape(name)), None),
                }
            }
        }
    }

    /// The field as Redis holds it (tenant appended).
    pub fn redis_field(&self) -> String {
        let (field, tenant) = self.field();
        match tenant {
            Some(tenant) => field + &escape(tenant),
            None => field,
        }
    }

    /// Reads a field back; `None` for one this version does not know (a newer
    /// instance's), which is then left out rather than misread.
    pub fn parse(field: &str) -> Option<Self> {
        let parts: Vec<String> = field.split('|').map(unescape).collect();
        let name = |s: &String| Arc::<str>::from(s.as_str());
        let side = |s: &String| Side::from_label(s);
        Some(match parts.as_slice() {
            [tag, endpoint, cache] if tag == "req" => Self::Requests {
                endpoint: name(endpoint),
                cache: name(cache),
            },
            [tag, upstream, status, model] if tag == "call" => Self::Calls {
                upstream: name(upstream),
                model: name(model),
                status: name(status),
            },
            [tag, upstream] if tag == "retry" => Self::Retries {
                upstream: name(upstream),
            },
            [tag, via, model] if tag == "saved" => Self::Saved {
                model: name(model),
                via: name(via),
            },
            [tag, s, kind, model] if tag == "tok" => Self::Tokens {
                side: side(s)?,
                kind: TokenKind::from_label(kind)?,
                model: name(model),
            },
            [tag, s, model] if tag == "usd" => Self::Cost {
                side: side(s)?,
                model: name(model),
            },
            [tag, s, model] if tag == "unknown" => Self::UsageUnknown {
                side: side(s)?,
                model: name(model),
            },
            [tag, s, model] if tag == "unpriced" => Self::Unpriced {
                side: side(s)?,
                model: name(model),
            },
            [tag, s, measure, who] if tag == "tenant" || tag == "upstream" || tag == "member" => {
                Self::By {
                    party: match tag.as_str() {
                        "tenant" => Party::Tenant,
                        "upstream" => Party::Upstream,
                        _ => Party::Member,
                    },
                    side: side(s)?,
                    measure: Measure::from_label(measure)?,
                    name: name(who),
                }
            }
            _ => return None,
        })
    }
}

/// The books' name of a pool member, `pool/member`: the pool's `%` and `/`
/// escaped, so [`split_member_name`] reads it back whatever either holds.
pub fn member_name(upstream: &str, member: &str) -> Arc<str> {
    let upstream = upstream.replace('%', "%25").replace('/', "%2F");
    format!("{upstream}/{member}").into()
}

/// The pool and the member of a [`member_name`].
pub fn split_member_name(name: &str) -> (String, String) {
    let (upstream, member) = name.split_once('/').unwrap_or((name, ""));
    (
        upstream.replace("%2F", "/").replace("%25", "%"),
        member.to_owned(),
    )
}

pub(super) fn escape(part: &str) -> String {
    part.replace('%', "%25").replace('|', "%7C")
}

pub(super) fn unescape(part: &str) -> String {
    part.replace("%7C", "|").replace("%25", "%")
}
