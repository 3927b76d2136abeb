//! [`VaultIndex`] on SQLite: each write is one job on the writer thread;
//! search by FTS5 on the reader pool.

use async_trait::async_trait;
use chrono::Utc;
use rusqlite::params;

use super::{HitRow, IndexedNote, VaultHit, VaultIndex, searchable};
use crate::store::Result;
use crate::store::{
    reader::{Reads, args},
    sqlite::{SqliteStore, any_of, writer::ts},
};

#[async_trait]
impl VaultIndex for SqliteStore {
    /// FTS5 over heading and text, any of the terms, ranked by BM25 with
    /// the heading weighing four times the text.
    async fn vault_search(&self, terms: &[String], limit: u32) -> Result<Vec<VaultHit>> {
        let Some(terms) = searchable(terms, limit) else {
            return Ok(Vec::new());
        };
        let sql = "SELECT c.id, c.path, c.heading, c.anchor, c.text, -bm25(vault_fts, 4.0, 1.0) \
             FROM vault_fts JOIN vault_chunks c ON c.id = vault_fts.rowid \
             WHERE vault_fts MATCH $1 ORDER BY bm25(vault_fts, 4.0, 1.0), c.id LIMIT $2";
        let rows: Vec<HitRow> = self
            .reader()
            .rows(sql, args![any_of(&terms), limit])
            .await?;
        Ok(rows.into_iter().map(VaultHit::from).collect())
    }

    async fn vault_put_note(&self, note: &IndexedNote) -> Result<()> {
        let note = note.clone();
        self.writes.run(move |connection| {
            connection
                .prepare_cached("DELETE FROM vault_chunks WHERE path = ?1")?
                .execute(params![note.path])?;
            connection
                .prepare_cached(
                    "INSERT INTO vault_notes (path, content_hash, bytes, indexed_at, embedding_model) \
                     VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (path) DO UPDATE SET \
                     content_hash = excluded.content_hash, bytes = excluded.bytes, \
                     indexed_at = excluded.indexed_at, embedding_model = excluded.embedding_model",
                )?
                .execute(params![
                    note.path,
                    note.content_hash,
                    note.bytes,
                    ts(Utc::now()),
                    note.embedding_model
                ])?;
            let mut insert = connection.prepare_cached(
                "INSERT INTO vault_chunks (path, ordinal, heading, anchor, text, embedding) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?;
            for (ordinal, chunk) in note.chunks.iter().enumerate() {
                insert.execute(params![
                    note.path,
                    i64::try_from(ordinal).unwrap_or(i64::MAX),
                    chunk.heading,
                    chunk.anchor,
                    chunk.text,
                    chunk
                        .embedding
                        .as_deref()
                        .map(crate::store::vault::vector_bytes)
                ])?;
            }
            Ok(())
        })
        .await
    }

    /// Removes notes and their chunks from the index.
    async fn vault_remove_notes(&self, paths: &[String]) -> Result<u64> {
        if paths.is_empty() {
            return Ok(0);
        }
        let paths = paths.to_vec();
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
