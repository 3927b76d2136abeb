//! `bench`: what agent-harness adds on top of an LLM provider, measured.
//!
//! One command (`cargo run --release -p bench -- run`) starts, on
//! loopback, a fast fake provider (OpenAI and Anthropic streaming formats)
//! and agent-harness (this same release binary, in its own process), then
//! drives both with the same SSE-aware load client and prints, per
//! scenario, the figures straight from the provider beside the figures
//! through agent-harness. See docs/benchmarks.md.

#![allow(clippy::print_stdout, reason = "the bench prints its report on stdout")]
#![allow(
    clippy::disallowed_methods,
    reason = "a test's (the bench's) own servers and clients live as long as it does"
)]
#![allow(
    clippy::too_many_lines,
    reason = "a measurement is one procedure told whole; the lint holds in the service code"
)]

mod client;
mod compare;
mod fake;
mod images;
mod procs;
mod relay;
mod scale;
mod scenarios;
mod stats;
mod tenants;
mod tree;

use std::{net::SocketAddr, path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};

/// The service's own allocator (src/main.rs): `bench run` runs the service
/// in this binary, and measures it as it ships.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
        /// Scenarios to run (default: all but scale): startup, overhead, ttft, tools, images, tree, fork, streams, held, eventlog, replicas, takeover, tenants, scale.
        #[arg(long, value_delimiter = ',')]
        scenarios: Vec<String>,
        /// Also run the database scenarios on this Postgres URL.
        #[arg(long)]
        postgres: Option<String>,
        /// Fewer requests per scenario (for a smoke run).
        #[arg(long)]
        quick: bool,
        /// Concurrent turns of the `streams` scenario (default 1,000; 100 with --quick) and of the `scale` scenario's paced streams (default 10,000; 1,000 with --quick).
        #[arg(long)]
        streams: Option<usize>,
    },
    /// Run agent-harness binaries alternately on the same workloads and
    /// print their figures side by side (see docs/benchmarks.md).
    Compare {
        /// Release binaries of agent-harness, the one to compare against first (one is
        /// enough with --floor).
        #[arg(required = true, num_args = 1..)]
        binaries: Vec<PathBuf>,
        /// Rounds (each workload on each binary once per round, the binaries in alternating order).
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Seconds per measured point.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Run on this Postgres server (a fresh database per binary and round) instead of SQLite.
        #[arg(long)]
        postgres: Option<String>,
        /// Only these workloads (default: all but katan): c=1, c=32, ttft, tools, ttft-in-step, c=256, eventlog, paced, katan (against llm-katan's echo backend; `pip install llm-katan`, or its command in BENCH_KATAN).
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
        /// Each binary on this many cores of its own, the fake provider and the client on
        /// others (pinned with taskset).
        #[arg(long)]
        service_cores: Option<usize>,
        /// Also run `bench relay` beside the binaries, as the last: the floor under
        /// their cost per token (a relay of the provider's stream and nothing else).
        #[arg(long)]
        floor: bool,
    },
    /// (internal) Relay a provider's stream and nothing else, configured as
    /// `bench compare` configures a binary (the floor of `compare --floor`).
    Relay,
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
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    // The service under test gets the runtime it gets in production.
    if let Command::Harness { database_url, .. } = &cli.command
        && let Some(workers) = procs::harness_workers(database_url)
    {
        builder.worker_threads(workers);
    }
    let runtime = match builder.enable_all().build() {
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
            Command::Compare {
                binaries,
                rounds,
                seconds,
                postgres,
                only,
                service_cores,
                floor,
            } => {
                compare::run(compare::Options {
                    binaries,
                    rounds,
                    seconds,
                    postgres,
                    only,
                    service_cores,
                    floor,
                })
                .await
            }
            Command::Relay => relay::serve().await,
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
