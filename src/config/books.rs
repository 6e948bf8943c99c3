//! `pricing` and `ledger`: the prices answers are costed at and the books they go in.

use std::{fmt, time::Duration};

use serde::{Deserialize, Serialize};

use super::ModelPrice;

/// The label a model gets when no price and no literal route names it; reserved.
pub const OTHER_MODEL: &str = "other";

/// Model prices for the cost metrics, over the embedded snapshot (`pricing.rs`).
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PricingConfig {
    /// When the prices below were read off the providers' price pages (shown on `/stats`).
    pub as_of: Option<String>,
    /// Whether the embedded price snapshot (`pricing/genai-prices.json`) prices
    /// the models `models` does not. Off: only `models` is priced.
    pub snapshot: bool,
    /// Model name or glob -> price, consulted before the embedded snapshot (an
    /// entry here overrides it). Names match case-insensitively; an exact name
    /// wins over a glob, and among globs the first listed wins, so list
    /// specific patterns before broad ones.
    #[schemars(with = "std::collections::BTreeMap<String, ModelPrice>")]
    pub models: PriceTable,
    /// What a model no price names (neither `models` nor the snapshot) spends
    /// against USD budgets, per million tokens. Its cost on `/metrics` and
    /// `/stats` stays unknown (`corral_unpriced_tokens_total`): this is what
    /// a budget charges, not what the provider billed. Absent: the dearest
    /// input and output rates the price table knows, so an unpriced model can
    /// never spend past a budget for free; price the model to be exact.
    pub unpriced: Option<ModelPrice>,
}

impl Default for PricingConfig {
    fn default() -> Self {
        Self {
            as_of: None,
            snapshot: true,
            models: PriceTable::default(),
            unpriced: None,
        }
    }
}

/// The books behind `/stats` (`ledger.rs`).
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct LedgerConfig {
    /// How often each instance adds its counts into the Redis ledger (and reads
    /// the cluster's totals back). Without Redis there is no ledger to flush.
    #[schemars(with = "String")]
    #[serde(with = "humantime_serde")]
    pub flush_interval: Duration,
    /// The ledger's Redis keys expire this long after the last flush of any instance.
    #[schemars(with = "String")]
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
    /// Distinct tenants counted by name, per instance and in the cluster
    /// ledger; later ones are counted as `other`.
    pub max_tenants: usize,
    /// Tenants `/stats` lists by name (the most spent first); the rest are summed as `other`.
    pub top_tenants: usize,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        Self {
            flush_interval: Duration::from_secs(1),
            retention: Duration::from_secs(400 * 24 * 3600),
            max_tenants: 1000,
            top_tenants: 10,
        }
    }
}

/// `pricing.models` in the order written: the order decides among globs, so a
/// plain map (which sorts or hashes its keys) would not do.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PriceTable(pub Vec<(String, ModelPrice)>);

impl<'de> Deserialize<'de> for PriceTable {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entries;
        impl<'de> serde::de::Visitor<'de> for Entries {
            type Value = PriceTable;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map from model name or glob to {input, output, cached_input}")
            }
            fn visit_unit<E>(self) -> Result<PriceTable, E> {
                Ok(PriceTable::default())
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<PriceTable, A::Error> {
                let mut entries: Vec<(String, ModelPrice)> = Vec::new();
                while let Some((name, price)) = map.next_entry::<String, ModelPrice>()? {
                    if entries
                        .iter()
                        .any(|(seen, _)| seen.eq_ignore_ascii_case(&name))
                    {
                        return Err(serde::de::Error::custom(format!(
                            "model `{name}` is priced twice"
                        )));
                    }
                    entries.push((name, price));
                }
                Ok(PriceTable(entries))
            }
        }
        deserializer.deserialize_map(Entries)
    }
}

impl Serialize for PriceTable {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, price) in &self.0 {
            map.serialize_entry(name, price)?;
        }
        map.end()
    }
}
