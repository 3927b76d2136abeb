//! [`VaultIndex`] on SQLite: each write is one job on the writer thread;
//! search by FTS5 on the reader pool.

use async_trait::async_trait;
use chrono::Utc;
use rusqlite::params;

use super::{HitRow, IndexedNote, VaultHit, VaultIndex, hit_of, note_key, searchable};
use crate::store::Result;
use crate::store::{
    reader::{Reads, args},
    sqlite::{SqliteStore, any_of, writer::ts},
};

#[async_trait]
impl VaultIndex for SqliteStore {
    /// FTS5 over heading and text, any of the terms, ranked by BM25 with
    /// the heading weighing four times the text.
    async fn vault_search(
        &self,
        vault: &str,
        terms: &[String],
        limit: u32,
    ) -> Result<Vec<VaultHit>> {
        let Some(terms) = searchable(terms, limit) else {
            return Ok(Vec::new());
        };
        let sql = "SELECT c.id, c.path, c.heading, c.anchor, c.text, -bm25(vault_fts, 4.0, 1.0) \
             FROM vault_fts JOIN vault_chunks c ON c.id = vault_fts.rowid \
             WHERE vault_fts MATCH $1 AND c.vault = $3 \
             ORDER BY bm25(vault_fts, 4.0, 1.0), c.id LIMIT $2";
        let rows: Vec<HitRow> = self
            .reader()
            .rows(sql, args![any_of(&terms), limit, vault])
            .await?;
        Ok(rows.into_iter().map(|row| hit_of(vault, row)).collect())
    }

    async fn vault_put_note(&self, vault: &str, note: &IndexedNote) -> Result<()> {
        let note = note.clone();
        let (vault, key) = (vault.to_owned(), note_key(vault, &note.path));
        self.writes.run(move |connection| {
            connection
                .prepare_cached("DELETE FROM vault_chunks WHERE path = ?1")?
                .execute(params![key])?;
            connection
                .prepare_cached(
                    "INSERT INTO vault_notes (path, content_hash, bytes, indexed_at, embedding_model, \
                     vault) VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (path) DO UPDATE SET \
                     content_hash = excluded.content_hash, bytes = excluded.bytes, \
                     indexed_at = excluded.indexed_at, embedding_model = excluded.embedding_model",
                )?
                .execute(params![
                    key,
                    note.content_hash,
                    note.bytes,
                    ts(Utc::now()),
                    note.embedding_model,
                    vault
                ])?;
            let mut insert = connection.prepare_cached(
                "INSERT INTO vault_chunks (path, ordinal, heading, anchor, text, embedding, vault) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?;
            for (ordinal, chunk) in note.chunks.iter().enumerate() {
                insert.execute(params![
                    key,
                    i64::try_from(ordinal).unwrap_or(i64::MAX),
                    chunk.heading,
                    chunk.anchor,
                    chunk.text,
                    chunk
                        .embedding
                        .as_deref()
                        .map(crate::store::vault::vector_bytes),
                    vault
                ])?;
            }
            Ok(())
        })
        .await
    }

    /// Removes notes and their chunks from the index.
    async fn vault_remove_notes(&self, vault: &str, paths: &[String]) -> Result<u64> {
        if paths.is_empty() {
            return Ok(0);
        }
        let paths: Vec<String> = paths.iter().map(|p| note_key(vault, p)).collect();
        self.writes
            .run(move |connection| {
                let mut removed = 0;
                for path in &paths {
                    connection
                        .prepare_cached("DELETE FROM vault_chunks WHERE path = ?1")?
                        .execute(params![path])?;
                    removed += connection
                        .prepare_cached("DELETE FROM vault_notes WHERE path = ?1")?
                        .execute(params![path])?;
                }
                Ok(u64::try_from(removed).unwrap_or(u64::MAX))
            })
            .await
    }
}
