//! Typed settings: defaults, then an optional TOML file, then the environment.
//!
//! Every setting has one environment name (see [`ENV_SETTINGS`]) and one key
//! in the TOML file (the field name). Secrets are never printed: `Debug`
//! redacts them. [`Settings::validate`] runs at start and names the setting
//! that is wrong.

use std::{fmt, net::SocketAddr, path::Path, time::Duration};

use serde::Deserialize;

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// All settings of the service.
#[derive(Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Address the HTTP server binds (`HARNESS_LISTEN`).
    pub listen: SocketAddr,
    /// `sqlite://path` (default `sqlite://./data/agent-harness.db`) or `postgres://...` (`DATABASE_URL`).
    pub database_url: String,
    /// Connections in the database pool (`HARNESS_DATABASE_MAX_CONNECTIONS`).
    pub database_max_connections: u32,
    /// Longest wait for a database connection, in ms: a request finds a
    /// database that is down this fast (`HARNESS_DATABASE_ACQUIRE_TIMEOUT_MS`).
    pub database_acquire_timeout_ms: u64,
    /// Base URL of the OpenAI-compatible API (`OPENAI_BASE_URL`).
    pub openai_base_url: String,
    /// API key sent as a bearer token; none is sent when empty (`OPENAI_API_KEY`).
    pub openai_api_key: Option<Secret>,
    /// Model used when a turn names none and `providers` is empty (`HARNESS_MODEL`).
    pub model: String,
    /// The provider chain, `name:model` in order of preference, e.g.
    /// `openai:gpt-4o-mini,anthropic:claude-sonnet-4-6`; empty means
    /// `openai:{model}` (`HARNESS_PROVIDERS`).
    pub providers: String,
    /// Anthropic API key (`ANTHROPIC_API_KEY`).
    pub anthropic_api_key: Option<Secret>,
    /// Anthropic base URL (`ANTHROPIC_BASE_URL`).
    pub anthropic_base_url: String,
    /// `max_tokens` of Anthropic answers (`HARNESS_ANTHROPIC_MAX_TOKENS`).
    pub anthropic_max_tokens: u32,
    /// Ollama server (`OLLAMA_HOST`).
    pub ollama_host: String,
    /// Tries per provider before falling over (`HARNESS_PROVIDER_MAX_ATTEMPTS`).
    pub provider_max_attempts: u32,
    /// First retry delay, doubled each time (`HARNESS_PROVIDER_RETRY_BASE_MS`).
    pub provider_retry_base_ms: u64,
    /// Longest retry delay (`HARNESS_PROVIDER_RETRY_MAX_MS`).
    pub provider_retry_max_ms: u64,
    /// USD per million tokens by model (`HARNESS_PRICING`, JSON; `[pricing]` in the file).
    pub pricing: crate::providers::pricing::PricingTable,
    /// System prompt of every turn (`HARNESS_SYSTEM_PROMPT`).
    pub system_prompt: String,
    /// Longest a provider stream may stay silent (`HARNESS_PROVIDER_IDLE_TIMEOUT_S`).
    pub provider_idle_timeout_s: u64,
    /// Longest time to connect to a provider (`HARNESS_PROVIDER_CONNECT_TIMEOUT_S`).
    pub provider_connect_timeout_s: u64,
    /// Largest provider response accepted, in bytes (`HARNESS_PROVIDER_MAX_RESPONSE_BYTES`).
    pub provider_max_response_bytes: usize,
    /// Absolute deadline of a turn (`HARNESS_TURN_TIMEOUT_S`).
    pub turn_timeout_s: u64,
    /// Maximum LLM steps of a turn (`HARNESS_MAX_STEPS`).
    pub max_steps: u32,
    /// Tool calls per turn (`HARNESS_MAX_TOOL_CALLS`).
    pub max_tool_calls: u32,
    /// Reflections per turn (`HARNESS_MAX_REFLECTIONS`).
    pub max_reflections: u32,
    /// `off`, `low`, `medium` or `high` (`HARNESS_THINK_LEVEL`).
    pub think_level: String,
    /// Reflect on every N-th turn of a session; 0 never (`HARNESS_REFLECT_EVERY`).
    pub reflect_every: u32,
    /// Run disjoint read-only tool calls in parallel (`HARNESS_PARALLEL_TOOLS`).
    pub parallel_tools: bool,
    /// Validate tool arguments against their schema (`HARNESS_TOOL_VALIDATION`).
    pub tool_validation: bool,
    /// Offer only the tools most related to the message (`HARNESS_SEMANTIC_TOOL_SELECTION`).
    pub semantic_tool_selection: bool,
    /// Tools offered when selection is on (`HARNESS_MAX_TOOLS_PER_TURN`).
    pub max_tools_per_turn: usize,
    /// `all`, `read_only` or `none` (`HARNESS_TOOL_PERMISSION`).
    pub tool_permission: String,
    /// Summarise older messages near the context limit (`HARNESS_AUTO_COMPACT`).
    pub auto_compact: bool,
    /// Context window of the model, in tokens (`HARNESS_CONTEXT_WINDOW_TOKENS`).
    pub context_window_tokens: u64,
    /// Prompt id for provenance and judges (`HARNESS_PROMPT_ID`).
    pub prompt_id: Option<String>,
    /// Prompt version (`HARNESS_PROMPT_VERSION`).
    pub prompt_version: Option<String>,
    /// Keep message text out of decision records and logs (`HARNESS_REDACT_LOGS`).
    pub redact_logs: bool,
    /// Stored messages used as history when a request brings none (`HARNESS_HISTORY_MAX_MESSAGES`).
    pub history_max_messages: u32,
    /// Largest request body, in bytes (`HARNESS_BODY_LIMIT_BYTES`).
    pub body_limit_bytes: usize,
    /// Time a request's head has to arrive, from its first byte
    /// (`HARNESS_HEADER_READ_TIMEOUT_S`).
    pub header_read_timeout_s: u64,
    /// Time a connection may wait for a request's first byte: a keep-alive
    /// connection idle this long is closed. Keep it above the idle timeout
    /// of a load balancer in front (`HARNESS_IDLE_TIMEOUT_S`).
    pub idle_timeout_s: u64,
    /// Time a request body has to arrive, whole (`HARNESS_BODY_READ_TIMEOUT_S`).
    pub body_read_timeout_s: u64,
    /// Connections open at once; unset: three quarters of the open-file
    /// limit (`HARNESS_MAX_CONNECTIONS`).
    pub max_connections: Option<usize>,
    /// Browser origins allowed to call the API (CORS): a comma-separated
    /// list of `scheme://host[:port]`, or `*`; empty: none
    /// (`HARNESS_CORS_ORIGINS`).
    pub cors_origins: String,
    /// Seconds between SSE keep-alive comments (`HARNESS_SSE_KEEPALIVE_S`).
    pub sse_keepalive_s: u64,
    /// Time running turns get to finish at shutdown (`HARNESS_SHUTDOWN_GRACE_S`).
    pub shutdown_grace_s: u64,
    /// Name of this replica; turns it left running are interrupted when it starts again (`HARNESS_INSTANCE_ID`).
    pub instance_id: String,
    /// Seconds between heartbeats of running turns (`HARNESS_HEARTBEAT_INTERVAL_S`).
    pub heartbeat_interval_s: u64,
    /// A running turn whose heartbeat is older than this is considered
    /// orphaned; unset: 1.5 heartbeat intervals, so that an orphan is taken
    /// over within two (`HARNESS_STALE_TURN_AFTER_S`).
    pub stale_turn_after_s: Option<u64>,
    /// Most events written in one transaction (`HARNESS_EVENT_BATCH_MAX`).
    pub event_batch_max: usize,
    /// Events that may wait for the writer before emitters are slowed down (`HARNESS_EVENT_QUEUE_CAPACITY`).
    pub event_queue_capacity: usize,
    /// `text` or `json` (`HARNESS_LOG_FORMAT`).
    pub log_format: LogFormat,
    /// tracing filter directives (`HARNESS_LOG`, else `RUST_LOG`).
    pub log_filter: String,
    /// OTLP/HTTP endpoint for traces; tracing export is off when unset (`OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub otlp_endpoint: Option<String>,
    /// Record prompt and completion text on spans (`HARNESS_TELEMETRY_CAPTURE_CONTENT`).
    pub telemetry_capture_content: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            database_url: "sqlite://./data/agent-harness.db".to_owned(),
            database_max_connections: 10,
            database_acquire_timeout_ms: 1000,
            openai_base_url: "https://api.openai.com/v1".to_owned(),
            openai_api_key: None,
            model: "gpt-4o-mini".to_owned(),
            providers: String::new(),
            anthropic_api_key: None,
            anthropic_base_url: "https://api.anthropic.com".to_owned(),
            anthropic_max_tokens: 4096,
            ollama_host: "http://127.0.0.1:11434".to_owned(),
            provider_max_attempts: 3,
            provider_retry_base_ms: 200,
            provider_retry_max_ms: 5000,
            pricing: Default::default(),
            system_prompt: crate::harness::DEFAULT_SYSTEM_PROMPT.to_owned(),
            provider_idle_timeout_s: 60,
            provider_connect_timeout_s: 10,
            provider_max_response_bytes: 8 * 1024 * 1024,
            turn_timeout_s: 60,
            max_steps: 6,
            max_tool_calls: 6,
            max_reflections: 4,
            think_level: "off".to_owned(),
            reflect_every: 0,
            parallel_tools: true,
            tool_validation: true,
            semantic_tool_selection: false,
            max_tools_per_turn: 25,
            tool_permission: "all".to_owned(),
            auto_compact: true,
            context_window_tokens: 128_000,
            prompt_id: None,
            prompt_version: None,
            redact_logs: false,
            history_max_messages: 50,
            body_limit_bytes: 1024 * 1024,
            cors_origins: String::new(),
            header_read_timeout_s: 10,
            idle_timeout_s: 75,
            body_read_timeout_s: 30,
            max_connections: None,
            sse_keepalive_s: 15,
            shutdown_grace_s: 30,
            instance_id: default_instance_id(),
            heartbeat_interval_s: 5,
            stale_turn_after_s: None,
            event_batch_max: 512,
            event_queue_capacity: 8192,
            log_format: LogFormat::Text,
            log_filter: "info".to_owned(),
            otlp_endpoint: None,
            telemetry_capture_content: false,
        }
    }
}

fn default_instance_id() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.trim().is_empty())
        .unwrap_or_else(|| "local".to_owned())
}

/// A setting that could not be used, named as the operator wrote it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    ReadFile {
        path: String,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid: {source}")]
    ParseFile {
        path: String,
        source: Box<toml::de::Error>,
    },
    #[error("{name}: {reason}")]
    Invalid { name: &'static str, reason: String },
}

fn invalid(name: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        name,
        reason: reason.into(),
    }
}

/// Stores a parsed value (keeps the setter table one line per setting).
fn assign<T>(slot: &mut T, value: T) -> Result<(), ConfigError> {
    *slot = value;
    Ok(())
}

type Apply = fn(&mut Settings, &'static str, &str) -> Result<(), ConfigError>;

fn parse<T: std::str::FromStr>(name: &'static str, raw: &str) -> Result<T, ConfigError>
where
    T::Err: fmt::Display,
{
    raw.trim()
        .parse()
        .map_err(|e| invalid(name, format!("cannot parse {raw:?}: {e}")))
}

fn parse_bool(name: &'static str, raw: &str) -> Result<bool, ConfigError> {
    match raw.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" | "" => Ok(false),
        _ => Err(invalid(
            name,
            format!("expected true or false, got {raw:?}"),
        )),
    }
}

fn non_empty(raw: &str) -> Option<String> {
    let trimmed = raw.trim();
    (!trimmed.is_empty()).then(|| trimmed.to_owned())
}

/// Environment variables, in the order they are applied, with their setters.
/// `RUST_LOG` comes before `HARNESS_LOG` so that the specific one wins.
pub const ENV_SETTINGS: &[(&str, Apply)] = &[
    ("HARNESS_LISTEN", |s, n, v| {
        assign(&mut s.listen, parse(n, v)?)
    }),
    ("DATABASE_URL", |s, _, v| {
        assign(&mut s.database_url, v.trim().to_owned())
    }),
    ("HARNESS_DATABASE_MAX_CONNECTIONS", |s, n, v| {
        assign(&mut s.database_max_connections, parse(n, v)?)
    }),
    ("HARNESS_DATABASE_ACQUIRE_TIMEOUT_MS", |s, n, v| {
        assign(&mut s.database_acquire_timeout_ms, parse(n, v)?)
    }),
    ("OPENAI_BASE_URL", |s, _, v| {
        assign(&mut s.openai_base_url, v.trim().to_owned())
    }),
    ("OPENAI_API_KEY", |s, _, v| {
        assign(&mut s.openai_api_key, non_empty(v).map(Secret::from))
    }),
    ("HARNESS_MODEL", |s, _, v| {
        assign(&mut s.model, v.trim().to_owned())
    }),
    ("HARNESS_PROVIDERS", |s, _, v| {
        assign(&mut s.providers, v.trim().to_owned())
    }),
    ("ANTHROPIC_API_KEY", |s, _, v| {
        assign(&mut s.anthropic_api_key, non_empty(v).map(Secret::from))
    }),
    ("ANTHROPIC_BASE_URL", |s, _, v| {
        assign(&mut s.anthropic_base_url, v.trim().to_owned())
    }),
    ("HARNESS_ANTHROPIC_MAX_TOKENS", |s, n, v| {
        assign(&mut s.anthropic_max_tokens, parse(n, v)?)
    }),
    ("OLLAMA_HOST", |s, _, v| {
        assign(&mut s.ollama_host, v.trim().to_owned())
    }),
    ("HARNESS_PROVIDER_MAX_ATTEMPTS", |s, n, v| {
        assign(&mut s.provider_max_attempts, parse(n, v)?)
    }),
    ("HARNESS_PROVIDER_RETRY_BASE_MS", |s, n, v| {
        assign(&mut s.provider_retry_base_ms, parse(n, v)?)
    }),
    ("HARNESS_PROVIDER_RETRY_MAX_MS", |s, n, v| {
        assign(&mut s.provider_retry_max_ms, parse(n, v)?)
    }),
    ("HARNESS_PRICING", |s, n, v| {
        let table = serde_json::from_str(v)
            .map_err(|e| invalid(n, format!("expected a JSON object of model prices: {e}")))?;
        assign(&mut s.pricing, table)
    }),
    ("HARNESS_SYSTEM_PROMPT", |s, _, v| {
        assign(&mut s.system_prompt, v.to_owned())
    }),
    ("HARNESS_PROVIDER_IDLE_TIMEOUT_S", |s, n, v| {
        assign(&mut s.provider_idle_timeout_s, parse(n, v)?)
    }),
    ("HARNESS_PROVIDER_CONNECT_TIMEOUT_S", |s, n, v| {
        assign(&mut s.provider_connect_timeout_s, parse(n, v)?)
    }),
    ("HARNESS_PROVIDER_MAX_RESPONSE_BYTES", |s, n, v| {
        assign(&mut s.provider_max_response_bytes, parse(n, v)?)
    }),
    ("HARNESS_TURN_TIMEOUT_S", |s, n, v| {
        assign(&mut s.turn_timeout_s, parse(n, v)?)
    }),
    ("HARNESS_MAX_STEPS", |s, n, v| {
        assign(&mut s.max_steps, parse(n, v)?)
    }),
    ("HARNESS_MAX_TOOL_CALLS", |s, n, v| {
        assign(&mut s.max_tool_calls, parse(n, v)?)
    }),
    ("HARNESS_MAX_REFLECTIONS", |s, n, v| {
        assign(&mut s.max_reflections, parse(n, v)?)
    }),
    ("HARNESS_THINK_LEVEL", |s, _, v| {
        assign(&mut s.think_level, v.trim().to_owned())
    }),
    ("HARNESS_REFLECT_EVERY", |s, n, v| {
        assign(&mut s.reflect_every, parse(n, v)?)
    }),
    ("HARNESS_PARALLEL_TOOLS", |s, n, v| {
        assign(&mut s.parallel_tools, parse_bool(n, v)?)
    }),
    ("HARNESS_TOOL_VALIDATION", |s, n, v| {
        assign(&mut s.tool_validation, parse_bool(n, v)?)
    }),
    ("HARNESS_SEMANTIC_TOOL_SELECTION", |s, n, v| {
        assign(&mut s.semantic_tool_selection, parse_bool(n, v)?)
    }),
    ("HARNESS_MAX_TOOLS_PER_TURN", |s, n, v| {
        assign(&mut s.max_tools_per_turn, parse(n, v)?)
    }),
    ("HARNESS_TOOL_PERMISSION", |s, _, v| {
        assign(&mut s.tool_permission, v.trim().to_owned())
    }),
    ("HARNESS_AUTO_COMPACT", |s, n, v| {
        assign(&mut s.auto_compact, parse_bool(n, v)?)
    }),
    ("HARNESS_CONTEXT_WINDOW_TOKENS", |s, n, v| {
        assign(&mut s.context_window_tokens, parse(n, v)?)
    }),
    ("HARNESS_PROMPT_ID", |s, _, v| {
        assign(&mut s.prompt_id, non_empty(v))
    }),
    ("HARNESS_PROMPT_VERSION", |s, _, v| {
        assign(&mut s.prompt_version, non_empty(v))
    }),
    ("HARNESS_REDACT_LOGS", |s, n, v| {
        assign(&mut s.redact_logs, parse_bool(n, v)?)
    }),
    ("HARNESS_HISTORY_MAX_MESSAGES", |s, n, v| {
        assign(&mut s.history_max_messages, parse(n, v)?)
    }),
    ("HARNESS_BODY_LIMIT_BYTES", |s, n, v| {
        assign(&mut s.body_limit_bytes, parse(n, v)?)
    }),
    ("HARNESS_HEADER_READ_TIMEOUT_S", |s, n, v| {
        assign(&mut s.header_read_timeout_s, parse(n, v)?)
    }),
    ("HARNESS_IDLE_TIMEOUT_S", |s, n, v| {
        assign(&mut s.idle_timeout_s, parse(n, v)?)
    }),
    ("HARNESS_BODY_READ_TIMEOUT_S", |s, n, v| {
        assign(&mut s.body_read_timeout_s, parse(n, v)?)
    }),
    ("HARNESS_MAX_CONNECTIONS", |s, n, v| {
        assign(&mut s.max_connections, Some(parse(n, v)?))
    }),
    ("HARNESS_CORS_ORIGINS", |s, _, v| {
        assign(&mut s.cors_origins, v.trim().to_owned())
    }),
    ("HARNESS_SSE_KEEPALIVE_S", |s, n, v| {
        assign(&mut s.sse_keepalive_s, parse(n, v)?)
    }),
    ("HARNESS_SHUTDOWN_GRACE_S", |s, n, v| {
        assign(&mut s.shutdown_grace_s, parse(n, v)?)
    }),
    ("HARNESS_INSTANCE_ID", |s, _, v| {
        assign(&mut s.instance_id, v.trim().to_owned())
    }),
    ("HARNESS_HEARTBEAT_INTERVAL_S", |s, n, v| {
        assign(&mut s.heartbeat_interval_s, parse(n, v)?)
    }),
    ("HARNESS_STALE_TURN_AFTER_S", |s, n, v| {
        assign(&mut s.stale_turn_after_s, Some(parse(n, v)?))
    }),
    ("HARNESS_EVENT_BATCH_MAX", |s, n, v| {
        assign(&mut s.event_batch_max, parse(n, v)?)
    }),
    ("HARNESS_EVENT_QUEUE_CAPACITY", |s, n, v| {
        assign(&mut s.event_queue_capacity, parse(n, v)?)
    }),
    ("HARNESS_LOG_FORMAT", |s, n, v| {
        s.log_format = match v.trim().to_ascii_lowercase().as_str() {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            _ => return Err(invalid(n, format!("expected text or json, got {v:?}"))),
        };
        Ok(())
    }),
    ("RUST_LOG", |s, _, v| {
        assign(&mut s.log_filter, v.to_owned())
    }),
    ("HARNESS_LOG", |s, _, v| {
        assign(&mut s.log_filter, v.to_owned())
    }),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", |s, _, v| {
        assign(&mut s.otlp_endpoint, non_empty(v))
    }),
    ("HARNESS_TELEMETRY_CAPTURE_CONTENT", |s, n, v| {
        assign(&mut s.telemetry_capture_content, parse_bool(n, v)?)
    }),
];

impl Settings {
    /// Loads defaults, then `file` if given, then the process environment,
    /// and validates the result.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_from(file, |name| std::env::var(name).ok())
    }

    /// [`Settings::load`] with an explicit environment, for tests.
    pub fn load_from(
        file: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let mut settings = match file {
            Some(path) => Self::from_toml_file(path)?,
            None => Self::default(),
        };
        for (name, apply) in ENV_SETTINGS {
            if let Some(value) = env(name) {
                apply(&mut settings, name, &value)?;
            }
        }
        settings.validate()?;
        Ok(settings)
    }

    fn from_toml_file(path: &Path) -> Result<Self, ConfigError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadFile {
            path: shown.clone(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::ParseFile {
            path: shown,
            source: Box::new(source),
        })
    }

    /// Checks every setting that has a range or a shape.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(self.database_url.starts_with("sqlite:")
            || self.database_url.starts_with("postgres://")
            || self.database_url.starts_with("postgresql://"))
        {
            return Err(invalid(
                "DATABASE_URL",
                "must start with sqlite:, postgres:// or postgresql://",
            ));
        }
        if self.database_url.starts_with("sqlite:") && self.database_url.contains(":memory:") {
            return Err(invalid(
                "DATABASE_URL",
                "an in-memory SQLite database is not supported: the writer and the readers share one file",
            ));
        }
        if self.database_max_connections == 0 {
            return Err(invalid(
                "HARNESS_DATABASE_MAX_CONNECTIONS",
                "must be at least 1",
            ));
        }
        if !(100..=60_000).contains(&self.database_acquire_timeout_ms) {
            return Err(invalid(
                "HARNESS_DATABASE_ACQUIRE_TIMEOUT_MS",
                "must be between 100 and 60000",
            ));
        }
        match reqwest::Url::parse(&self.openai_base_url) {
            Ok(url) if matches!(url.scheme(), "http" | "https") => {}
            Ok(_) => return Err(invalid("OPENAI_BASE_URL", "must be an http or https URL")),
            Err(e) => return Err(invalid("OPENAI_BASE_URL", format!("not a URL: {e}"))),
        }
        if self.model.is_empty() {
            return Err(invalid("HARNESS_MODEL", "must not be empty"));
        }
        self.provider_chain()
            .map_err(|reason| invalid("HARNESS_PROVIDERS", reason))?;
        if reqwest::Url::parse(&self.anthropic_base_url).is_err() {
            return Err(invalid("ANTHROPIC_BASE_URL", "not a URL"));
        }
        if self.ollama_host.trim().is_empty() {
            return Err(invalid("OLLAMA_HOST", "must not be empty"));
        }
        if self.anthropic_max_tokens == 0 {
            return Err(invalid(
                "HARNESS_ANTHROPIC_MAX_TOKENS",
                "must be at least 1",
            ));
        }
        if !(1..=10).contains(&self.provider_max_attempts) {
            return Err(invalid(
                "HARNESS_PROVIDER_MAX_ATTEMPTS",
                "must be between 1 and 10",
            ));
        }
        if self.provider_retry_max_ms < self.provider_retry_base_ms {
            return Err(invalid(
                "HARNESS_PROVIDER_RETRY_MAX_MS",
                "must not be less than HARNESS_PROVIDER_RETRY_BASE_MS",
            ));
        }
        self.pricing
            .validate()
            .map_err(|reason| invalid("HARNESS_PRICING", reason))?;
        let positive: [(&'static str, u64); 12] = [
            (
                "HARNESS_PROVIDER_IDLE_TIMEOUT_S",
                self.provider_idle_timeout_s,
            ),
            (
                "HARNESS_PROVIDER_CONNECT_TIMEOUT_S",
                self.provider_connect_timeout_s,
            ),
            ("HARNESS_TURN_TIMEOUT_S", self.turn_timeout_s),
            ("HARNESS_SSE_KEEPALIVE_S", self.sse_keepalive_s),
            ("HARNESS_HEARTBEAT_INTERVAL_S", self.heartbeat_interval_s),
            ("HARNESS_BODY_LIMIT_BYTES", self.body_limit_bytes as u64),
            ("HARNESS_HEADER_READ_TIMEOUT_S", self.header_read_timeout_s),
            ("HARNESS_IDLE_TIMEOUT_S", self.idle_timeout_s),
            ("HARNESS_BODY_READ_TIMEOUT_S", self.body_read_timeout_s),
            (
                "HARNESS_MAX_CONNECTIONS",
                self.max_connections.unwrap_or(1) as u64,
            ),
            ("HARNESS_EVENT_BATCH_MAX", self.event_batch_max as u64),
            (
                "HARNESS_EVENT_QUEUE_CAPACITY",
                self.event_queue_capacity as u64,
            ),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(invalid(name, "must be greater than 0"));
        }
        if self.provider_max_response_bytes < 1024 {
            return Err(invalid(
                "HARNESS_PROVIDER_MAX_RESPONSE_BYTES",
                "must be at least 1024",
            ));
        }
        if !(1..=100).contains(&self.max_steps) {
            return Err(invalid("HARNESS_MAX_STEPS", "must be between 1 and 100"));
        }
        self.think_level()
            .map_err(|reason| invalid("HARNESS_THINK_LEVEL", reason))?;
        self.tool_permission()
            .map_err(|reason| invalid("HARNESS_TOOL_PERMISSION", reason))?;
        if !(1..=100).contains(&self.max_tool_calls) {
            return Err(invalid(
                "HARNESS_MAX_TOOL_CALLS",
                "must be between 1 and 100",
            ));
        }
        if self.max_reflections > 100 {
            return Err(invalid("HARNESS_MAX_REFLECTIONS", "must be at most 100"));
        }
        if self.max_tools_per_turn == 0 {
            return Err(invalid("HARNESS_MAX_TOOLS_PER_TURN", "must be at least 1"));
        }
        if self.context_window_tokens < 1024 {
            return Err(invalid(
                "HARNESS_CONTEXT_WINDOW_TOKENS",
                "must be at least 1024",
            ));
        }
        if self
            .stale_turn_after_s
            .is_some_and(|stale| stale <= self.heartbeat_interval_s)
        {
            return Err(invalid(
                "HARNESS_STALE_TURN_AFTER_S",
                "must be more than HARNESS_HEARTBEAT_INTERVAL_S",
            ));
        }
        self.cors()
            .map_err(|reason| invalid("HARNESS_CORS_ORIGINS", reason))?;
        if self.idle_timeout_s < self.header_read_timeout_s {
            return Err(invalid(
                "HARNESS_IDLE_TIMEOUT_S",
                "must be at least HARNESS_HEADER_READ_TIMEOUT_S",
            ));
        }
        if self.instance_id.is_empty() || self.instance_id.len() > 128 {
            return Err(invalid(
                "HARNESS_INSTANCE_ID",
                "must be 1 to 128 characters",
            ));
        }
        if let Some(endpoint) = &self.otlp_endpoint
            && reqwest::Url::parse(endpoint).is_err()
        {
            return Err(invalid("OTEL_EXPORTER_OTLP_ENDPOINT", "not a URL"));
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log_filter) {
            return Err(invalid("HARNESS_LOG", e.to_string()));
        }
        Ok(())
    }

    /// The chain as `(provider, model)` pairs.
    pub fn provider_chain(&self) -> Result<Vec<(String, String)>, String> {
        if self.providers.trim().is_empty() {
            return Ok(vec![("openai".to_owned(), self.model.clone())]);
        }
        self.providers
            .split(',')
            .map(|entry| {
                let entry = entry.trim();
                let (name, model) = entry
                    .split_once(':')
                    .ok_or_else(|| format!("{entry:?} is not provider:model"))?;
                let (name, model) = (name.trim(), model.trim());
                if !matches!(name, "openai" | "anthropic" | "ollama") {
                    return Err(format!(
                        "unknown provider {name:?} (openai, anthropic, ollama)"
                    ));
                }
                if model.is_empty() {
                    return Err(format!("{entry:?} names no model"));
                }
                Ok((name.to_owned(), model.to_owned()))
            })
            .collect()
    }

    pub fn think_level(&self) -> Result<crate::providers::ThinkLevel, String> {
        self.think_level.parse()
    }

    pub fn tool_permission(&self) -> Result<crate::tools::PermissionMode, String> {
        match self.tool_permission.trim().to_ascii_lowercase().as_str() {
            "all" => Ok(crate::tools::PermissionMode::All),
            "read_only" => Ok(crate::tools::PermissionMode::ReadOnly),
            "none" => Ok(crate::tools::PermissionMode::None),
            other => Err(format!("expected all, read_only or none, got {other:?}")),
        }
    }

    pub fn turn_timeout(&self) -> Duration {
        Duration::from_secs(self.turn_timeout_s)
    }

    /// The CORS policy: `None` when no origin is allowed (no CORS headers
    /// at all), else any origin (`*`) or the listed ones.
    pub fn cors(&self) -> Result<Option<CorsOrigins>, String> {
        let listed: Vec<&str> = self
            .cors_origins
            .split(',')
            .map(str::trim)
            .filter(|o| !o.is_empty())
            .collect();
        if listed.is_empty() {
            return Ok(None);
        }
        if listed == ["*"] {
            return Ok(Some(CorsOrigins::Any));
        }
        let mut origins = Vec::with_capacity(listed.len());
        for origin in listed {
            let url = reqwest::Url::parse(origin)
                .map_err(|e| format!("{origin:?} is not an origin: {e}"))?;
            let bare = matches!(url.scheme(), "http" | "https")
                && url.host_str().is_some()
                && url.path() == "/"
                && !origin.ends_with('/')
                && url.query().is_none()
                && url.username().is_empty();
            if !bare {
                return Err(format!(
                    "{origin:?} is not an origin: use scheme://host[:port], or `*` alone"
                ));
            }
            origins.push(origin.to_owned());
        }
        Ok(Some(CorsOrigins::List(origins)))
    }

    /// When a running turn without a heartbeat is an orphan: the setting,
    /// else 1.5 heartbeat intervals (a live owner's heartbeat is at most one
    /// interval old; sweeps every half interval then take an orphan over
    /// within two intervals of its owner's last beat).
    pub fn stale_turn_after(&self) -> Duration {
        self.stale_turn_after_s.map_or_else(
            || Duration::from_secs(self.heartbeat_interval_s).mul_f64(1.5),
            Duration::from_secs,
        )
    }

    pub fn is_postgres(&self) -> bool {
        self.database_url.starts_with("postgres")
    }
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("listen", &self.listen)
            .field("database_url", &redact_url(&self.database_url))
            .field(
                "openai_base_url",
                &crate::providers::redact::Redactor::default().text(&self.openai_base_url),
            )
            .field("openai_api_key", &self.openai_api_key)
            .field("anthropic_api_key", &self.anthropic_api_key)
            .field("providers", &self.provider_chain())
            .field("model", &self.model)
            .field("turn_timeout_s", &self.turn_timeout_s)
            .field("max_steps", &self.max_steps)
            .field("instance_id", &self.instance_id)
            .finish_non_exhaustive()
    }
}

/// A value that must never be printed (an API key): its `Debug` and
/// `Display` say `<redacted>`; [`Secret::expose`] is the one way to read it.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// The value, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self(value.to_owned())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Origins allowed to call the API from a browser.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CorsOrigins {
    Any,
    List(Vec<String>),
}

/// Hides the password of a connection URL.
pub fn redact_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            // Setting a password only fails for URLs that cannot have one.
            let _ = parsed.set_password(Some("<redacted>"));
            parsed.to_string()
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn load(env: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        let map: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Settings::load_from(None, |name| map.get(name).cloned())
    }

    #[test]
    fn defaults_are_valid_and_local() {
        let s = load(&[]).unwrap();
        assert_eq!(s.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(s.database_url, "sqlite://./data/agent-harness.db");
        assert_eq!(s.body_limit_bytes, 1024 * 1024);
        assert_eq!(s.max_steps, 6);
        assert_eq!(s.turn_timeout_s, 60);
    }

    #[test]
    fn environment_overrides_file_which_overrides_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("harness.toml");
        std::fs::write(&path, "model = \"from-file\"\nmax_steps = 3\n").unwrap();
        let s = Settings::load_from(Some(&path), |name| {
            (name == "HARNESS_MODEL").then(|| "from-env".to_owned())
        })
        .unwrap();
        assert_eq!(s.model, "from-env");
        assert_eq!(s.max_steps, 3);
    }

    #[test]
    fn a_bad_value_names_its_setting() {
        let err = load(&[("HARNESS_LISTEN", "not-an-address")]).unwrap_err();
        assert!(err.to_string().starts_with("HARNESS_LISTEN:"), "{err}");
        let err = load(&[("DATABASE_URL", "mysql://x")]).unwrap_err();
        assert!(err.to_string().starts_with("DATABASE_URL:"), "{err}");
        let err = load(&[("DATABASE_URL", "sqlite::memory:")]).unwrap_err();
        assert!(err.to_string().starts_with("DATABASE_URL:"), "{err}");
        let err = load(&[("HARNESS_MAX_STEPS", "0")]).unwrap_err();
        assert!(err.to_string().starts_with("HARNESS_MAX_STEPS:"), "{err}");
        let err = load(&[("OPENAI_BASE_URL", "ftp://x")]).unwrap_err();
        assert!(err.to_string().starts_with("OPENAI_BASE_URL:"), "{err}");
    }

    #[test]
    fn an_unknown_key_in_the_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("harness.toml");
        std::fs::write(&path, "modle = \"typo\"\n").unwrap();
        let err = Settings::load_from(Some(&path), |_| None).unwrap_err();
        assert!(err.to_string().contains("modle"), "{err}");
    }

    #[test]
    fn the_provider_chain_is_parsed_and_checked() {
        let s = load(&[("HARNESS_MODEL", "gpt-4.1")]).unwrap();
        assert_eq!(
            s.provider_chain().unwrap(),
            [("openai".to_owned(), "gpt-4.1".to_owned())]
        );
        let s = load(&[(
            "HARNESS_PROVIDERS",
            "openai:gpt-4o-mini, anthropic:claude-sonnet-4-6,ollama:llama3.2",
        )])
        .unwrap();
        assert_eq!(s.provider_chain().unwrap().len(), 3);
        for bad in ["openai", "mystery:x", "anthropic:"] {
            let err = load(&[("HARNESS_PROVIDERS", bad)]).unwrap_err();
            assert!(err.to_string().starts_with("HARNESS_PROVIDERS:"), "{err}");
        }
        let err = load(&[("HARNESS_PRICING", r#"{"m": {"input": -1, "output": 1}}"#)]).unwrap_err();
        assert!(err.to_string().starts_with("HARNESS_PRICING:"), "{err}");
        let s = load(&[("HARNESS_PRICING", r#"{"m": {"input": 1, "output": 2}}"#)]).unwrap();
        assert_eq!(s.pricing.0["m"].output, 2.0);
    }

    #[test]
    fn a_secret_never_prints_and_is_read_only_through_expose() {
        let key = Secret::from("sk-never-shown");
        assert_eq!(format!("{key} {key:?}"), "<redacted> <redacted>");
        assert_eq!(key.expose(), "sk-never-shown");
        let s = load(&[("OPENAI_API_KEY", " sk-from-env ")]).unwrap();
        assert_eq!(
            s.openai_api_key.as_ref().map(Secret::expose),
            Some("sk-from-env")
        );
    }

    #[test]
    fn debug_output_hides_secrets() {
        let s = load(&[
            ("OPENAI_API_KEY", "sk-secret"),
            ("DATABASE_URL", "postgres://u:hunter2@db/x"),
            (
                "OPENAI_BASE_URL",
                "https://r.openai.azure.com/openai/deployments/d?api-version=1&api-key=qk-secret",
            ),
        ])
        .unwrap();
        let shown = format!("{s:?}");
        assert!(
            !shown.contains("sk-secret")
                && !shown.contains("hunter2")
                && !shown.contains("qk-secret"),
            "{shown}"
        );
        assert!(
            shown.contains("api-version=1&api-key=[redacted]"),
            "{shown}"
        );
    }
}
