//! [`Attribution`]: whom one answer is billed to, and what its spend counts
//! against (the budgets of its tenant, or of nobody for the gateway's own
//! calls, and of its upstream's account).

use std::sync::Arc;

use super::ModelLabel;
use crate::{budget::Budgets, usage::Usage};

/// Whom one answer is billed to: its model (with the price), the tenant that
/// asked, the upstream that answered, and the endpoint. Built once per request.
#[derive(Debug, Clone)]
pub struct Attribution {
    pub model: ModelLabel,
    /// The tenant's configured label, or its scope's short hash (`/stats` only).
    pub tenant: Arc<str>,
    pub upstream: Arc<str>,
    /// `Endpoint::label`: `chat`, `completions` or `embeddings`.
    pub endpoint: &'static str,
    /// The pool member that answered (set by the loader once the call is
    /// made: [`answered_by`](Self::answered_by)); `None` before.
    pub member: Option<Arc<str>>,
}

impl Attribution {
    /// The same call billed to the gateway itself ([`GATEWAY`](crate::ledger::GATEWAY)):
    /// a background refresh, which the caller whose hit started it did not
    /// ask for (it was answered from the cache) and must not pay for.
    pub fn gateways_own(&self) -> Self {
        Self {
            tenant: crate::ledger::GATEWAY.into(),
            ..self.clone()
        }
    }

    /// The same answer, made by the pool `member` whose attempt it was (a
    /// pool's spend is then booked to that member too, on `/stats`).
    #[must_use]
    pub fn answered_by(&self, member: Option<Arc<str>>) -> Self {
        Self {
            member,
            ..self.clone()
        }
    }

    /// The tenant whose budgets the call spends and is checked against:
    /// none for the gateway's own calls, which only the upstream's account
    /// caps count. (No key label may be `gateway`, and no scope is spelled so.)
    pub fn budget_tenant(&self) -> Option<&Arc<str>> {
        (&*self.tenant != crate::ledger::GATEWAY).then_some(&self.tenant)
    }

    /// Spends one upstream call's `usage` (at the model's price, or an
    /// unpriced model's budget rate: `ModelLabel::budget_cost`) against the
    /// budgets of its tenant, if any, and of its upstream.
    pub fn spend(&self, budgets: &Budgets, usage: &Usage) {
        if budgets.is_active() {
            let picos = self.model.budget_cost(usage).map(|cost| cost.0);
            budgets.spend_for(self.budget_tenant(), &self.upstream, picos, usage.total());
        }
    }
}
