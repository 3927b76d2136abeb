//! [`Access`] on SQLite: each write is one job on the writer thread.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rusqlite::params;

use super::Access;
use crate::store::Result;
use crate::store::{
    NewApproval, NewArtifact, NewCheckpoint, NewToolResult,
    sqlite::{SqliteStore, writer::ts},
};

#[async_trait]
impl Access for SqliteStore {
    async fn put_artifact(&self, artifact: &NewArtifact) -> Result<()> {
        let artifact = artifact.clone();
        self.writes
            .run(move |connection| {
                connection
                    .prepare_cached(
                        "INSERT INTO artifacts (id, session_id, turn_id, call_id, tool, content, \
                     created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                    )?
                    .execute(params![
                        artifact.id,
                        artifact.session_id.as_str(),
                        artifact.turn_id,
                        artifact.call_id,
                        artifact.tool,
                        artifact.content,
                        ts(artifact.created_at)
                    ])?;
                Ok(())
            })
            .await
    }

    async fn put_checkpoint(&self, checkpoint: &NewCheckpoint) -> Result<()> {
        let checkpoint = checkpoint.clone();
        self.writes
            .run(move |connection| {
                let bytes = checkpoint
                    .content
                    .as_ref()
                    .map(|c| i64::try_from(c.len()).unwrap_or(i64::MAX));
                connection
                    .prepare_cached(
                        "INSERT INTO checkpoints (id, session_id, turn_id, call_id, tool, path, \
                     existed, content, bytes, created_at) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                    )?
                    .execute(params![
                        checkpoint.id,
                        checkpoint.session_id.as_str(),
                        checkpoint.turn_id,
                        checkpoint.call_id,
                        checkpoint.tool,
                        checkpoint.path,
                        checkpoint.content.is_some(),
                        checkpoint.content,
                        bytes,
                        ts(checkpoint.created_at)
                    ])?;
                Ok(())
            })
            .await
    }

    async fn mark_checkpoint_restored(&self, id: &str, at: DateTime<Utc>) -> Result<bool> {
        let id = id.to_owned();
        self.writes
            .run(move |connection| {
                let updated = connection
                .prepare_cached(
                    "UPDATE checkpoints SET restored_at = ?2 WHERE id = ?1 AND restored_at IS NULL",
                )?
                .execute(params![id, ts(at)])?;
                Ok(updated == 1)
            })
            .await
    }

    async fn create_api_key(
        &self,
        id: &str,
        tenant: &str,
        key_hash: &str,
        admin: bool,
        at: DateTime<Utc>,
    ) -> Result<()> {
        let (id, tenant, key_hash) = (id.to_owned(), tenant.to_owned(), key_hash.to_owned());
        self.writes
            .run(move |connection| {
                connection
                    .prepare_cached(
                        "INSERT INTO api_keys (id, tenant, key_hash, admin, created_at) \
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                    )?
                    .execute(params![id, tenant, key_hash, admin, ts(at)])?;
                Ok(())
            })
            .await
    }

    async fn revoke_api_key(&self, id: &str, at: DateTime<Utc>) -> Result<bool> {
        let id = id.to_owned();
        self.writes
            .run(move |connection| {
                let done = connection
                    .prepare_cached(
                        "UPDATE api_keys SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL",
                    )?
                    .execute(params![id, ts(at)])?;
                Ok(done == 1)
            })
            .await
    }

    async fn post_tool_result(&self, result: &NewToolResult) -> Result<bool> {
        let r = result.clone();
        self.writes
            .run(move |connection| {
                let inserted = connection
                    .prepare_cached(
                        "INSERT INTO client_tool_results (turn_id, call_id, session_id, output, \
                         is_error, posted_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
                         ON CONFLICT (turn_id, call_id) DO NOTHING",
                    )?
                    .execute(params![
                        r.turn_id.to_string(),
                        r.call_id,
                        r.session_id.as_str(),
                        r.output,
                        r.is_error,
                        ts(Utc::now())
                    ])?;
                Ok(inserted == 1)
            })
            .await
    }

    async fn decide_approval(&self, approval: &NewApproval) -> Result<bool> {
        let a = approval.clone();
        self.writes
            .run(move |connection| {
                let inserted = connection
                    .prepare_cached(
                        "INSERT INTO approvals (turn_id, call_id, session_id, approved, reason, \
                     decided_at, edited_arguments, arguments_sha256) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) \
                     ON CONFLICT (turn_id, call_id) DO NOTHING",
                    )?
                    .execute(params![
                        a.turn_id.to_string(),
                        a.call_id,
                        a.session_id.as_str(),
                        a.approved,
                        a.reason,
                        ts(Utc::now()),
                        a.edited_arguments,
                        a.arguments_sha256
                    ])?;
                Ok(inserted == 1)
            })
            .await
    }
}
