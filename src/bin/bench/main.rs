//! `bench`: what agent-harness adds on top of an LLM provider, measured.
//!
//! One command (`cargo run --release --bin bench -- run`) starts, on
//! loopback, a fast fake provider (OpenAI and Anthropic streaming formats)
//! and agent-harness (this same release binary, in its own process), then
//! drives both with the same SSE-aware load client and prints, per
//! scenario, the figures straight from the provider beside the figures
//! through agent-harness. See BENCHMARKS.md.

#![allow(clippy::print_stdout, reason = "the bench prints its report on stdout")]

mod client;
mod fake;
mod procs;
mod scenarios;
mod stats;

use std::{net::SocketAddr, path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "bench", about = "Measure agent-harness against its provider")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the scenarios and print their figures.
    Run {
        /// Scenarios to run (default: all): startup, overhead, ttft, tools, streams, held, eventlog.
        #[arg(long, value_delimiter = ',')]
        scenarios: Vec<String>,
        /// Also run the database scenarios on this Postgres URL.
        #[arg(long)]
        postgres: Option<String>,
        /// Fewer requests per scenario (for a smoke run).
        #[arg(long)]
        quick: bool,
        /// Concurrent turns of the `streams` scenario (default 1,000; 100 with --quick).
        #[arg(long)]
        streams: Option<usize>,
    },
    /// (internal) Serve the fake provider.
    FakeProvider {
        #[arg(long)]
        listen: SocketAddr,
    },
    /// (internal) Serve agent-harness with the bench tool.
    Harness {
        #[arg(long)]
        listen: SocketAddr,
        #[arg(long)]
        database_url: String,
        #[arg(long)]
        provider: String,
        #[arg(long, default_value_t = 60)]
        turn_timeout_s: u64,
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("bench: cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Run {
                scenarios,
                postgres,
                quick,
                streams,
            } => scenarios::run(scenarios, postgres, quick, streams).await,
            Command::FakeProvider { listen } => fake::serve(listen).await,
            Command::Harness {
                listen,
                database_url,
                provider,
                turn_timeout_s,
                data_dir: _,
            } => procs::serve_harness(listen, database_url, provider, turn_timeout_s).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e}");
            ExitCode::FAILURE
        }
    }
}
