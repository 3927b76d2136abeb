//! The `agent-harness` binary: `serve` (the default), and the commands
//! beside it (`migrate`, `index-vault`, `keys`, `openapi`, `chat`, `health`).

use std::{io::Write as _, process::ExitCode};

use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};

use agent_harness::startup;
use harness_core::{
    config::{self, ConfigError, Settings},
    telemetry,
};

mod cli;

use cli::{
    admin::{self, AuditArgs, KeyAction, TenantAction},
    chat, health,
    import::import,
    vault::index_vault,
};

/// mimalloc, not the C library's allocator: glibc's `malloc`, `free` and
/// their bins' consolidation were about a tenth of a paced token's CPU.
/// Built without transparent huge pages (`no_thp`): with them, a held
/// stream cost half as much memory again (measured in the git history
/// of docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Every setting is a flag with an environment variable and a key in the
/// settings file; `--help` lists them.
#[derive(Debug, Parser)]
#[command(
    name = "agent-harness",
    version,
    about = "Runs LLM agent turns over HTTP/SSE"
)]
struct Cli {
    #[command(flatten)]
    settings: Settings,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the HTTP API (the default).
    Serve,
    /// Apply database migrations and exit.
    Migrate,
    /// Index the vault folder into the database's full-text index and exit
    /// (incremental: only notes added or changed since are read again).
    IndexVault,
    /// Print the OpenAPI document and exit.
    Openapi,
    /// Make, list or revoke API keys (`HARNESS_AUTH`).
    Keys {
        #[command(subcommand)]
        action: KeyAction,
    },
    /// Set or list tenants' own limits (over `HARNESS_TENANT_*`).
    Tenants {
        #[command(subcommand)]
        action: TenantAction,
    },
    /// Print the audit trail, oldest first, one JSON object a line.
    Audit(AuditArgs),
    /// Make a session from an export (`GET /sessions/{id}/export`), in
    /// this database, for a tenant; whole or not at all.
    Import {
        /// The export (JSON Lines); `-` reads standard input.
        file: std::path::PathBuf,
        /// The tenant the session is made for.
        #[arg(long, default_value = "default")]
        tenant: String,
    },
    /// Send a message to a running service and print the answer as it
    /// streams (tool activity on standard error).
    Chat(chat::ChatArgs),
    /// Ask a running service whether it is ready (`GET /readyz`); exit 0
    /// when it is, 1 when not (a container's HEALTHCHECK).
    Health {
        /// What to ask [default: /readyz on loopback at HARNESS_LISTEN's port].
        #[arg(long)]
        url: Option<String>,
    },
}

/// The command line, the environment and the settings file, checked.
fn load() -> Result<Cli, ConfigError> {
    let matches = config::load_matches(Cli::command(), std::env::args_os(), |name| {
        std::env::var(name).ok()
    })?;
    let cli = Cli::from_arg_matches(&matches).map_err(ConfigError::Cli)?;
    cli.settings.validate()?;
    Ok(cli)
}

fn main() -> ExitCode {
    let cli = match load() {
        Ok(cli) => cli,
        // Help, the version, or a command line clap refuses.
        Err(ConfigError::Cli(e)) => e.exit(),
        Err(e) => {
            eprintln!("agent-harness: configuration error: {e}");
            return ExitCode::from(2);
        }
    };
    let settings = cli.settings;
    let command = cli.command;
    if let Some(Command::Chat(args)) = command {
        return match runtime(&mut tokio::runtime::Builder::new_current_thread()) {
            Ok(runtime) => runtime.block_on(chat::run(args)),
            Err(code) => code,
        };
    }
    if let Some(Command::Health { url }) = &command {
        let url = url.clone().unwrap_or_else(|| {
            format!("http://127.0.0.1:{}/readyz", settings.server.listen.port())
        });
        return match runtime(&mut tokio::runtime::Builder::new_current_thread()) {
            Ok(runtime) => runtime.block_on(health::run(&url)),
            Err(code) => code,
        };
    }
    if matches!(command, Some(Command::Openapi)) {
        // The document is this command's output; a closed pipe is an error.
        let mut stdout = std::io::stdout().lock();
        return match stdout.write_all(agent_harness::http::openapi_yaml().as_bytes()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("agent-harness: cannot write the document: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(settings.worker_threads(cores));
    let runtime = match runtime(&mut builder) {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    runtime.block_on(async move {
        let telemetry = match telemetry::init(&settings) {
            Ok(guard) => guard,
            Err(e) => {
                eprintln!("agent-harness: configuration error: {e}");
                return ExitCode::from(2);
            }
        };
        let result = match command {
            Some(Command::Migrate) => admin::migrate(&settings).await,
            Some(Command::IndexVault) => index_vault(&settings).await,
            Some(Command::Keys { action }) => admin::keys(&settings, action).await,
            Some(Command::Tenants { action }) => admin::tenants(&settings, action).await,
            Some(Command::Audit(args)) => admin::print_audit(&settings, args).await,
            Some(Command::Import { file, tenant }) => import(&settings, &file, &tenant).await,
            _ => serve(settings).await,
        };
        telemetry.shutdown();
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!("{e}");
                eprintln!("agent-harness: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

async fn serve(settings: Settings) -> Result<(), cli::error::CliError> {
    tracing::info!(settings = ?settings, "starting");
    let application = startup::Application::build(settings).await?;
    tracing::info!(port = application.port(), "listening");
    let shutdown = application.shutdown_token();
    let running = application.run_until_stopped();
    tokio::pin!(running);
    let result = tokio::select! {
        result = &mut running => result,
        () = startup::shutdown_signal() => {
            shutdown.cancel();
            running.await
        }
    };
    Ok(result?)
}

/// The async runtime `builder` makes (with its I/O and timers), or the
/// exit code of a process that could not start one (said on stderr).
fn runtime(builder: &mut tokio::runtime::Builder) -> Result<tokio::runtime::Runtime, ExitCode> {
    builder.enable_all().build().map_err(|e| {
        eprintln!("agent-harness: cannot start the async runtime: {e}");
        ExitCode::FAILURE
    })
}
