//! The caller's response built from a shared answer: the upstream headers
//! every caller may see, corral's status headers (`x-corral-cache`, RFC 9211
//! `Cache-Status`, `Age`, the fingerprint), and the caller's own echoed labels.

use std::{sync::Arc, time::Duration};

use axum::{
    body::Body,
    http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header},
    response::Response,
};
use bytes::Bytes;

use super::{Answered, Dedup};
use crate::{
    cache::StoredResponse,
    cache_status::CacheStatus,
    coalesce::Served,
    error::{ErrorShape, GatewayError},
    fingerprint::Fingerprint,
    memo::Derived,
    metrics::Attribution,
    request::DedupRequest,
    usage::Usage,
    wire::{Echo, Wire},
};

/// Upstream response headers that may be shared with every caller of a
/// response. Everything else (`set-cookie`, `x-ratelimit-*`, request ids,
/// `openai-organization`) belongs to the one call that produced it.
pub(super) const SHARED_RESPONSE_HEADERS: &[&str] =
    &["content-type", "openai-model", "openai-version"];

pub const FINGERPRINT_HEADER: &str = "x-corral-fingerprint";
pub const CACHE_HEADER: &str = "x-corral-cache";
pub const FINGERPRINT_HEADER_NAME: HeaderName = HeaderName::from_static(FINGERPRINT_HEADER);
pub const CACHE_HEADER_NAME: HeaderName = HeaderName::from_static(CACHE_HEADER);
/// The pool member whose call made the answer (an answer the cache or a
/// flight shares names the member that made it).
pub const MEMBER_HEADER: HeaderName = HeaderName::from_static("x-corral-member");
/// Written on every response by the request pipeline (`api::pipeline`); named
/// here because a HIT's prebuilt headers hold its place.
pub const REQUEST_ID_HEADER: &str = "x-request-id";
pub const REQUEST_ID_HEADER_NAME: HeaderName = HeaderName::from_static(REQUEST_ID_HEADER);
/// RFC 9211.
const CACHE_STATUS_HEADER_NAME: HeaderName = HeaderName::from_static("cache-status");

/// An upstream answer as every caller of it shares it: the status, the
/// shared headers copied, the body, and the usage its API's adapter reads.
pub(super) fn shared_response(
    wire: &dyn Wire,
    status: StatusCode,
    headers: &HeaderMap,
    body: Bytes,
) -> StoredResponse {
    let usage = wire.usage(&body);
    shared_response_with(status, headers, body, usage)
}

/// As [`shared_response`], with the usage already read (`Wire::answer_facts`).
pub(super) fn shared_response_with(
    status: StatusCode,
    headers: &HeaderMap,
    body: Bytes,
    usage: Option<Usage>,
) -> StoredResponse {
    let headers = SHARED_RESPONSE_HEADERS
        .iter()
        .filter_map(|name| {
            // A copy, not a clone: a parsed header value is a slice of the whole
            // buffer the response head was read into (kilobytes), and a cached
            // entry holding the slice would pin that buffer for its lifetime.
            let value = headers.get(*name)?;
            let owned = HeaderValue::from_bytes(value.as_bytes()).unwrap_or_else(|_| value.clone());
            Some((HeaderName::from_static(name), owned))
        })
        .collect();
    StoredResponse {
        status,
        headers,
        usage,
        body,
    }
}

/// The response headers a served answer ends up with at most: the shared
/// ones, the four status headers, the request id, `content-length`.
pub(super) const RESPONSE_HEADERS_CAPACITY: usize = 12;

pub(super) fn response_from(shared: &StoredResponse) -> Response {
    let mut response = Response::new(Body::from(shared.body.clone()));
    *response.status_mut() = shared.status;
    let headers = response.headers_mut();
    headers.reserve(RESPONSE_HEADERS_CAPACITY);
    for (name, value) in &shared.headers {
        headers.insert(name.clone(), value.clone());
    }
    response
}

/// The caller's own label fields in an answer another caller's values may
/// fill (`wire::Echo`); the body is replaced only where they differ.
pub(super) fn own_echo(response: &mut Response, echo: Option<&Echo>, shared: &StoredResponse) {
    if let Some(own) = echo.and_then(|echo| echo.answer(&shared.body)) {
        *response.body_mut() = Body::from(own);
    }
}

/// A complete (not streamed) answer, or the error, as the caller's response.
/// A HIT of a request the memo knows clones the headers built for its answer.
#[allow(clippy::too_many_arguments)]
pub(super) fn complete_response(
    dedup: &Dedup,
    served: Result<Served, Arc<GatewayError>>,
    bill: &Attribution,
    revalidate: bool,
    fingerprint: Fingerprint,
    fingerprint_header: &HeaderValue,
    shape: ErrorShape,
    derived: Option<&Derived>,
    echo: Option<&Echo>,
) -> Answered {
    match served {
        Ok(Served {
            response: shared,
            status,
            stored,
            age,
        }) => {
            tracing::debug!(cache = status.as_str(), "served");
            dedup.metrics.served(bill, status, shared.usage);
            if dedup.traced {
                crate::traces::record_answer(shared.usage, &shared.body);
            }
            let built = || {
                let mut response = response_from(&shared);
                let headers = response.headers_mut();
                write_status_headers(
                    headers,
                    fingerprint_header,
                    revalidate,
                    status,
                    stored,
                    None,
                );
                response
            };
            let mut response = match derived {
                Some(derived) if status == CacheStatus::Hit => {
                    // Built with `Age` and the request id in place (the
                    // pipeline writes the caller's over it): a clone has room
                    // for exactly its entries, and adding one would grow it.
                    let headers = derived.hit_headers(&shared, || {
                        let mut headers = built().into_parts().0.headers;
                        headers.insert(header::AGE, age_value(Duration::ZERO));
                        headers.insert(REQUEST_ID_HEADER_NAME, HeaderValue::from_static("-"));
                        headers
                    });
                    let mut response = Response::new(Body::from(shared.body.clone()));
                    *response.status_mut() = shared.status;
                    *response.headers_mut() = headers;
                    if age.is_none() {
                        response.headers_mut().remove(header::AGE);
                    }
                    response
                }
                _ => built(),
            };
            if let Some(age) = age {
                response.headers_mut().insert(header::AGE, age_value(age));
            }
            own_echo(&mut response, echo, &shared);
            response
                .headers_mut()
                .extend(budget_left(dedup, bill, status));
            Answered::new(response, Some(status), fingerprint)
        }
        Err(error) => {
            let mut response = error.shared_response_as(shape);
            response
                .headers_mut()
                .insert(FINGERPRINT_HEADER_NAME, fingerprint_header.clone());
            Answered::new(response, None, fingerprint)
        }
    }
}

/// What is left of the caller's own budgets (`budgets`), in USD, on an
/// answer it was billed for.
pub const BUDGET_HEADER: &str = "x-corral-budget-remaining-usd";

/// Tells a caller billed for its answer (MISS, BYPASS) what is left of its
/// tenant's own budgets: the least of them, never below 0. An upstream's cap
/// is every tenant's, and is not shown (it would tell each tenant the others'
/// spend). A stream's head leaves before its cost is known, so it says what
/// was left when it began. `None` for an answer the caller was not billed
/// for, or no budget of its own.
pub(super) fn budget_left(
    dedup: &Dedup,
    bill: &Attribution,
    status: CacheStatus,
) -> Option<(HeaderName, HeaderValue)> {
    if !matches!(status, CacheStatus::Miss | CacheStatus::Bypass) {
        return None;
    }
    let left = dedup.budgets.remaining_usd(&bill.tenant)?;
    let value = HeaderValue::from_str(&format!("{left:.9}")).ok()?;
    Some((HeaderName::from_static(BUDGET_HEADER), value))
}

/// `x-corral-cache`, RFC 9211 `Cache-Status`, `Age` and the fingerprint.
pub(super) fn set_status_headers(
    headers: &mut HeaderMap,
    request: &DedupRequest,
    status: CacheStatus,
    stored: bool,
    age: Option<Duration>,
) {
    write_status_headers(
        headers,
        &header_value(&request.fingerprint.hex()),
        request.policy.revalidate,
        status,
        stored,
        age,
    );
}

pub(super) fn write_status_headers(
    headers: &mut HeaderMap,
    fingerprint: &HeaderValue,
    revalidate: bool,
    status: CacheStatus,
    stored: bool,
    age: Option<Duration>,
) {
    headers.insert(FINGERPRINT_HEADER_NAME, fingerprint.clone());
    headers.insert(CACHE_HEADER_NAME, HeaderValue::from_static(status.as_str()));
    let cache_status = match (status, stored) {
        (CacheStatus::Hit, _) => "corral; hit",
        (CacheStatus::Stale, _) => "corral; hit; fwd=stale",
        (CacheStatus::Miss, true) if revalidate => "corral; fwd=request; stored",
        (CacheStatus::Miss, false) if revalidate => "corral; fwd=request",
        (CacheStatus::Miss, true) => "corral; fwd=miss; stored",
        (CacheStatus::Miss, false) => "corral; fwd=miss",
        (CacheStatus::Coalesced, true) => "corral; fwd=miss; collapsed; stored",
        (CacheStatus::Coalesced, false) => "corral; fwd=miss; collapsed",
        (CacheStatus::Bypass, _) => "corral; fwd=bypass",
        (CacheStatus::Retry, _) => "corral; hit; detail=retry",
    };
    headers.insert(
        CACHE_STATUS_HEADER_NAME,
        HeaderValue::from_static(cache_status),
    );
    if let Some(age) = age {
        headers.insert(header::AGE, age_value(age));
    }
}

/// Ages below this many seconds are made once and shared: every HIT carries
/// one, and a `HeaderValue` made from a number is an allocation of its own.
pub(super) const SHARED_AGE_VALUES: u64 = 3_600;

/// The `Age` header's value for `age`, in whole seconds.
pub(super) fn age_value(age: Duration) -> HeaderValue {
    static SHARED: std::sync::OnceLock<Vec<HeaderValue>> = std::sync::OnceLock::new();
    let seconds = age.as_secs();
    if seconds >= SHARED_AGE_VALUES {
        return HeaderValue::from(seconds);
    }
    let shared = SHARED.get_or_init(|| {
        // One string of every number, each value a static slice of it:
        // cloning a value then counts no reference.
        let mut text = String::new();
        let mut ends = Vec::with_capacity(SHARED_AGE_VALUES as usize);
        for n in 0..SHARED_AGE_VALUES {
            text.push_str(itoa::Buffer::new().format(n));
            ends.push(text.len());
        }
        let text: &'static str = Box::leak(text.into_boxed_str());
        let mut start = 0;
        ends.into_iter()
            .map(|end| {
                let value = HeaderValue::from_static(&text[start..end]);
                start = end;
                value
            })
            .collect()
    });
    shared[seconds as usize].clone()
}

pub(super) fn header_value(text: &str) -> HeaderValue {
    HeaderValue::from_str(text).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_allowlisted_headers_are_shared() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.insert("set-cookie", HeaderValue::from_static("s=1"));
        headers.insert(
            "x-ratelimit-remaining-requests",
            HeaderValue::from_static("9"),
        );
        headers.insert("openai-organization", HeaderValue::from_static("org-x"));
        let shared = shared_response(&crate::wire::CHAT, StatusCode::OK, &headers, Bytes::new());
        let names: Vec<&str> = shared.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["content-type"]);
    }

    #[test]
    fn an_age_reads_as_its_whole_seconds_shared_or_not() {
        for (age, text) in [
            (Duration::ZERO, "0"),
            (Duration::from_millis(1_999), "1"),
            (Duration::from_secs(59), "59"),
            (Duration::from_secs(SHARED_AGE_VALUES - 1), "3599"),
            (Duration::from_secs(SHARED_AGE_VALUES), "3600"),
            (Duration::from_secs(86_400), "86400"),
        ] {
            assert_eq!(age_value(age), text, "{age:?}");
        }
    }
}
