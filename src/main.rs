//! The `agent-harness` binary: `serve` (default) or `migrate`.

use std::{io::Write as _, process::ExitCode};

use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};

use agent_harness::{
    config::{self, ConfigError, Settings},
    startup, store, telemetry,
};

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
    /// Print the OpenAPI document and exit.
    Openapi,
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
    if matches!(cli.command, Some(Command::Openapi)) {
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
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("agent-harness: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let telemetry = match telemetry::init(&settings) {
            Ok(guard) => guard,
            Err(e) => {
                eprintln!("agent-harness: configuration error: {e}");
                return ExitCode::from(2);
            }
        };
        let result = match cli.command {
            Some(Command::Migrate) => migrate(&settings).await,
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

async fn migrate(settings: &Settings) -> Result<(), String> {
    let store = store::connect(
        settings.database.url.as_str(),
        1,
        settings.database.acquire_timeout(),
    )
    .await
    .map_err(|e| e.to_string())?;
    store.migrate().await.map_err(|e| e.to_string())?;
    tracing::info!(backend = store.backend(), "migrations applied");
    Ok(())
}

async fn serve(settings: Settings) -> Result<(), String> {
    tracing::info!(settings = ?settings, "starting");
    let application = startup::Application::build(settings)
        .await
        .map_err(|e| e.to_string())?;
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
    result.map_err(|e| e.to_string())
}
