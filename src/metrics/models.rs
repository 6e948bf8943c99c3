//! Which `model` label a request's model gets, and what its tokens cost.
//!
//! The label set is fixed when the state is built: the keys of the pricing
//! table, the literal (glob-free) names in `upstreams[].models`, and `other`.
//! A caller can put any string in `model`; none of them can grow the label set.

use std::{
    collections::{HashMap, hash_map::Entry},
    sync::Arc,
};

use glob::{MatchOptions, Pattern};

use crate::{
    cache::Usage,
    config::{ModelPrice, OTHER_MODEL, PricingConfig, UpstreamConfig},
};

/// A bounded model label and the price it is billed at, if known. Cheap to clone.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelLabel {
    name: Arc<str>,
    price: Option<ModelPrice>,
}

impl ModelLabel {
    fn new(name: &str, price: Option<ModelPrice>) -> Self {
        Self {
            name: name.into(),
            price,
        }
    }

    pub fn as_str(&self) -> &str {
        &self.name
    }

    /// The name as a metric label: shared, so a per-request lookup allocates nothing.
    pub(crate) fn shared_name(&self) -> Arc<str> {
        self.name.clone()
    }

    pub fn price(&self) -> Option<ModelPrice> {
        self.price
    }

    /// USD for `usage` at this label's price; `None` when the model has no price.
    ///
    /// Token counts are integers well below 2^53, so each converts to f64
    /// exactly; the only rounding is in the two products, their sum and the
    /// division, which keeps repeated sums far inside 1e-9 of the exact value.
    pub fn cost_usd(&self, usage: Usage) -> Option<f64> {
        let price = self.price?;
        Some(
            (usage.prompt_tokens as f64 * price.input
                + usage.completion_tokens as f64 * price.output)
                / 1_000_000.0,
        )
    }
}

#[derive(Debug)]
pub struct ModelTable {
    /// Lower-cased exact names (priced ones and literal route names).
    exact: HashMap<String, ModelLabel>,
    /// Priced globs, in the order written.
    globs: Vec<(Pattern, ModelLabel)>,
    other: ModelLabel,
    /// Every label, table order first, `other` last (what `/stats` walks).
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
    pub fn new(pricing: &PricingConfig, upstreams: &[UpstreamConfig]) -> Self {
        let mut exact = HashMap::new();
        let mut globs = Vec::new();
        let mut all = Vec::new();
        for (name, price) in &pricing.models.0 {
            let label = ModelLabel::new(name, Some(*price));
            if is_glob(name) {
                // Validated by `Config::validate`; a bad pattern here is skipped.
                if let Ok(pattern) = Pattern::new(name) {
                    globs.push((pattern, label.clone()));
                    all.push(label);
                }
            } else if let Entry::Vacant(slot) = exact.entry(name.to_lowercase()) {
                slot.insert(label.clone());
                all.push(label);
            }
        }
        let mut table = Self {
            exact,
            globs,
            other: ModelLabel::new(OTHER_MODEL, None),
            all,
        };
        // Literal route names are labels too, priced by the glob that covers them, if any.
        let literals: Vec<&str> = upstreams
            .iter()
            .flat_map(|upstream| upstream.models.iter())
            .map(String::as_str)
            .filter(|name| !is_glob(name) && !name.eq_ignore_ascii_case(OTHER_MODEL))
            .collect();
        for name in literals {
            if table.exact.contains_key(&name.to_lowercase()) {
                continue;
            }
            let price = table.glob_match(name).and_then(ModelLabel::price);
            let label = ModelLabel::new(name, price);
            table.exact.insert(name.to_lowercase(), label.clone());
            table.all.push(label);
        }
        table.all.push(table.other.clone());
        table
    }

    fn glob_match(&self, model: &str) -> Option<&ModelLabel> {
        self.globs
            .iter()
            .find(|(pattern, _)| pattern.matches_with(model, CASE_INSENSITIVE))
            .map(|(_, label)| label)
    }

    /// The label for a request's `model`: an exact name, else the first glob
    /// that matches, else `other`.
    pub fn label(&self, model: &str) -> ModelLabel {
        if let Some(label) = self.exact.get(&model.to_lowercase()) {
            return label.clone();
        }
        self.glob_match(model).unwrap_or(&self.other).clone()
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
        }
    }

    fn table(routes: &[&str]) -> ModelTable {
        let mut config = Config::for_tests("http://127.0.0.1:1/v1");
        config.upstreams[0].models = routes.iter().map(|r| (*r).to_owned()).collect();
        let pricing = PricingConfig {
            as_of: None,
            models: PriceTable(vec![
                ("gpt-4o-mini".into(), price(0.15, 0.6)),
                ("gpt-4o-mini-*".into(), price(0.15, 0.6)),
                ("gpt-4o*".into(), price(2.5, 10.0)),
                ("claude-*".into(), price(3.0, 15.0)),
            ]),
        };
        ModelTable::new(&pricing, &config.upstreams)
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
        assert_eq!(label("claude-custom"), "claude-custom");
        assert_eq!(label("gpt-anything-a-caller-invents"), "other");
        assert_eq!(label("sk-live-secret-as-a-model"), "other");
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
    fn cost_is_tokens_times_price_per_million() {
        let table = table(&["*"]);
        let usage = Usage {
            prompt_tokens: 1_000,
            completion_tokens: 2_000,
        };
        let cost = table.label("gpt-4o").cost_usd(usage).unwrap();
        assert!((cost - (1_000.0 * 2.5 + 2_000.0 * 10.0) / 1e6).abs() < 1e-15);
        assert_eq!(table.label("unknown").cost_usd(usage), None);
        // Many small repeated costs stay exact to well under 1e-9.
        let one = table.label("gpt-4o-mini").cost_usd(usage).unwrap();
        let sum: f64 = (0..10_000).map(|_| one).sum();
        assert!((sum - 10_000.0 * one).abs() < 1e-9);
    }
}
