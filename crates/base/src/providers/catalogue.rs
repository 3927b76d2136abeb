//! What the service knows of each model: its context window, its longest
//! answer and its prices. Common OpenAI, Anthropic and Ollama models are
//! built in; `HARNESS_MODELS` (or `[providers.models]`) adds models and
//! overrides fields of the built-in ones, and `HARNESS_PRICING` overrides
//! prices. A model takes the entry that is its name, else the longest
//! entry its name starts with (`gpt-4o-mini-2024-07-18` → `gpt-4o-mini`,
//! `llama3.2:3b` → `llama3.2`). A model with no entry falls back to
//! `HARNESS_CONTEXT_WINDOW_TOKENS`, the provider's own answer limit, no
//! price, and text alone as its input.
//!
//! What a model reads besides text is its entry's `inputs` (`["text",
//! "image", "pdf"]`; `input` is its input price): the built-in entries
//! give it for the families known to read images (GPT-4o, 4.1 and 5, the
//! o-series but `o3-mini`, GPT-4 Turbo, Claude 3 and later, Ollama's
//! vision models) and PDFs (those of OpenAI and Anthropic among them).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{
    Usage,
    pricing::{ModelPrice, PricingTable},
};

/// One model's entry: every field optional (an override names only what it
/// changes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelEntry {
    /// Tokens the model reads at once (prompt and answer).
    pub context_window: Option<u64>,
    /// Tokens it writes at most in one answer.
    pub max_output: Option<u32>,
    /// USD per million tokens.
    pub input: Option<f64>,
    pub output: Option<f64>,
    pub cache_read: Option<f64>,
    pub cache_write: Option<f64>,
    /// What it reads besides text.
    pub inputs: Option<Inputs>,
}

/// What a model reads besides text; said as the list of what it reads
/// (`["text", "image", "pdf"]`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Inputs {
    pub image: bool,
    pub pdf: bool,
}

impl Inputs {
    /// Images and PDFs.
    pub const ALL: Self = Self {
        image: true,
        pdf: true,
    };
    /// Images, no PDFs.
    pub const IMAGES: Self = Self {
        image: true,
        pdf: false,
    };
}

impl Serialize for Inputs {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut names = vec!["text"];
        names.extend(self.image.then_some("image"));
        names.extend(self.pdf.then_some("pdf"));
        names.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Inputs {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let names = Vec::<String>::deserialize(deserializer)?;
        let mut inputs = Self::default();
        for name in &names {
            match name.as_str() {
                "text" => {}
                "image" => inputs.image = true,
                "pdf" => inputs.pdf = true,
                other => {
                    return Err(serde::de::Error::custom(format!(
                        "`{other}` is not an input: `text`, `image` or `pdf`"
                    )));
                }
            }
        }
        if !names.iter().any(|n| n == "text") {
            return Err(serde::de::Error::custom("a model's inputs include `text`"));
        }
        Ok(inputs)
    }
}

impl ModelEntry {
    /// `self` with every field `over` names replaced.
    fn overridden_by(self, over: &Self) -> Self {
        Self {
            context_window: over.context_window.or(self.context_window),
            max_output: over.max_output.or(self.max_output),
            input: over.input.or(self.input),
            output: over.output.or(self.output),
            cache_read: over.cache_read.or(self.cache_read),
            cache_write: over.cache_write.or(self.cache_write),
            inputs: over.inputs.or(self.inputs),
        }
    }

    fn price(&self) -> Option<ModelPrice> {
        Some(ModelPrice {
            input: self.input?,
            output: self.output?,
            cache_read: self.cache_read,
            cache_write: self.cache_write,
        })
    }
}

/// Entries by model name, as the settings give them
/// (`{"llama3.2": {"context_window": 8192}}`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ModelEntries(pub BTreeMap<String, ModelEntry>);

impl std::str::FromStr for ModelEntries {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        serde_json::from_str(s).map_err(|e| format!("expected a JSON object of model entries: {e}"))
    }
}

impl ModelEntries {
    pub fn validate(&self) -> Result<(), String> {
        for (model, entry) in &self.0 {
            if entry.context_window == Some(0) || entry.max_output == Some(0) {
                return Err(format!(
                    "{model:?}: context_window and max_output must be positive"
                ));
            }
            let prices = [
                entry.input,
                entry.output,
                entry.cache_read,
                entry.cache_write,
            ];
            if prices
                .into_iter()
                .flatten()
                .any(|p| !p.is_finite() || p < 0.0)
            {
                return Err(format!("{model:?}: prices must be finite and not negative"));
            }
            if entry.input.is_some() != entry.output.is_some() {
                return Err(format!(
                    "{model:?}: give both an input and an output price, or neither"
                ));
            }
        }
        Ok(())
    }
}

/// (name, context window, max output, input, output, cache read, cache
/// write): list prices in USD per million tokens.
type Builtin = (
    &'static str,
    u64,
    Option<u32>,
    f64,
    f64,
    Option<f64>,
    Option<f64>,
);

/// The built-in models. Ollama's entries are the models' own windows: an
/// Ollama server runs a smaller `num_ctx` unless told otherwise, so set
/// `context_window` to the server's value there.
#[rustfmt::skip]
const BUILTIN: &[Builtin] = &[
    // OpenAI.
    ("gpt-3.5-turbo",      16_385,     Some(4_096),    0.5,   1.5,   None,         None),
    ("gpt-4",              8_192,      Some(8_192),    30.0,  60.0,  None,         None),
    ("gpt-4-turbo",        128_000,    Some(4_096),    10.0,  30.0,  None,         None),
    ("gpt-4o",             128_000,    Some(16_384),   2.5,   10.0,  Some(1.25),   None),
    ("gpt-4o-mini",        128_000,    Some(16_384),   0.15,  0.6,   Some(0.075),  None),
    ("gpt-4.1",            1_047_576,  Some(32_768),   2.0,   8.0,   Some(0.5),    None),
    ("gpt-4.1-mini",       1_047_576,  Some(32_768),   0.4,   1.6,   Some(0.1),    None),
    ("gpt-4.1-nano",       1_047_576,  Some(32_768),   0.1,   0.4,   Some(0.025),  None),
    ("gpt-5",              400_000,    Some(128_000),  1.25,  10.0,  Some(0.125),  None),
    ("gpt-5-mini",         400_000,    Some(128_000),  0.25,  2.0,   Some(0.025),  None),
    ("gpt-5-nano",         400_000,    Some(128_000),  0.05,  0.4,   Some(0.005),  None),
    ("o1",                 200_000,    Some(100_000),  15.0,  60.0,  Some(7.5),    None),
    ("o3",                 200_000,    Some(100_000),  2.0,   8.0,   Some(0.5),    None),
    ("o3-mini",            200_000,    Some(100_000),  1.1,   4.4,   Some(0.55),   None),
    ("o4-mini",            200_000,    Some(100_000),  1.1,   4.4,   Some(0.275),  None),
    // Anthropic.
    ("claude-3-5-haiku",   200_000,    Some(8_192),    0.8,   4.0,   Some(0.08),   Some(1.0)),
    ("claude-3-5-sonnet",  200_000,    Some(8_192),    3.0,   15.0,  Some(0.3),    Some(3.75)),
    ("claude-3-7-sonnet",  200_000,    Some(64_000),   3.0,   15.0,  Some(0.3),    Some(3.75)),
    ("claude-haiku-4-5",   200_000,    Some(64_000),   1.0,   5.0,   Some(0.1),    Some(1.25)),
    ("claude-sonnet-4",    200_000,    Some(64_000),   3.0,   15.0,  Some(0.3),    Some(3.75)),
    ("claude-opus-4",      200_000,    Some(32_000),   15.0,  75.0,  Some(1.5),    Some(18.75)),
    ("claude-opus-4-5",    200_000,    Some(64_000),   5.0,   25.0,  Some(0.5),    Some(6.25)),
    // Ollama (local: no price).
    ("llama3",             8_192,      None,           0.0,   0.0,   None,         None),
    ("llama3.1",           131_072,    None,           0.0,   0.0,   None,         None),
    ("llama3.2",           131_072,    None,           0.0,   0.0,   None,         None),
    ("llama3.3",           131_072,    None,           0.0,   0.0,   None,         None),
    ("gemma2",             8_192,      None,           0.0,   0.0,   None,         None),
    ("gemma3",             131_072,    None,           0.0,   0.0,   None,         None),
    ("qwen2.5",            32_768,     None,           0.0,   0.0,   None,         None),
    ("qwen3",              40_960,     None,           0.0,   0.0,   None,         None),
    ("mistral",            32_768,     None,           0.0,   0.0,   None,         None),
    ("phi3",               4_096,      None,           0.0,   0.0,   None,         None),
    ("deepseek-r1",        131_072,    None,           0.0,   0.0,   None,         None),
];

/// The built-in models that read more than text (a model takes the entry
/// its name starts with, the longest, as for [`BUILTIN`]).
#[rustfmt::skip]
const READS: &[(&str, Inputs)] = &[
    ("gpt-4-turbo",        Inputs::IMAGES),
    ("gpt-4o",             Inputs::ALL),
    ("gpt-4.1",            Inputs::ALL),
    ("gpt-5",              Inputs::ALL),
    ("o1",                 Inputs::ALL),
    ("o3",                 Inputs::ALL),
    ("o3-mini",            Inputs::default_const()),
    ("o4-mini",            Inputs::ALL),
    ("claude-3",           Inputs::ALL),
    ("claude-haiku-4",     Inputs::ALL),
    ("claude-sonnet-4",    Inputs::ALL),
    ("claude-opus-4",      Inputs::ALL),
    ("gemma3",             Inputs::IMAGES),
    ("llama3.2-vision",    Inputs::IMAGES),
    ("llama4",             Inputs::IMAGES),
    ("llava",              Inputs::IMAGES),
    ("qwen2.5vl",          Inputs::IMAGES),
    ("minicpm-v",          Inputs::IMAGES),
    // The demo provider's models (`demo:echo`, `demo:slow`).
    ("echo",               Inputs::ALL),
    ("slow",               Inputs::ALL),
];

impl Inputs {
    /// Text alone.
    const fn default_const() -> Self {
        Self {
            image: false,
            pdf: false,
        }
    }
}

/// The catalogue: the built-in entries with the settings' over them.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelCatalogue {
    entries: BTreeMap<String, ModelEntry>,
    /// The window of a model without one.
    default_window: u64,
}

impl ModelCatalogue {
    /// The built-in entries, `models` over them, then `pricing`'s prices
    /// over those; `default_window` for a model without a window.
    pub fn new(models: &ModelEntries, pricing: &PricingTable, default_window: u64) -> Self {
        let mut entries: BTreeMap<String, ModelEntry> = BUILTIN
            .iter()
            .map(
                |&(name, window, max_output, input, output, cache_read, cache_write)| {
                    let entry = ModelEntry {
                        context_window: Some(window),
                        max_output,
                        input: Some(input),
                        output: Some(output),
                        cache_read,
                        cache_write,
                        inputs: None,
                    };
                    (name.to_owned(), entry)
                },
            )
            .collect();
        for &(name, inputs) in READS {
            entries.entry(name.to_owned()).or_default().inputs = Some(inputs);
        }
        for (name, over) in &models.0 {
            let entry = entries.entry(name.clone()).or_default();
            *entry = entry.overridden_by(over);
        }
        for (name, price) in &pricing.0 {
            let entry = entries.entry(name.clone()).or_default();
            *entry = entry.overridden_by(&ModelEntry {
                input: Some(price.input),
                output: Some(price.output),
                cache_read: price.cache_read,
                cache_write: price.cache_write,
                ..ModelEntry::default()
            });
        }
        Self {
            entries,
            default_window,
        }
    }

    /// The entry `model` takes (see the module's rule).
    fn entry(&self, model: &str) -> Option<&ModelEntry> {
        self.entries.get(model).or_else(|| {
            self.entries
                .iter()
                .filter(|(name, _)| model.starts_with(name.as_str()))
                .max_by_key(|(name, _)| name.len())
                .map(|(_, entry)| entry)
        })
    }

    /// Tokens `model` reads at once.
    pub fn context_window(&self, model: &str) -> u64 {
        self.entry(model)
            .and_then(|e| e.context_window)
            .unwrap_or(self.default_window)
    }

    /// The longest answer `model` writes; `None`: the provider's default.
    pub fn max_output(&self, model: &str) -> Option<u32> {
        self.entry(model).and_then(|e| e.max_output)
    }

    /// What `model` reads besides text: the `inputs` of the longest entry
    /// its name starts with that says them (a price-only entry of a newer
    /// model keeps its family's), else text alone.
    pub fn inputs(&self, model: &str) -> Inputs {
        self.entries
            .iter()
            .filter(|(name, entry)| model.starts_with(name.as_str()) && entry.inputs.is_some())
            .max_by_key(|(name, _)| name.len())
            .and_then(|(_, entry)| entry.inputs)
            .unwrap_or_default()
    }

    /// The cost of `usage` on `model`; `None` when it has no price.
    pub fn cost(&self, model: &str, usage: &Usage) -> Option<f64> {
        Some(self.entry(model)?.price()?.cost(usage))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(input: u64, output: u64) -> Usage {
        Usage {
            input_tokens: input,
            output_tokens: output,
            ..Usage::default()
        }
    }

    #[test]
    fn built_in_models_are_known_by_name_and_prefix() {
        let catalogue =
            ModelCatalogue::new(&ModelEntries::default(), &PricingTable::default(), 128_000);
        assert_eq!(catalogue.context_window("gpt-4"), 8_192);
        assert_eq!(catalogue.context_window("gpt-4o-mini-2024-07-18"), 128_000);
        assert_eq!(catalogue.max_output("gpt-4o-mini-2024-07-18"), Some(16_384));
        assert_eq!(catalogue.context_window("llama3:8b"), 8_192);
        assert_eq!(catalogue.context_window("llama3.2:3b"), 131_072);
        assert_eq!(catalogue.max_output("claude-sonnet-4-6"), Some(64_000));
        // One million tokens in and out of gpt-4o-mini: 0.15 + 0.60.
        let cost = catalogue.cost("gpt-4o-mini", &usage(1_000_000, 1_000_000));
        assert!((cost.unwrap() - 0.75).abs() < 1e-9, "{cost:?}");
        assert_eq!(catalogue.cost("llama3.2", &usage(10, 10)), Some(0.0));
        // Unknown: the setting's window, no limit, no price.
        assert_eq!(catalogue.context_window("my-finetune"), 128_000);
        assert_eq!(catalogue.max_output("my-finetune"), None);
        assert_eq!(catalogue.cost("my-finetune", &usage(10, 10)), None);
    }

    #[test]
    fn what_a_model_reads_besides_text() {
        let catalogue =
            ModelCatalogue::new(&ModelEntries::default(), &PricingTable::default(), 128_000);
        for model in [
            "gpt-4o-mini-2024-07-18",
            "gpt-5",
            "o4-mini",
            "claude-sonnet-4-5",
        ] {
            assert_eq!(catalogue.inputs(model), Inputs::ALL, "{model}");
        }
        assert_eq!(catalogue.inputs("claude-3-5-haiku-latest"), Inputs::ALL);
        for model in ["llama3.2-vision:11b", "gemma3:4b", "llava:7b"] {
            assert_eq!(catalogue.inputs(model), Inputs::IMAGES, "{model}");
        }
        for model in [
            "gpt-3.5-turbo",
            "gpt-4",
            "o3-mini",
            "llama3.2:3b",
            "my-finetune",
        ] {
            assert_eq!(catalogue.inputs(model), Inputs::default(), "{model}");
        }
        // Settings say it for a model of their own, or take it away.
        let models: ModelEntries = r#"{
            "my-vision": {"inputs": ["text", "image"]},
            "gpt-4o": {"inputs": ["text"]}
        }"#
        .parse()
        .unwrap();
        let catalogue = ModelCatalogue::new(&models, &PricingTable::default(), 128_000);
        assert_eq!(catalogue.inputs("my-vision-2"), Inputs::IMAGES);
        assert_eq!(catalogue.inputs("gpt-4o"), Inputs::default());
        // Its family's, through the name it starts with.
        assert_eq!(catalogue.inputs("gpt-4o-mini"), Inputs::default());
        assert_eq!(catalogue.inputs("gpt-4.1-mini"), Inputs::ALL);
        let entry: ModelEntry = serde_json::from_str(r#"{"inputs": ["text", "pdf"]}"#).unwrap();
        assert_eq!(
            serde_json::to_string(&entry.inputs).unwrap(),
            r#"["text","pdf"]"#
        );
        for wrong in [
            r#"{"inputs": ["image"]}"#,
            r#"{"inputs": ["text", "audio"]}"#,
        ] {
            assert!(
                serde_json::from_str::<ModelEntry>(wrong).is_err(),
                "{wrong}"
            );
        }
    }

    #[test]
    fn settings_add_models_and_override_fields() {
        let models: ModelEntries = r#"{
            "llama3.2": {"context_window": 8192},
            "my-finetune": {"context_window": 4096, "max_output": 512, "input": 1.0, "output": 2.0}
        }"#
        .parse()
        .unwrap();
        let pricing: PricingTable =
            r#"{"gpt-4o-mini": {"input": 1.0, "output": 1.0}}"#.parse().unwrap();
        let catalogue = ModelCatalogue::new(&models, &pricing, 128_000);
        assert_eq!(catalogue.context_window("llama3.2:3b"), 8_192);
        assert_eq!(
            catalogue.cost("llama3.2", &usage(10, 10)),
            Some(0.0),
            "the rest is kept"
        );
        assert_eq!(catalogue.max_output("my-finetune-v2"), Some(512));
        let cost = catalogue.cost("gpt-4o-mini", &usage(1_000_000, 1_000_000));
        assert!((cost.unwrap() - 2.0).abs() < 1e-9, "{cost:?}");
        assert_eq!(catalogue.context_window("gpt-4o-mini"), 128_000);
        assert!(
            "{\"x\": {\"context_window\": 0}}"
                .parse::<ModelEntries>()
                .unwrap()
                .validate()
                .is_err()
        );
        assert!(
            "{\"x\": {\"input\": 1.0}}"
                .parse::<ModelEntries>()
                .unwrap()
                .validate()
                .is_err()
        );
    }
}
