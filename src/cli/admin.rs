//! The operator's commands on the database: `migrate`, `keys`, `tenants`
//! and `audit`. Each opens the database on one connection, migrated, and
//! writes what it did to the audit trail (as `cli`).

use std::{io::Write as _, sync::Arc};

use clap::Subcommand;
use harness_base::ids::{DEFAULT_TENANT, SessionId};
use harness_core::{
    config::{Settings, Span},
    harness::Reasoning,
};
use harness_store::store::{
    self, AuditFilter, Store, TenantLimits,
    audit::{AuditEntry, kinds},
};

use super::error::CliError;

/// Which rows of the audit trail to print.
#[derive(Debug, clap::Args)]
pub struct AuditArgs {
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
pub enum TenantAction {
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
        retention: Option<Span>,
        /// Whether its clients see the model's reasoning: `show` or
        /// `hidden` (its tokens count either way).
        #[arg(long, value_enum)]
        reasoning: Option<Reasoning>,
    },
    /// List the tenants with limits of their own.
    List,
}

#[derive(Debug, Subcommand)]
pub enum KeyAction {
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

/// The database of `settings` on one connection, its migrations applied:
/// what a command other than `serve` works on.
pub async fn migrated_store(settings: &Settings) -> Result<Arc<dyn Store>, CliError> {
    let limits = store::PoolLimits {
        max_connections: 1,
        ..settings.database.limits()
    };
    let store = store::connect(settings.database.url.as_str(), limits).await?;
    store.migrate().await?;
    Ok(store)
}

pub async fn migrate(settings: &Settings) -> Result<(), CliError> {
    let store = migrated_store(settings).await?;
    tracing::info!(backend = store.backend(), "migrations applied");
    Ok(())
}

fn valid_tenant(tenant: &str) -> Result<(), CliError> {
    SessionId::parse(tenant)
        .map(|_| ())
        .map_err(CliError::InvalidTenant)
}

/// A tenant's limits as a line of `tenants`' output.
fn limits_line(tenant: &str, limits: &TenantLimits) -> String {
    let or_default = |limit: Option<String>| limit.unwrap_or_else(|| "default".to_owned());
    format!(
        "{tenant} max_running_turns={} max_streams={} tokens_per_day={} retention_s={} \
         reasoning={}",
        or_default(limits.max_running_turns.map(|n| n.to_string())),
        or_default(limits.max_streams.map(|n| n.to_string())),
        or_default(limits.tokens_per_day.map(|n| n.to_string())),
        or_default(limits.retention_s.map(|n| n.to_string())),
        or_default(
            limits
                .show_reasoning
                .map(|show| if show { "show" } else { "hidden" }.to_owned())
        ),
    )
}

pub async fn tenants(settings: &Settings, action: TenantAction) -> Result<(), CliError> {
    let store = migrated_store(settings).await?;
    let mut stdout = std::io::stdout().lock();
    match action {
        TenantAction::Set {
            tenant,
            max_running_turns,
            max_streams,
            tokens_per_day,
            retention,
            reasoning,
        } => {
            valid_tenant(&tenant)?;
            let limits = TenantLimits {
                max_running_turns,
                max_streams,
                tokens_per_day,
                retention_s: retention.map(|span| span.0.as_secs().max(1)),
                show_reasoning: reasoning.map(|r| r == Reasoning::Show),
            };
            store
                .set_tenant_limits(&tenant, &limits, chrono::Utc::now())
                .await?;
            writeln!(stdout, "{}", limits_line(&tenant, &limits))?;
        }
        TenantAction::List => {
            for (tenant, limits) in store.list_tenants().await? {
                writeln!(stdout, "{}", limits_line(&tenant, &limits))?;
            }
        }
    }
    Ok(())
}

/// A new key: `ah_` and 64 hex digits of the thread's CSPRNG.
fn new_key() -> String {
    let mut bytes = [0u8; 32];
    rand::fill(&mut bytes);
    format!("ah_{}", hex::encode(bytes))
}

pub async fn keys(settings: &Settings, action: KeyAction) -> Result<(), CliError> {
    let store = migrated_store(settings).await?;
    let mut stdout = std::io::stdout().lock();
    match action {
        KeyAction::Create { tenant, admin } => {
            let tenant = tenant.unwrap_or_else(|| DEFAULT_TENANT.to_owned());
            valid_tenant(&tenant)?;
            let key = new_key();
            let id = format!("key_{}", uuid::Uuid::now_v7().simple());
            let hash = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(key.as_bytes()));
            store
                .create_api_key(&id, &tenant, &hash, admin, chrono::Utc::now())
                .await?;
            let made = if admin { "admin" } else { "tenant" };
            let entry = AuditEntry::new(&tenant, kinds::KEY_CREATED)
                .subject(&id)
                .outcome(made);
            audit(&*store, entry).await?;
            writeln!(stdout, "{key}")?;
            eprintln!("key {id} for tenant {tenant}: keep it now, it is not shown again");
        }
        KeyAction::List => {
            for (id, tenant, admin, created, revoked) in store.list_api_keys().await? {
                let revoked = revoked.map_or_else(String::new, |r| format!(" revoked {r}"));
                let admin = if admin { " admin" } else { "" };
                writeln!(stdout, "{id} {tenant}{admin} {created}{revoked}")?;
            }
        }
        KeyAction::Revoke { id } => {
            if !store.revoke_api_key(&id, chrono::Utc::now()).await? {
                return Err(CliError::NoSuchKey(id));
            }
            let tenant = store.api_key_tenant(&id).await?.unwrap_or_default();
            audit(
                &*store,
                AuditEntry::new(&tenant, kinds::KEY_REVOKED).subject(&id),
            )
            .await?;
            writeln!(stdout, "revoked {id}")?;
        }
    }
    Ok(())
}

/// Prints the rows of the audit trail `args` selects, a page at a time.
pub async fn print_audit(settings: &Settings, args: AuditArgs) -> Result<(), CliError> {
    let store = migrated_store(settings).await?;
    let mut filter = AuditFilter {
        tenant: args.tenant,
        kind: args.kind,
        since: args.since,
        until: None,
        after: 0,
        limit: args.limit,
    };
    let mut stdout = std::io::stdout().lock();
    let mut left = filter.limit;
    // Bounded: each page takes at least one row off `left`, or ends it.
    while left > 0 {
        filter.limit = left.min(500);
        let rows = store.audit_rows(&filter).await?;
        for row in &rows {
            writeln!(stdout, "{}", serde_json::to_string(row)?)?;
        }
        match rows.last() {
            Some(last) if rows.len() == filter.limit as usize => filter.after = last.id,
            _ => break,
        }
        left -= filter.limit;
    }
    Ok(())
}

/// Adds a row of the command line's doing to the audit trail.
pub async fn audit(store: &dyn Store, entry: AuditEntry) -> Result<(), CliError> {
    let entry = AuditEntry {
        actor: "cli".to_owned(),
        ..entry
    };
    store
        .audit(&entry, chrono::Utc::now())
        .await
        .map_err(CliError::Audit)
}
