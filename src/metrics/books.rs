//! The answer counters of `/metrics`, encoded at each scrape from this
//! instance's books (`ledger.rs`) rather than counted twice: one post per
//! answer feeds `/metrics` and `/stats` alike.

use std::{fmt, sync::Arc};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::counter::ConstCounter,
};

use super::{SavedLabels, SourceLabels, TokenLabels, VIA_LABELS};
use crate::{
    ledger::{Account, Books, Side},
    pricing::PicoUsd,
};

/// The answer counters (`corral_tokens_total`, `corral_cost_usd_total`,
/// `corral_usage_unknown_total`, `corral_unpriced_tokens_total`,
/// `corral_saved_responses_total`), encoded at each scrape from this
/// instance's books: one post per answer feeds `/metrics` and `/stats` alike,
/// and money leaves its integer picodollars only here, as the float Prometheus wants.
#[derive(Debug)]
pub(super) struct BooksCollector(pub(super) Arc<Books>);

/// One family's series, sorted for a stable scrape.
type Series<L, V> = Vec<(L, V)>;

impl Collector for BooksCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let mut tokens: Series<TokenLabels, u64> = Vec::new();
        let mut cost: Series<SourceLabels, PicoUsd> = Vec::new();
        let mut unknown: Series<SourceLabels, u64> = Vec::new();
        let mut unpriced: Series<SourceLabels, u64> = Vec::new();
        let mut saved: Series<SavedLabels, u64> = Vec::new();
        let count = |amount: u128| u64::try_from(amount).unwrap_or(u64::MAX);
        let source = |model: &Arc<str>, side: &Side| SourceLabels {
            model: model.clone(),
            source: side.label(),
        };
        self.0.for_each_local(|account, amount| match account {
            Account::Tokens { side, kind, model } => tokens.push((
                TokenLabels {
                    model: model.clone(),
                    kind: kind.label(),
                    source: side.label(),
                },
                count(amount),
            )),
            Account::Cost { side, model } => cost.push((source(model, side), PicoUsd(amount))),
            Account::UsageUnknown { side, model } => {
                unknown.push((source(model, side), count(amount)));
            }
            Account::Unpriced { side, model } => {
                unpriced.push((source(model, side), count(amount)));
            }
            Account::Saved { model, via } => {
                if let Some(via) = VIA_LABELS.into_iter().find(|known| **via == **known) {
                    saved.push((
                        SavedLabels {
                            model: model.clone(),
                            via,
                        },
                        count(amount),
                    ));
                }
            }
            _ => {}
        });
        tokens.sort_by(|a, b| {
            (&a.0.model, a.0.source, a.0.kind).cmp(&(&b.0.model, b.0.source, b.0.kind))
        });
        let by_source =
            |a: &SourceLabels, b: &SourceLabels| (&a.model, a.source).cmp(&(&b.model, b.source));
        cost.sort_by(|a, b| by_source(&a.0, &b.0));
        unknown.sort_by(|a, b| by_source(&a.0, &b.0));
        unpriced.sort_by(|a, b| by_source(&a.0, &b.0));
        saved.sort_by(|a, b| (&a.0.model, a.0.via).cmp(&(&b.0.model, b.0.via)));

        encode_counters(
            &mut encoder,
            "corral_tokens",
            "Tokens from the provider's usage, by billed kind (input, cached_input, cache_write, output, reasoning: disjoint, so they sum to all tokens): source=upstream were paid for, source=saved were served without a call",
            tokens,
        )?;
        encode_counters(
            &mut encoder,
            "corral_cost_usd",
            "USD at the model's price (pricing.models, else the embedded snapshot): source=upstream spent, source=saved not spent",
            cost.into_iter().map(|(labels, usd)| (labels, usd.as_usd())),
        )?;
        encode_counters(
            &mut encoder,
            "corral_usage_unknown",
            "Responses that carried no usage: their tokens and cost are unknown and not counted",
            unknown,
        )?;
        encode_counters(
            &mut encoder,
            "corral_unpriced_tokens",
            "Tokens of answers from a model with no price (in neither pricing.models nor the snapshot): their cost is unknown and not in corral_cost_usd_total",
            unpriced,
        )?;
        encode_counters(
            &mut encoder,
            "corral_saved_responses",
            "Responses served without their own upstream call, by how (hit, stale, coalesced, retry: a client's retry answered from the retry window)",
            saved,
        )
    }
}

/// One counter family: its descriptor (always, so the family is visible before
/// its first series), then one series per label set.
fn encode_counters<L, V>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (L, V)>,
) -> Result<(), fmt::Error>
where
    L: EncodeLabelSet,
    V: prometheus_client::encoding::EncodeCounterValue,
{
    let mut family = encoder.encode_descriptor(
        name,
        help,
        None,
        prometheus_client::metrics::MetricType::Counter,
    )?;
    for (labels, value) in series {
        ConstCounter::new(value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}
