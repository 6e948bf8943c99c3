//! A request seen before (`memo.rs`): the cache's answer when it has one,
//! else the flight, whose upstream call parses the request when it runs.
//! What it answers and counts is what `buffered.rs` would for the parsed
//! request; the hot path of a cached hit, so it parses, hashes and spans
//! nothing.

use std::sync::Arc;

use tracing::Instrument;

use super::{
    Answered, Caller, Dedup, RawRequest, loaders::parsing_loader, respond::complete_response,
};
use crate::{
    coalesce::{Answer, Lookup},
    memo::Derived,
};

pub(super) async fn serve(
    dedup: &Arc<Dedup>,
    derived: &Derived,
    caller: &Caller,
    raw: RawRequest,
) -> Answered {
    let bill = &derived.bill;
    let shape = raw.shape();
    if dedup.traced {
        crate::traces::record_request(&derived.model, &dedup.upstream_names[derived.upstream]);
    }
    let key = dedup.purges.key(
        derived.key.clone(),
        &derived.key.fingerprint,
        &derived.model,
        &bill.tenant,
    );
    let looked_up = if derived.policy.read {
        dedup.coalescer.lookup(&key, derived.policy).await
    } else {
        Lookup::Absent
    };
    let served = match looked_up {
        Lookup::Fresh(served) => Ok(served),
        Lookup::Refresh(served) => {
            let age = served.age.unwrap_or_default();
            let loader = parsing_loader(dedup.clone(), raw, bill.clone(), key.clone());
            dedup.coalescer.refresh_in_background(key, loader, age);
            Ok(served)
        }
        Lookup::Absent => {
            let raw_span = raw.span(caller);
            let loader = parsing_loader(dedup.clone(), raw, bill.clone(), key.clone());
            // Boxed, as the parse path: a hit's future does not carry a flight's states.
            Box::pin(dedup.coalescer.fly(key, derived.policy, loader, None))
                .instrument(raw_span)
                .await
                .map(|answer| match answer {
                    Answer::Complete(served) => served,
                    Answer::Live { .. } => unreachable!("no live log without a stream format"),
                })
        }
    };
    complete_response(
        dedup,
        served,
        bill,
        derived.policy.revalidate,
        derived.key.fingerprint,
        &derived.fingerprint_header,
        shape,
        Some(derived),
        derived.echo.as_deref(),
    )
}
