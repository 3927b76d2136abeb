//! Cost of tokens: a pricing table per model, in USD per million tokens.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Usage;

/// Prices of one model, USD per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelPrice {
    pub input: f64,
    pub output: f64,
    /// Cached prompt tokens read (default: the input price).
    #[serde(default)]
    pub cache_read: Option<f64>,
    /// Prompt tokens written to the cache (default: the input price).
    #[serde(default)]
    pub cache_write: Option<f64>,
}

/// Prices by model name. A model without its own entry takes the entry
/// that is the longest prefix of its name (`gpt-4o-mini-2024-07-18` →
/// `gpt-4o-mini`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PricingTable(pub BTreeMap<String, ModelPrice>);

/// A table written as JSON: `{"gpt-4o-mini": {"input": 0.15, "output": 0.6}}`.
impl std::str::FromStr for PricingTable {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        serde_json::from_str(s).map_err(|e| format!("expected a JSON object of model prices: {e}"))
    }
}

impl PricingTable {
    pub fn price(&self, model: &str) -> Option<&ModelPrice> {
        self.0.get(model).or_else(|| {
            self.0
                .iter()
                .filter(|(name, _)| model.starts_with(name.as_str()))
                .max_by_key(|(name, _)| name.len())
                .map(|(_, price)| price)
        })
    }

    /// The cost of `usage` on `model`; `None` when the model has no price.
    /// `input_tokens` counts every prompt token, cached ones included.
    pub fn cost(&self, model: &str, usage: &Usage) -> Option<f64> {
        let price = self.price(model)?;
        let cached = usage.cache_read_tokens + usage.cache_creation_tokens;
        let fresh = usage.input_tokens.saturating_sub(cached) as f64;
        let cost = fresh * price.input
            + usage.cache_read_tokens as f64 * price.cache_read.unwrap_or(price.input)
            + usage.cache_creation_tokens as f64 * price.cache_write.unwrap_or(price.input)
            + usage.output_tokens as f64 * price.output;
        Some(cost / 1_000_000.0)
    }

    pub fn validate(&self) -> Result<(), String> {
        for (model, price) in &self.0 {
            let all = [
                Some(price.input),
                Some(price.output),
                price.cache_read,
                price.cache_write,
            ];
            if all.into_iter().flatten().any(|p| !p.is_finite() || p < 0.0) {
                return Err(format!(
                    "prices of {model:?} must be finite and not negative"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> PricingTable {
        PricingTable(BTreeMap::from([
            (
                "gpt-4o-mini".to_owned(),
                ModelPrice {
                    input: 0.15,
                    output: 0.6,
                    cache_read: Some(0.075),
                    cache_write: None,
                },
            ),
            (
                "gpt-4o".to_owned(),
                ModelPrice {
                    input: 2.5,
                    output: 10.0,
                    cache_read: None,
                    cache_write: None,
                },
            ),
        ]))
    }

    #[test]
    fn costs_split_fresh_cached_and_output_tokens() {
        let usage = Usage {
            input_tokens: 1_000_000,
            output_tokens: 500_000,
            cache_read_tokens: 400_000,
            cache_creation_tokens: 0,
        };
        let cost = table().cost("gpt-4o-mini", &usage).unwrap();
        assert!(
            (cost - (0.6 * 0.15 + 0.4 * 0.075 + 0.5 * 0.6)).abs() < 1e-9,
            "{cost}"
        );
    }

    #[test]
    fn the_longest_prefix_prices_a_dated_model() {
        let usage = Usage {
            input_tokens: 1_000_000,
            ..Usage::default()
        };
        assert_eq!(table().cost("gpt-4o-mini-2024-07-18", &usage), Some(0.15));
        assert_eq!(table().cost("gpt-4o-2024-08-06", &usage), Some(2.5));
        assert_eq!(table().cost("claude-sonnet-4-6", &usage), None);
    }
}
