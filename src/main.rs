//! The `agent-harness` binary: `serve` (default) or `migrate`.

use std::{io::Write as _, path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};

use agent_harness::{config::Settings, startup, store, telemetry};

#[derive(Debug, Parser)]
#[command(
    name = "agent-harness",
    version,
    about = "Runs LLM agent turns over HTTP/SSE"
)]
struct Cli {
    /// TOML file with settings (the environment overrides it).
    #[arg(long, global = true, env = "HARNESS_CONFIG")]
    config: Option<PathBuf>,
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let settings = match Settings::load(cli.config.as_deref()) {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("agent-harness: configuration error: {e}");
            return ExitCode::from(2);
        }
    };
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
        &settings.database_url,
        1,
        std::time::Duration::from_millis(settings.database_acquire_timeout_ms),
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
