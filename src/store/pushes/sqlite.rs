//! [`Pushes`] on SQLite: each write is one job on the writer thread.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rusqlite::params;
use uuid::Uuid;

use super::{PUSH_CONFIGS_PER_TASK, PushConfig, PushDelivery, PushProgress, Pushes};
use crate::{
    ids::SessionKey,
    store::{
        Result,
        sqlite::{SqliteStore, writer::ts},
    },
};

#[async_trait]
impl Pushes for SqliteStore {
    async fn put_push_config(
        &self,
        config: &PushConfig,
        session_id: &SessionKey,
        sent_seq: i64,
    ) -> Result<bool> {
        let (config, session) = (config.clone(), session_id.as_str().to_owned());
        self.writes
            .run(move |connection| {
                let task = config.task_id.to_string();
                let held: i64 = connection
                    .prepare_cached(
                        "SELECT COUNT(*) FROM push_configs WHERE task_id = ?1 AND id <> ?2",
                    )?
                    .query_row(params![task, config.id], |row| row.get(0))?;
                if held >= i64::from(PUSH_CONFIGS_PER_TASK) {
                    return Ok(false);
                }
                let (scheme, credentials) = match &config.auth {
                    Some(auth) => (Some(auth.scheme.clone()), auth.credentials.clone()),
                    None => (None, None),
                };
                connection
                    .prepare_cached(
                        "INSERT INTO push_configs (task_id, id, session_id, url, token, \
                         auth_scheme, auth_credentials, created_at, sent_seq, next_at) \
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?8) \
                         ON CONFLICT (task_id, id) DO UPDATE SET url = excluded.url, \
                         token = excluded.token, auth_scheme = excluded.auth_scheme, \
                         auth_credentials = excluded.auth_credentials",
                    )?
                    .execute(params![
                        task,
                        config.id,
                        session,
                        config.url,
                        config.token,
                        scheme,
                        credentials,
                        ts(config.created_at),
                        sent_seq
                    ])?;
                Ok(true)
            })
            .await
    }

    async fn delete_push_config(&self, task_id: Uuid, id: &str) -> Result<bool> {
        let (task, id) = (task_id.to_string(), id.to_owned());
        self.writes
            .run(move |connection| {
                let deleted = connection
                    .prepare_cached("DELETE FROM push_configs WHERE task_id = ?1 AND id = ?2")?
                    .execute(params![task, id])?;
                Ok(deleted > 0)
            })
            .await
    }

    /// Round robin by tenant within each tenant's share ([`super::Share`]).
    async fn claim_pushes(
        &self,
        owner: &str,
        now: DateTime<Utc>,
        lease_until: DateTime<Utc>,
        limit: u32,
        share: &super::Share,
    ) -> Result<Vec<PushDelivery>> {
        let owned = owner.to_owned();
        let (per_tenant, busy) = (share.per_tenant(), share.busy_json());
        let claimed = self
            .writes
            .run(move |connection| {
                let claimed = connection
                    .prepare_cached(
                        "UPDATE push_configs SET lease_owner = ?1, lease_until = ?2 \
                         WHERE rowid IN (SELECT rowid FROM ( \
                           SELECT rowid, next_at, ROW_NUMBER() OVER (PARTITION BY share \
                             ORDER BY next_at, rowid) + COALESCE((SELECT j.value \
                             FROM json_each(?6) j WHERE j.key = share), 0) AS place \
                           FROM (SELECT rowid, next_at, CASE WHEN instr(session_id, '/') > 0 \
                             THEN substr(session_id, 1, instr(session_id, '/') - 1) \
                             ELSE 'default' END AS share FROM push_configs WHERE done = 0 \
                             AND next_at <= ?3 AND (lease_until IS NULL OR lease_until < ?3))) \
                         WHERE place <= ?5 ORDER BY place, next_at LIMIT ?4)",
                    )?
                    .execute(params![
                        owned,
                        ts(lease_until),
                        ts(now),
                        limit,
                        per_tenant,
                        busy
                    ])?;
                Ok(claimed)
            })
            .await?;
        if claimed == 0 {
            return Ok(Vec::new());
        }
        self.held_pushes(owner).await
    }

    async fn record_push(
        &self,
        task_id: Uuid,
        id: &str,
        owner: &str,
        progress: &PushProgress,
        release: bool,
    ) -> Result<bool> {
        let (task, id, owner, progress) = (
            task_id.to_string(),
            id.to_owned(),
            owner.to_owned(),
            progress.clone(),
        );
        self.writes
            .run(move |connection| {
                let updated = connection
                    .prepare_cached(
                        "UPDATE push_configs SET sent_seq = ?4, attempts = ?5, \
                         failing_since = ?6, next_at = ?7, done = ?8, last_error = ?9, \
                         lease_owner = CASE WHEN ?10 THEN NULL ELSE lease_owner END, \
                         lease_until = CASE WHEN ?10 THEN NULL ELSE lease_until END \
                         WHERE task_id = ?1 AND id = ?2 AND lease_owner = ?3",
                    )?
                    .execute(params![
                        task,
                        id,
                        owner,
                        progress.sent_seq,
                        progress.attempts,
                        progress.failing_since.map(ts),
                        ts(progress.next_at),
                        progress.done,
                        progress.last_error,
                        release
                    ])?;
                Ok(updated > 0)
            })
            .await
    }

    async fn release_pushes(&self, owner: &str) -> Result<()> {
        let owner = owner.to_owned();
        self.writes
            .run(move |connection| {
                connection
                    .prepare_cached(
                        "UPDATE push_configs SET lease_owner = NULL, lease_until = NULL \
                         WHERE substr(lease_owner, 1, length(?1)) = ?1",
                    )?
                    .execute(params![owner])?;
                Ok(())
            })
            .await
    }
}
