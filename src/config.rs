//! Typed settings in sections that mirror the modules: [`ServerSettings`]
//! (the edge and the process), [`DatabaseSettings`] (the store and its
//! writer), [`ProviderSettings`] (the chain, adapters, retries, prices),
//! [`HarnessSettings`] (the turn loop), [`VaultSettings`] (the notes),
//! [`WebSettings`] (the web tools) and [`TelemetrySettings`] (logs and
//! traces).
//!
//! Every setting has a flag, an environment variable and a key in its
//! section of the TOML file (`[harness] max_steps`); `agent-harness --help`
//! lists them all with their variables and defaults. A value is taken from
//! the first of: the command line, the environment, the file, the built-in
//! default; an empty value counts as unset. Each is parsed into its type at
//! load (`ThinkLevel`, `PermissionMode`, the provider list, origins, URLs),
//! and [`Settings::validate`] checks ranges and settings that depend on one
//! another. Errors name the variable, flag or file key the value came from.
//! Secrets never print: see [`Secret`].

mod load;
mod values;

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::{ArgAction, builder::BoolishValueParser};

pub use load::{ConfigError, load_matches};
pub use values::{
    AuthMode, CorsOrigins, DatabaseUrl, EffectList, EmbeddingModel, HostUrl, HttpUrl, LogFormat,
    OtlpProtocol, ProviderKind, ProviderList, ProviderRef, ResourceAttributes, Secret, redact_url,
};

use crate::{
    memory::judges::JudgeList,
    providers::ThinkLevel,
    providers::{catalogue::ModelEntries, pricing::PricingTable},
    tools::{
        PermissionMode,
        http_tool::HttpToolList,
        mcp::McpServerList,
        web::{WebConfig, guard::NetGuard},
    },
};

/// All settings of the service.
#[derive(Debug, Clone, clap::Args)]
pub struct Settings {
    /// TOML file with settings, one table per section (`[server]`,
    /// `[database]`, `[providers]`, `[harness]`, `[vault]`, `[web]`,
    /// `[memory]`, `[judges]`, `[tools]`, `[telemetry]`);
    /// the environment and the command line override it.
    #[arg(
        id = "config",
        long = "config",
        value_name = "FILE",
        env = "HARNESS_CONFIG",
        global = true
    )]
    pub config_file: Option<PathBuf>,
    #[command(flatten, next_help_heading = "Server")]
    pub server: ServerSettings,
    #[command(flatten, next_help_heading = "Database")]
    pub database: DatabaseSettings,
    #[command(flatten, next_help_heading = "Providers")]
    pub providers: ProviderSettings,
    #[command(flatten, next_help_heading = "Harness")]
    pub harness: HarnessSettings,
    #[command(flatten, next_help_heading = "Vault")]
    pub vault: VaultSettings,
    #[command(flatten, next_help_heading = "Web")]
    pub web: WebSettings,
    #[command(flatten, next_help_heading = "Memory")]
    pub memory: MemorySettings,
    #[command(flatten, next_help_heading = "Judges")]
    pub judges: JudgeSettings,
    #[command(flatten, next_help_heading = "Tools")]
    pub tools: ToolSettings,
    #[command(flatten, next_help_heading = "Telemetry")]
    pub telemetry: TelemetrySettings,
}

/// The HTTP edge and the life of the process among its replicas.
#[derive(Debug, Clone, clap::Args)]
pub struct ServerSettings {
    /// Address the HTTP server binds.
    #[arg(
        id = "server.listen",
        long = "listen",
        env = "HARNESS_LISTEN",
        default_value = "127.0.0.1:8080"
    )]
    pub listen: SocketAddr,
    /// Largest request body, in bytes.
    #[arg(id = "server.body_limit_bytes", long = "body-limit-bytes", env = "HARNESS_BODY_LIMIT_BYTES", default_value_t = 1024 * 1024)]
    pub body_limit_bytes: usize,
    /// Time a request's head has to arrive (a new connection's first from its accept, a later one from its first byte), in seconds.
    #[arg(
        id = "server.header_read_timeout_s",
        long = "header-read-timeout-s",
        env = "HARNESS_HEADER_READ_TIMEOUT_S",
        default_value_t = 10
    )]
    pub header_read_timeout_s: u64,
    /// Time a connection may wait for a request's first byte, in seconds:
    /// keep it above the idle timeout of a load balancer in front.
    #[arg(
        id = "server.idle_timeout_s",
        long = "idle-timeout-s",
        env = "HARNESS_IDLE_TIMEOUT_S",
        default_value_t = 75
    )]
    pub idle_timeout_s: u64,
    /// Time a request body has to arrive whole, in seconds.
    #[arg(
        id = "server.body_read_timeout_s",
        long = "body-read-timeout-s",
        env = "HARNESS_BODY_READ_TIMEOUT_S",
        default_value_t = 30
    )]
    pub body_read_timeout_s: u64,
    /// Connections open at once; when full, a new one takes the place of the one waiting longest [default: three quarters of the open-file limit].
    #[arg(
        id = "server.max_connections",
        long = "max-connections",
        env = "HARNESS_MAX_CONNECTIONS"
    )]
    pub max_connections: Option<usize>,
    /// Browser origins allowed to call the API (CORS): a comma-separated
    /// list of scheme://host[:port], or `*` [default: none].
    #[arg(
        id = "server.cors_origins",
        long = "cors-origins",
        env = "HARNESS_CORS_ORIGINS"
    )]
    pub cors_origins: Option<CorsOrigins>,
    /// Whether requests need an API key (`Authorization: Bearer`, made with
    /// `agent-harness keys create`): on, off, or auto (on unless listening
    /// on loopback only).
    #[arg(
        id = "server.auth",
        long = "auth",
        env = "HARNESS_AUTH",
        value_enum,
        default_value = "auto"
    )]
    pub auth: AuthMode,
    /// Requests a key may make per minute (a bucket that refills
    /// steadily; past it, 429 with Retry-After); 0: no limit.
    #[arg(
        id = "server.rate_limit_per_minute",
        long = "rate-limit-per-minute",
        env = "HARNESS_RATE_LIMIT_PER_MINUTE",
        default_value_t = 600
    )]
    pub rate_limit_per_minute: u32,
    /// Seconds between SSE keep-alive comments.
    #[arg(
        id = "server.sse_keepalive_s",
        long = "sse-keepalive-s",
        env = "HARNESS_SSE_KEEPALIVE_S",
        default_value_t = 15
    )]
    pub sse_keepalive_s: u64,
    /// Seconds running turns get to finish at shutdown.
    #[arg(
        id = "server.shutdown_grace_s",
        long = "shutdown-grace-s",
        env = "HARNESS_SHUTDOWN_GRACE_S",
        default_value_t = 30
    )]
    pub shutdown_grace_s: u64,
    /// Name of this replica: turns it left running are interrupted when it
    /// starts again [default: $HOSTNAME, else `local`].
    #[arg(id = "server.instance_id", long = "instance-id", env = "HARNESS_INSTANCE_ID", default_value_t = default_instance_id(), hide_default_value = true)]
    pub instance_id: String,
    /// Seconds between heartbeats of running turns.
    #[arg(
        id = "server.heartbeat_interval_s",
        long = "heartbeat-interval-s",
        env = "HARNESS_HEARTBEAT_INTERVAL_S",
        default_value_t = 5
    )]
    pub heartbeat_interval_s: u64,
    /// A running turn whose heartbeat is older than this many seconds is an
    /// orphan [default: 1.5 heartbeat intervals, so that an orphan is taken
    /// over within two].
    #[arg(
        id = "server.stale_turn_after_s",
        long = "stale-turn-after-s",
        env = "HARNESS_STALE_TURN_AFTER_S"
    )]
    pub stale_turn_after_s: Option<u64>,
    /// Threads that run the service's requests and turns [default: one a
    /// core].
    #[arg(
        id = "server.worker_threads",
        long = "worker-threads",
        env = "HARNESS_WORKER_THREADS"
    )]
    pub worker_threads: Option<usize>,
}

/// The store and its event writer.
#[derive(Debug, Clone, clap::Args)]
pub struct DatabaseSettings {
    /// sqlite://path or postgres://user@host/db.
    #[arg(
        id = "database.url",
        long = "database-url",
        env = "DATABASE_URL",
        hide_env_values = true,
        default_value = "sqlite://./data/agent-harness.db"
    )]
    pub url: DatabaseUrl,
    /// Connections in the database pool.
    #[arg(
        id = "database.max_connections",
        long = "database-max-connections",
        env = "HARNESS_DATABASE_MAX_CONNECTIONS",
        default_value_t = 10
    )]
    pub max_connections: u32,
    /// Longest wait for a database connection, in ms: a request finds a
    /// database that is down this fast.
    #[arg(
        id = "database.acquire_timeout_ms",
        long = "database-acquire-timeout-ms",
        env = "HARNESS_DATABASE_ACQUIRE_TIMEOUT_MS",
        default_value_t = 1000
    )]
    pub acquire_timeout_ms: u64,
    /// Longest wait for Postgres to answer one call (a statement, or the
    /// transaction of a few), in ms. A call past it fails as if the
    /// database were down and its connection is dropped, so a connection
    /// whose peer went silent (a network partition) holds up nothing for
    /// longer; the server ends a session idle this long in a transaction.
    #[arg(
        id = "database.call_timeout_ms",
        long = "database-call-timeout-ms",
        env = "HARNESS_DATABASE_CALL_TIMEOUT_MS",
        default_value_t = 3000
    )]
    pub call_timeout_ms: u64,
    /// Most events written in one transaction.
    #[arg(
        id = "database.event_batch_max",
        long = "event-batch-max",
        env = "HARNESS_EVENT_BATCH_MAX",
        default_value_t = 512
    )]
    pub event_batch_max: usize,
    /// Events that may wait for the writer before emitters are slowed down.
    #[arg(
        id = "database.event_queue_capacity",
        long = "event-queue-capacity",
        env = "HARNESS_EVENT_QUEUE_CAPACITY",
        default_value_t = 8192
    )]
    pub event_queue_capacity: usize,
    /// Longest a text delta waits for the ones after it to share its
    /// commit, in ms (0: every delta is committed as soon as the writer
    /// is free). A step's first text and every other event never wait.
    #[arg(
        id = "database.event_linger_ms",
        long = "event-linger-ms",
        env = "HARNESS_EVENT_LINGER_MS",
        default_value_t = 2
    )]
    pub event_linger_ms: u64,
}

/// The provider chain, its adapters, retries and prices.
#[derive(Debug, Clone, clap::Args)]
pub struct ProviderSettings {
    /// The provider chain, name:model in order of preference, e.g.
    /// openai:gpt-4o-mini,anthropic:claude-sonnet-4-6 [default: openai:{model}].
    #[arg(id = "providers.chain", long = "providers", env = "HARNESS_PROVIDERS")]
    pub chain: Option<ProviderList>,
    /// Model used when the chain is not set.
    #[arg(
        id = "providers.model",
        long = "model",
        env = "HARNESS_MODEL",
        default_value = "gpt-4o-mini"
    )]
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
        env = "HARNESS_ANTHROPIC_MAX_TOKENS",
        default_value_t = 4096
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
        env = "HARNESS_PROVIDER_MAX_ATTEMPTS",
        default_value_t = 3
    )]
    pub max_attempts: u32,
    /// First retry delay in ms, doubled each time.
    #[arg(
        id = "providers.retry_base_ms",
        long = "provider-retry-base-ms",
        env = "HARNESS_PROVIDER_RETRY_BASE_MS",
        default_value_t = 200
    )]
    pub retry_base_ms: u64,
    /// Longest retry delay in ms.
    #[arg(
        id = "providers.retry_max_ms",
        long = "provider-retry-max-ms",
        env = "HARNESS_PROVIDER_RETRY_MAX_MS",
        default_value_t = 5000
    )]
    pub retry_max_ms: u64,
    /// Longest a provider stream may stay silent, in seconds.
    #[arg(
        id = "providers.idle_timeout_s",
        long = "provider-idle-timeout-s",
        env = "HARNESS_PROVIDER_IDLE_TIMEOUT_S",
        default_value_t = 60
    )]
    pub idle_timeout_s: u64,
    /// Longest time to connect to a provider, in seconds.
    #[arg(
        id = "providers.connect_timeout_s",
        long = "provider-connect-timeout-s",
        env = "HARNESS_PROVIDER_CONNECT_TIMEOUT_S",
        default_value_t = 10
    )]
    pub connect_timeout_s: u64,
    /// Largest provider response accepted, in bytes.
    #[arg(id = "providers.max_response_bytes", long = "provider-max-response-bytes", env = "HARNESS_PROVIDER_MAX_RESPONSE_BYTES", default_value_t = 8 * 1024 * 1024)]
    pub max_response_bytes: usize,
    /// USD per million tokens by model, as JSON
    /// ({"gpt-4o-mini": {"input": 0.15, "output": 0.6}}); a table in the file.
    #[arg(
        id = "providers.pricing",
        long = "pricing",
        env = "HARNESS_PRICING",
        default_value = "{}",
        hide_default_value = true
    )]
    pub pricing: PricingTable,
    /// Models beyond the built-in ones, or fields of built-in ones to
    /// change, as JSON ({"llama3.2": {"context_window": 8192, "max_output":
    /// 2048, "input": 0, "output": 0}}); a table in the file.
    #[arg(
        id = "providers.models",
        long = "models",
        env = "HARNESS_MODELS",
        default_value = "{}",
        hide_default_value = true
    )]
    pub models: ModelEntries,
}

/// The turn loop: limits, tools, reflection, compaction, the prompt.
#[derive(Debug, Clone, clap::Args)]
pub struct HarnessSettings {
    /// System prompt of every turn [default: the built-in prompt].
    #[arg(id = "harness.system_prompt", long = "system-prompt", env = "HARNESS_SYSTEM_PROMPT", default_value = crate::harness::DEFAULT_SYSTEM_PROMPT, hide_default_value = true)]
    pub system_prompt: String,
    /// Absolute deadline of a turn, in seconds.
    #[arg(
        id = "harness.turn_timeout_s",
        long = "turn-timeout-s",
        env = "HARNESS_TURN_TIMEOUT_S",
        default_value_t = 60
    )]
    pub turn_timeout_s: u64,
    /// Most model calls in a turn.
    #[arg(
        id = "harness.max_steps",
        long = "max-steps",
        env = "HARNESS_MAX_STEPS",
        default_value_t = 6
    )]
    pub max_steps: u32,
    /// Most tool calls in a turn.
    #[arg(
        id = "harness.max_tool_calls",
        long = "max-tool-calls",
        env = "HARNESS_MAX_TOOL_CALLS",
        default_value_t = 6
    )]
    pub max_tool_calls: u32,
    /// Most reflections in a turn.
    #[arg(
        id = "harness.max_reflections",
        long = "max-reflections",
        env = "HARNESS_MAX_REFLECTIONS",
        default_value_t = 4
    )]
    pub max_reflections: u32,
    /// How much the model is asked to think: off, low, medium or high.
    #[arg(
        id = "harness.think_level",
        long = "think-level",
        env = "HARNESS_THINK_LEVEL",
        default_value = "off"
    )]
    pub think_level: ThinkLevel,
    /// Reflect on every N-th turn of a session; 0 never.
    #[arg(
        id = "harness.reflect_every",
        long = "reflect-every",
        env = "HARNESS_REFLECT_EVERY",
        default_value_t = 0
    )]
    pub reflect_every: u32,
    /// Run disjoint read-only tool calls in parallel.
    #[arg(id = "harness.parallel_tools", long = "parallel-tools", env = "HARNESS_PARALLEL_TOOLS", default_value_t = true, action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub parallel_tools: bool,
    /// Validate tool arguments against their schema.
    #[arg(id = "harness.tool_validation", long = "tool-validation", env = "HARNESS_TOOL_VALIDATION", default_value_t = true, action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub tool_validation: bool,
    /// Keep each turn's decision record (`support.chat.turn`), committed
    /// with the turn.
    #[arg(id = "harness.record_decisions", long = "record-decisions", env = "HARNESS_RECORD_DECISIONS", default_value_t = true, action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub record_decisions: bool,
    /// Let clients send `system` messages in a turn's history (`history`,
    /// and the earlier messages of `/v1/chat/completions`, `/v1/ui/chat`
    /// and `/v1/agui`); off, they are refused with 422
    /// `invalid_history_role`: a system message is trusted, and a client's
    /// text is not.
    #[arg(id = "harness.allow_client_system_messages", long = "allow-client-system-messages", env = "HARNESS_ALLOW_CLIENT_SYSTEM_MESSAGES", default_value_t = false, action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub allow_client_system_messages: bool,
    /// Offer only the tools most related to the message.
    #[arg(id = "harness.semantic_tool_selection", long = "semantic-tool-selection", env = "HARNESS_SEMANTIC_TOOL_SELECTION", default_value_t = false, action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub semantic_tool_selection: bool,
    /// Tools offered when selection is on.
    #[arg(
        id = "harness.max_tools_per_turn",
        long = "max-tools-per-turn",
        env = "HARNESS_MAX_TOOLS_PER_TURN",
        default_value_t = 25
    )]
    pub max_tools_per_turn: usize,
    /// Which tools may run: auto (all, without asking), read_only or none.
    #[arg(
        id = "harness.tool_permission",
        long = "tool-permission",
        env = "HARNESS_TOOL_PERMISSION",
        default_value = "auto"
    )]
    pub tool_permission: PermissionMode,
    /// Summarise older messages near the context limit.
    #[arg(id = "harness.auto_compact", long = "auto-compact", env = "HARNESS_AUTO_COMPACT", default_value_t = true, action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub auto_compact: bool,
    /// Context window of the model, in tokens.
    #[arg(
        id = "harness.context_window_tokens",
        long = "context-window-tokens",
        env = "HARNESS_CONTEXT_WINDOW_TOKENS",
        default_value_t = 128_000
    )]
    pub context_window_tokens: u64,
    /// Prompt id, for provenance and judges.
    #[arg(
        id = "harness.prompt_id",
        long = "prompt-id",
        env = "HARNESS_PROMPT_ID"
    )]
    pub prompt_id: Option<String>,
    /// Prompt version.
    #[arg(
        id = "harness.prompt_version",
        long = "prompt-version",
        env = "HARNESS_PROMPT_VERSION"
    )]
    pub prompt_version: Option<String>,
    /// Effect classes whose tool calls wait for a person's approval
    /// (`approval.requested`), e.g. LOCAL_WRITE,DESTRUCTIVE [default: none].
    #[arg(
        id = "harness.approval_required",
        long = "approval-required",
        env = "HARNESS_APPROVAL_REQUIRED"
    )]
    pub approval_required: Option<EffectList>,
    /// Stored messages used as history when a request brings none.
    #[arg(
        id = "harness.history_max_messages",
        long = "history-max-messages",
        env = "HARNESS_HISTORY_MAX_MESSAGES",
        default_value_t = 50
    )]
    pub history_max_messages: u32,
}

/// The folder of notes the retrieval tools search and the write tools
/// change.
#[derive(Debug, Clone, clap::Args)]
pub struct VaultSettings {
    /// Folder of markdown notes (created by the first note written).
    #[arg(
        id = "vault.dir",
        long = "vault-dir",
        env = "HARNESS_VAULT_DIR",
        default_value = "./vault"
    )]
    pub dir: PathBuf,
    /// Index the vault when the service starts (in the background; turns
    /// are served meanwhile).
    #[arg(id = "vault.index_on_start", long = "vault-index-on-start", env = "HARNESS_VAULT_INDEX_ON_START", default_value_t = true, action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub index_on_start: bool,
    /// Embed chunks with this model for ranking by meaning beside words:
    /// openai:{model} (the OpenAI base URL's /embeddings) or ollama:{model}
    /// [default: none, words only].
    #[arg(
        id = "vault.embeddings",
        long = "vault-embeddings",
        env = "HARNESS_VAULT_EMBEDDINGS"
    )]
    pub embeddings: Option<EmbeddingModel>,
}

/// The web tools (offered to turns with `web_mode: on`).
#[derive(Debug, Clone, clap::Args)]
pub struct WebSettings {
    /// A SearXNG-compatible search service (its JSON format); web_search
    /// exists only with one [default: none].
    #[arg(
        id = "web.search_url",
        long = "web-search-url",
        env = "HARNESS_WEB_SEARCH_URL",
        hide_env_values = true
    )]
    pub search_url: Option<HttpUrl>,
    /// Largest page fetch_url reads, in bytes (a longer one is cut there).
    #[arg(id = "web.fetch_max_bytes", long = "web-fetch-max-bytes", env = "HARNESS_WEB_FETCH_MAX_BYTES", default_value_t = 2 * 1024 * 1024)]
    pub fetch_max_bytes: usize,
    /// Longest a search or a fetch may take, in seconds.
    #[arg(
        id = "web.timeout_s",
        long = "web-timeout-s",
        env = "HARNESS_WEB_TIMEOUT_S",
        default_value_t = 15
    )]
    pub timeout_s: u64,
    /// Hosts, addresses or networks fetch_url may reach although they are
    /// internal (loopback, private, link-local), comma-separated
    /// [default: none].
    #[arg(id = "web.allow", long = "web-allow", env = "HARNESS_WEB_ALLOW")]
    pub allow: Option<NetGuard>,
}

impl WebSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        if !(1024..=64 * 1024 * 1024).contains(&self.fetch_max_bytes) {
            return Err(invalid(
                "HARNESS_WEB_FETCH_MAX_BYTES",
                "must be between 1024 and 67108864",
            ));
        }
        within("HARNESS_WEB_TIMEOUT_S", self.timeout_s, 1..=300)
    }

    /// What the web tools are built from.
    pub fn config(&self) -> WebConfig {
        WebConfig {
            search_url: self.search_url.as_ref().map(ToString::to_string),
            fetch_max_bytes: self.fetch_max_bytes,
            timeout: Duration::from_secs(self.timeout_s),
            guard: self.allow.clone().unwrap_or_default(),
        }
    }
}

/// Memory: what the service remembers of a user (or a session) between
/// turns, and the research learner's observations.
#[derive(Debug, Clone, clap::Args)]
pub struct MemorySettings {
    /// Put the scope's relevant memories and its preferences in each
    /// turn's prompt.
    #[arg(id = "memory.retrieval", long = "memory-retrieval", env = "HARNESS_MEMORY_RETRIEVAL", default_value_t = true, action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub retrieval: bool,
    /// After each completed turn, ask the turn's model (in the background)
    /// for facts and preferences worth remembering: one more model call per
    /// turn.
    #[arg(id = "memory.extraction", long = "memory-extraction", env = "HARNESS_MEMORY_EXTRACTION", default_value_t = false, action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub extraction: bool,
    /// Background jobs (memory extraction, judges) run at once.
    #[arg(
        id = "memory.job_concurrency",
        long = "job-concurrency",
        env = "HARNESS_JOB_CONCURRENCY",
        default_value_t = 4
    )]
    pub job_concurrency: u32,
    /// Background jobs that may wait; past it the oldest waiting memory
    /// extractions are given up (judge jobs never are).
    #[arg(
        id = "memory.job_backlog_max",
        long = "job-backlog-max",
        env = "HARNESS_JOB_BACKLOG_MAX",
        default_value_t = 1000
    )]
    pub job_backlog_max: u64,
    /// Memories put in a prompt, at most.
    #[arg(
        id = "memory.top_k",
        long = "memory-top-k",
        env = "HARNESS_MEMORY_TOP_K",
        default_value_t = 8
    )]
    pub top_k: u32,
    /// Longest an extraction call may take, in seconds.
    #[arg(
        id = "memory.timeout_s",
        long = "memory-timeout-s",
        env = "HARNESS_MEMORY_TIMEOUT_S",
        default_value_t = 30
    )]
    pub timeout_s: u64,
    /// Most tokens an extraction's answer may take.
    #[arg(
        id = "memory.max_output_tokens",
        long = "memory-max-output-tokens",
        env = "HARNESS_MEMORY_MAX_OUTPUT_TOKENS",
        default_value_t = 400
    )]
    pub max_output_tokens: u32,
    /// Keep each turn's question and answer as a research observation.
    #[arg(id = "memory.research_learner", long = "research-learner", env = "HARNESS_RESEARCH_LEARNER", default_value_t = true, action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub research_learner: bool,
}

/// LLM judges of turns whose prompt has an id.
#[derive(Debug, Clone, clap::Args)]
pub struct JudgeSettings {
    /// Schedule the declared judges after turns (with HARNESS_PROMPT_ID).
    #[arg(id = "judges.enabled", long = "judges-enabled", env = "HARNESS_JUDGES_ENABLED", default_value_t = true, action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub enabled: bool,
    /// The judges: a JSON list of {name, criteria, prompt_ids, threshold,
    /// model} (a `[[judges.list]]` table each in the file) [default: none].
    #[arg(id = "judges.list", long = "judges", env = "HARNESS_JUDGES")]
    pub list: Option<JudgeList>,
    /// Longest a judge's call may take, in seconds.
    #[arg(
        id = "judges.timeout_s",
        long = "judges-timeout-s",
        env = "HARNESS_JUDGES_TIMEOUT_S",
        default_value_t = 30
    )]
    pub timeout_s: u64,
    /// Most tokens a judge's answer may take.
    #[arg(
        id = "judges.max_output_tokens",
        long = "judges-max-output-tokens",
        env = "HARNESS_JUDGES_MAX_OUTPUT_TOKENS",
        default_value_t = 300
    )]
    pub max_output_tokens: u32,
}

impl MemorySettings {
    fn validate(&self) -> Result<(), ConfigError> {
        within("HARNESS_MEMORY_TOP_K", self.top_k.into(), 1..=50)?;
        within("HARNESS_MEMORY_TIMEOUT_S", self.timeout_s, 1..=300)?;
        within(
            "HARNESS_JOB_CONCURRENCY",
            self.job_concurrency.into(),
            1..=64,
        )?;
        within(
            "HARNESS_JOB_BACKLOG_MAX",
            self.job_backlog_max,
            1..=1_000_000,
        )?;
        within(
            "HARNESS_MEMORY_MAX_OUTPUT_TOKENS",
            self.max_output_tokens.into(),
            50..=8000,
        )
    }
}

impl JudgeSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        within("HARNESS_JUDGES_TIMEOUT_S", self.timeout_s, 1..=300)?;
        within(
            "HARNESS_JUDGES_MAX_OUTPUT_TOKENS",
            self.max_output_tokens.into(),
            50..=8000,
        )
    }
}

/// Tools beyond the built-in ones.
#[derive(Debug, Clone, clap::Args)]
pub struct ToolSettings {
    /// HTTP APIs as tools: a JSON list of {name, description, parameters,
    /// method, url, headers, effect, timeout_s} (a `[[tools.http]]` table
    /// each in the file); `${NAME}` in a header value is read from the
    /// environment at start [default: none].
    #[arg(id = "tools.http", long = "http-tools", env = "HARNESS_HTTP_TOOLS")]
    pub http: Option<HttpToolList>,
    /// MCP servers whose tools join the registry as `{server}__{tool}`: a
    /// JSON list of {name, command, args, env} (stdio) or {name, url,
    /// headers} (streamable HTTP), each with an optional timeout_s (a
    /// `[[tools.mcp]]` table each in the file) [default: none].
    #[arg(id = "tools.mcp", long = "mcp-servers", env = "HARNESS_MCP_SERVERS")]
    pub mcp: Option<McpServerList>,
}

/// Logs and traces.
#[derive(Debug, Clone, clap::Args)]
pub struct TelemetrySettings {
    /// Log lines as text or json.
    #[arg(
        id = "telemetry.log_format",
        long = "log-format",
        env = "HARNESS_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
    /// tracing filter directives (RUST_LOG is read when this is not set).
    #[arg(
        id = "telemetry.log",
        long = "log",
        env = "HARNESS_LOG",
        default_value = "info"
    )]
    pub log: String,
    /// OTLP/HTTP endpoint for traces [default: no trace export].
    #[arg(
        id = "telemetry.otlp_endpoint",
        long = "otel-exporter-otlp-endpoint",
        env = "OTEL_EXPORTER_OTLP_ENDPOINT",
        hide_env_values = true
    )]
    pub otlp_endpoint: Option<HttpUrl>,
    /// How spans are sent: http/protobuf or http/json (gRPC is not built
    /// in).
    #[arg(
        id = "telemetry.otlp_protocol",
        long = "otel-exporter-otlp-protocol",
        env = "OTEL_EXPORTER_OTLP_PROTOCOL",
        value_enum,
        default_value = "http/protobuf"
    )]
    pub otlp_protocol: OtlpProtocol,
    /// The `service.name` of the spans [default: `service.name` of
    /// OTEL_RESOURCE_ATTRIBUTES, else agent-harness].
    #[arg(
        id = "telemetry.service_name",
        long = "otel-service-name",
        env = "OTEL_SERVICE_NAME"
    )]
    pub service_name: Option<String>,
    /// More resource attributes of the spans, `key=value,key=value`
    /// (`service.name` here counts when OTEL_SERVICE_NAME is not set)
    /// [default: none].
    #[arg(
        id = "telemetry.resource_attributes",
        long = "otel-resource-attributes",
        env = "OTEL_RESOURCE_ATTRIBUTES"
    )]
    pub resource_attributes: Option<ResourceAttributes>,
    /// Record prompt and completion text on spans.
    #[arg(id = "telemetry.capture_content", long = "telemetry-capture-content", env = "HARNESS_TELEMETRY_CAPTURE_CONTENT", default_value_t = false, action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub capture_content: bool,
    /// Keep message text out of decision records, spans and logs.
    #[arg(id = "telemetry.redact_logs", long = "redact-logs", env = "HARNESS_REDACT_LOGS", default_value_t = false, action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub redact_logs: bool,
}

impl TelemetrySettings {
    fn validate(&self) -> Result<(), ConfigError> {
        tracing_subscriber::EnvFilter::try_new(&self.log)
            .map(drop)
            .map_err(|e| invalid("HARNESS_LOG", e.to_string()))
    }
}

fn default_instance_id() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.trim().is_empty())
        .unwrap_or_else(|| "local".to_owned())
}

/// The built-in defaults (what `--help` shows), with nothing read from the
/// environment.
impl Default for Settings {
    fn default() -> Self {
        match Self::load_from(["agent-harness"], |_| None) {
            Ok(settings) => settings,
            // The defaults are checked by `the_defaults_are_valid_and_local`.
            Err(e) => unreachable!("the built-in defaults are invalid: {e}"),
        }
    }
}

impl Settings {
    /// The model catalogue: the built-in models with `HARNESS_MODELS` and
    /// `HARNESS_PRICING` over them; an unknown model's window is
    /// `HARNESS_CONTEXT_WINDOW_TOKENS`.
    pub fn model_catalogue(&self) -> crate::providers::catalogue::ModelCatalogue {
        crate::providers::catalogue::ModelCatalogue::new(
            &self.providers.models,
            &self.providers.pricing,
            self.harness.context_window_tokens,
        )
    }

    /// A command with the settings' flags (and no subcommand).
    pub fn command() -> clap::Command {
        use clap::Args as _;
        Self::augment_args(clap::Command::new("agent-harness"))
    }

    /// Loads the settings of the process: its command line, its
    /// environment and the file they name.
    pub fn load() -> Result<Self, ConfigError> {
        Self::load_from(std::env::args_os(), |name| std::env::var(name).ok())
    }

    /// [`Settings::load`] from explicit arguments and environment.
    pub fn load_from<I, T>(
        args: I,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let matches = load_matches(Self::command(), args, env)?;
        Self::from_matches(&matches)
    }

    /// The settings of matches [`load_matches`] made, validated.
    pub fn from_matches(matches: &clap::ArgMatches) -> Result<Self, ConfigError> {
        use clap::FromArgMatches as _;
        let settings = Self::from_arg_matches(matches).map_err(ConfigError::Cli)?;
        settings.validate()?;
        Ok(settings)
    }

    /// Checks ranges and settings that depend on one another (a value's
    /// shape is checked when it is parsed).
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.server.validate()?;
        self.database.validate()?;
        self.providers.validate()?;
        self.harness.validate()?;
        self.web.validate()?;
        self.memory.validate()?;
        self.judges.validate()?;
        self.telemetry.validate()
    }

    /// The chain of providers to ask, in order.
    pub fn provider_chain(&self) -> Vec<ProviderRef> {
        self.providers.chain()
    }

    /// The async runtime's worker threads: the setting, else one a core.
    /// Fewer workers (one on two cores with SQLite, whose writer has a
    /// thread of its own) cost less CPU a turn at low load, as fewer idle
    /// workers are woken, but lengthen the wait of turns that start
    /// together (BENCHMARKS.md, issue 23).
    pub fn worker_threads(&self, cores: usize) -> usize {
        self.server.worker_threads.unwrap_or(cores.max(1))
    }
}

fn invalid(name: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        name: name.to_owned(),
        reason: reason.into(),
    }
}

/// Fails with `name` when `value` is 0.
fn positive(name: &'static str, value: u64) -> Result<(), ConfigError> {
    if value == 0 {
        return Err(invalid(name, "must be greater than 0"));
    }
    Ok(())
}

/// Fails with `name` when `value` is outside `range`.
fn within(
    name: &'static str,
    value: u64,
    range: std::ops::RangeInclusive<u64>,
) -> Result<(), ConfigError> {
    if !range.contains(&value) {
        return Err(invalid(
            name,
            format!("must be between {} and {}", range.start(), range.end()),
        ));
    }
    Ok(())
}

impl ServerSettings {
    /// Whether requests need a key, `auto` resolved by the listen address.
    pub fn auth_required(&self) -> bool {
        match self.auth {
            AuthMode::On => true,
            AuthMode::Off => false,
            AuthMode::Auto => !self.listen.ip().is_loopback(),
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        positive("HARNESS_BODY_LIMIT_BYTES", self.body_limit_bytes as u64)?;
        positive("HARNESS_HEADER_READ_TIMEOUT_S", self.header_read_timeout_s)?;
        positive("HARNESS_IDLE_TIMEOUT_S", self.idle_timeout_s)?;
        positive("HARNESS_BODY_READ_TIMEOUT_S", self.body_read_timeout_s)?;
        positive(
            "HARNESS_MAX_CONNECTIONS",
            self.max_connections.unwrap_or(1) as u64,
        )?;
        positive("HARNESS_SSE_KEEPALIVE_S", self.sse_keepalive_s)?;
        positive("HARNESS_HEARTBEAT_INTERVAL_S", self.heartbeat_interval_s)?;
        if let Some(threads) = self.worker_threads {
            within("HARNESS_WORKER_THREADS", threads as u64, 1..=1024)?;
        }
        if self.idle_timeout_s < self.header_read_timeout_s {
            return Err(invalid(
                "HARNESS_IDLE_TIMEOUT_S",
                "must be at least HARNESS_HEADER_READ_TIMEOUT_S",
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
        if self.instance_id.is_empty() || self.instance_id.len() > 128 {
            return Err(invalid(
                "HARNESS_INSTANCE_ID",
                "must be 1 to 128 characters",
            ));
        }
        Ok(())
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
}

impl DatabaseSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.max_connections == 0 {
            return Err(invalid(
                "HARNESS_DATABASE_MAX_CONNECTIONS",
                "must be at least 1",
            ));
        }
        within(
            "HARNESS_DATABASE_ACQUIRE_TIMEOUT_MS",
            self.acquire_timeout_ms,
            100..=60_000,
        )?;
        within(
            "HARNESS_DATABASE_CALL_TIMEOUT_MS",
            self.call_timeout_ms,
            100..=600_000,
        )?;
        positive("HARNESS_EVENT_BATCH_MAX", self.event_batch_max as u64)?;
        positive(
            "HARNESS_EVENT_QUEUE_CAPACITY",
            self.event_queue_capacity as u64,
        )?;
        within("HARNESS_EVENT_LINGER_MS", self.event_linger_ms, 0..=100)
    }

    /// The store's use of its connections, as set.
    pub fn limits(&self) -> crate::store::PoolLimits {
        crate::store::PoolLimits {
            max_connections: self.max_connections,
            acquire_timeout: Duration::from_millis(self.acquire_timeout_ms),
            call_timeout: Duration::from_millis(self.call_timeout_ms),
        }
    }
}

impl ProviderSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.model.trim().is_empty() {
            return Err(invalid("HARNESS_MODEL", "must not be empty"));
        }
        if self.ollama_host.as_str().is_empty() {
            return Err(invalid("OLLAMA_HOST", "must not be empty"));
        }
        if self.anthropic_max_tokens == 0 {
            return Err(invalid(
                "HARNESS_ANTHROPIC_MAX_TOKENS",
                "must be at least 1",
            ));
        }
        within(
            "HARNESS_PROVIDER_MAX_ATTEMPTS",
            self.max_attempts.into(),
            1..=10,
        )?;
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
        positive("HARNESS_PROVIDER_IDLE_TIMEOUT_S", self.idle_timeout_s)?;
        positive("HARNESS_PROVIDER_CONNECT_TIMEOUT_S", self.connect_timeout_s)?;
        if self.max_response_bytes < 1024 {
            return Err(invalid(
                "HARNESS_PROVIDER_MAX_RESPONSE_BYTES",
                "must be at least 1024",
            ));
        }
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

impl HarnessSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        positive("HARNESS_TURN_TIMEOUT_S", self.turn_timeout_s)?;
        within("HARNESS_MAX_STEPS", self.max_steps.into(), 1..=100)?;
        within(
            "HARNESS_MAX_TOOL_CALLS",
            self.max_tool_calls.into(),
            1..=100,
        )?;
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
        Ok(())
    }

    pub fn turn_timeout(&self) -> Duration {
        Duration::from_secs(self.turn_timeout_s)
    }
}

#[cfg(test)]
mod tests;
