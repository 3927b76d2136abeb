//! The `agent-harness` binary: `serve` (the default), and the commands
//! beside it (`migrate`, `index-vault`, `keys`, `openapi`, `chat`, `health`).

use std::{
    io::{IsTerminal as _, Write as _},
    process::ExitCode,
};

use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};

use agent_harness::startup;
use harness_core::{
    config::{self, ConfigError, Settings},
    telemetry, vault,
};
use harness_store::store::{
    self,
    audit::{AuditEntry, kinds},
};

mod cli;

use cli::{chat, health};

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
    Chat {
        /// The service's address.
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
        /// The session [default: a new one for this run].
        #[arg(long)]
        session: Option<String>,
        /// Whose memories (the turn's `user_id`).
        #[arg(long)]
        user: Option<String>,
        /// The message; without one, each line of standard input is a turn.
        message: Vec<String>,
    },
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

/// Which rows of the audit trail to print.
#[derive(Debug, clap::Args)]
struct AuditArgs {
    /// One tenant's rows.
    #[arg(long)]
    tenant: Option<String>,
    /// One kind (`key.created`, `session.erased`, `auth.failed`, ...).
    #[arg(long)]
    kind: Option<String>,
    /// Rows at or after this time (RFC 3339).
    #[arg(long)]
    since: Option<chrono::DateTime<chrono::Utc>>,
    /// Rows at most.
    #[arg(long, default_value_t = 1000)]
    limit: u32,
}

#[derive(Debug, Subcommand)]
enum TenantAction {
    /// Set a tenant's own limits; a limit not given keeps the service's
    /// default (and clears one set before). Replicas take it within 5 s.
    Set {
        /// The tenant (1-128 characters of `[A-Za-z0-9._:-]`).
        tenant: String,
        /// Running turns at once, across replicas.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        max_running_turns: Option<u32>,
        /// Requests in flight at once, per process.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        max_streams: Option<u32>,
        /// Input and output tokens per UTC day.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        tokens_per_day: Option<u64>,
        /// How long its sessions are kept after their last activity (a
        /// span such as `30d`, `12h` or `90s`).
        #[arg(long)]
        retention: Option<harness_core::config::Span>,
    },
    /// List the tenants with limits of their own.
    List,
}

#[derive(Debug, Subcommand)]
enum KeyAction {
    /// Make a key for a tenant; the key is printed once and only its hash
    /// is kept.
    Create {
        /// The tenant (1-128 characters of `[A-Za-z0-9._:-]`); an admin
        /// key's is `default` unless given.
        #[arg(long, required_unless_present = "admin")]
        tenant: Option<String>,
        /// An admin key: it may also use the admin routes (erase a tenant,
        /// import a session, read the audit trail).
        #[arg(long)]
        admin: bool,
    },
    /// List the keys (id, tenant, admin, made, revoked).
    List,
    /// Revoke a key by its id.
    Revoke { id: String },
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
    if let Some(Command::Chat {
        url,
        session,
        user,
        message,
    }) = &cli.command
    {
        return match runtime(&mut tokio::runtime::Builder::new_current_thread()) {
            Ok(runtime) => runtime.block_on(chat::run(url, session.clone(), user.clone(), message)),
            Err(code) => code,
        };
    }
    if let Some(Command::Health { url }) = &cli.command {
        let url = url.clone().unwrap_or_else(|| {
            format!("http://127.0.0.1:{}/readyz", settings.server.listen.port())
        });
        return match runtime(&mut tokio::runtime::Builder::new_current_thread()) {
            Ok(runtime) => runtime.block_on(health::run(&url)),
            Err(code) => code,
        };
    }
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
        let result = match cli.command {
            Some(Command::Migrate) => migrate(&settings).await,
            Some(Command::IndexVault) => index_vault(&settings).await,
            Some(Command::Keys { action }) => keys(&settings, action).await,
            Some(Command::Tenants { action }) => tenants(&settings, action).await,
            Some(Command::Audit(args)) => print_audit(&settings, args).await,
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

/// The database of `settings` on one connection, its migrations applied:
/// what a command other than `serve` works on.
async fn migrated_store(settings: &Settings) -> Result<std::sync::Arc<dyn store::Store>, String> {
    let limits = store::PoolLimits {
        max_connections: 1,
        ..settings.database.limits()
    };
    let store = store::connect(settings.database.url.as_str(), limits)
        .await
        .map_err(|e| e.to_string())?;
    store.migrate().await.map_err(|e| e.to_string())?;
    Ok(store)
}

async fn migrate(settings: &Settings) -> Result<(), String> {
    let store = migrated_store(settings).await?;
    tracing::info!(backend = store.backend(), "migrations applied");
    Ok(())
}

async fn tenants(settings: &Settings, action: TenantAction) -> Result<(), String> {
    let store = migrated_store(settings).await?;
    let mut stdout = std::io::stdout().lock();
    let shown = |e: std::io::Error| format!("cannot write: {e}");
    let line = |tenant: &str, limits: &store::TenantLimits| {
        let or_default = |limit: Option<String>| limit.unwrap_or_else(|| "default".to_owned());
        format!(
            "{tenant} max_running_turns={} max_streams={} tokens_per_day={} retention_s={}",
            or_default(limits.max_running_turns.map(|n| n.to_string())),
            or_default(limits.max_streams.map(|n| n.to_string())),
            or_default(limits.tokens_per_day.map(|n| n.to_string())),
            or_default(limits.retention_s.map(|n| n.to_string())),
        )
    };
    match action {
        TenantAction::Set {
            tenant,
            max_running_turns,
            max_streams,
            tokens_per_day,
            retention,
        } => {
            harness_base::ids::SessionId::parse(&tenant)
                .map_err(|e| format!("the tenant is not valid: {e}"))?;
            let limits = store::TenantLimits {
                max_running_turns,
                max_streams,
                tokens_per_day,
                retention_s: retention.map(|span| span.0.as_secs().max(1)),
            };
            store
                .set_tenant_limits(&tenant, &limits, chrono::Utc::now())
                .await
                .map_err(|e| e.to_string())?;
            writeln!(stdout, "{}", line(&tenant, &limits)).map_err(shown)?;
        }
        TenantAction::List => {
            for (tenant, limits) in store.list_tenants().await.map_err(|e| e.to_string())? {
                writeln!(stdout, "{}", line(&tenant, &limits)).map_err(shown)?;
            }
        }
    }
    Ok(())
}

async fn keys(settings: &Settings, action: KeyAction) -> Result<(), String> {
    let store = migrated_store(settings).await?;
    let mut stdout = std::io::stdout().lock();
    let shown = |e: std::io::Error| format!("cannot write: {e}");
    match action {
        KeyAction::Create { tenant, admin } => {
            let tenant = tenant.unwrap_or_else(|| harness_base::ids::DEFAULT_TENANT.to_owned());
            harness_base::ids::SessionId::parse(&tenant)
                .map_err(|e| format!("the tenant is not valid: {e}"))?;
            let key = format!(
                "ah_{}{}",
                uuid::Uuid::new_v4().simple(),
                uuid::Uuid::new_v4().simple()
            );
            let id = format!("key_{}", uuid::Uuid::now_v7().simple());
            let hash = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(key.as_bytes()));
            store
                .create_api_key(&id, &tenant, &hash, admin, chrono::Utc::now())
                .await
                .map_err(|e| e.to_string())?;
            let made = if admin { "admin" } else { "tenant" };
            audit(
                &*store,
                AuditEntry::new(&tenant, kinds::KEY_CREATED)
                    .subject(&id)
                    .outcome(made),
            )
            .await?;
            writeln!(stdout, "{key}").map_err(shown)?;
            eprintln!("key {id} for tenant {tenant}: keep it now, it is not shown again");
        }
        KeyAction::List => {
            for (id, tenant, admin, created, revoked) in
                store.list_api_keys().await.map_err(|e| e.to_string())?
            {
                let revoked = revoked.map_or_else(String::new, |r| format!(" revoked {r}"));
                let admin = if admin { " admin" } else { "" };
                writeln!(stdout, "{id} {tenant}{admin} {created}{revoked}").map_err(shown)?;
            }
        }
        KeyAction::Revoke { id } => {
            if !store
                .revoke_api_key(&id, chrono::Utc::now())
                .await
                .map_err(|e| e.to_string())?
            {
                return Err(format!("no active key {id}"));
            }
            let tenant = store
                .api_key_tenant(&id)
                .await
                .map_err(|e| e.to_string())?
                .unwrap_or_default();
            audit(
                &*store,
                AuditEntry::new(&tenant, kinds::KEY_REVOKED).subject(&id),
            )
            .await?;
            writeln!(stdout, "revoked {id}").map_err(shown)?;
        }
    }
    Ok(())
}

/// Prints the rows of the audit trail `filter` selects, a page at a time.
async fn print_audit(settings: &Settings, args: AuditArgs) -> Result<(), String> {
    let store = migrated_store(settings).await?;
    let mut filter = store::AuditFilter {
        tenant: args.tenant,
        kind: args.kind,
        since: args.since,
        until: None,
        after: 0,
        limit: args.limit,
    };
    let mut stdout = std::io::stdout().lock();
    let mut left = filter.limit;
    while left > 0 {
        filter.limit = left.min(500);
        let rows = store.audit_rows(&filter).await.map_err(|e| e.to_string())?;
        for row in &rows {
            let line = serde_json::to_string(row).map_err(|e| e.to_string())?;
            writeln!(stdout, "{line}").map_err(|e| format!("cannot write: {e}"))?;
        }
        match rows.last() {
            Some(last) if rows.len() == filter.limit as usize => filter.after = last.id,
            _ => break,
        }
        left -= filter.limit;
    }
    Ok(())
}

/// The largest export `import` reads.
const IMPORT_MAX_BYTES: u64 = 1 << 30;

/// Imports the export in `file` for `tenant`; prints what was made.
async fn import(settings: &Settings, file: &std::path::Path, tenant: &str) -> Result<(), String> {
    use std::io::Read as _;
    harness_base::ids::SessionId::parse(tenant)
        .map_err(|e| format!("the tenant is not valid: {e}"))?;
    let mut text = String::new();
    let read = if file.as_os_str() == "-" {
        std::io::stdin()
            .take(IMPORT_MAX_BYTES + 1)
            .read_to_string(&mut text)
    } else {
        std::fs::File::open(file)
            .and_then(|f| f.take(IMPORT_MAX_BYTES + 1).read_to_string(&mut text))
    };
    read.map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    if text.len() as u64 > IMPORT_MAX_BYTES {
        return Err(format!("{} is larger than 1 GiB", file.display()));
    }
    let store = migrated_store(settings).await?;
    let made = store::audit::acting_as(
        "cli".to_owned(),
        agent_harness::http::sessions::export::import(&store, tenant, &text),
    )
    .await
    .map_err(|e| format!("{} ({})", e, e.code()))?;
    let shown = serde_json::to_string(&made).map_err(|e| e.to_string())?;
    writeln!(std::io::stdout().lock(), "{shown}").map_err(|e| format!("cannot write: {e}"))
}

/// Adds a row of the command line's doing to the audit trail.
async fn audit(store: &dyn store::Store, entry: AuditEntry) -> Result<(), String> {
    let entry = AuditEntry {
        actor: "cli".to_owned(),
        ..entry
    };
    store
        .audit(&entry, chrono::Utc::now())
        .await
        .map_err(|e| format!("cannot write the audit trail: {e}"))
}

/// A progress bar on a terminal.
struct Bar(indicatif::ProgressBar);

impl vault::Progress for Bar {
    fn found(&self, total: usize) {
        self.0.set_length(u64::try_from(total).unwrap_or(u64::MAX));
    }

    fn indexed(&self, done: usize, path: &str) {
        self.0.set_position(u64::try_from(done).unwrap_or(u64::MAX));
        self.0.set_message(path.to_owned());
    }
}

async fn index_vault(settings: &Settings) -> Result<(), String> {
    let store = store::connect(settings.database.url.as_str(), settings.database.limits())
        .await
        .map_err(|e| e.to_string())?;
    store.migrate().await.map_err(|e| e.to_string())?;
    let vault = startup::build_vault(settings, store).map_err(|e| e.to_string())?;
    let report = if std::io::stderr().is_terminal() {
        let bar = indicatif::ProgressBar::new(0).with_style(
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} notes {wide_msg}")
                .map_err(|e| e.to_string())?,
        );
        let report = vault.reindex(&Bar(bar.clone())).await;
        bar.finish_with_message("done");
        report
    } else {
        vault.reindex(&()).await
    }
    .map_err(|e| e.to_string())?;
    // The summary is this command's output.
    let mut stdout = std::io::stdout().lock();
    writeln!(
        stdout,
        "indexed {}: {}",
        vault.root().display(),
        report.summary()
    )
    .map_err(|e| format!("cannot write the summary: {e}"))?;
    for skipped in &report.skipped {
        writeln!(stdout, "skipped {}: {}", skipped.path, skipped.reason)
            .map_err(|e| format!("cannot write the summary: {e}"))?;
    }
    // Each tenant's own vault with a folder (`{folder}/.tenants/{tenant}`).
    let vaults = vault::Vaults::new(vault, settings.vault.sharing());
    for tenant in vaults.tenants_with_folders(usize::MAX) {
        let report = vaults
            .of_tenant(&tenant)
            .reindex(&())
            .await
            .map_err(|e| e.to_string())?;
        writeln!(stdout, "indexed tenant {tenant}: {}", report.summary())
            .map_err(|e| format!("cannot write the summary: {e}"))?;
    }
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

/// The async runtime `builder` makes (with its I/O and timers), or the
/// exit code of a process that could not start one (said on stderr).
fn runtime(builder: &mut tokio::runtime::Builder) -> Result<tokio::runtime::Runtime, ExitCode> {
    builder.enable_all().build().map_err(|e| {
        eprintln!("agent-harness: cannot start the async runtime: {e}");
        ExitCode::FAILURE
    })
}
