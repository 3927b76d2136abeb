//! The processes of a run: the fake provider and agent-harness, each a
//! child running this binary, and what `/proc` says of them.

use std::{
    net::{SocketAddr, TcpListener},
    process::{Child, Command, Stdio},
    sync::Arc,
    time::Duration,
};

use agent_harness::startup::{Application, build_provider};
use async_trait::async_trait;
use harness_core::{
    config::Settings,
    tools::{EffectClass, Tool, ToolContext, ToolError, ToolErrorKind, ToolOutput, ToolSpec},
};
use harness_store::store;
use serde_json::{Value, json};
use tokio::time::Instant;

/// A child process, killed when dropped.
pub struct Proc {
    child: Child,
    pub addr: SocketAddr,
}

impl Proc {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Its `/metrics` text, or none (no answer, or no such page).
    pub async fn metrics(&self, http: &reqwest::Client) -> Option<String> {
        http.get(format!("{}/metrics", self.url()))
            .send()
            .await
            .ok()?
            .error_for_status()
            .ok()?
            .text()
            .await
            .ok()
    }

    /// Resident memory, KiB.
    pub fn rss_kib(&self) -> u64 {
        self.status_kib("VmRSS:")
    }

    /// Resident memory that is no file's (the heap, stacks), KiB: the
    /// rest is pages of mapped files, such as the SQLite database the
    /// service maps to read.
    pub fn rss_anon_kib(&self) -> u64 {
        self.status_kib("RssAnon:")
    }

    /// A figure of `/proc/<pid>/status` in KiB (0 when it cannot be read).
    fn status_kib(&self, field: &str) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .ok()
            .and_then(|status| {
                status
                    .lines()
                    .find(|l| l.starts_with(field))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|kb| kb.parse().ok())
            })
            .unwrap_or(0)
    }

    /// CPU time used so far (user + system).
    pub fn cpu(&self) -> Duration {
        stat_cpu(self.pid(), false).unwrap_or_default()
    }

    /// CPU time used so far by the process's threads named `name` (zero
    /// when it has none). Under a profiler that forks (`perf record`) the
    /// named threads are its child's, which this does not see.
    pub fn thread_cpu(&self, name: &str) -> Duration {
        let tasks = format!("/proc/{}/task", self.pid());
        let Ok(entries) = std::fs::read_dir(&tasks) else {
            return Duration::ZERO;
        };
        let mut total = Duration::ZERO;
        for entry in entries.flatten() {
            let path = entry.path();
            let named = std::fs::read_to_string(path.join("comm"))
                .is_ok_and(|comm| comm.trim_end() == name);
            if named {
                total += std::fs::read_to_string(path.join("stat"))
                    .ok()
                    .and_then(|stat| parse_cpu(&stat, false))
                    .unwrap_or_default();
            }
        }
        total
    }
}

/// The CPU time (user + system) of process `pid` so far, with that of its
/// children it has reaped if `reaped` (fields 14-17 of `/proc/<pid>/stat`).
fn stat_cpu(pid: u32, reaped: bool) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_cpu(&stat, reaped)
}

/// The CPU time a `/proc/…/stat` line gives (see [`stat_cpu`]).
fn parse_cpu(stat: &str, reaped: bool) -> Option<Duration> {
    let ticks_per_second = 100.0; // USER_HZ on Linux
    // Fields after the command name (which may hold spaces).
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| -> Option<f64> { fields.get(i)?.parse().ok() };
    let mut ticks = field(11)? + field(12)?;
    if reaped {
        ticks += field(13)? + field(14)?;
    }
    Some(Duration::from_secs_f64(ticks / ticks_per_second))
}

/// The parent of process `pid`.
fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// A Postgres server on this machine, found by its postmaster's pid.
pub struct PostgresServer {
    postmaster: u32,
}

impl PostgresServer {
    /// The server behind `url`, when it runs here and this user may read
    /// its data directory's `postmaster.pid`; else `None`.
    pub async fn find(url: &str) -> Option<Self> {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(url)
            .await
            .ok()?;
        let directory: Option<String> = sqlx::query_scalar("SHOW data_directory")
            .fetch_one(&pool)
            .await
            .ok();
        pool.close().await;
        let pid_file = std::fs::read_to_string(format!("{}/postmaster.pid", directory?)).ok()?;
        let postmaster = pid_file.lines().next()?.trim().parse().ok()?;
        stat_cpu(postmaster, true)?;
        Some(Self { postmaster })
    }

    /// CPU time of the whole server so far: the postmaster, every process
    /// it runs (backends, WAL writer, checkpointer…) and those it reaped.
    pub fn cpu(&self) -> Duration {
        let mut total = stat_cpu(self.postmaster, true).unwrap_or_default();
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return total;
        };
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if parent(pid) == Some(self.postmaster) {
                total += stat_cpu(pid, false).unwrap_or_default();
            }
        }
        total
    }
}

impl Proc {
    /// SIGKILL, and reaped.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM (a deploy's stop); does not wait for the exit.
    pub fn terminate(&self) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
    }
}

impl Drop for Proc {
    /// SIGINT first, so that a profiler wrapping the process
    /// (`BENCH_HARNESS_WRAPPER`) writes its data and the service shuts
    /// down; SIGKILL if it has not exited within 10 s.
    fn drop(&mut self) {
        let interrupted = std::process::Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        if interrupted {
            for _ in 0..100 {
                if matches!(self.child.try_wait(), Ok(Some(_))) {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_addr() -> Result<SocketAddr, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port: {e}"))
}

/// Starts this binary with `args`; under `wrapper` (a profiler's command
/// line, e.g. `heaptrack`) when one is given.
fn spawn(args: &[String], env: &[(&str, String)], wrapper: Option<&str>) -> Result<Child, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find myself: {e}"))?;
    let mut words = wrapper.into_iter().flat_map(str::split_whitespace);
    let mut command = match words.next() {
        Some(program) => {
            let mut command = Command::new(program);
            command.args(words).arg(exe);
            command
        }
        None => Command::new(exe),
    };
    command
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start {args:?}: {e}"))
}

/// Starts the agent-harness binary at `binary` as a user runs it: its own
/// defaults, configured by `env` only, in the folder `cwd` (so that
/// whatever it keeps beside it, such as the vault folder, is a fresh one),
/// its standard output (the logs) to /dev/null and its standard error to `log`, on the cores
/// `cpus` only when given. Returns it once `/readyz` answers, with the time that took.
pub async fn start_binary(
    binary: &std::path::Path,
    args: &[&str],
    env: &[(&str, String)],
    cwd: &std::path::Path,
    log: &std::path::Path,
    cpus: Option<&str>,
) -> Result<(Proc, Duration), String> {
    let addr = free_addr()?;
    let log = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    // Pinned: `taskset` runs the binary in its own place (same pid).
    let mut command = match cpus {
        Some(cpus) => {
            let mut command = Command::new("taskset");
            command.args(["-c", cpus]).arg(binary);
            command
        }
        None => Command::new(binary),
    };
    let child = command
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("HARNESS_LISTEN", addr.to_string())
        .current_dir(cwd)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
    let proc = Proc { child, addr };
    let ready = wait_ready(&format!("{}/readyz", proc.url())).await?;
    Ok((proc, ready))
}

/// Polls `url` until it answers 200; returns how long that took.
pub async fn wait_ready(url: &str) -> Result<Duration, String> {
    let client = reqwest::Client::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        if let Ok(response) = client.get(url).send().await
            && response.status().is_success()
        {
            return Ok(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Err(format!("{url} did not become ready"))
}

pub async fn start_fake() -> Result<Proc, String> {
    start_fake_on(None).await
}

/// The fake provider, on the cores `cpus` (as `taskset -c` takes them)
/// when given.
pub async fn start_fake_on(cpus: Option<&str>) -> Result<Proc, String> {
    let addr = free_addr()?;
    let pinned = cpus.map(|cpus| format!("taskset -c {cpus}"));
    let child = spawn(
        &["fake-provider".into(), "--listen".into(), addr.to_string()],
        &[],
        pinned.as_deref(),
    )?;
    let proc = Proc { child, addr };
    wait_ready(&format!("{}/healthz", proc.url())).await?;
    Ok(proc)
}

/// The model llm-katan serves in the `katan` workload.
pub const KATAN_MODEL: &str = "bench-echo";

/// llm-katan (an outside OpenAI-compatible provider in Python) with its
/// echo backend, as `BENCH_KATAN` names the command (default `llm-katan`,
/// from `pip install llm-katan`), on the cores `cpus` when given. It runs
/// with its own defaults but the address, the model name and one switch:
/// its OpenAI endpoint answers every request that offers tools with a tool
/// call, and a turn that is offered tools would then never end.
pub async fn start_katan(cpus: Option<&str>) -> Result<Proc, String> {
    let addr = free_addr()?;
    let command = std::env::var("BENCH_KATAN").unwrap_or_else(|_| "llm-katan".into());
    let mut words: Vec<String> = cpus
        .map(|cpus| vec!["taskset".into(), "-c".into(), cpus.into()])
        .unwrap_or_default();
    words.extend(command.split_whitespace().map(str::to_owned));
    let Some((program, before)) = words.split_first() else {
        return Err("BENCH_KATAN is empty".into());
    };
    let child = Command::new(program)
        .args(before)
        .args(["--model", KATAN_MODEL, "--backend", "echo", "--host"])
        .arg(addr.ip().to_string())
        .arg("--port")
        .arg(addr.port().to_string())
        .args(["--no-auto-tool-providers", "openai"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| {
            format!("cannot start {command:?} (pip install llm-katan, or set BENCH_KATAN): {e}")
        })?;
    let proc = Proc { child, addr };
    wait_ready(&format!("{}/health", proc.url())).await?;
    Ok(proc)
}

/// Starts agent-harness on `database_url` against `provider`; returns it
/// and its start-to-ready time (migrations included).
pub async fn start_harness(
    database_url: &str,
    provider: &str,
    turn_timeout_s: u64,
) -> Result<(Proc, Duration), String> {
    start_harness_with(database_url, provider, turn_timeout_s, &[]).await
}

/// [`start_harness`] with more `HARNESS_…` settings in its environment.
pub async fn start_harness_with(
    database_url: &str,
    provider: &str,
    turn_timeout_s: u64,
    env: &[(&str, String)],
) -> Result<(Proc, Duration), String> {
    start_harness_pinned(None, database_url, provider, turn_timeout_s, env).await
}

/// [`start_harness_with`] on the cores `cpus` only (as `taskset -c` takes
/// them): its runtime sizes itself to them.
pub async fn start_harness_on(
    cpus: &str,
    database_url: &str,
    provider: &str,
    turn_timeout_s: u64,
    env: &[(&str, String)],
) -> Result<(Proc, Duration), String> {
    start_harness_pinned(Some(cpus), database_url, provider, turn_timeout_s, env).await
}

async fn start_harness_pinned(
    cpus: Option<&str>,
    database_url: &str,
    provider: &str,
    turn_timeout_s: u64,
    env: &[(&str, String)],
) -> Result<(Proc, Duration), String> {
    let addr = free_addr()?;
    let args = [
        "harness".into(),
        "--listen".into(),
        addr.to_string(),
        "--database-url".into(),
        database_url.into(),
        "--provider".into(),
        provider.into(),
        "--turn-timeout-s".into(),
        turn_timeout_s.to_string(),
    ];
    // A profiler to run agent-harness under (docs/benchmarks.md, "Profiles").
    let profiler = std::env::var("BENCH_HARNESS_WRAPPER").unwrap_or_default();
    let wrapper = match cpus {
        Some(cpus) => format!("taskset -c {cpus} {profiler}"),
        None => profiler,
    };
    let child = spawn(
        &args,
        env,
        Some(wrapper.as_str()).filter(|w| !w.trim().is_empty()),
    )?;
    let proc = Proc { child, addr };
    let ready = wait_ready(&format!("{}/readyz", proc.url())).await?;
    Ok((proc, ready))
}

/// The tool of the `tools` scenario: a read-only sleep on a key.
struct BenchSleep(ToolSpec);

#[async_trait]
impl Tool for BenchSleep {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }

    fn resource_keys(&self, arguments: &Value) -> Vec<String> {
        arguments["key"]
            .as_str()
            .map(|k| vec![k.to_owned()])
            .unwrap_or_default()
    }

    async fn call(&self, ctx: ToolContext, arguments: Value) -> Result<ToolOutput, ToolError> {
        let ms = arguments["ms"].as_u64().unwrap_or(100);
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(ms)) => Ok(ToolOutput::text("slept")),
            () = ctx.cancel.cancelled() => Err(ToolError::new(ToolErrorKind::Cancelled, "cancelled", true)),
        }
    }
}

/// The worker threads agent-harness would run with on `database_url` and
/// this machine's cores, as its settings say (`None`: the settings do not
/// load; `serve_harness` says why).
pub fn harness_workers(database_url: &str) -> Option<usize> {
    let mut settings =
        Settings::load_from(["agent-harness"], |name| std::env::var(name).ok()).ok()?;
    settings.database.url = database_url.parse().ok()?;
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    Some(settings.worker_threads(cores))
}

/// The `harness` subcommand: agent-harness as configured by default, with
/// the provider at `provider` and the bench tool registered.
pub async fn serve_harness(
    listen: SocketAddr,
    database_url: String,
    provider: String,
    turn_timeout_s: u64,
) -> Result<(), String> {
    // The environment's HARNESS_* settings apply (to compare settings);
    // what the bench needs is set over them.
    let mut settings = Settings::load_from(["agent-harness"], |name| std::env::var(name).ok())
        .map_err(|e| e.to_string())?;
    settings.server.listen = listen;
    settings.server.instance_id = format!("bench-{}", std::process::id());
    settings.database.url = database_url.parse()?;
    settings.providers.openai_base_url = format!("{provider}/v1").parse()?;
    settings.providers.anthropic_base_url = provider.parse()?;
    settings.providers.chain = Some("openai:bench,anthropic:bench".parse()?);
    settings.providers.max_attempts = 1;
    settings.harness.turn_timeout_s = turn_timeout_s;
    for model in crate::fake::offered_models() {
        // The fake reads images and PDFs (it answers whatever it is sent).
        settings.providers.models.0.entry(model).or_default().inputs =
            Some(harness_base::providers::catalogue::Inputs::ALL);
    }
    // Everything else is the service's default (memory extraction is off
    // by default; `bench run` prints what it changes).
    settings.validate().map_err(|e| e.to_string())?;
    // Logs and traces as the service makes them (its standard output, the
    // logs, goes to /dev/null here, as the formatting is the cost).
    let telemetry = harness_core::telemetry::init(&settings).map_err(|e| e.to_string())?;
    let result = serve(settings).await;
    telemetry.shutdown();
    result
}

async fn serve(settings: Settings) -> Result<(), String> {
    let store = store::connect(settings.database.url.as_str(), settings.database.limits())
        .await
        .map_err(|e| e.to_string())?;
    store.migrate().await.map_err(|e| e.to_string())?;
    let llm = build_provider(&settings).map_err(|e| e.to_string())?;
    let sleep: Arc<dyn Tool> = Arc::new(BenchSleep(ToolSpec::new(
        "bench_sleep",
        "Sleep for `ms` milliseconds on a key.",
        json!({"type": "object", "properties": {"key": {"type": "string"}, "ms": {"type": "integer"}}, "required": ["key"]}),
        EffectClass::ReadOnly,
    )));
    let app = Application::build_with_tools(settings, store, llm, vec![sleep])
        .await
        .map_err(|e| e.to_string())?;
    // SIGTERM and ctrl-c shut it down as they do the service (its turns
    // handed over), not kill it.
    let shutdown = app.shutdown_token();
    let running = app.run_until_stopped();
    tokio::pin!(running);
    let result = tokio::select! {
        result = &mut running => result,
        () = agent_harness::startup::shutdown_signal() => {
            shutdown.cancel();
            running.await
        }
    };
    result.map_err(|e| e.to_string())
}
