//! Which `model` label a request's model gets, and what its tokens cost.
//!
//! The label set is fixed when the state is built: the keys of the configured
//! pricing table, the model ids of the embedded price snapshot, the literal
//! (glob-free) names in `upstreams[].models`, and `other`. A caller can put any
//! string in `model`; none of them can grow the label set.
//!
//! A model is looked up in the configured table first (exact names, then
//! globs in the order written), then in the snapshot (exact names, then its
//! globs in its order): an entry in `pricing.models` overrides the snapshot.

use std::{
    collections::{HashMap, hash_map::Entry},
    sync::Arc,
};

use glob::{MatchOptions, Pattern};

use crate::{
    config::{ModelPrice, OTHER_MODEL, PricingConfig, UpstreamConfig},
    pricing::{PicoUsd, Rates, Snapshot, SnapshotModel, Tariff},
    usage::Usage,
};

/// A bounded model label and the price it is billed at, if known. Cheap to clone.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelLabel {
    name: Arc<str>,
    price: Option<ModelPrice>,
    rates: Option<Rates>,
    /// Every rate: `rates`, and the snapshot's long-context tiers and audio prices.
    tariff: Option<Arc<Tariff>>,
    /// Of a label with no price: what its tokens spend against USD budgets
    /// (`pricing.unpriced`, else the dearest rates the table knows).
    unpriced: Option<Arc<Tariff>>,
}

impl ModelLabel {
    fn new(name: &str, price: Option<ModelPrice>) -> Self {
        // A price `Config::validate` accepted always has rates.
        let rates = price.as_ref().and_then(Rates::of);
        Self {
            name: name.into(),
            rates,
            tariff: rates.map(|rates| Arc::new(Tariff::flat(rates))),
            price,
            unpriced: None,
        }
    }

    /// A snapshot model's label: its tiers and audio prices too.
    fn of_snapshot(model: &SnapshotModel) -> Self {
        let mut label = Self::new(&model.id, Some(model.price()));
        if let Some(tariff) = model.tariff() {
            label.tariff = Some(Arc::new(tariff));
        }
        label
    }

    pub fn as_str(&self) -> &str {
        &self.name
    }

    #[cfg(test)]
    pub(crate) fn for_tests(name: &str) -> Self {
        Self::new(name, None)
    }

    /// The name as a metric label: shared, so a per-request lookup allocates nothing.
    pub(crate) fn shared_name(&self) -> Arc<str> {
        self.name.clone()
    }

    pub fn price(&self) -> Option<ModelPrice> {
        self.price
    }

    pub fn rates(&self) -> Option<Rates> {
        self.rates
    }

    /// What `usage` costs at this label's price, exactly (its long-context
    /// tier and audio rates included); `None` when the model has no price.
    pub fn cost(&self, usage: &Usage) -> Option<PicoUsd> {
        Some(self.tariff.as_ref()?.cost(usage))
    }

    /// What `usage` spends against USD budgets: its [`cost`](Self::cost), or
    /// for a model with no price, its tokens at the unpriced rate (never free:
    /// a budget no unpriced model can pass is a budget).
    pub fn budget_cost(&self, usage: &Usage) -> Option<PicoUsd> {
        self.cost(usage)
            .or_else(|| Some(self.unpriced.as_ref()?.cost(usage)))
    }
}

/// Labels by lower-cased name; foldhash, not SipHash: every answer looks
/// its model up.
type Names = HashMap<String, ModelLabel, foldhash::fast::RandomState>;

/// One source of prices: exact names and globs.
#[derive(Debug, Default)]
struct Layer {
    /// Lower-cased exact names.
    exact: Names,
    /// Globs, in the order written.
    globs: Vec<(Pattern, ModelLabel)>,
}

impl Layer {
    fn find(&self, model: &str, lower: &str) -> Option<&ModelLabel> {
        self.exact.get(lower).or_else(|| {
            self.globs
                .iter()
                .find(|(pattern, _)| pattern.matches_with(model, CASE_INSENSITIVE))
                .map(|(_, label)| label)
        })
    }

    fn add(&mut self, name: &str, label: &ModelLabel) {
        if is_glob(name) {
            // Validated by `Config::validate` (and the snapshot's test); a bad pattern is skipped.
            if let Ok(pattern) = Pattern::new(name) {
                self.globs.push((pattern, label.clone()));
            }
        } else if let Entry::Vacant(slot) = self.exact.entry(name.to_lowercase()) {
            slot.insert(label.clone());
        }
    }
}

/// What an unpriced model's tokens spend against budgets: `pricing.unpriced`,
/// else the dearest input and output rates among `labels` (zero when none has
/// a price: then there is nothing to be dear by, and budgets count the
/// priced models only).
fn unpriced_tariff(pricing: &PricingConfig, labels: &[ModelLabel]) -> Tariff {
    if let Some(rates) = pricing.unpriced.as_ref().and_then(Rates::of) {
        return Tariff::flat(rates);
    }
    let dearest = |rate: fn(&Rates) -> u64| {
        labels
            .iter()
            .filter_map(|label| label.rates.as_ref().map(rate))
            .max()
            .unwrap_or(0)
    };
    let input = dearest(|rates| rates.input);
    Tariff::flat(Rates {
        input,
        cached_input: input,
        cache_write: input,
        output: dearest(|rates| rates.output),
    })
}

/// The longest `model` a price or a route could name; a longer one is `other`.
pub const LONGEST_MODEL_NAME: usize = 256;

#[derive(Debug)]
pub struct ModelTable {
    /// The configured prices, then the snapshot.
    layers: [Layer; 2],
    /// Literal route names no price names exactly (lower-cased).
    routes: Names,
    other: ModelLabel,
    /// Every label, configured first, `other` last.
    all: Vec<ModelLabel>,
}

const CASE_INSENSITIVE: MatchOptions = MatchOptions {
    case_sensitive: false,
    require_literal_separator: false,
    require_literal_leading_dot: false,
};

fn is_glob(name: &str) -> bool {
    name.contains(['*', '?', '['])
}

impl ModelTable {
    pub fn new(
        pricing: &PricingConfig,
        snapshot: Option<&Snapshot>,
        upstreams: &[UpstreamConfig],
    ) -> Self {
        let mut all = Vec::new();
        let mut configured = Layer::default();
        for (name, price) in &pricing.models.0 {
            let label = ModelLabel::new(name, Some(*price));
            configured.add(name, &label);
            all.push(label);
        }
        let mut snapshotted = Layer::default();
        let mut ids = std::collections::HashSet::new();
        for model in snapshot.map_or(&[][..], |s| &s.models) {
            let id = model.id.to_lowercase();
            if configured.exact.contains_key(&id) || !ids.insert(id) {
                continue;
            }
            let label = ModelLabel::of_snapshot(model);
            for name in &model.names {
                snapshotted.add(name, &label);
            }
            // The id names its own label, even where no match rule spells it out.
            snapshotted.add(&model.id, &label);
            all.push(label);
        }
        let mut table = Self {
            layers: [configured, snapshotted],
            routes: Names::default(),
            other: ModelLabel::new(OTHER_MODEL, None),
            all,
        };
        // A literal route name no price names exactly is a label of its own,
        // priced by the pattern that covers it, if any.
        let literals: Vec<&str> = upstreams
            .iter()
            .flat_map(|upstream| upstream.models.iter())
            .map(String::as_str)
            .filter(|name| !is_glob(name) && !name.eq_ignore_ascii_case(OTHER_MODEL))
            .collect();
        for name in literals {
            let lower = name.to_lowercase();
            if table.routes.contains_key(&lower)
                || table
                    .layers
                    .iter()
                    .any(|layer| layer.exact.contains_key(&lower))
            {
                continue;
            }
            let covering = table.find(name, &lower);
            let mut label = ModelLabel::new(name, covering.and_then(ModelLabel::price));
            if let Some(covering) = covering {
                label.tariff = covering.tariff.clone();
            }
            table.routes.insert(lower, label.clone());
            table.all.push(label);
        }
        // Every label without a price spends the unpriced rate against budgets.
        let unpriced = Arc::new(unpriced_tariff(pricing, &table.all));
        table.other.unpriced = Some(unpriced.clone());
        for label in table.routes.values_mut().chain(table.all.iter_mut()) {
            if label.tariff.is_none() {
                label.unpriced = Some(unpriced.clone());
            }
        }
        table.all.push(table.other.clone());
        table
    }

    fn find(&self, model: &str, lower: &str) -> Option<&ModelLabel> {
        self.layers
            .iter()
            .find_map(|layer| layer.find(model, lower))
    }

    /// The label for a request's `model`: a configured exact name, a literal
    /// route name, a configured glob, then the snapshot, else `other`.
    pub fn label(&self, model: &str) -> ModelLabel {
        // No price or route names a model this long: `other`, without
        // folding and matching megabytes of a caller's text against every glob.
        if model.len() > LONGEST_MODEL_NAME {
            return self.other.clone();
        }
        let lower = model.to_lowercase();
        self.layers[0]
            .exact
            .get(&lower)
            .or_else(|| self.routes.get(&lower))
            .or_else(|| self.find(model, &lower))
            .unwrap_or(&self.other)
            .clone()
    }

    /// The label named `name` exactly (as `/stats` shows it), if this table has it.
    pub fn named(&self, name: &str) -> Option<&ModelLabel> {
        self.all.iter().find(|label| label.as_str() == name)
    }

    pub fn all(&self) -> &[ModelLabel] {
        &self.all
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, PriceTable};

    fn price(input: f64, output: f64) -> ModelPrice {
        ModelPrice {
            input,
            output,
            cached_input: None,
            cache_write: None,
        }
    }

    fn table(routes: &[&str]) -> ModelTable {
        let mut config = Config::for_tests("http://127.0.0.1:1/v1");
        config.upstreams[0].models = routes.iter().map(|r| (*r).to_owned()).collect();
        let pricing = PricingConfig {
            as_of: None,
            snapshot: false,
            models: PriceTable(vec![
                ("gpt-4o-mini".into(), price(0.15, 0.6)),
                ("gpt-4o-mini-*".into(), price(0.15, 0.6)),
                ("gpt-4o*".into(), price(2.5, 10.0)),
                ("claude-*".into(), price(3.0, 15.0)),
            ]),
            unpriced: None,
        };
        ModelTable::new(&pricing, None, &config.upstreams)
    }

    /// B3: a model no price names spends against budgets at the dearest
    /// rates the table knows (or `pricing.unpriced`), never for free; its
    /// cost stays unknown where the books report it.
    #[test]
    fn an_unpriced_model_spends_the_dearest_rate_against_budgets() {
        let table = table(&["my-finetune", "gpt-*"]);
        let usage = Usage {
            prompt_tokens: 1_000_000,
            completion_tokens: 1_000_000,
            ..Usage::default()
        };
        for model in ["my-finetune", "gpt-anything-a-caller-invents"] {
            let label = table.label(model);
            assert_eq!(label.cost(&usage), None, "{model}: its cost is unknown");
            assert_eq!(
                label.budget_cost(&usage),
                Some(PicoUsd(18 * 1_000_000_000_000)),
                "{model}: claude-*'s input and output, the dearest"
            );
        }
        let priced = table.label("gpt-4o-mini");
        assert_eq!(priced.budget_cost(&usage), priced.cost(&usage));
        let mut config = Config::for_tests("http://127.0.0.1:1/v1");
        config.upstreams[0].models = vec!["my-finetune".into()];
        let pricing = PricingConfig {
            unpriced: Some(price(1.0, 2.0)),
            ..PricingConfig::default()
        };
        let configured = ModelTable::new(&pricing, None, &config.upstreams);
        assert_eq!(
            configured.label("my-finetune").budget_cost(&usage),
            Some(PicoUsd(3 * 1_000_000_000_000))
        );
    }

    #[test]
    fn labels_come_from_the_table_and_the_literal_routes_only() {
        let table = table(&["claude-custom", "my-finetune", "gpt-*"]);
        let label = |model: &str| table.label(model).as_str().to_owned();
        assert_eq!(label("gpt-4o-mini"), "gpt-4o-mini", "exact wins over globs");
        assert_eq!(
            label("GPT-4o-Mini"),
            "gpt-4o-mini",
            "case does not split labels"
        );
        assert_eq!(label("gpt-4o-mini-2024-07-18"), "gpt-4o-mini-*");
        assert_eq!(label("gpt-4o-2024-08-06"), "gpt-4o*");
        assert_eq!(label("my-finetune"), "my-finetune", "literal route name");
        assert_eq!(label("gpt-anything-a-caller-invents"), "other");
        assert_eq!(label("sk-live-secret-as-a-model"), "other");
        assert_eq!(
            label(&"gpt-4o".repeat(1 << 20)),
            "other",
            "too long to be a name"
        );
        assert_eq!(label("claude-custom"), "claude-custom");
        // A literal route name is priced by the glob that covers it.
        assert_eq!(table.label("claude-custom").price(), Some(price(3.0, 15.0)));
        assert_eq!(table.label("my-finetune").price(), None);
        let all: Vec<&str> = table.all().iter().map(ModelLabel::as_str).collect();
        assert_eq!(
            all,
            [
                "gpt-4o-mini",
                "gpt-4o-mini-*",
                "gpt-4o*",
                "claude-*",
                "claude-custom",
                "my-finetune",
                "other"
            ]
        );
    }

    #[test]
    fn the_snapshot_prices_what_the_config_does_not_and_the_config_overrides_it() {
        let snapshot = crate::pricing::snapshot();
        let mut config = Config::for_tests("http://127.0.0.1:1/v1");
        config.pricing.models = PriceTable(vec![("gpt-4o".into(), price(1.0, 2.0))]);
        let table = ModelTable::new(&config.pricing, Some(snapshot), &config.upstreams);
        let gpt_4o = table.label("gpt-4o");
        assert_eq!(gpt_4o.price(), Some(price(1.0, 2.0)), "the config wins");
        assert_eq!(
            table
                .all()
                .iter()
                .filter(|l| l.as_str() == "gpt-4o")
                .count(),
            1,
            "one label per name"
        );
        let mini = table.label("gpt-4o-mini");
        assert_eq!(mini.as_str(), "gpt-4o-mini");
        assert_eq!(mini.price().unwrap().input, 0.15);
        assert_eq!(mini.price().unwrap().cached_input, Some(0.075));
        let claude = table.label("claude-sonnet-4-5-20250929");
        assert_eq!(claude.as_str(), "claude-sonnet-4-5");
        assert_eq!(claude.price().unwrap().cache_write, Some(3.75));
        assert_eq!(table.label("no-such-model-anywhere").as_str(), "other");
    }

    #[test]
    fn cost_is_each_kind_times_its_price() {
        let table = table(&["*"]);
        let usage = Usage {
            prompt_tokens: 1_000,
            completion_tokens: 2_000,
            ..Usage::default()
        };
        let cost = table.label("gpt-4o").cost(&usage).unwrap();
        // (1000 x 2.5 + 2000 x 10) / 1e6 dollars = 22500000000 picodollars.
        assert_eq!(cost, PicoUsd(22_500_000_000));
        assert_eq!(table.label("unknown").cost(&usage), None);
    }
}
