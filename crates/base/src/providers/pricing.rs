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

/// Prices by model name, as the settings give them; the model catalogue
/// (`super::catalogue`) puts them over its own and finds a model's entry.
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

impl ModelPrice {
    /// The cost of `usage` at these prices. `input_tokens` counts every
    /// prompt token, cached ones included.
    pub fn cost(&self, usage: &Usage) -> f64 {
        let cached = usage.cache_read_tokens + usage.cache_creation_tokens;
        let fresh = usage.input_tokens.saturating_sub(cached) as f64;
        let cost = fresh * self.input
            + usage.cache_read_tokens as f64 * self.cache_read.unwrap_or(self.input)
            + usage.cache_creation_tokens as f64 * self.cache_write.unwrap_or(self.input)
            + usage.output_tokens as f64 * self.output;
        cost / 1_000_000.0
    }
}

impl PricingTable {
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

    #[test]
    fn costs_split_fresh_cached_and_output_tokens() {
        let price = ModelPrice {
            input: 0.15,
            output: 0.6,
            cache_read: Some(0.075),
            cache_write: None,
        };
        let usage = Usage {
            input_tokens: 1_000_000,
            output_tokens: 500_000,
            cache_read_tokens: 400_000,
            cache_creation_tokens: 0,
            reasoning_tokens: 0,
        };
        let cost = price.cost(&usage);
        assert!(
            (cost - (0.6 * 0.15 + 0.4 * 0.075 + 0.5 * 0.6)).abs() < 1e-9,
            "{cost}"
        );
    }
}
