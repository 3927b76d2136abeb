//! [`VaultIndex`] on Postgres: plain sqlx, each call bounded by the call
//! timeout (see [`PostgresStore::bounded`]); search by `tsvector`.

use async_trait::async_trait;
use sqlx::Postgres;

use super::{
    HitRow, IndexedNote, VaultHit, VaultIndex, hit_of, note_key, searchable, vector_bytes,
};
use crate::store::Result;
use crate::store::{postgres::PostgresStore, reader::Reads};

/// Chunks per multi-row insert (7 parameters each).
const VAULT_CHUNKS_PER_INSERT: usize = 200;

#[async_trait]
impl VaultIndex for PostgresStore {
    /// `tsvector` matches of any of the terms, ranked by how many of the
    /// terms a chunk matches, then by `ts_rank_cd` (heading weighted above
    /// text): `ts_rank_cd` alone ranks a heading naming one word above a
    /// passage with all of them.
    async fn vault_search(
        &self,
        vault: &str,
        terms: &[String],
        limit: u32,
    ) -> Result<Vec<VaultHit>> {
        let Some(terms) = searchable(terms, limit) else {
            return Ok(Vec::new());
        };
        let mut sql = String::from("SELECT c.id, c.path, c.heading, c.anchor, c.text, (0");
        let mut bound = Vec::with_capacity(terms.len() + 2);
        for (n, term) in terms.iter().enumerate() {
            sql.push_str(&format!(
                " + (c.tsv @@ to_tsquery('english', ${}))::int",
                n + 1
            ));
            bound.push(term.clone().into());
        }
        sql.push_str(&format!(
            ")::float8 + ts_rank_cd(c.tsv, q)::float8 / (1 + ts_rank_cd(c.tsv, q)::float8) AS score \
             FROM vault_chunks c, to_tsquery('english', ${}) q WHERE c.tsv @@ q \
             AND c.vault = ${} ORDER BY score DESC, c.id LIMIT ${}",
            terms.len() + 1,
            terms.len() + 2,
            terms.len() + 3
        ));
        bound.push(terms.join(" | ").into());
        bound.push(vault.to_owned().into());
        bound.push(limit.into());
        let rows: Vec<HitRow> = self.reader().rows(sqlx::AssertSqlSafe(sql), bound).await?;
        Ok(rows.into_iter().map(|row| hit_of(vault, row)).collect())
    }

    /// Indexes a note in place of what was indexed at its path; the note's
    /// row is locked first, so two indexers of one note take turns.
    async fn vault_put_note(&self, vault: &str, note: &IndexedNote) -> Result<()> {
        let key = note_key(vault, &note.path);
        self.bounded(async {
            let mut tx = self.begin_write().await?;
            sqlx::query(
                "INSERT INTO vault_notes (path, content_hash, bytes, indexed_at, embedding_model, \
                 vault) VALUES ($1, $2, $3, now(), $4, $5) ON CONFLICT (path) DO UPDATE SET \
                 content_hash = excluded.content_hash, bytes = excluded.bytes, \
                 indexed_at = excluded.indexed_at, embedding_model = excluded.embedding_model",
            )
            .bind(&key)
            .bind(&note.content_hash)
            .bind(note.bytes)
            .bind(&note.embedding_model)
            .bind(vault)
            .execute(&mut *tx)
            .await?;
            sqlx::query("DELETE FROM vault_chunks WHERE path = $1")
                .bind(&key)
                .execute(&mut *tx)
                .await?;
            let mut ordinal: i32 = 0;
            for rows in note.chunks.chunks(VAULT_CHUNKS_PER_INSERT) {
                let mut insert = sqlx::QueryBuilder::<Postgres>::new(
                    "INSERT INTO vault_chunks (path, ordinal, heading, anchor, text, embedding, \
                     vault) ",
                );
                insert.push_values(rows, |mut row, chunk| {
                    row.push_bind(&key)
                        .push_bind(ordinal)
                        .push_bind(&chunk.heading)
                        .push_bind(&chunk.anchor)
                        .push_bind(&chunk.text)
                        .push_bind(chunk.embedding.as_deref().map(vector_bytes))
                        .push_bind(vault);
                    ordinal += 1;
                });
                insert.build().execute(&mut *tx).await?;
            }
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    async fn vault_remove_notes(&self, vault: &str, paths: &[String]) -> Result<u64> {
        if paths.is_empty() {
            return Ok(0);
        }
        let keys: Vec<String> = paths.iter().map(|p| note_key(vault, p)).collect();
        let sql = "DELETE FROM vault_notes WHERE path = ANY($1)";
        let statement = sqlx::query(sql).bind(keys).execute(self.writer());
        Ok(self
            .bounded(async { Ok(statement.await?) })
            .await?
            .rows_affected())
    }
}
