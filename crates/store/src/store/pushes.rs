//! A2A push notification configurations and their delivery: a task's
//! log is the outbox, and each configuration keeps how far along it its
//! URL has acknowledged (`sent_seq`), when to try next, and which
//! replica holds it (a lease that runs out: a replica that dies
//! mid-delivery leaves the cursor where it was, and another goes on).
//!
//! The reads are written once here; each backend's writes stand side by
//! side in `pushes/sqlite.rs` and `pushes/postgres.rs`.

mod postgres;
mod sqlite;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::reader::args;
use crate::{ids::SessionKey, store::Result};

/// How a push is authenticated: `Authorization: {scheme} {credentials}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushAuth {
    pub scheme: String,
    pub credentials: Option<String>,
}

/// A task's push notification configuration, as the client gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushConfig {
    pub task_id: Uuid,
    pub id: String,
    pub url: String,
    /// Sent as `X-A2A-Notification-Token`.
    pub token: Option<String>,
    pub auth: Option<PushAuth>,
    pub created_at: DateTime<Utc>,
}

/// A configuration a replica holds to deliver, with its progress.
#[derive(Debug, Clone)]
pub struct PushDelivery {
    pub config: PushConfig,
    pub session_id: SessionKey,
    /// The last event of the task's log the URL acknowledged.
    pub sent_seq: i64,
    /// Failed tries of the next push.
    pub attempts: u32,
    /// When the next push first failed.
    pub failing_since: Option<DateTime<Utc>>,
}

/// A delivery's state after a try.
#[derive(Debug, Clone)]
pub struct PushProgress {
    pub sent_seq: i64,
    pub attempts: u32,
    pub failing_since: Option<DateTime<Utc>>,
    pub next_at: DateTime<Utc>,
    /// Nothing more to deliver: the task's end went out, or it was given
    /// up on.
    pub done: bool,
    pub last_error: Option<String>,
}

#[derive(sqlx::FromRow)]
struct ConfigRow {
    task_id: String,
    id: String,
    url: String,
    token: Option<String>,
    auth_scheme: Option<String>,
    auth_credentials: Option<String>,
    created_at: DateTime<Utc>,
}

#[derive(sqlx::FromRow)]
struct DeliveryRow {
    #[sqlx(flatten)]
    config: ConfigRow,
    session_id: String,
    sent_seq: i64,
    attempts: i64,
    failing_since: Option<DateTime<Utc>>,
}

impl TryFrom<ConfigRow> for PushConfig {
    type Error = super::StoreError;
    fn try_from(row: ConfigRow) -> Result<Self> {
        Ok(Self {
            task_id: super::records::parse_uuid(&row.task_id)?,
            id: row.id,
            url: row.url,
            token: row.token,
            auth: row.auth_scheme.map(|scheme| PushAuth {
                scheme,
                credentials: row.auth_credentials,
            }),
            created_at: row.created_at,
        })
    }
}

const CONFIG_COLUMNS: &str = "task_id, id, url, token, auth_scheme, auth_credentials, created_at";

/// Configurations a task holds at most.
pub const PUSH_CONFIGS_PER_TASK: u32 = 10;

/// Push configurations and their deliveries.
#[async_trait]
pub trait Pushes: super::Leases + Send + Sync + 'static {
    /// Stores a task's configuration, or replaces the one of that id
    /// (its delivery goes on from where it was). `sent_seq`: the last
    /// event of the log the new configuration is not sent. False: the
    /// task holds [`PUSH_CONFIGS_PER_TASK`] others already.
    async fn put_push_config(
        &self,
        config: &PushConfig,
        session_id: &SessionKey,
        sent_seq: i64,
    ) -> Result<bool>;

    /// Deletes a task's configuration; false when there was none.
    async fn delete_push_config(&self, task_id: Uuid, id: &str) -> Result<bool>;

    /// Records a delivery's progress, if `owner` still holds it; `release`
    /// gives its lease up. False: the lease was lost (another replica
    /// took it, or the configuration is gone).
    async fn record_push(
        &self,
        task_id: Uuid,
        id: &str,
        owner: &str,
        progress: &PushProgress,
        release: bool,
    ) -> Result<bool>;

    /// A task's configurations, oldest first.
    async fn push_configs(&self, task_id: Uuid) -> Result<Vec<PushConfig>> {
        let sql = format!(
            "SELECT {CONFIG_COLUMNS} FROM push_configs WHERE task_id = $1 \
             ORDER BY created_at, id LIMIT $2"
        );
        let rows: Vec<ConfigRow> = self
            .reader()
            .rows(
                sqlx::AssertSqlSafe(sql),
                args![task_id, PUSH_CONFIGS_PER_TASK],
            )
            .await?;
        rows.into_iter().map(TryInto::try_into).collect()
    }

    /// One configuration of a task.
    async fn push_config(&self, task_id: Uuid, id: &str) -> Result<Option<PushConfig>> {
        let sql =
            format!("SELECT {CONFIG_COLUMNS} FROM push_configs WHERE task_id = $1 AND id = $2");
        self.reader()
            .row::<ConfigRow>(sqlx::AssertSqlSafe(sql), args![task_id, id])
            .await?
            .map(TryInto::try_into)
            .transpose()
    }

    /// The deliveries `owner` holds (what a claim took).
    async fn held_pushes(&self, owner: &str) -> Result<Vec<PushDelivery>> {
        let sql = format!(
            "SELECT {CONFIG_COLUMNS}, session_id, sent_seq, attempts, failing_since \
             FROM push_configs WHERE lease_owner = $1 AND NOT done ORDER BY next_at"
        );
        let rows: Vec<DeliveryRow> = self
            .reader()
            .rows(sqlx::AssertSqlSafe(sql), args![owner])
            .await?;
        rows.into_iter()
            .map(|row| {
                Ok(PushDelivery {
                    config: row.config.try_into()?,
                    session_id: SessionKey::from(row.session_id),
                    sent_seq: row.sent_seq,
                    attempts: u32::try_from(row.attempts).unwrap_or(u32::MAX),
                    failing_since: row.failing_since,
                })
            })
            .collect()
    }
}
