//! `GET /v1/models`: the models of every upstream in one list, so a model
//! picker sees everything corral routes, not only the first provider's.
//!
//! Each upstream is asked in parallel (guarded and retried like any call, not
//! billed). An entry is kept only if corral routes its id to the upstream
//! that listed it (first matching glob of that upstream's API wins, as for
//! requests), which also
//! de-duplicates: an id two providers list appears once, from the one that
//! serves it. Entries are passed through as the provider wrote them
//! (`owned_by` included). An upstream that fails is left out of the list
//! (logged); only when every upstream fails is the first failure relayed.

use std::collections::HashSet;

use axum::{
    Json,
    http::{HeaderMap, Method},
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};

use super::{Passthrough, relay::forwarded_headers};
use crate::{auth::forwarded_credential, error::GatewayError, upstream::Outbound};

impl Passthrough<'_> {
    /// `GET /v1/models`: every upstream's list, merged (see the module docs).
    pub(super) async fn models(&self, headers: &HeaderMap) -> Result<Response, GatewayError> {
        // Gemini's own list is Gemini's (`gemini.rs`), merged into nothing else.
        let upstreams: Vec<usize> = (0..self.upstreams.len())
            .filter(|&upstream| self.upstreams[upstream].api != crate::config::Api::Gemini)
            .collect();
        let asked = upstreams.iter().map(|&upstream| async move {
            self.policy
                .check(&Method::GET, "/v1/models", self.shares_a_key(upstream))?;
            let outbound = Outbound {
                upstream,
                method: Method::GET,
                path: "/models".into(),
                query: None,
                headers: forwarded_headers(headers),
                authorization: forwarded_credential(headers),
                body: Default::default(),
                affinity: None,
                pin: None,
                model: None,
            };
            // A key of one provider is not shown to another: that upstream's
            // list is left out (all of them foreign: the refusal answers).
            self.upstream
                .check_credential(upstream, outbound.authorization.as_ref())?;
            let answer = self.upstream.call_unbilled(&outbound).await?;
            let list: Value = serde_json::from_slice(&answer.body).map_err(|err| {
                GatewayError::UpstreamInvalid {
                    upstream: self.upstream.name(upstream).to_owned(),
                    reason: format!("its model list is not JSON: {err}"),
                }
            })?;
            Ok::<_, GatewayError>(list)
        });
        let answers = futures::future::join_all(asked).await;
        let mut errors = Vec::new();
        let mut seen = HashSet::new();
        let mut data = Vec::new();
        for (&upstream, answer) in upstreams.iter().zip(answers) {
            let list = match answer {
                Ok(list) => list,
                Err(error) => {
                    tracing::warn!(upstream = self.upstream.name(upstream), %error, "model list left out");
                    errors.push(error);
                    continue;
                }
            };
            let entries = list
                .get("data")
                .and_then(Value::as_array)
                .into_iter()
                .flatten();
            for entry in entries {
                let Some(id) = entry.get("id").and_then(Value::as_str) else {
                    continue;
                };
                let api = self.upstream.api(upstream);
                if self.routes.route_for(api, id) == Some(upstream) && seen.insert(id.to_owned()) {
                    data.push(entry.clone());
                }
            }
        }
        // A partial list beats none; when every upstream failed, the first failure answers.
        if errors.len() == upstreams.len()
            && let Some(first) = errors.into_iter().next()
        {
            return Err(first);
        }
        Ok(Json(json!({"object": "list", "data": data})).into_response())
    }
}
