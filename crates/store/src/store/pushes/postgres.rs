//! [`Pushes`] on Postgres: plain sqlx, each call bounded by the call
//! timeout; replicas claim without waiting on each other (`SKIP LOCKED`).

use async_trait::async_trait;
use uuid::Uuid;

use super::{PUSH_CONFIGS_PER_TASK, PushConfig, PushProgress, Pushes};
use crate::{
    ids::SessionKey,
    store::{Result, postgres::PostgresStore, reader::args},
};

#[async_trait]
impl Pushes for PostgresStore {
    async fn put_push_config(
        &self,
        config: &PushConfig,
        session_id: &SessionKey,
        sent_seq: i64,
    ) -> Result<bool> {
        let (scheme, credentials) = match &config.auth {
            Some(auth) => (Some(auth.scheme.as_str()), auth.credentials.as_deref()),
            None => (None, None),
        };
        // One statement: inserted only while the task holds fewer than
        // the most (a replacement always).
        let sql = "INSERT INTO push_configs (task_id, id, session_id, url, token, auth_scheme, \
                   auth_credentials, created_at, sent_seq, next_at, share_key) \
                   SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $8, $11 \
                   WHERE (SELECT COUNT(*) FROM push_configs WHERE task_id = $1 AND id <> $2) < $10 \
                   ON CONFLICT (task_id, id) DO UPDATE SET url = excluded.url, \
                   token = excluded.token, auth_scheme = excluded.auth_scheme, \
                   auth_credentials = excluded.auth_credentials";
        let written = self
            .execute(
                sql,
                args![
                    config.task_id,
                    config.id.as_str(),
                    session_id,
                    config.url.as_str(),
                    config.token.as_deref(),
                    scheme,
                    credentials,
                    config.created_at,
                    sent_seq,
                    i64::from(PUSH_CONFIGS_PER_TASK),
                    session_id.tenant()
                ],
            )
            .await?;
        Ok(written > 0)
    }

    async fn delete_push_config(&self, task_id: Uuid, id: &str) -> Result<bool> {
        let sql = "DELETE FROM push_configs WHERE task_id = $1 AND id = $2";
        Ok(self.execute(sql, args![task_id, id]).await? > 0)
    }

    async fn record_push(
        &self,
        task_id: Uuid,
        id: &str,
        owner: &str,
        progress: &PushProgress,
        release: bool,
    ) -> Result<bool> {
        let sql = "UPDATE push_configs SET sent_seq = $4, attempts = $5, failing_since = $6, \
                   next_at = $7, done = $8, last_error = $9, \
                   lease_owner = CASE WHEN $10 THEN NULL ELSE lease_owner END, \
                   lease_until = CASE WHEN $10 THEN NULL ELSE lease_until END \
                   WHERE task_id = $1 AND id = $2 AND lease_owner = $3";
        let updated = self
            .execute(
                sql,
                args![
                    task_id,
                    id,
                    owner,
                    progress.sent_seq,
                    i64::from(progress.attempts),
                    progress.failing_since,
                    progress.next_at,
                    progress.done,
                    progress.last_error.as_deref(),
                    release
                ],
            )
            .await?;
        Ok(updated > 0)
    }
}
