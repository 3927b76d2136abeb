//! [`Access`] on Postgres: plain sqlx, each call bounded by the call
//! timeout (see [`PostgresStore::bounded`]).

use async_trait::async_trait;

use super::Access;
use crate::store::Result;
use crate::store::{
    NewApproval, NewArtifact, NewCheckpoint, NewToolResult, postgres::PostgresStore, reader::args,
};

#[async_trait]
impl Access for PostgresStore {
    async fn put_artifact(&self, artifact: &NewArtifact) -> Result<()> {
        let sql = "INSERT INTO artifacts (id, session_id, turn_id, call_id, tool, content, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7)";
        self.execute(
            sql,
            args![
                &artifact.id,
                &artifact.session_id,
                &artifact.turn_id,
                &artifact.call_id,
                &artifact.tool,
                &artifact.content,
                artifact.created_at
            ],
        )
        .await?;
        Ok(())
    }

    async fn put_checkpoint(&self, checkpoint: &NewCheckpoint) -> Result<()> {
        let c = checkpoint;
        let sql = "INSERT INTO checkpoints (id, session_id, turn_id, call_id, tool, path, existed, \
             content, bytes, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";
        let bytes = c
            .content
            .as_ref()
            .map(|content| i64::try_from(content.len()).unwrap_or(i64::MAX));
        let args = args![
            &c.id,
            &c.session_id,
            &c.turn_id,
            &c.call_id,
            &c.tool,
            &c.path,
            c.content.is_some(),
            c.content.as_deref(),
            bytes,
            c.created_at
        ];
        self.execute(sql, args).await?;
        Ok(())
    }

    async fn mark_checkpoint_restored(
        &self,
        id: &str,
        at: chrono::DateTime<chrono::Utc>,
    ) -> Result<bool> {
        let sql = "UPDATE checkpoints SET restored_at = $2 WHERE id = $1 AND restored_at IS NULL";
        let done = self.execute(sql, args![id, at]).await?;
        Ok(done == 1)
    }

    async fn create_api_key(
        &self,
        id: &str,
        tenant: &str,
        key_hash: &str,
        admin: bool,
        at: chrono::DateTime<chrono::Utc>,
    ) -> Result<()> {
        let sql = "INSERT INTO api_keys (id, tenant, key_hash, admin, created_at) \
                   VALUES ($1, $2, $3, $4, $5)";
        self.execute(sql, args![id, tenant, key_hash, admin, at])
            .await?;
        Ok(())
    }

    async fn revoke_api_key(&self, id: &str, at: chrono::DateTime<chrono::Utc>) -> Result<bool> {
        let sql = "UPDATE api_keys SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL";
        let done = self.execute(sql, args![id, at]).await?;
        Ok(done == 1)
    }

    async fn post_tool_result(&self, result: &NewToolResult) -> Result<bool> {
        let r = result;
        let sql = "INSERT INTO client_tool_results (turn_id, call_id, session_id, output, is_error, \
                   posted_at) VALUES ($1, $2, $3, $4, $5, now()) \
                   ON CONFLICT (turn_id, call_id) DO NOTHING";
        let inserted = self
            .execute(
                sql,
                args![r.turn_id, &r.call_id, &r.session_id, &r.output, r.is_error],
            )
            .await?;
        Ok(inserted == 1)
    }

    async fn decide_approval(&self, approval: &NewApproval) -> Result<bool> {
        let a = approval;
        let sql = "INSERT INTO approvals (turn_id, call_id, session_id, approved, reason, \
                 decided_at, edited_arguments, arguments_sha256) \
                 VALUES ($1, $2, $3, $4, $5, now(), $6, $7) ON CONFLICT (turn_id, call_id) DO NOTHING";
        let inserted = self
            .execute(
                sql,
                args![
                    a.turn_id,
                    &a.call_id,
                    &a.session_id,
                    a.approved,
                    &a.reason,
                    &a.edited_arguments,
                    &a.arguments_sha256
                ],
            )
            .await?;
        Ok(inserted == 1)
    }
}
