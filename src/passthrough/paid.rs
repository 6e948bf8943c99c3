//! Paid pass-through calls: which proxied calls the provider bills, and how
//! each is held to the budgets and booked like a deduplicated miss.
//!
//! A call is paid unless it is known to be free ([`FREE`]): reading or
//! deleting stored state, the model list, moderations, token counts, file
//! uploads, cancellations. Images, audio (speech, transcriptions,
//! translations), batches and whatever a provider adds are paid. A paid call
//! is admitted by the budgets before it is sent (429 for a tenant whose
//! budget, or an upstream whose account cap, is spent; another tenant is
//! still served), and booked as one upstream call of its tenant when its
//! answer's body ends (or is abandoned): its spend is the `usage` a JSON
//! answer reports at its top level (gpt-image's, a gpt-4o transcription's),
//! at the price table's price for its model; without one (audio bytes, a
//! stream, `whisper-1`) it is a call of unknown usage and spends nothing.

use std::{
    pin::Pin,
    sync::{Arc, LazyLock},
    task::{Context, Poll},
};

use axum::http::Method;
use bytes::Bytes;
use futures::Stream;

use super::{Passthrough, usage_scan::UsageScan};
use crate::{
    budget::Budgets,
    config::PassRule,
    error::GatewayError,
    metrics::{Attribution, Metrics},
};

/// What the provider does not bill per call, as `METHOD /v1/path-glob`
/// rules over the decoded path (`*` spans segments). Gemini's paths are
/// matched below `/v1/`, whatever the caller's version.
pub const FREE: &[&str] = &[
    "GET /v1/*",
    "HEAD /v1/*",
    "DELETE /v1/*",
    "POST /v1/moderations",
    "POST /v1/messages/count_tokens",
    "POST /v1/responses/input_tokens",
    "POST /v1/models/*:countTokens",
    "POST /v1/models/*:computeTokens",
    "POST /v1/files",
    "POST /v1/uploads*",
    "POST /v1/*/cancel",
];

static FREE_RULES: LazyLock<Vec<PassRule>> = LazyLock::new(|| {
    FREE.iter()
        .map(|text| PassRule::parse(text).expect("the built-in rules parse"))
        .collect()
});

/// Whether the provider bills `method path` (`path` decoded, `/v1/...`).
pub fn is_paid(method: &Method, path: &str) -> bool {
    !FREE_RULES.iter().any(|rule| rule.matches(method, path))
}

/// What the pass-through books paid calls in and holds them to.
#[derive(Debug, Clone, Copy)]
pub struct Billing<'a> {
    pub budgets: &'a Arc<Budgets>,
    pub metrics: &'a Metrics,
}

/// Who made a proxied call, and what it asked for: what a paid call is
/// billed to.
#[derive(Debug, Clone, Copy)]
pub(super) struct Caller<'a> {
    /// The tenant's name in the books and budgets (`Auth::tenant_label`).
    pub tenant: &'a Arc<str>,
    /// The model the call names, if it names one.
    pub model: Option<&'a str>,
}

impl Passthrough<'_> {
    /// A paid call's bill, once the budgets admit it (429 when its tenant's
    /// or its upstream's budget is spent); `None` for a free call.
    pub(super) async fn admit_paid(
        &self,
        method: &Method,
        path: &str,
        upstream: usize,
        caller: Caller<'_>,
    ) -> Result<Option<Attribution>, GatewayError> {
        if !is_paid(method, path) {
            return Ok(None);
        }
        let bill = Attribution {
            model: self.billing.metrics.model(caller.model.unwrap_or_default()),
            tenant: caller.tenant.clone(),
            upstream: self.upstreams[upstream].name.as_str().into(),
            endpoint: "passthrough",
            member: None,
        };
        self.billing
            .budgets
            .admit_for(bill.budget_tenant(), &bill.upstream)
            .await?;
        Ok(Some(bill))
    }

    /// `body` (a paid call's answer), booking the call when it ends or is
    /// dropped; `json`: its `usage` is read as it passes.
    pub(super) fn booked<S>(&self, bill: Attribution, json: bool, body: S) -> Booked<S> {
        Booked {
            inner: Box::pin(body),
            booking: Booking {
                bill,
                metrics: self.billing.metrics.clone(),
                budgets: self.billing.budgets.clone(),
                scan: json.then(UsageScan::default),
                booked: false,
            },
        }
    }
}

/// A paid call to book once: in the books as an upstream call of its tenant
/// and model, and against the budgets by the usage its answer reported.
struct Booking {
    bill: Attribution,
    metrics: Metrics,
    budgets: Arc<Budgets>,
    scan: Option<UsageScan>,
    booked: bool,
}

impl Booking {
    fn book(&mut self) {
        if std::mem::replace(&mut self.booked, true) {
            return;
        }
        let usage = self.scan.as_ref().and_then(UsageScan::usage);
        self.metrics.upstream_usage(&self.bill, usage);
        if let Some(usage) = &usage {
            self.bill.spend(&self.budgets, usage);
        }
    }
}

impl Drop for Booking {
    /// An answer cut short or abandoned by its client was still made, and billed.
    fn drop(&mut self) {
        self.book();
    }
}

/// A paid answer's body: relayed unchanged, scanned for its `usage`, and
/// booked at its end, before the client sees that end (so a client that
/// read the answer finds it in the books), or when dropped.
pub(super) struct Booked<S> {
    inner: Pin<Box<S>>,
    booking: Booking,
}

impl<S, E> Stream for Booked<S>
where
    S: Stream<Item = Result<Bytes, E>>,
{
    type Item = Result<Bytes, E>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let next = this.inner.as_mut().poll_next(cx);
        match &next {
            Poll::Ready(Some(Ok(chunk))) => {
                if let Some(scan) = &mut this.booking.scan {
                    scan.feed(chunk);
                }
            }
            Poll::Ready(None) => this.booking.book(),
            Poll::Ready(Some(Err(_))) | Poll::Pending => {}
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_is_known_to_be_free_is_free() {
        for (method, path) in [
            (Method::POST, "/v1/images/generations"),
            (Method::POST, "/v1/images/edits"),
            (Method::POST, "/v1/audio/speech"),
            (Method::POST, "/v1/audio/transcriptions"),
            (Method::POST, "/v1/audio/translations"),
            (Method::POST, "/v1/batches"),
            (Method::POST, "/v1/models/imagen-4:predict"),
            (Method::POST, "/v1/models/gemini-2.5-flash:generateContent"),
            (Method::POST, "/v1/something/new"),
            (Method::PUT, "/v1/anything"),
        ] {
            assert!(is_paid(&method, path), "{method} {path}");
        }
        for (method, path) in [
            (Method::GET, "/v1/models"),
            (Method::GET, "/v1/files/f-1/content"),
            (Method::DELETE, "/v1/responses/resp_1"),
            (Method::POST, "/v1/moderations"),
            (Method::POST, "/v1/messages/count_tokens"),
            (Method::POST, "/v1/responses/input_tokens"),
            (Method::POST, "/v1/models/gemini-2.5-flash:countTokens"),
            (Method::POST, "/v1/files"),
            (Method::POST, "/v1/uploads/u-1/parts"),
            (Method::POST, "/v1/batches/b-1/cancel"),
        ] {
            assert!(!is_paid(&method, path), "{method} {path}");
        }
    }
}
