//! What a person or a tool may reach: API keys, decisions on calls
//! waiting for approval, checkpoints of notes before a write, and tool
//! outputs kept as artifacts.
//!
//! The reads are written once here; each backend's writes stand side by
//! side in `access/sqlite.rs` and `access/postgres.rs`.

mod postgres;
mod sqlite;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{
    ArtifactRecord, CheckpointRecord, NewApproval, NewArtifact, NewCheckpoint, NewToolResult,
    reader::{Reads, args},
};
use crate::ids::SessionKey;
use crate::store::Result;

/// An API key as listed: id, tenant, admin, created, revoked.
pub type ApiKeyRow = (String, String, bool, DateTime<Utc>, Option<DateTime<Utc>>);

/// A key as found: its id, its tenant, whether it is an admin key.
pub type FoundKey = (String, String, bool);

/// The columns of a [`CheckpointRecord`].
const CHECKPOINT_COLUMNS: &str =
    "id, session_id, turn_id, call_id, tool, path, existed, bytes, created_at, restored_at";

/// Keys, approvals, checkpoints and artifacts.
#[async_trait]
pub trait Access: Reads + Send + Sync + 'static {
    /// Keeps an API key's hash for `tenant` (`admin`: an admin key).
    async fn create_api_key(
        &self,
        id: &str,
        tenant: &str,
        key_hash: &str,
        admin: bool,
        at: DateTime<Utc>,
    ) -> Result<()>;

    /// The key of a hash, unless revoked.
    async fn find_api_key(&self, key_hash: &str) -> Result<Option<FoundKey>> {
        let sql = "SELECT id, tenant, admin FROM api_keys \
                   WHERE key_hash = $1 AND revoked_at IS NULL";
        self.reader().row(sql, args![key_hash]).await
    }

    /// The hashes of the keys not revoked made at or after `since` (all
    /// of them: `None`), oldest first, at most `limit`, each with when it
    /// was made.
    async fn api_key_hashes(
        &self,
        since: Option<DateTime<Utc>>,
        limit: u32,
    ) -> Result<Vec<(String, DateTime<Utc>)>> {
        let sql = "SELECT key_hash, created_at FROM api_keys \
                   WHERE revoked_at IS NULL AND ($1 IS NULL OR created_at >= $1) \
                   ORDER BY created_at, id LIMIT $2";
        self.reader()
            .rows(sql, args![since, i64::from(limit)])
            .await
    }

    /// The ids of the keys revoked at or after `since` (at most 10,000).
    async fn keys_revoked_since(&self, since: DateTime<Utc>) -> Result<Vec<String>> {
        let sql = "SELECT id FROM api_keys WHERE revoked_at >= $1 ORDER BY revoked_at LIMIT 10000";
        let rows: Vec<(String,)> = self.reader().rows(sql, args![since]).await?;
        Ok(rows.into_iter().map(|(id,)| id).collect())
    }

    /// Revokes a key; false when there is no such key (or it already was).
    async fn revoke_api_key(&self, id: &str, at: DateTime<Utc>) -> Result<bool>;

    /// The tenant of the key `id`.
    async fn api_key_tenant(&self, id: &str) -> Result<Option<String>> {
        let sql = "SELECT tenant FROM api_keys WHERE id = $1";
        let row: Option<(String,)> = self.reader().row(sql, args![id]).await?;
        Ok(row.map(|(tenant,)| tenant))
    }

    /// Revokes every key of `tenant`; their ids.
    async fn revoke_tenant_keys(&self, tenant: &str, at: DateTime<Utc>) -> Result<Vec<String>> {
        let sql = "SELECT id FROM api_keys WHERE tenant = $1 AND revoked_at IS NULL ORDER BY id";
        let ids: Vec<(String,)> = self.reader().rows(sql, args![tenant]).await?;
        let mut revoked = Vec::with_capacity(ids.len());
        for (id,) in ids {
            if self.revoke_api_key(&id, at).await? {
                revoked.push(id);
            }
        }
        Ok(revoked)
    }

    /// Keys, oldest first.
    async fn list_api_keys(&self) -> Result<Vec<ApiKeyRow>> {
        let sql = "SELECT id, tenant, admin, created_at, revoked_at FROM api_keys \
                   ORDER BY created_at, id";
        self.reader().rows(sql, args![]).await
    }

    /// Records a person's decision on a call waiting for approval; false
    /// when the call was already decided (the first decision stands).
    async fn decide_approval(&self, approval: &NewApproval) -> Result<bool>;

    /// The decision on a call, if one was made: approved, and why not.
    async fn get_approval(
        &self,
        turn_id: Uuid,
        call_id: &str,
    ) -> Result<Option<(bool, Option<String>)>> {
        let sql = "SELECT approved, reason FROM approvals WHERE turn_id = $1 AND call_id = $2";
        self.reader().row(sql, args![turn_id, call_id]).await
    }

    /// What an approval of a call binds: the edited arguments (JSON),
    /// when the person edited them, and the SHA-256 of the arguments it is
    /// for (decisions made before approvals were bound have neither).
    async fn approval_terms(
        &self,
        turn_id: Uuid,
        call_id: &str,
    ) -> Result<Option<(Option<String>, Option<String>)>> {
        let sql = "SELECT edited_arguments, arguments_sha256 FROM approvals \
                   WHERE turn_id = $1 AND call_id = $2";
        self.reader().row(sql, args![turn_id, call_id]).await
    }

    /// Records what a client posted for a call of its own tool; false when
    /// the call already has an answer (the first stands).
    async fn post_tool_result(&self, result: &NewToolResult) -> Result<bool>;

    /// What a client posted for a call, if it did: the output, and whether
    /// it is an error.
    async fn get_tool_result(
        &self,
        turn_id: Uuid,
        call_id: &str,
    ) -> Result<Option<(String, bool)>> {
        let sql = "SELECT output, is_error FROM client_tool_results \
                   WHERE turn_id = $1 AND call_id = $2";
        self.reader().row(sql, args![turn_id, call_id]).await
    }

    /// Keeps a note's state before a write.
    async fn put_checkpoint(&self, checkpoint: &NewCheckpoint) -> Result<()>;

    /// The newest `limit` checkpoints of a session, oldest first.
    async fn list_checkpoints(
        &self,
        session_id: &SessionKey,
        limit: u32,
    ) -> Result<Vec<CheckpointRecord>> {
        let sql = format!(
            "SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE session_id = $1 \
             ORDER BY created_at DESC, id DESC LIMIT $2"
        );
        let mut newest_first: Vec<CheckpointRecord> = self
            .reader()
            .rows(sqlx::AssertSqlSafe(sql), args![session_id, limit])
            .await?;
        newest_first.reverse();
        Ok(newest_first)
    }

    /// A checkpoint and the note's saved bytes (`None`: there was no note).
    async fn get_checkpoint(
        &self,
        id: &str,
    ) -> Result<Option<(CheckpointRecord, Option<Vec<u8>>)>> {
        let sql = format!("SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE id = $1");
        let reader = self.reader();
        let Some(record) = reader.row(sqlx::AssertSqlSafe(sql), args![id]).await? else {
            return Ok(None);
        };
        let sql = "SELECT content FROM checkpoints WHERE id = $1";
        let content: Option<Vec<u8>> = reader.value(sql, args![id]).await?;
        Ok(Some((record, content)))
    }

    /// The checkpoints of one call of a turn, oldest first: each one's id,
    /// note path and saved bytes (`None`: there was no note).
    async fn call_checkpoints(
        &self,
        session_id: &SessionKey,
        turn_id: &str,
        call_id: &str,
    ) -> Result<Vec<(String, String, Option<Vec<u8>>)>> {
        let sql = "SELECT id, path, content FROM checkpoints \
             WHERE session_id = $1 AND turn_id = $2 AND call_id = $3 ORDER BY created_at, id";
        self.reader()
            .rows(sql, args![session_id, turn_id, call_id])
            .await
    }

    /// Marks a checkpoint restored; false when it already was (or is not).
    async fn mark_checkpoint_restored(&self, id: &str, at: DateTime<Utc>) -> Result<bool>;

    /// The tenant a checkpoint belongs to (through its session).
    async fn checkpoint_tenant(&self, checkpoint_id: &str) -> Result<Option<String>> {
        let sql = "SELECT s.tenant FROM checkpoints c JOIN sessions s ON s.id = c.session_id \
             WHERE c.id = $1";
        let row: Option<(String,)> = self.reader().row(sql, args![checkpoint_id]).await?;
        Ok(row.map(|(tenant,)| tenant))
    }

    /// Stores a tool output too large for the prompt.
    async fn put_artifact(&self, artifact: &NewArtifact) -> Result<()>;

    /// An artifact of a session.
    async fn get_artifact(
        &self,
        session_id: &SessionKey,
        artifact_id: &str,
    ) -> Result<Option<ArtifactRecord>> {
        let sql = "SELECT id, session_id, turn_id, call_id, tool, content, created_at \
             FROM artifacts WHERE id = $1 AND session_id = $2";
        self.reader().row(sql, args![artifact_id, session_id]).await
    }
}
