//! [`Files`] on Postgres: each write one transaction, bounded by the call
//! timeout, holding the tenant's file lock ([`super::lock_key`]).

use std::path::Path;

use async_trait::async_trait;
use sqlx::{Postgres, Transaction};

use super::{
    CHUNK_BYTES, DELETE_ONE, DELETE_USER, DROP_UNNAMED, FilePut, FileRecord, Files, lock_key,
    spooled_error,
};
use crate::store::{Result, postgres::PostgresStore};

/// Takes the tenant's file lock for the rest of `tx`.
pub(crate) async fn lock_files(
    tx: &mut Transaction<'static, Postgres>,
    tenant: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind(lock_key(tenant))
        .execute(&mut **tx)
        .await
        .map(drop)
}

#[async_trait]
impl Files for PostgresStore {
    async fn put_file(&self, file: &FileRecord, content: &Path, quota: u64) -> Result<FilePut> {
        self.bounded(async {
            let mut tx = self.begin_write().await?;
            lock_files(&mut tx, &file.tenant).await?;
            // Held when a file names them; a blob that none names is an
            // upload that never finished (its chunks written again).
            let held: Option<(bool,)> = sqlx::query_as(
                "SELECT EXISTS (SELECT 1 FROM files f WHERE f.tenant = b.tenant \
                 AND f.sha256 = b.sha256) FROM file_blobs b WHERE b.tenant = $1 AND b.sha256 = $2",
            )
            .bind(&file.tenant)
            .bind(&file.sha256)
            .fetch_optional(&mut *tx)
            .await?;
            let new_bytes = held != Some((true,));
            if held.is_none() {
                let (used,): (i64,) = sqlx::query_as(
                    "SELECT COALESCE(SUM(bytes), 0)::BIGINT FROM file_blobs WHERE tenant = $1",
                )
                .bind(&file.tenant)
                .fetch_one(&mut *tx)
                .await?;
                let used = u64::try_from(used).unwrap_or(0);
                if used.saturating_add(u64::try_from(file.bytes).unwrap_or(u64::MAX)) > quota {
                    return Ok(FilePut::OverQuota { used });
                }
                sqlx::query(
                    "INSERT INTO file_blobs (tenant, sha256, bytes, created_at) \
                     VALUES ($1, $2, $3, $4)",
                )
                .bind(&file.tenant)
                .bind(&file.sha256)
                .bind(file.bytes)
                .bind(file.created_at)
                .execute(&mut *tx)
                .await?;
            }
            if new_bytes {
                write_chunks(&mut tx, file, content).await?;
            }
            sqlx::query(
                "INSERT INTO files (tenant, id, sha256, bytes, media_type, filename, purpose, \
                 session_id, user_id, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            )
            .bind(&file.tenant)
            .bind(&file.id)
            .bind(&file.sha256)
            .bind(file.bytes)
            .bind(&file.media_type)
            .bind(&file.filename)
            .bind(&file.purpose)
            .bind(&file.session_id)
            .bind(&file.user_id)
            .bind(file.created_at)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(FilePut::Stored { new_bytes })
        })
        .await
    }

    async fn drop_unnamed_blob(&self, tenant: &str, sha256: &str) -> Result<()> {
        self.delete_files(tenant, sha256, &DROP_UNNAMED)
            .await
            .map(drop)
    }

    async fn delete_file(&self, tenant: &str, id: &str) -> Result<bool> {
        self.delete_files(tenant, id, &DELETE_ONE)
            .await
            .map(|n| n > 0)
    }

    async fn erase_user_files(&self, tenant: &str, user: &str) -> Result<u64> {
        self.delete_files(tenant, user, &DELETE_USER).await
    }
}

impl PostgresStore {
    /// Runs a statement set of [`super`] (`$1` the tenant), under the
    /// tenant's file lock;
    /// how many files went.
    async fn delete_files(
        &self,
        tenant: &str,
        second: &str,
        statements: &[&'static str],
    ) -> Result<u64> {
        self.bounded(async {
            let mut tx = self.begin_write().await?;
            lock_files(&mut tx, tenant).await?;
            let mut deleted = 0;
            for sql in statements {
                deleted = sqlx::query(*sql)
                    .bind(tenant)
                    .bind(second)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
            }
            tx.commit().await?;
            Ok(deleted)
        })
        .await
    }
}

/// Writes the bytes of `content` as `file`'s blob's chunks.
async fn write_chunks(
    tx: &mut Transaction<'static, Postgres>,
    file: &FileRecord,
    content: &Path,
) -> Result<()> {
    let mut source = tokio::fs::File::open(content)
        .await
        .map_err(spooled_error)?;
    let mut chunk = vec![0; CHUNK_BYTES];
    let (mut index, mut total) = (0i32, 0i64);
    loop {
        let filled = super::next_chunk(&mut source, &mut chunk).await?;
        if filled == 0 {
            break;
        }
        sqlx::query(
            "INSERT INTO file_chunks (tenant, sha256, idx, data) VALUES ($1, $2, $3, $4) \
             ON CONFLICT DO NOTHING",
        )
        .bind(&file.tenant)
        .bind(&file.sha256)
        .bind(index)
        .bind(&chunk[..filled])
        .execute(&mut **tx)
        .await?;
        index += 1;
        total += filled as i64;
    }
    if total != file.bytes {
        let why = format!("{total} bytes, not {}", file.bytes);
        return Err(spooled_error(std::io::Error::other(why)));
    }
    Ok(())
}
