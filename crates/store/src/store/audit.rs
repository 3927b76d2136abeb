//! The audit trail: who did what to whose data (keys made and revoked,
//! approvals decided, sessions, users and tenants erased, sessions
//! exported and imported, webhook endpoints made and deleted, refusals
//! of another tenant's ids, failed authentications), never what was said
//! or a call's arguments.
//!
//! Rows are only added: nothing in the service changes or removes one,
//! but the count of a failed-authentication row (one per client address
//! and minute) and the trim of rows older than `HARNESS_AUDIT_RETENTION`.
//! The reads are written once here; each backend's writes stand side by
//! side in `audit/sqlite.rs` and `audit/postgres.rs`.

mod postgres;
mod sqlite;

use async_trait::async_trait;
use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use serde::Serialize;

use super::reader::{Reads, args};
use crate::store::Result;

/// What an audit row records.
pub mod kinds {
    pub const KEY_CREATED: &str = "key.created";
    pub const KEY_REVOKED: &str = "key.revoked";
    pub const APPROVAL_DECIDED: &str = "approval.decided";
    pub const SESSION_ERASED: &str = "session.erased";
    pub const USER_ERASED: &str = "user.erased";
    pub const TENANT_ERASED: &str = "tenant.erased";
    pub const SESSION_EXPORTED: &str = "session.exported";
    pub const SESSION_IMPORTED: &str = "session.imported";
    pub const SESSION_FORKED: &str = "session.forked";
    pub const RETENTION_SWEPT: &str = "retention.swept";
    pub const WEBHOOK_CREATED: &str = "webhook.created";
    pub const WEBHOOK_DELETED: &str = "webhook.deleted";
    pub const REFUSED_OTHER_TENANT: &str = "refused.other_tenant";
    pub const AUTH_FAILED: &str = "auth.failed";
    pub const FILE_CREATED: &str = "file.created";
    pub const FILE_DELETED: &str = "file.deleted";

    /// Every kind, for the filter's check.
    pub const ALL: &[&str] = &[
        KEY_CREATED,
        KEY_REVOKED,
        APPROVAL_DECIDED,
        SESSION_ERASED,
        USER_ERASED,
        TENANT_ERASED,
        SESSION_EXPORTED,
        SESSION_IMPORTED,
        SESSION_FORKED,
        RETENTION_SWEPT,
        WEBHOOK_CREATED,
        WEBHOOK_DELETED,
        REFUSED_OTHER_TENANT,
        AUTH_FAILED,
        FILE_CREATED,
        FILE_DELETED,
    ];
}

/// One thing done, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    /// The tenant whose data it was.
    pub tenant: String,
    /// One of [`kinds`].
    pub kind: &'static str,
    /// Who: a key's id, `local` (keys off), `cli`, `retention`.
    pub actor: String,
    /// What it was done to: a session's id, a key's, `turn/call`.
    pub subject: Option<String>,
    /// How it ended, in a word or a count (`approved`, `denied`, `3`).
    pub outcome: Option<String>,
}

/// A row of the trail.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct AuditRow {
    /// Increasing: the page cursor.
    pub id: i64,
    pub at: DateTime<Utc>,
    /// `null`: a failed authentication (no tenant is known).
    pub tenant: Option<String>,
    pub kind: String,
    pub actor: String,
    pub subject: Option<String>,
    pub outcome: Option<String>,
    /// The client's address (a failed authentication: its /64 for IPv6).
    pub address: Option<String>,
    /// How many times in the row's minute (failed authentications); 1
    /// for the rest.
    pub count: i64,
}

/// What else a route names by a global id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owned {
    Webhook,
    Artifact,
}

/// Which rows to read.
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    pub tenant: Option<String>,
    pub kind: Option<String>,
    /// At or after.
    pub since: Option<DateTime<Utc>>,
    /// Before.
    pub until: Option<DateTime<Utc>>,
    /// Rows after this id (the previous page's last).
    pub after: i64,
    pub limit: u32,
}

/// The minute a failed authentication is counted in.
pub fn minute_of(at: DateTime<Utc>) -> DateTime<Utc> {
    at.duration_trunc(TimeDelta::minutes(1)).unwrap_or(at)
}

/// The audit trail.
#[async_trait]
pub trait Audit: Reads + Send + Sync {
    /// Adds a row.
    async fn audit(&self, entry: &AuditEntry, at: DateTime<Utc>) -> Result<()>;

    /// Counts a failed authentication from `address` in `at`'s minute.
    async fn audit_auth_failure(&self, address: &str, at: DateTime<Utc>) -> Result<()>;

    /// Removes the rows older than `before`, at most `limit`; how many.
    async fn trim_audit(&self, before: DateTime<Utc>, limit: u32) -> Result<u64>;

    /// Adds a row now; a failure is logged (what was done stands).
    async fn record(&self, entry: AuditEntry) {
        if let Err(e) = self.audit(&entry, Utc::now()).await {
            tracing::error!(error = %e, kind = entry.kind, "the audit row was not written");
        }
    }

    /// A tenant other than `tenant` with a session whose id is `id` (as
    /// clients name it): what a refused request reached for.
    async fn session_elsewhere(&self, tenant: &str, id: &str) -> Result<Option<String>> {
        let sql = "SELECT s.tenant FROM sessions s WHERE s.tenant <> $2 AND s.id IN \
                   (SELECT k.tenant || '/' || $1 FROM api_keys k WHERE k.tenant <> 'default' \
                    UNION SELECT CAST($1 AS TEXT)) LIMIT 1";
        let row: Option<(String,)> = self.reader().row(sql, args![id, tenant]).await?;
        Ok(row.map(|(owner,)| owner))
    }

    /// The tenant of the turn `turn_id`.
    async fn tenant_of_turn(&self, turn_id: uuid::Uuid) -> Result<Option<String>> {
        let sql = "SELECT s.tenant FROM turns t JOIN sessions s ON s.id = t.session_id \
                   WHERE t.id = $1";
        let row: Option<(String,)> = self.reader().row(sql, args![turn_id]).await?;
        Ok(row.map(|(owner,)| owner))
    }

    /// The tenant of the webhook endpoint `id`, or of the artifact `id`
    /// (through its session): `table` is `webhooks` or `artifacts`.
    async fn tenant_of(&self, table: Owned, id: &str) -> Result<Option<String>> {
        let sql = match table {
            Owned::Webhook => "SELECT tenant FROM webhooks WHERE id = $1",
            Owned::Artifact => {
                "SELECT s.tenant FROM artifacts a JOIN sessions s ON s.id = a.session_id \
                 WHERE a.id = $1"
            }
        };
        let row: Option<(String,)> = self.reader().row(sql, args![id]).await?;
        Ok(row.map(|(owner,)| owner))
    }

    /// The rows `filter` selects, oldest first.
    async fn audit_rows(&self, filter: &AuditFilter) -> Result<Vec<AuditRow>> {
        let sql = "SELECT id, at, tenant, kind, actor, subject, outcome, address, count \
                   FROM audit WHERE id > $1 \
                   AND ($2 IS NULL OR tenant = $2) AND ($3 IS NULL OR kind = $3) \
                   AND ($4 IS NULL OR at >= $4) AND ($5 IS NULL OR at < $5) \
                   ORDER BY id LIMIT $6";
        self.reader()
            .rows(
                sql,
                args![
                    filter.after,
                    filter.tenant.as_deref(),
                    filter.kind.as_deref(),
                    filter.since,
                    filter.until,
                    filter.limit
                ],
            )
            .await
    }
}

/// The insert of a row.
const INSERT: &str = "INSERT INTO audit (at, tenant, kind, actor, subject, outcome) \
                      VALUES ($1, $2, $3, $4, $5, $6)";

/// A refusal of another tenant's resource: one row per owner, caller and
/// minute (`$1` is the minute), counted; the first request's id and
/// method stay.
const REFUSAL: &str = "INSERT INTO audit (at, tenant, kind, actor, subject, outcome) \
                       VALUES ($1, $2, $3, $4, $5, $6) \
                       ON CONFLICT (tenant, actor, at) WHERE kind = 'refused.other_tenant' \
                       DO UPDATE SET count = audit.count + 1";

/// The statement that writes `entry` at `at`, and the time it writes:
/// refusals of another tenant's resource are counted by the minute.
fn insert_of(entry: &AuditEntry, at: DateTime<Utc>) -> (&'static str, DateTime<Utc>) {
    if entry.kind == kinds::REFUSED_OTHER_TENANT {
        (REFUSAL, minute_of(at))
    } else {
        (INSERT, at)
    }
}

/// The count of a failed authentication.
const AUTH_FAILURE: &str = "INSERT INTO audit (at, kind, actor, address) \
                            VALUES ($1, 'auth.failed', 'anonymous', $2) \
                            ON CONFLICT (address, at) WHERE kind = 'auth.failed' \
                            DO UPDATE SET count = audit.count + 1";

/// The trim of the oldest rows.
const TRIM: &str = "DELETE FROM audit WHERE id IN \
                    (SELECT id FROM audit WHERE at < $1 ORDER BY id LIMIT $2)";

tokio::task_local! {
    /// Who the request being served is (see [`acting_as`]).
    static ACTOR: String;
}

/// Runs `work` as `actor`: what it records in the trail names them.
pub async fn acting_as<F: std::future::Future>(actor: String, work: F) -> F::Output {
    ACTOR.scope(actor, work).await
}

/// Who the work being done is for: the request's key (see
/// [`acting_as`]), else `service` (the service's own work).
pub fn actor() -> String {
    ACTOR
        .try_with(Clone::clone)
        .unwrap_or_else(|_| "service".to_owned())
}

impl AuditEntry {
    /// A row of `kind` on `tenant`'s data, by the current [`actor`].
    pub fn new(tenant: &str, kind: &'static str) -> Self {
        Self {
            tenant: tenant.to_owned(),
            kind,
            actor: actor(),
            subject: None,
            outcome: None,
        }
    }

    pub fn subject(mut self, subject: impl Into<String>) -> Self {
        self.subject = Some(subject.into());
        self
    }

    pub fn outcome(mut self, outcome: impl Into<String>) -> Self {
        self.outcome = Some(outcome.into());
        self
    }
}
