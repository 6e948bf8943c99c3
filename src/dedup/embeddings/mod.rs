//! `POST /v1/embeddings` by the item: each input of a batch is cached and
//! coalesced on its own key, so a batch sends upstream only the inputs nobody
//! has embedded yet, in one call, and the caller gets every vector back in
//! its order and its `encoding_format`.
//!
//! Each API's item format is an [`Items`]: `wire.rs` knows OpenAI's
//! (items, upstream bodies, answers, encodings), `gemini.rs` Gemini's
//! `embedContent` and `batchEmbedContents`; the coalescer's batch flights
//! (`coalesce/batch.rs`) know only keys and bytes.

mod distinct;
mod gemini;
pub mod wire;

use std::sync::Arc;

use axum::{
    body::Body,
    http::{HeaderName, HeaderValue, StatusCode, header},
    response::IntoResponse,
};
use bytes::Bytes;

use super::{
    Answered, Dedup,
    loaders::billed_to,
    respond::{FINGERPRINT_HEADER_NAME, header_value, set_status_headers},
};
use crate::{
    cache::StoredResponse,
    cache_status::CacheStatus,
    coalesce::{BatchCall, BatchLoader, ItemsLoaded, ItemsServed},
    error::GatewayError,
    fingerprint::{CacheKey, Endpoint, Fingerprint, KeyInput},
    metrics::{Attribution, Metrics},
    request::DedupRequest,
    upstream::Outbound,
    usage::{Estimated, Usage},
    wire::PathCall,
};
use gemini::GeminiItems;
use wire::{ItemizedRequest, SplitAnswer};

/// A batch request taken apart into its distinct items, in its API's wire
/// format: what each item is keyed by, the upstream call for any subset of
/// them, the provider's answer split back into one stored body per item,
/// and the caller's answer put together from stored bodies.
trait Items: Send + Sync + std::fmt::Debug {
    /// Distinct items.
    fn len(&self) -> usize;
    /// What item `item`'s fingerprint is computed from.
    fn item_key_body(&self, item: usize) -> Vec<u8>;
    /// The path an items call goes to, when not the request's own.
    fn upstream_path(&self) -> Option<String> {
        None
    }
    /// The upstream body asking for `items`, in that order.
    fn upstream_body(&self, items: &[usize]) -> Bytes;
    /// The tokens item `item` costs, where the request itself says.
    fn known_tokens(&self, item: usize) -> Option<u64>;
    /// The provider's answer to `expected` items, one stored body each.
    fn split_answer(&self, body: &[u8], expected: usize) -> Result<SplitAnswer, String>;
    /// The caller's answer from the stored bodies of its distinct items.
    fn assemble(&self, items: &[&[u8]], model: &str, billed: Usage) -> Result<Bytes, String>;
}

/// The request's items, in its endpoint's format.
fn items_of(dedup: &Dedup, request: &DedupRequest) -> Result<Arc<dyn Items>, GatewayError> {
    Ok(match request.endpoint {
        Endpoint::EmbedContent => Arc::new(GeminiItems::parse(
            &request.body,
            request.call.as_ref().and_then(PathCall::gemini_method),
            &request.model,
            dedup.item_limits,
        )?),
        _ => Arc::new(ItemizedRequest::parse(&request.body, dedup.item_limits)?),
    })
}

/// How many of a batch's inputs were served which way.
pub const ITEMS_HEADER: &str = "x-corral-items";

/// An embeddings request's answer, before it becomes a response with its
/// status headers.
#[derive(Debug)]
struct EmbeddingsAnswer {
    pub body: Bytes,
    /// The request's one status: see [`Counts::status`].
    pub status: CacheStatus,
    /// Some input went upstream for this request and was stored.
    pub stored: bool,
    /// The [`ITEMS_HEADER`] value.
    pub items: String,
}

/// Serves an embeddings request (not `no-store`) item by item.
pub(in crate::dedup) async fn serve(
    dedup: &Arc<Dedup>,
    request: &DedupRequest,
    outbound: Outbound,
    bill: Attribution,
) -> Answered {
    let fingerprint = request.fingerprint;
    let traced = dedup.traced;
    let mut response = match itemized(dedup, request, outbound, bill).await {
        Ok(answer) => {
            if traced {
                crate::traces::record_answer(Usage::from_body(&answer.body), &answer.body);
            }
            let mut response = (StatusCode::OK, Body::from(answer.body)).into_response();
            let headers = response.headers_mut();
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            set_status_headers(headers, request, answer.status, answer.stored, None);
            headers.insert(
                HeaderName::from_static(ITEMS_HEADER),
                header_value(&answer.items),
            );
            return Answered::new(response, Some(answer.status), fingerprint);
        }
        Err(error) => error.shared_response_as(request.shape),
    };
    response
        .headers_mut()
        .insert(FINGERPRINT_HEADER_NAME, header_value(&fingerprint.hex()));
    Answered::new(response, None, fingerprint)
}

async fn itemized(
    dedup: &Arc<Dedup>,
    request: &DedupRequest,
    outbound: Outbound,
    bill: Attribution,
) -> Result<EmbeddingsAnswer, Arc<GatewayError>> {
    let itemized = items_of(dedup, request).map_err(Arc::new)?;
    let upstream = &dedup.upstream_keys[request.upstream];
    let keys: Arc<[CacheKey]> = (0..itemized.len())
        .map(|item| {
            let key = CacheKey {
                scope: request.scope.clone(),
                fingerprint: Fingerprint::of(&KeyInput {
                    endpoint: request.endpoint,
                    upstream,
                    scope: &request.scope,
                    headers: &request.keyed_headers,
                    query: &request.query_pairs,
                    body: &itemized.item_key_body(item),
                }),
            };
            // Purges re-key inputs too; by fingerprint, the batch's own.
            dedup
                .purges
                .key(key, &request.fingerprint, &request.model, &bill.tenant)
        })
        .collect();
    let loader = batch_loader(dedup.clone(), itemized.clone(), outbound, bill.clone());
    let ItemsServed { items, billed } = dedup
        .coalescer
        .get_or_fetch_items(keys, request.policy, loader)
        .await?;
    let mut counts = Counts::default();
    for item in &items {
        counts.add(item.status);
        // Each input served without this caller's own call saved its tokens,
        // where the input's own count is known; otherwise it is counted as unknown.
        dedup
            .metrics
            .served(&bill, item.status, item.response.usage);
    }
    counts.record(&dedup.metrics, &bill);
    let bodies: Vec<&[u8]> = items
        .iter()
        .map(|item| item.response.body.as_ref())
        .collect();
    let billed_usage = billed.map(|billed| billed.usage).unwrap_or_default();
    let body = itemized
        .assemble(&bodies, &request.model, billed_usage)
        .map_err(|reason| {
            Arc::new(GatewayError::Internal(anyhow::anyhow!(
                "assembling embeddings: {reason}"
            )))
        })?;
    tracing::debug!(
        hit = counts.hit,
        stale = counts.stale,
        coalesced = counts.coalesced,
        miss = counts.miss,
        fingerprint = %request.fingerprint.short_hex(),
        "served embeddings"
    );
    Ok(EmbeddingsAnswer {
        body,
        status: counts.status(),
        stored: counts.miss > 0 && request.policy.write,
        items: counts.header(),
    })
}

/// The one upstream call of a batch flight: the body asks for the flight's
/// items only (in their relative order); the answer is split into one stored
/// vector per item, or refused whole.
fn batch_loader(
    dedup: Arc<Dedup>,
    itemized: Arc<dyn Items>,
    outbound: Outbound,
    bill: Attribution,
) -> BatchLoader {
    let outbound = Arc::new(outbound);
    let bill = Arc::new(bill);
    Arc::new(move |BatchCall { items, background }| {
        let (dedup, itemized, outbound, bill) = (
            dedup.clone(),
            itemized.clone(),
            outbound.clone(),
            billed_to(&bill, background),
        );
        Box::pin(async move {
            let mut call = (*outbound).clone();
            call.body = itemized.upstream_body(&items);
            if let Some(path) = itemized.upstream_path() {
                call.path = path.into();
            }
            dedup.may_call_upstream(&bill).await?;
            let buffered = dedup.upstream.call_buffered(&call, &bill.model).await?;
            let answer = itemized.split_answer(&buffered.body, items.len());
            let usage = match &answer {
                Ok(split) => split.usage,
                Err(_) => Usage::from_body(&buffered.body),
            };
            // Paid for, whether or not the answer is usable; an answer without
            // usage (Gemini's embeddings never carry one) is billed its request's size.
            let request_bytes = call.body.len();
            dedup.billed_or_estimated(
                &bill.answered_by(buffered.member.clone()),
                usage,
                || Usage::estimate(request_bytes, 0),
                Estimated::Unreported,
            );
            let split = answer.map_err(|reason| GatewayError::UpstreamInvalid {
                upstream: dedup.upstream.name(call.upstream).to_owned(),
                reason,
            })?;
            let alone = items.len() == 1;
            let responses = split
                .items
                .into_iter()
                .zip(&items)
                .map(|(body, &item)| {
                    // An input's own token count: the call's when it was embedded
                    // alone, its token ids' when it came as tokens; else unknown.
                    let tokens = match alone {
                        true => usage.map(|usage| usage.prompt_tokens),
                        false => itemized.known_tokens(item),
                    };
                    StoredResponse {
                        status: StatusCode::OK,
                        headers: vec![(
                            header::CONTENT_TYPE,
                            HeaderValue::from_static("application/json"),
                        )],
                        body,
                        usage: tokens.map(|prompt_tokens| Usage {
                            prompt_tokens,
                            ..Usage::default()
                        }),
                    }
                })
                .collect();
            Ok(ItemsLoaded {
                items: responses,
                usage,
                compute_time: buffered.elapsed,
            })
        })
    })
}

/// A batch's inputs by how they were served.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    hit: u64,
    stale: u64,
    coalesced: u64,
    miss: u64,
}

impl Counts {
    fn add(&mut self, status: CacheStatus) {
        match status {
            // Items are never served from the retry window; a whole request is.
            CacheStatus::Hit | CacheStatus::Retry => self.hit += 1,
            CacheStatus::Stale => self.stale += 1,
            CacheStatus::Coalesced => self.coalesced += 1,
            CacheStatus::Miss | CacheStatus::Bypass => self.miss += 1,
        }
    }

    /// The request's one status: MISS when it paid for any input, else
    /// COALESCED when it shared another's call, else STALE, else HIT.
    fn status(self) -> CacheStatus {
        if self.miss > 0 {
            CacheStatus::Miss
        } else if self.coalesced > 0 {
            CacheStatus::Coalesced
        } else if self.stale > 0 {
            CacheStatus::Stale
        } else {
            CacheStatus::Hit
        }
    }

    fn header(self) -> String {
        format!(
            "hit={}, stale={}, coalesced={}, miss={}",
            self.hit, self.stale, self.coalesced, self.miss
        )
    }

    fn record(self, metrics: &Metrics, bill: &Attribution) {
        for (status, count) in [
            (CacheStatus::Hit, self.hit),
            (CacheStatus::Stale, self.stale),
            (CacheStatus::Coalesced, self.coalesced),
            (CacheStatus::Miss, self.miss),
        ] {
            metrics.embedding_inputs(&bill.model, status, count);
        }
    }
}
