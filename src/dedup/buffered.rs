//! A complete (not streamed) answer: the retry window's, when this is a
//! client's retry of an answer it already paid for; else the cache's or a
//! flight's, which makes the one upstream call every identical caller shares.

use std::sync::Arc;

use super::{
    Answered, Dedup,
    fallback::Fallbacks,
    loaders::upstream_loader,
    respond::{complete_response, header_value, own_echo, response_from, set_status_headers},
};
use crate::{
    cache_status::CacheStatus, error::GatewayError, metrics::Attribution, request::DedupRequest,
    upstream::Outbound,
};

pub(super) async fn serve(
    dedup: &Arc<Dedup>,
    request: &DedupRequest,
    outbound: Outbound,
    bill: &Attribution,
    fallbacks: Option<Arc<Fallbacks>>,
) -> Result<Answered, GatewayError> {
    let fingerprint = request.fingerprint;
    let (key, retained) = dedup.key_and_retained(request, bill).await?;
    if let Some(retained) = retained {
        tracing::debug!(fingerprint = %fingerprint.short_hex(), "served a retry from the retry window");
        dedup
            .metrics
            .served(bill, CacheStatus::Retry, retained.response.usage);
        let mut response = response_from(&retained.response);
        own_echo(&mut response, request.echo.as_deref(), &retained.response);
        let age = retained.age(dedup.clock.now_ms());
        set_status_headers(
            response.headers_mut(),
            request,
            CacheStatus::Retry,
            true,
            Some(age),
        );
        return Ok(Answered::new(
            response,
            Some(CacheStatus::Retry),
            fingerprint,
        ));
    }
    let retained_under = dedup.own_retry_key(request, &key);
    let loader = upstream_loader(
        dedup.clone(),
        outbound,
        request.wire,
        bill.clone(),
        retained_under,
        dedup.pin_owners(request),
        fallbacks,
    );
    let served = dedup
        .coalescer
        .get_or_fetch(key, request.policy, loader)
        .await;
    let failed = served
        .as_ref()
        .map_or(true, |served| !served.response.status.is_success());
    dedup.release_key_of_failed(request, failed).await;
    Ok(complete_response(
        dedup,
        served,
        bill,
        request.policy.revalidate,
        fingerprint,
        &header_value(&fingerprint.hex()),
        request.shape,
        None,
        request.echo.as_deref(),
    ))
}
