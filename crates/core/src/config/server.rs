//! `[server]`: the HTTP edge and the life of the process among its
//! replicas.

use std::net::SocketAddr;
use std::time::Duration;

use super::{AgentSkills, AuthMode, ConfigError, CorsOrigins, HttpUrl, invalid};

/// The HTTP edge and the life of the process among its replicas.
#[derive(Debug, Clone, clap::Args)]
pub struct ServerSettings {
    /// Address the HTTP server binds.
    #[arg(
        id = "server.listen",
        long = "listen",
        default_value = "127.0.0.1:8080"
    )]
    pub listen: SocketAddr,
    /// Largest request body, in bytes.
    #[arg(id = "server.body_limit_bytes", long = "body-limit-bytes", default_value_t = 1024 * 1024, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub body_limit_bytes: usize,
    /// Time a request's head has to arrive once its first byte came, in seconds.
    #[arg(
        id = "server.header_read_timeout_s",
        long = "header-read-timeout-s",
        default_value_t = 10,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub header_read_timeout_s: u64,
    /// Time a connection may wait for a request's first byte (a new one's
    /// from its accept), in seconds: keep it above the idle timeout of a
    /// load balancer or client pool in front.
    #[arg(
        id = "server.idle_timeout_s",
        long = "idle-timeout-s",
        default_value_t = 75,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub idle_timeout_s: u64,
    /// Time a request body has to arrive whole, in seconds.
    #[arg(
        id = "server.body_read_timeout_s",
        long = "body-read-timeout-s",
        default_value_t = 30,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub body_read_timeout_s: u64,
    /// Connections open at once; when full, a new one takes the place of the one waiting longest [default: three quarters of the open-file limit].
    #[arg(
        id = "server.max_connections",
        long = "max-connections",
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
    )]
    pub max_connections: Option<usize>,
    /// Browser origins allowed to call the API (CORS): a comma-separated
    /// list of scheme://host[:port], or `*` [default: none].
    #[arg(id = "server.cors_origins", long = "cors-origins")]
    pub cors_origins: Option<CorsOrigins>,
    /// Whether requests need an API key (`Authorization: Bearer`, made with
    /// `agent-harness keys create`): on, off, or auto (on unless listening
    /// on loopback only).
    #[arg(id = "server.auth", long = "auth", value_enum, default_value = "auto")]
    pub auth: AuthMode,
    /// Requests a key may make per minute (a bucket that refills
    /// steadily; past it, 429 with Retry-After); 0: no limit.
    #[arg(
        id = "server.rate_limit_per_minute",
        long = "rate-limit-per-minute",
        default_value_t = 600
    )]
    pub rate_limit_per_minute: u32,
    /// Failed authentications a client address may make per minute (a
    /// bucket that refills steadily; past it, 429 `too_many_auth_failures`
    /// for a key no API key's hash matches, before it is looked up; a key
    /// that verifies is never refused); 0: no limit.
    #[arg(
        id = "server.auth_failures_per_minute",
        long = "auth-failures-per-minute",
        default_value_t = 30
    )]
    pub auth_failures_per_minute: u32,
    /// The proxies in front of the service (addresses or networks,
    /// comma-separated, e.g. the gateway's): a request from one of them is
    /// counted against the client its `X-Forwarded-For` names (the
    /// nearest address that is not a proxy) [default: none; the header
    /// is ignored, and every client behind a proxy shares its address].
    #[arg(id = "server.trusted_proxies", long = "trusted-proxies")]
    pub trusted_proxies: Option<super::TrustedProxies>,
    /// Browser origins that may call the service besides its own (a
    /// comma-separated list of scheme://host[:port], or `*`); a request
    /// from any other `Origin` is 403 `origin_not_allowed` on every route
    /// while keys are off, and on `/mcp` always [default: none; the CORS
    /// origins count too].
    #[arg(id = "server.allowed_origins", long = "allowed-origins")]
    pub allowed_origins: Option<CorsOrigins>,
    /// The URL clients reach the service at (behind a gateway, the
    /// gateway's): the public agent card names it, never the request's
    /// `Host` [default: http:// and the listen address, `localhost` for an
    /// unspecified one].
    #[arg(id = "server.public_url", long = "public-url")]
    pub public_url: Option<HttpUrl>,
    /// Serve `/metrics` on this address instead of the main listener
    /// (which then answers it 404) [default: the main listener].
    #[arg(id = "server.metrics_listen", long = "metrics-listen")]
    pub metrics_listen: Option<SocketAddr>,
    /// The skills the public A2A agent card declares, as JSON
    /// ([{"id", "name", "description", "tags"?, "examples"?}]) [default:
    /// one `chat` skill]. The card names no tool; the extended card
    /// (`GetExtendedAgentCard`, with a key when keys are on) lists them.
    #[arg(id = "server.agent_skills", long = "agent-skills")]
    pub agent_skills: Option<AgentSkills>,
    /// The agent profiles the MCP server offers as prompts, as JSON
    /// ([{"name", "text" with {{argument}}s, "arguments"?: [{"name",
    /// "description"?, "required"?, "values"?}], "title"?,
    /// "description"?}]) [default: one `research` profile, its `topic`
    /// required].
    #[arg(id = "server.agent_profiles", long = "agent-profiles")]
    pub agent_profiles: Option<super::AgentProfiles>,
    /// Running turns a tenant may have at once, counted across replicas
    /// (in the database); past it, 429 `tenant_busy`. A tenant's own limit
    /// (`agent-harness tenants set`) overrides it.
    #[arg(
        id = "server.tenant_max_running_turns",
        long = "tenant-max-running-turns",
        default_value_t = 64,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub tenant_max_running_turns: u32,
    /// Requests a tenant may have in flight in one process (open event
    /// streams, queue waits, callers waiting for a turn's end); past it,
    /// 429 `too_many_streams`. A tenant's own limit overrides it.
    #[arg(
        id = "server.tenant_max_streams",
        long = "tenant-max-streams",
        default_value_t = 256,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub tenant_max_streams: u32,
    /// Input and output tokens a tenant's turns may use per UTC day; a
    /// turn that would start past it is refused (429 `quota_exceeded`)
    /// [default: no quota]. A tenant's own quota overrides it.
    #[arg(
        id = "server.tenant_tokens_per_day",
        long = "tenant-tokens-per-day",
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub tenant_tokens_per_day: Option<u64>,
    /// Bytes one file may have (an upload to `/files`, or an image or
    /// file a message carries inline); past it, 413 `file_too_large`.
    #[arg(
        id = "server.file_max_bytes",
        long = "file-max-bytes",
        default_value_t = 20 * 1024 * 1024,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub file_max_bytes: u64,
    /// Bytes a tenant's files may take in all, the same bytes counted
    /// once; past it, 429 `quota_exceeded` (shown in `GET /usage`).
    #[arg(
        id = "server.tenant_file_bytes",
        long = "tenant-file-bytes",
        default_value_t = 1024 * 1024 * 1024,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub tenant_file_bytes: u64,
    /// What an OpenAI-compatible provider is sent for an image a message
    /// gave by its `https` URL: `inline` (a data URL of the bytes the
    /// service fetched and stored) or `pass` (the URL itself, for the
    /// provider to fetch; the service still fetches and stores a copy,
    /// for its checks, its history and other providers).
    #[arg(
        id = "server.file_urls",
        long = "file-urls",
        value_enum,
        default_value = "inline"
    )]
    pub file_urls: crate::files::FileUrls,
    /// How long a session is kept after its last activity: a span such as
    /// `30d`, `12h` or `90s`; older sessions are erased whole (as `DELETE
    /// /sessions/{id}` does), never one whose turn runs or waits [default:
    /// kept forever]. A tenant's own retention (`agent-harness tenants
    /// set --retention`) overrides it.
    #[arg(id = "server.retention", long = "retention")]
    pub retention: Option<super::Span>,
    /// How often the retention sweep runs (on one replica at a time).
    #[arg(
        id = "server.retention_sweep_interval",
        long = "retention-sweep-interval",
        default_value = "10m"
    )]
    pub retention_sweep_interval: super::Span,
    /// How long the audit trail keeps a row: a span such as `400d`;
    /// older rows are removed by the retention sweep [default: kept
    /// forever].
    #[arg(id = "server.audit_retention", long = "audit-retention")]
    pub audit_retention: Option<super::Span>,
    /// With keys off, let callers use the admin routes (erase a tenant,
    /// import a session, read the audit trail); with keys on, only an
    /// admin key may (`agent-harness keys create --admin`).
    #[arg(
        id = "server.allow_local_admin",
        long = "allow-local-admin",
        default_value_t = false,
        action = clap::ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub allow_local_admin: bool,
    /// Seconds between SSE keep-alive comments.
    #[arg(
        id = "server.sse_keepalive_s",
        long = "sse-keepalive-s",
        default_value_t = 15,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub sse_keepalive_s: u64,
    /// Seconds running turns get to finish at shutdown.
    #[arg(
        id = "server.shutdown_grace_s",
        long = "shutdown-grace-s",
        default_value_t = 30
    )]
    pub shutdown_grace_s: u64,
    /// Let A2A push notifications go to loopback, private, link-local and
    /// other internal addresses (tests, private networks); by default
    /// only public addresses are pushed to.
    #[arg(id = "server.outbound_allow_private", long = "outbound-allow-private", default_value_t = false, action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub outbound_allow_private: bool,
    /// A PEM file of certificates the service's own requests (webhooks,
    /// A2A pushes, images fetched by URL) trust as roots besides the
    /// system's: a private CA's [default: the system's alone].
    #[arg(id = "server.outbound_ca_file", long = "outbound-ca-file")]
    pub outbound_ca_file: Option<std::path::PathBuf>,
    /// The operator's webhook endpoint: every tenant's turn and response
    /// events are POSTed to it, signed with HARNESS_WEBHOOK_SECRET
    /// (Standard Webhooks) [default: none].
    #[arg(id = "server.webhook_url", long = "webhook-url")]
    pub webhook_url: Option<HttpUrl>,
    /// The secret the operator's webhooks are signed with: `whsec_` and at
    /// least 24 bytes, base64 (required with HARNESS_WEBHOOK_URL).
    #[arg(
        id = "server.webhook_secret",
        long = "webhook-secret",
        hide_env_values = true
    )]
    pub webhook_secret: Option<super::Secret>,
    /// Name of this replica: turns it left running are interrupted when it
    /// starts again [default: $HOSTNAME, else `local`].
    #[arg(id = "server.instance_id", long = "instance-id", default_value_t = default_instance_id(), hide_default_value = true)]
    pub instance_id: String,
    /// Seconds between heartbeats of running turns.
    #[arg(
        id = "server.heartbeat_interval_s",
        long = "heartbeat-interval-s",
        default_value_t = 5,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub heartbeat_interval_s: u64,
    /// A running turn whose heartbeat is older than this many seconds is an
    /// orphan [default: 1.5 heartbeat intervals, so that an orphan is taken
    /// over within two].
    #[arg(id = "server.stale_turn_after_s", long = "stale-turn-after-s")]
    pub stale_turn_after_s: Option<u64>,
    /// Times a turn whose process died or shut down is taken over by
    /// another (or, on SQLite, by the service started again) before it
    /// ends `interrupted` (0: never taken over).
    #[arg(
        id = "server.turn_max_attempts",
        long = "turn-max-attempts",
        default_value_t = 3,
        value_parser = clap::value_parser!(u32).range(0..=100)
    )]
    pub turn_max_attempts: u32,
    /// Threads that run the service's requests and turns [default: one a
    /// core].
    #[arg(
        id = "server.worker_threads",
        long = "worker-threads",
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024)
    )]
    pub worker_threads: Option<usize>,
}

impl ServerSettings {
    /// The tenants' limits where a tenant has none of its own.
    pub fn tenant_defaults(&self) -> crate::store::TenantLimits {
        crate::store::TenantLimits {
            max_running_turns: Some(self.tenant_max_running_turns),
            max_streams: Some(self.tenant_max_streams),
            tokens_per_day: self.tenant_tokens_per_day,
            retention_s: self.retention.map(|span| span.0.as_secs().max(1)),
            // `HARNESS_REASONING`, which the harness holds.
            show_reasoning: None,
        }
    }

    /// Whom the service's own requests may reach and trust; why the CA
    /// file cannot be read.
    pub fn outbound_trust(&self) -> Result<crate::outbox::Trust, String> {
        crate::outbox::Trust::load(
            self.outbound_allow_private,
            self.outbound_ca_file.as_deref(),
        )
    }

    /// What a file may be.
    pub fn file_limits(&self) -> crate::files::FileLimits {
        crate::files::FileLimits {
            max_bytes: self.file_max_bytes,
            tenant_bytes: self.tenant_file_bytes,
        }
    }

    /// Where clients reach the service, without a trailing `/`.
    pub fn public_url(&self) -> String {
        match &self.public_url {
            Some(url) => url.as_str().trim_end_matches('/').to_owned(),
            None if self.listen.ip().is_unspecified() => {
                format!("http://localhost:{}", self.listen.port())
            }
            None => format!("http://{}", self.listen),
        }
    }

    /// Whether requests need a key, `auto` resolved by the listen address.
    pub fn auth_required(&self) -> bool {
        match self.auth {
            AuthMode::On => true,
            AuthMode::Off => false,
            AuthMode::Auto => !self.listen.ip().is_loopback(),
        }
    }

    /// Ranges are checked as each value is parsed; these depend on
    /// another setting.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
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
        match (&self.webhook_url, &self.webhook_secret) {
            (Some(_), None) => {
                return Err(invalid(
                    "HARNESS_WEBHOOK_SECRET",
                    "is required with HARNESS_WEBHOOK_URL",
                ));
            }
            (_, Some(secret)) if !crate::signing::secret_is_valid(secret.expose()) => {
                return Err(invalid(
                    "HARNESS_WEBHOOK_SECRET",
                    "must be `whsec_` and at least 24 bytes, base64",
                ));
            }
            _ => {}
        }
        if self.instance_id.is_empty() || self.instance_id.len() > 128 {
            return Err(invalid(
                "HARNESS_INSTANCE_ID",
                "must be 1 to 128 characters",
            ));
        }
        if let Err(why) = self.outbound_trust() {
            return Err(invalid("HARNESS_OUTBOUND_CA_FILE", why));
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

pub(super) fn default_instance_id() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.trim().is_empty())
        .unwrap_or_else(|| "local".to_owned())
}
