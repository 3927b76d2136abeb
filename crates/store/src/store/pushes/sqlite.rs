//! [`Pushes`] on SQLite: each write is one job on the writer thread.

use async_trait::async_trait;
use rusqlite::params;
use uuid::Uuid;

use super::{PUSH_CONFIGS_PER_TASK, PushConfig, PushProgress, Pushes};
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
        let tenant = session_id.tenant().to_owned();
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
                         auth_scheme, auth_credentials, created_at, sent_seq, next_at, share_key) \
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?8, ?10) \
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
                        sent_seq,
                        tenant
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
}
