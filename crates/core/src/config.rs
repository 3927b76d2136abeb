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
//! a number against its range by its parser (`value_parser!(u64).range(..)`
//! beside the setting), and [`Settings::validate`] checks the settings that
//! depend on one another. Errors name the variable, flag or file key the value came from.
//! Secrets never print: see [`Secret`].

mod database;
mod harness;
mod judges;
mod load;
mod memory;
mod profiles;
mod providers;
mod proxies;
mod server;
mod telemetry;
mod tools;
mod values;
mod vault;
mod web;

use std::path::PathBuf;

pub use database::DatabaseSettings;
pub use harness::HarnessSettings;
pub use judges::JudgeSettings;
pub use load::{ConfigError, load_matches};
pub use memory::MemorySettings;
pub use profiles::{AgentProfile, AgentProfiles, ProfileArgument, variables};
pub use providers::ProviderSettings;
pub use proxies::TrustedProxies;
pub use server::ServerSettings;
pub use telemetry::TelemetrySettings;
pub use tools::ToolSettings;
pub use values::{
    AgentSkills, AuthMode, CorsOrigins, DatabaseUrl, EffectList, EmbeddingModel, HostUrl, HttpUrl,
    LogFormat, OtlpProtocol, ProviderKind, ProviderList, ProviderRef, ResourceAttributes, Secret,
    Span, redact_url,
};
pub use vault::VaultSettings;
pub use web::WebSettings;

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

    /// A command with the settings' flags and variables (and no
    /// subcommand).
    pub fn command() -> clap::Command {
        use clap::Args as _;
        load::with_variables(Self::augment_args(clap::Command::new("agent-harness")))
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

    /// Checks the settings that depend on one another (a value's shape
    /// and range are checked when it is parsed).
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.server.validate()?;
        self.providers.validate()?;
        self.telemetry.validate()
    }

    /// The chain of providers to ask, in order.
    pub fn provider_chain(&self) -> Vec<ProviderRef> {
        self.providers.chain()
    }

    /// The models a request may name: the chain's and
    /// `[providers.models]`'s, in that order. No other name reaches a
    /// provider on the operator's account.
    pub fn allowed_models(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        let listed = self.providers.models.0.keys().cloned();
        for name in self
            .provider_chain()
            .into_iter()
            .map(|p| p.model)
            .chain(listed)
        {
            if !names.contains(&name) {
                names.push(name);
            }
        }
        names
    }

    /// The async runtime's worker threads: the setting, else one a core.
    /// Fewer workers (one on two cores with SQLite, whose writer has a
    /// thread of its own) cost less CPU a turn at low load, as fewer idle
    /// workers are woken, but lengthen the wait of turns that start
    /// together (measured in the git history of docs/benchmarks.md).
    pub fn worker_threads(&self, cores: usize) -> usize {
        self.server.worker_threads.unwrap_or(cores.max(1))
    }
}

pub(super) fn invalid(name: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        name: name.to_owned(),
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests;
