//! [`Pushes`] on Postgres: plain sqlx, each call bounded by the call
//! timeout; replicas claim without waiting on each other (`SKIP LOCKED`).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{PUSH_CONFIGS_PER_TASK, PushConfig, PushDelivery, PushProgress, Pushes};
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
                   auth_credentials, created_at, sent_seq, next_at) \
                   SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $8 \
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
                    i64::from(PUSH_CONFIGS_PER_TASK)
                ],
            )
            .await?;
        Ok(written > 0)
    }

    async fn delete_push_config(&self, task_id: Uuid, id: &str) -> Result<bool> {
        let sql = "DELETE FROM push_configs WHERE task_id = $1 AND id = $2";
        Ok(self.execute(sql, args![task_id, id]).await? > 0)
    }

    /// Round robin by tenant within each tenant's share ([`super::Share`]); the
    /// lease is checked again on the row it updates (a replica that took
    /// it meanwhile keeps it).
    async fn claim_pushes(
        &self,
        owner: &str,
        now: DateTime<Utc>,
        lease_until: DateTime<Utc>,
        limit: u32,
        share: &super::Share,
    ) -> Result<Vec<PushDelivery>> {
        let sql = "UPDATE push_configs SET lease_owner = $1, lease_until = $2 \
                   WHERE NOT done AND (lease_until IS NULL OR lease_until < $3) \
                   AND (task_id, id) IN (SELECT task_id, id FROM ( \
                     SELECT task_id, id, next_at, ROW_NUMBER() OVER (PARTITION BY share \
                       ORDER BY next_at, task_id, id) + COALESCE(($6::jsonb ->> share)::int8, 0) \
                       AS place \
                     FROM (SELECT task_id, id, next_at, CASE WHEN strpos(session_id, '/') > 0 \
                       THEN split_part(session_id, '/', 1) ELSE 'default' END AS share \
                       FROM push_configs WHERE NOT done AND next_at <= $3 \
                       AND (lease_until IS NULL OR lease_until < $3)) due) placed \
                   WHERE place <= $5 ORDER BY place, next_at LIMIT $4)";
        let busy = share.busy_json();
        let claimed = self
            .execute(
                sql,
                args![
                    owner,
                    lease_until,
                    now,
                    limit,
                    share.per_tenant(),
                    busy.as_str()
                ],
            )
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

    async fn release_pushes(&self, owner: &str) -> Result<()> {
        let sql = "UPDATE push_configs SET lease_owner = NULL, lease_until = NULL \
                   WHERE substr(lease_owner, 1, length($1)) = $1";
        self.execute(sql, args![owner]).await?;
        Ok(())
    }
}
