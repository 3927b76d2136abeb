//! `[providers]`: the provider chain, its adapters, retries and prices.

use super::{
    ConfigError, HostUrl, HttpUrl, ProviderKind, ProviderList, ProviderRef, Secret, invalid,
};
use crate::{providers::catalogue::ModelEntries, providers::pricing::PricingTable};

/// The provider chain, its adapters, retries and prices.
#[derive(Debug, Clone, clap::Args)]
pub struct ProviderSettings {
    /// The provider chain, name:model in order of preference, e.g.
    /// openai:gpt-4o-mini,anthropic:claude-sonnet-4-6 [default: openai:{model}].
    #[arg(id = "providers.chain", long = "providers")]
    pub chain: Option<ProviderList>,
    /// Model used when the chain is not set.
    #[arg(id = "providers.model", long = "model", default_value = "gpt-4o-mini")]
    pub model: String,
    /// Base URL of the OpenAI-compatible API.
    #[arg(
        id = "providers.openai_base_url",
        long = "openai-base-url",
        env = "OPENAI_BASE_URL",
        hide_env_values = true,
        default_value = "https://api.openai.com/v1"
    )]
    pub openai_base_url: HttpUrl,
    /// API key sent as a bearer token [default: none sent].
    #[arg(
        id = "providers.openai_api_key",
        long = "openai-api-key",
        env = "OPENAI_API_KEY",
        hide_env_values = true
    )]
    pub openai_api_key: Option<Secret>,
    /// Anthropic base URL.
    #[arg(
        id = "providers.anthropic_base_url",
        long = "anthropic-base-url",
        env = "ANTHROPIC_BASE_URL",
        hide_env_values = true,
        default_value = "https://api.anthropic.com"
    )]
    pub anthropic_base_url: HttpUrl,
    /// Anthropic API key.
    #[arg(
        id = "providers.anthropic_api_key",
        long = "anthropic-api-key",
        env = "ANTHROPIC_API_KEY",
        hide_env_values = true
    )]
    pub anthropic_api_key: Option<Secret>,
    /// max_tokens of Anthropic answers.
    #[arg(
        id = "providers.anthropic_max_tokens",
        long = "anthropic-max-tokens",
        default_value_t = 4096,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub anthropic_max_tokens: u32,
    /// Ollama server.
    #[arg(
        id = "providers.ollama_host",
        long = "ollama-host",
        env = "OLLAMA_HOST",
        hide_env_values = true,
        default_value = "http://127.0.0.1:11434"
    )]
    pub ollama_host: HostUrl,
    /// Tries per provider before falling over to the next.
    #[arg(
        id = "providers.max_attempts",
        long = "provider-max-attempts",
        default_value_t = 3,
        value_parser = clap::value_parser!(u32).range(1..=10)
    )]
    pub max_attempts: u32,
    /// First retry delay in ms, doubled each time.
    #[arg(
        id = "providers.retry_base_ms",
        long = "provider-retry-base-ms",
        default_value_t = 200
    )]
    pub retry_base_ms: u64,
    /// Longest retry delay in ms.
    #[arg(
        id = "providers.retry_max_ms",
        long = "provider-retry-max-ms",
        default_value_t = 5000
    )]
    pub retry_max_ms: u64,
    /// Longest a provider stream may stay silent, in seconds.
    #[arg(
        id = "providers.idle_timeout_s",
        long = "provider-idle-timeout-s",
        default_value_t = 60,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub idle_timeout_s: u64,
    /// Longest time to connect to a provider, in seconds.
    #[arg(
        id = "providers.connect_timeout_s",
        long = "provider-connect-timeout-s",
        default_value_t = 10,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub connect_timeout_s: u64,
    /// Largest provider response accepted, in bytes.
    #[arg(id = "providers.max_response_bytes", long = "provider-max-response-bytes", default_value_t = 8 * 1024 * 1024, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1024..))]
    pub max_response_bytes: usize,
    /// USD per million tokens by model, as JSON
    /// ({"gpt-4o-mini": {"input": 0.15, "output": 0.6}}); a table in the file.
    #[arg(
        id = "providers.pricing",
        long = "pricing",
        default_value = "{}",
        hide_default_value = true
    )]
    pub pricing: PricingTable,
    /// Models beyond the built-in ones, or fields of built-in ones to
    /// change, as JSON ({"llama3.2": {"context_window": 8192, "max_output":
    /// 2048, "input": 0, "output": 0, "inputs": ["text", "image"]}}); a
    /// table in the file. `inputs` says what the model reads: `text`,
    /// `image`, `pdf`.
    #[arg(
        id = "providers.models",
        long = "models",
        default_value = "{}",
        hide_default_value = true
    )]
    pub models: ModelEntries,
}

impl ProviderSettings {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.model.trim().is_empty() {
            return Err(invalid("HARNESS_MODEL", "must not be empty"));
        }
        if self.ollama_host.as_str().is_empty() {
            return Err(invalid("OLLAMA_HOST", "must not be empty"));
        }
        if self.retry_max_ms < self.retry_base_ms {
            return Err(invalid(
                "HARNESS_PROVIDER_RETRY_MAX_MS",
                "must not be less than HARNESS_PROVIDER_RETRY_BASE_MS",
            ));
        }
        self.pricing
            .validate()
            .map_err(|reason| invalid("HARNESS_PRICING", reason))?;
        self.models
            .validate()
            .map_err(|reason| invalid("HARNESS_MODELS", reason))?;
        Ok(())
    }

    /// The chain: the setting, else the OpenAI adapter with `model`.
    pub fn chain(&self) -> Vec<ProviderRef> {
        match &self.chain {
            Some(list) => list.0.clone(),
            None => vec![ProviderRef {
                kind: ProviderKind::OpenAi,
                model: self.model.trim().to_owned(),
            }],
        }
    }
}
