//! Fallback to another pool (`upstreams[].fallback`): when none of a pool's
//! members could answer a flight's call before its first byte (each cooling,
//! open, or failed over for it), the call goes on to the pool's fallback
//! models, in order. A fallback is a model name routed like a request naming
//! it: the request is parsed again with its `model` rewritten, so the
//! fallback's upstream, body and cache key are exactly those of a request
//! naming that model. Its answer (whose `model` says so) is every caller's
//! of the flight, and is stored only under that key, never the primary's
//! (`Loaded::stored_under`). Fallbacks are not chained: a fallback pool's
//! own `fallback` is not followed.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Map, Value};

use super::{Dedup, RawRequest, outbound_of};
use crate::{
    error::GatewayError, fingerprint::CacheKey, metrics::Attribution, request::DedupRequest,
    upstream::Outbound,
};

/// What a flight keeps to send its request on to its pool's fallbacks: the
/// request as it came, and the fallback models in order. Only a request to a
/// pool with a `fallback` keeps one.
#[derive(Debug)]
pub(super) struct Fallbacks {
    raw: RawRequest,
    models: Arc<[String]>,
    /// The caller's name on `/stats`, whose purges re-key its answers
    /// (`Purges::key`): the flight's starter, even when a background
    /// refresh bills the gateway.
    tenant: Arc<str>,
}

/// The request re-aimed at one fallback model.
pub(super) struct Retargeted {
    /// The request naming the fallback model, as a parse of it gives.
    pub(super) request: DedupRequest,
    pub(super) outbound: Outbound,
    /// The key a request naming the fallback model has: the only one its
    /// answer is stored under.
    pub(super) key: CacheKey,
    /// Counted and billed under the model that answers, at its upstream.
    pub(super) bill: Attribution,
}

impl Fallbacks {
    /// The fallbacks of a request routed to `upstream` and billed to
    /// `tenant`; `None` when the upstream has none (nothing is kept).
    pub(super) fn of(
        dedup: &Dedup,
        upstream: usize,
        raw: &RawRequest,
        tenant: &Arc<str>,
    ) -> Option<Arc<Self>> {
        let models = dedup.fallbacks.get(upstream).filter(|m| !m.is_empty())?;
        Some(Arc::new(Self {
            raw: raw.clone(),
            models: models.clone(),
            tenant: tenant.clone(),
        }))
    }

    /// The request re-aimed at each fallback model in order, for a call that
    /// `from` (its pool) could not answer, billed as `bill` but under the
    /// model and upstream that answer. Each one handed out is counted as a
    /// failover (`reason="fallback"`). A fallback that does not parse (the
    /// config was validated, so it should) is logged and passed over.
    pub(super) fn targets<'a>(
        &'a self,
        dedup: &'a Dedup,
        bill: &'a Attribution,
        from: usize,
    ) -> impl Iterator<Item = Retargeted> + 'a {
        self.models.iter().filter_map(move |model| {
            let target = self
                .retarget(dedup, model, bill)
                .inspect_err(|error| {
                    tracing::warn!(%model, %error, "fallback model passed over");
                })
                .ok()?;
            let (pool, to) = (
                &dedup.upstream_names[from],
                &dedup.upstream_names[target.request.upstream],
            );
            tracing::info!(upstream = %pool, to = %to, %model, "every member failed: the call falls back");
            dedup.metrics.failover(pool, pool, to, "fallback");
            Some(target)
        })
    }

    fn retarget(
        &self,
        dedup: &Dedup,
        model: &str,
        bill: &Attribution,
    ) -> Result<Retargeted, GatewayError> {
        let raw = RawRequest {
            body: naming(&self.raw.body, model)?,
            ..self.raw.clone()
        };
        let mut request = raw.parse(dedup)?;
        dedup
            .upstream
            .check_credential(request.upstream, request.authorization.as_ref())?;
        let bill = Attribution {
            model: dedup.metrics.model(&request.model),
            upstream: dedup.upstream_names[request.upstream].as_str().into(),
            ..bill.clone()
        };
        let key = dedup.key_of(&request, &self.tenant);
        let outbound = outbound_of(&mut request);
        Ok(Retargeted {
            request,
            outbound,
            key,
            bill,
        })
    }
}

/// `body` (a JSON object, as its parse found) with its `model` replaced.
fn naming(body: &Bytes, model: &str) -> Result<Bytes, GatewayError> {
    let mut object: Map<String, Value> = serde_json::from_slice(body)
        .map_err(|_| GatewayError::invalid("the request body must be a JSON object"))?;
    object.insert("model".to_owned(), Value::String(model.to_owned()));
    serde_json::to_vec(&object)
        .map(Bytes::from)
        .map_err(|err| GatewayError::Internal(err.into()))
}

/// Whether a pool's failure lets its call go on to a fallback: the
/// provider's 429 or 5xx after every member was tried, no member reachable
/// or in time, every circuit open, every member cooling or capped. Never a
/// caller's own 4xx (the request is the problem, wherever it goes), nor
/// anything after a byte reached a caller (those never end a call here).
pub(super) fn pool_could_not_answer(error: &GatewayError) -> bool {
    match error {
        GatewayError::Upstream { status, .. } => status.as_u16() == 429 || status.is_server_error(),
        GatewayError::UpstreamUnreachable { .. }
        | GatewayError::UpstreamTimeout { .. }
        | GatewayError::CircuitOpen { .. }
        | GatewayError::RateLimited { .. } => true,
        GatewayError::Shaped { error, .. } => pool_could_not_answer(error),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;

    use super::*;

    fn provider(status: u16) -> GatewayError {
        GatewayError::Upstream {
            status: StatusCode::from_u16(status).unwrap(),
            content_type: None,
            retry_after: None,
            body: Bytes::new(),
        }
    }

    #[test]
    fn only_the_pools_failure_falls_back_never_the_callers() {
        for status in [429, 500, 502, 503, 529] {
            assert!(pool_could_not_answer(&provider(status)), "{status}");
        }
        for status in [400, 401, 403, 404, 413, 422] {
            assert!(!pool_could_not_answer(&provider(status)), "{status}");
        }
        let shaped = provider(503).in_shape(crate::error::ErrorShape::Anthropic);
        assert!(pool_could_not_answer(&shaped));
        assert!(!pool_could_not_answer(&GatewayError::ShuttingDown));
        assert!(!pool_could_not_answer(&GatewayError::invalid("bad")));
    }

    #[test]
    fn naming_replaces_only_the_model() {
        let body =
            Bytes::from_static(br#"{"model":"a","messages":[{"role":"user","content":"hi"}]}"#);
        let named: Value = serde_json::from_slice(&naming(&body, "b").unwrap()).unwrap();
        assert_eq!(named["model"], "b");
        assert_eq!(named["messages"][0]["content"], "hi");
        assert!(naming(&Bytes::from_static(b"[1]"), "b").is_err());
    }
}
