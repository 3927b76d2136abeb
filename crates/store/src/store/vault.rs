//! The vault's index in the store: notes by content hash, their chunks,
//! and full-text search over them (SQLite FTS5, Postgres `tsvector`).
//!
//! The shared reads are written once here; each backend's writes (and
//! its search) stand side by side in `vault/sqlite.rs` and
//! `vault/postgres.rs`.

mod postgres;
mod sqlite;

use std::collections::HashMap;

use async_trait::async_trait;

use super::reader::{Reads, args};
use crate::store::Result;

/// A piece of a note, as indexed.
#[derive(Debug, Clone, PartialEq)]
pub struct VaultChunk {
    /// The nearest heading above the text; empty before the first one.
    pub heading: String,
    /// `path#heading`, or `path` before the first heading: what a citation
    /// of this chunk points at.
    pub anchor: String,
    pub text: String,
    /// The text's embedding, when the vault has an embedding model.
    pub embedding: Option<Vec<f32>>,
}

/// A note to (re-)index: it replaces whatever was indexed at its path.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexedNote {
    /// Path in the vault, `/`-separated (`notes/project.md`).
    pub path: String,
    /// SHA-256 of the file's bytes, hex.
    pub content_hash: String,
    pub bytes: i64,
    /// The model that embedded the chunks; `None`: not embedded.
    pub embedding_model: Option<String>,
    pub chunks: Vec<VaultChunk>,
}

/// What the index holds of a note.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoteState {
    pub content_hash: String,
    pub embedding_model: Option<String>,
}

/// A chunk that matched a search, best first.
#[derive(Debug, Clone, PartialEq)]
pub struct VaultHit {
    /// The chunk's row (it changes when its note is indexed again).
    pub id: i64,
    pub path: String,
    pub heading: String,
    pub anchor: String,
    pub text: String,
    /// Higher is better; comparable within one search only.
    pub score: f64,
}

/// An embedding as stored: f32, little-endian.
pub fn vector_bytes(vector: &[f32]) -> Vec<u8> {
    vector.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// An embedding read back; `None` when the bytes are not whole floats.
pub fn vector_of(bytes: &[u8]) -> Option<Vec<f32>> {
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    Some(
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
    )
}

/// The search words a full-text query may carry: letters and digits only,
/// so that nothing in them is query syntax. `None` when such a search
/// finds nothing: no word is left, or `limit` is 0.
pub(crate) fn searchable(terms: &[String], limit: u32) -> Option<Vec<String>> {
    let terms: Vec<String> = terms
        .iter()
        .map(|t| {
            t.chars()
                .filter(|c| c.is_alphanumeric())
                .collect::<String>()
        })
        .filter(|t| !t.is_empty())
        .take(32)
        .collect();
    (!terms.is_empty() && limit > 0).then_some(terms)
}

/// The index's key of the note at `path` of `vault` (`""`: the default
/// tenant's vault, and the shared one; else a tenant's): a tenant's notes
/// are keyed `{tenant}:{path}` (a vault path holds no `:`), so the
/// default tenant's keys are its paths, as before vaults were per tenant.
pub fn note_key(vault: &str, path: &str) -> String {
    if vault.is_empty() {
        path.to_owned()
    } else {
        format!("{vault}:{path}")
    }
}

/// The path of a key of `vault` ([`note_key`] undone).
pub fn path_of_key(vault: &str, key: String) -> String {
    if vault.is_empty() {
        return key;
    }
    match key
        .strip_prefix(vault)
        .and_then(|rest| rest.strip_prefix(':'))
    {
        Some(path) => path.to_owned(),
        None => key,
    }
}

/// The vault's index: each method names the vault (see [`note_key`]), and
/// sees nothing of another.
#[async_trait]
pub trait VaultIndex: Reads + Send + Sync + 'static {
    /// What the index holds of each note of `vault`, by path.
    async fn vault_notes(&self, vault: &str) -> Result<HashMap<String, NoteState>> {
        let sql = "SELECT path, content_hash, embedding_model FROM vault_notes WHERE vault = $1";
        let rows: Vec<(String, String, Option<String>)> =
            self.reader().rows(sql, args![vault]).await?;
        Ok(rows
            .into_iter()
            .map(|(key, content_hash, embedding_model)| {
                let state = NoteState {
                    content_hash,
                    embedding_model,
                };
                (path_of_key(vault, key), state)
            })
            .collect())
    }

    /// Indexes a note of `vault`, replacing what was indexed at its path.
    async fn vault_put_note(&self, vault: &str, note: &IndexedNote) -> Result<()>;

    /// Removes notes of `vault` (and their chunks) from the index; returns
    /// how many were there.
    async fn vault_remove_notes(&self, vault: &str, paths: &[String]) -> Result<u64>;

    /// Chunks of `vault` matching any of `terms` (words), best first.
    async fn vault_search(
        &self,
        vault: &str,
        terms: &[String],
        limit: u32,
    ) -> Result<Vec<VaultHit>>;

    /// The embeddings `model` made of `vault`'s chunks, by chunk id, at
    /// most `limit`.
    async fn vault_vectors(
        &self,
        vault: &str,
        model: &str,
        limit: u32,
    ) -> Result<Vec<(i64, Vec<f32>)>> {
        let sql = "SELECT c.id, c.embedding FROM vault_chunks c \
             JOIN vault_notes n ON n.path = c.path \
             WHERE c.vault = $3 AND n.embedding_model = $1 AND c.embedding IS NOT NULL \
             ORDER BY c.id LIMIT $2";
        let rows: Vec<(i64, Vec<u8>)> = self.reader().rows(sql, args![model, limit, vault]).await?;
        Ok(rows
            .into_iter()
            .filter_map(|(id, bytes)| vector_of(&bytes).map(|v| (id, v)))
            .collect())
    }

    /// Chunks of `vault` by id (score 0), in no particular order; ids no
    /// longer indexed (or of another vault) are left out.
    async fn vault_chunks(&self, vault: &str, ids: &[i64]) -> Result<Vec<VaultHit>> {
        let ids = &ids[..ids.len().min(256)];
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let list: Vec<String> = (2..=ids.len() + 1).map(|n| format!("${n}")).collect();
        let sql = format!(
            "SELECT id, path, heading, anchor, text FROM vault_chunks \
             WHERE vault = $1 AND id IN ({})",
            list.join(", ")
        );
        let mut bound = vec![vault.to_owned().into()];
        bound.extend(ids.iter().map(|id| (*id).into()));
        let rows: Vec<(i64, String, String, String, String)> =
            self.reader().rows(sqlx::AssertSqlSafe(sql), bound).await?;
        Ok(rows
            .into_iter()
            .map(|(id, key, heading, anchor, text)| {
                (id, path_of_key(vault, key), heading, anchor, text, 0.0).into()
            })
            .collect())
    }
}

/// A [`VaultHit`] as selected: id, path, heading, anchor, text, score.
type HitRow = (i64, String, String, String, String, f64);

/// The hit of a row of `vault`: its key made a path again.
fn hit_of(vault: &str, (id, key, heading, anchor, text, score): HitRow) -> VaultHit {
    (id, path_of_key(vault, key), heading, anchor, text, score).into()
}

impl From<HitRow> for VaultHit {
    fn from((id, path, heading, anchor, text, score): HitRow) -> Self {
        Self {
            id,
            path,
            heading,
            anchor,
            text,
            score,
        }
    }
}
