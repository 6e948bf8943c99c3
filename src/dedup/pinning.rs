//! State stays with its account (`pins.rs`): a Responses request naming a
//! `previous_response_id` goes to the pool member that made that response,
//! and a stored response a member makes is pinned to it.

use serde_json::Value;

use super::Dedup;
use crate::{fingerprint::Endpoint, request::DedupRequest, tenant::TenantScope};

/// The tenants a stored response an answer makes is pinned for: the
/// caller's own, and the cache scope its answer is shared in when that is
/// another (`cache.scope: global`: every tenant served the answer may follow
/// its id up).
#[derive(Debug, Clone)]
pub(super) struct PinOwners {
    upstream: usize,
    tenants: Vec<TenantScope>,
}

impl Dedup {
    /// The member a request must go to: the one that made the stored
    /// response its `previous_response_id` names (only in a pool of several).
    pub(super) async fn pin_of(&self, request: &DedupRequest) -> Option<std::sync::Arc<str>> {
        if request.endpoint != Endpoint::Responses || !self.upstream.is_pool(request.upstream) {
            return None;
        }
        let id = request.body.get("previous_response_id")?.as_str()?;
        // Boxed: the pins' lookup (Redis's, when shared) would otherwise make
        // every request's future larger, pinned or not.
        Box::pin(self.pinned_member(request, id)).await
    }

    /// The member `id`'s response is pinned to, for the caller's own scope or its tenant's.
    async fn pinned_member(&self, request: &DedupRequest, id: &str) -> Option<std::sync::Arc<str>> {
        let pool = self.upstream.name(request.upstream);
        for tenant in [&request.own_scope, &request.scope] {
            if let Some(member) = self.pins.member(tenant.as_str(), pool, id).await {
                return Some(member);
            }
        }
        None
    }

    /// Whom the stored response `request`'s answer makes is pinned for: a
    /// Responses request with `store` not false, to a pool of several.
    pub(super) fn pin_owners(&self, request: &DedupRequest) -> Option<PinOwners> {
        let stored = request.body.get("store") != Some(&Value::Bool(false));
        if request.endpoint != Endpoint::Responses
            || !stored
            || !self.upstream.is_pool(request.upstream)
        {
            return None;
        }
        let mut tenants = vec![request.own_scope.clone()];
        if request.scope != request.own_scope {
            tenants.push(request.scope.clone());
        }
        Some(PinOwners {
            upstream: request.upstream,
            tenants,
        })
    }

    /// Pins the response `answer` (a Responses object) names to `member`,
    /// before its caller can name it in a follow-up.
    pub(super) async fn pin_answer(
        &self,
        owners: Option<&PinOwners>,
        member: Option<&str>,
        answer: &[u8],
    ) {
        let (Some(owners), Some(member)) = (owners, member) else {
            return;
        };
        let Some(id) = serde_json::from_slice::<Value>(answer)
            .ok()
            .and_then(|answer| answer.get("id").and_then(Value::as_str).map(str::to_owned))
        else {
            return;
        };
        // Boxed, as `pin_of`'s lookup: the pins' write would otherwise make
        // every flight's future larger, pinned or not.
        Box::pin(self.record_pins(owners, member, &id)).await;
    }

    /// Pins `id` to `member` for each of `owners`' tenants.
    async fn record_pins(&self, owners: &PinOwners, member: &str, id: &str) {
        let pool = self.upstream.name(owners.upstream);
        for tenant in &owners.tenants {
            self.pins.record(tenant.as_str(), pool, id, member).await;
        }
    }
}
