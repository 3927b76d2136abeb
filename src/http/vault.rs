//! `/vault`: the notes folder's index.

use axum::{
    Extension,
    extract::{Path, State},
};
use chrono::Utc;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::{app::AppState, store::NewCheckpoint, vault::IndexReport};
use crate::{ids::Tenant, protocols::error::ApiError};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(reindex_vault))
        .routes(routes!(restore_checkpoint))
}

/// What a restore did.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RestoreView {
    pub checkpoint_id: String,
    /// The note's path in the vault.
    pub path: String,
    /// `restored`: the note has its saved bytes again; `removed`: it did
    /// not exist before the write, and now does not again.
    pub outcome: RestoreOutcome,
    /// A checkpoint of the note as it was just before this restore:
    /// restoring it undoes the restore.
    pub undo_checkpoint_id: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RestoreOutcome {
    Restored,
    Removed,
}

/// Undoes a note write: the note gets back the exact bytes it had before
/// the write (or is removed, when the write made it). A checkpoint of the
/// note as it is now is taken first, so that the restore can be undone in
/// turn. A checkpoint is restored once.
#[utoipa::path(
    post,
    path = "/checkpoints/{checkpoint_id}/restore",
    tag = "vault",
    params(("checkpoint_id" = String, Path, description = "As `GET /sessions/{session_id}/checkpoints` lists it")),
    responses(
        (status = 200, description = "The note is as it was before the write", body = RestoreView),
        (status = 404, description = "No such checkpoint (`checkpoint_not_found`)"),
        (status = 409, description = "Already restored (`checkpoint_already_restored`), or the note cannot be changed (`note_refused`)"),
        (status = 503, description = "The database is unavailable (`store_unavailable`)",
            headers(("Retry-After" = u32, description = "Seconds to wait"))),
    )
)]
async fn restore_checkpoint(
    State(app): State<AppState>,
    Path(checkpoint_id): Path<String>,
) -> Result<axum::Json<RestoreView>, ApiError> {
    if !is_checkpoint_id(&checkpoint_id) {
        return Err(ApiError::CheckpointNotFound);
    }
    let (checkpoint, content) = app
        .store
        .get_checkpoint(&checkpoint_id)
        .await?
        .ok_or(ApiError::CheckpointNotFound)?;
    if checkpoint.restored_at.is_some() {
        return Err(ApiError::CheckpointAlreadyRestored);
    }
    // The checkpoint's own tenant's vault (`check_owner` let only that
    // tenant's key this far).
    let vault = app.vaults.of_session(&checkpoint.session_id);
    let (note, now) = vault.snapshot(&checkpoint.path).await?;
    let undo = NewCheckpoint {
        id: new_checkpoint_id(),
        session_id: checkpoint.session_id.clone().into(),
        turn_id: checkpoint.turn_id.clone(),
        call_id: checkpoint.id.clone(),
        tool: "restore".to_owned(),
        path: note.relative.clone(),
        content: now,
        created_at: Utc::now(),
    };
    app.store.put_checkpoint(&undo).await?;
    vault.restore(&checkpoint.path, content.as_deref()).await?;
    // Two restores at once write the same bytes; one of them says so.
    if !app
        .store
        .mark_checkpoint_restored(&checkpoint.id, Utc::now())
        .await?
    {
        return Err(ApiError::CheckpointAlreadyRestored);
    }
    tracing::info!(checkpoint = %checkpoint.id, path = %note.relative, "note restored");
    Ok(axum::Json(RestoreView {
        checkpoint_id: checkpoint.id,
        path: note.relative,
        outcome: if content.is_some() {
            RestoreOutcome::Restored
        } else {
            RestoreOutcome::Removed
        },
        undo_checkpoint_id: undo.id,
    }))
}

/// A new checkpoint id: `ckpt_` and 32 hex digits.
pub fn new_checkpoint_id() -> String {
    format!("ckpt_{}", uuid::Uuid::now_v7().simple())
}

fn is_checkpoint_id(id: &str) -> bool {
    id.strip_prefix("ckpt_")
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Brings the vault's index in line with the folder: notes added or
/// changed since are indexed, deleted ones removed. An indexing already
/// running (the one at start) is waited for first.
#[utoipa::path(
    post,
    path = "/vault/reindex",
    tag = "vault",
    responses(
        (status = 200, description = "What the indexing did", body = IndexReport),
        (status = 404, description = "The vault folder does not exist (`vault_not_found`)"),
        (status = 503, description = "The database is unavailable (`store_unavailable`)",
            headers(("Retry-After" = u32, description = "Seconds to wait"))),
    )
)]
async fn reindex_vault(
    State(app): State<AppState>,
    Extension(tenant): Extension<Tenant>,
) -> Result<axum::Json<IndexReport>, ApiError> {
    let report = app.vaults.of_tenant(&tenant.0).reindex(&()).await?;
    tracing::info!(summary = %report.summary(), "vault indexed");
    Ok(axum::Json(report))
}
