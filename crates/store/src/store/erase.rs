//! Erasing a session and everything it owns, in one transaction: its
//! turns and their records, events, messages, decisions, artifacts,
//! checkpoints, approvals, client-tool results, background jobs, the
//! files its messages carried,
//! judgements, observations, queue tickets, steers, push configurations, webhook
//! deliveries, and the memories extracted from it (or kept in its own
//! scope). Nothing is erased while a turn of the session runs (or waits,
//! parked).
//!
//! The statements are written once here, in the SQL both backends read
//! (`$1` is the session's stored key, `$2` its own memory scope); each
//! backend runs them in its own transaction (`erase/sqlite.rs`,
//! `erase/postgres.rs`).

mod postgres;
mod sqlite;

use async_trait::async_trait;
use uuid::Uuid;

use crate::{
    ids::SessionKey,
    store::{
        Result,
        reader::{Reads, args},
    },
};

/// What an erase found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Erased {
    /// The session and all it owned are gone.
    Erased,
    /// There was no such session (nothing was written).
    NotFound,
    /// A turn of the session runs (nothing was written).
    Running(Uuid),
    /// Forks read through the session's turns (nothing was written): the
    /// first [`crate::store::forks::FORKS_NAMED`] of them, by the ids
    /// their tenant knows. Erase them first.
    Forked(Vec<String>),
}

/// The forks that hold a session, as an erase names them (read under its
/// lock; see [`Erased::Forked`]).
fn forks_named(keys: Vec<String>) -> Option<Erased> {
    (!keys.is_empty()).then(|| {
        Erased::Forked(
            keys.iter()
                .map(|key| crate::ids::client_session_id(key).to_owned())
                .collect(),
        )
    })
}

/// Erases sessions.
#[async_trait]
pub trait Erase: Reads + Send + Sync {
    /// Erases the session `key` and every row it owns, unless a turn of it
    /// runs.
    async fn erase_session(&self, key: &SessionKey) -> Result<Erased>;

    /// The stored keys of `tenant`'s sessions in which `user` asked a
    /// turn (its `user_id`), at most `limit`.
    async fn sessions_of_user(&self, tenant: &str, user: &str, limit: u32) -> Result<Vec<String>>;

    /// The stored keys of `tenant`'s sessions, at most `limit`.
    async fn sessions_of_tenant(&self, tenant: &str, limit: u32) -> Result<Vec<String>> {
        let sql = "SELECT id FROM sessions WHERE tenant = $1 ORDER BY id LIMIT $2";
        let rows: Vec<(String,)> = self.reader().rows(sql, args![tenant, limit]).await?;
        Ok(rows.into_iter().map(|(id,)| id).collect())
    }

    /// Erases what `tenant` holds outside its sessions, in one
    /// transaction: its memories, webhook endpoints and their deliveries,
    /// its own limits, its usage, its files, and its own vault's index (see
    /// [`tenant_statements`]). Its sessions are erased first, one by one.
    async fn erase_tenant_rest(&self, tenant: &str) -> Result<()>;
}

/// The statements that erase what a tenant holds outside its sessions;
/// each takes the tenant as `$1`. The default tenant's memories are the
/// scopes without a tenant's prefix; its vault is the operator's folder,
/// whose index stays.
fn tenant_statements(tenant: &str) -> Vec<&'static str> {
    let mut statements = vec![
        "DELETE FROM webhook_deliveries WHERE tenant = $1 \
         OR webhook_id IN (SELECT id FROM webhooks WHERE tenant = $1)",
        "DELETE FROM webhooks WHERE tenant = $1",
        "DELETE FROM tenant_usage WHERE tenant = $1",
        "DELETE FROM tenants WHERE tenant = $1",
    ];
    statements.extend(crate::store::files::DELETE_TENANT);
    if tenant == crate::ids::DEFAULT_TENANT {
        statements.push("DELETE FROM memories WHERE scope NOT LIKE '%/%' AND $1 = $1");
    } else {
        statements.extend([
            "DELETE FROM memories WHERE substr(scope, 1, length($1) + 1) = $1 || '/'",
            "DELETE FROM vault_chunks WHERE vault = $1",
            "DELETE FROM vault_notes WHERE vault = $1",
        ]);
    }
    statements
}

/// The sessions of a user, given how the backend reads a turn request's
/// `user_id` (`{user}`: the expression).
fn sessions_of_user_sql(user: &str) -> String {
    format!(
        "SELECT DISTINCT t.session_id FROM turns t JOIN sessions s ON s.id = t.session_id \
         WHERE s.tenant = $1 AND {user} = $2 ORDER BY t.session_id LIMIT $3"
    )
}

/// The statements that erase a session's rows, children before parents;
/// `true`: it takes the session's memory scope as `$2`.
const ERASE: &[(&str, bool)] = &[
    // First: a background job writes what it made only while its row is
    // there (Postgres: locked `FOR SHARE`), so one that wrote before the
    // erase took its row has its rows erased below, and one after writes
    // nothing.
    ("DELETE FROM background_jobs WHERE session_id = $1", false),
    (
        "DELETE FROM webhook_deliveries WHERE session_id = $1",
        false,
    ),
    ("DELETE FROM push_configs WHERE session_id = $1", false),
    (
        "DELETE FROM turn_steps WHERE turn_id IN (SELECT id FROM turns WHERE session_id = $1)",
        false,
    ),
    (
        "DELETE FROM client_tool_results WHERE session_id = $1",
        false,
    ),
    ("DELETE FROM approvals WHERE session_id = $1", false),
    ("DELETE FROM judgements WHERE session_id = $1", false),
    (
        "DELETE FROM research_observations WHERE session_id = $1",
        false,
    ),
    ("DELETE FROM checkpoints WHERE session_id = $1", false),
    ("DELETE FROM artifacts WHERE session_id = $1", false),
    ("DELETE FROM decisions WHERE session_id = $1", false),
    ("DELETE FROM messages WHERE session_id = $1", false),
    // The files its messages carried, and their bytes unless a file
    // outside the session holds them.
    (crate::store::files::DELETE_SESSION[0], false),
    (crate::store::files::DELETE_SESSION[1], false),
    (crate::store::files::DELETE_SESSION[2], false),
    (
        "DELETE FROM memories WHERE source_session_id = $1 OR scope = $2",
        true,
    ),
    ("DELETE FROM turn_queue WHERE session_id = $1", false),
    ("DELETE FROM steers WHERE session_id = $1", false),
    ("DELETE FROM events WHERE session_id = $1", false),
    ("DELETE FROM turns WHERE session_id = $1", false),
];

/// The running turn of a session, read under the erase's lock.
const RUNNING: &str = "SELECT id FROM turns WHERE session_id = $1 AND status = 'running' LIMIT 1";

/// The session's row, last.
const SESSION: &str = "DELETE FROM sessions WHERE id = $1";

/// The memory scope a session's own memories are kept in.
fn own_scope(key: &SessionKey) -> String {
    crate::ids::tenant_scope(key.tenant(), &format!("session:{}", key.id()))
}
