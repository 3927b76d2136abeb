//! [`Files`] on SQLite: each write is one job on the writer thread.

use std::{io::Read, path::Path};

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};

use super::{
    CHUNK_BYTES, DELETE_ONE, DELETE_USER, FilePut, FileRecord, Files, fill, spooled_error,
};
use crate::store::{
    Result,
    sqlite::{SqliteStore, writer::ts},
};

#[async_trait]
impl Files for SqliteStore {
    async fn put_file(&self, file: &FileRecord, content: &Path, quota: u64) -> Result<FilePut> {
        let (file, content) = (file.clone(), content.to_owned());
        self.writes
            .run(move |tx| put(tx, &file, &content, quota))
            .await
    }

    async fn delete_file(&self, tenant: &str, id: &str) -> Result<bool> {
        let (tenant, id) = (tenant.to_owned(), id.to_owned());
        self.writes
            .run(move |tx| {
                let mut deleted = 0;
                for sql in DELETE_ONE {
                    deleted = tx.prepare_cached(sql)?.execute(params![tenant, id])?;
                }
                Ok(deleted > 0)
            })
            .await
    }

    async fn erase_user_files(&self, tenant: &str, user: &str) -> Result<u64> {
        let (tenant, user) = (tenant.to_owned(), user.to_owned());
        self.writes
            .run(move |tx| {
                tx.execute_batch("PRAGMA secure_delete = ON")?;
                let mut deleted = Ok(0);
                for sql in DELETE_USER {
                    deleted = tx
                        .prepare_cached(sql)
                        .and_then(|mut statement| statement.execute(params![tenant, user]));
                    if deleted.is_err() {
                        break;
                    }
                }
                tx.execute_batch("PRAGMA secure_delete = OFF")?;
                Ok(deleted? as u64)
            })
            .await
    }
}

/// The put, in the writer's transaction.
fn put(tx: &Connection, file: &FileRecord, content: &Path, quota: u64) -> Result<FilePut> {
    let held: Option<i64> = tx
        .prepare_cached("SELECT bytes FROM file_blobs WHERE tenant = ?1 AND sha256 = ?2")?
        .query_row(params![file.tenant, file.sha256], |row| row.get(0))
        .optional()?;
    let new_bytes = held.is_none();
    if new_bytes {
        let used: i64 = tx
            .prepare_cached("SELECT COALESCE(SUM(bytes), 0) FROM file_blobs WHERE tenant = ?1")?
            .query_row(params![file.tenant], |row| row.get(0))?;
        let used = u64::try_from(used).unwrap_or(0);
        if used.saturating_add(u64::try_from(file.bytes).unwrap_or(u64::MAX)) > quota {
            return Ok(FilePut::OverQuota { used });
        }
        tx.prepare_cached(
            "INSERT INTO file_blobs (tenant, sha256, bytes, created_at) VALUES (?1, ?2, ?3, ?4)",
        )?
        .execute(params![
            file.tenant,
            file.sha256,
            file.bytes,
            ts(file.created_at)
        ])?;
        let mut source = std::fs::File::open(content).map_err(spooled_error)?;
        let mut chunk = vec![0; CHUNK_BYTES];
        let mut insert = tx.prepare_cached(
            "INSERT INTO file_chunks (tenant, sha256, idx, data) VALUES (?1, ?2, ?3, ?4)",
        )?;
        let (mut index, mut total) = (0i64, 0i64);
        loop {
            let read = fill(&mut chunk, |buf| source.read(buf)).map_err(spooled_error)?;
            if read == 0 {
                break;
            }
            insert.execute(params![file.tenant, file.sha256, index, &chunk[..read]])?;
            index += 1;
            total += read as i64;
        }
        if total != file.bytes {
            return Err(spooled_error(std::io::Error::other(format!(
                "{total} bytes, not {}",
                file.bytes
            ))));
        }
    }
    tx.prepare_cached(
        "INSERT INTO files (tenant, id, sha256, bytes, media_type, filename, purpose, \
         session_id, user_id, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )?
    .execute(params![
        file.tenant,
        file.id,
        file.sha256,
        file.bytes,
        file.media_type,
        file.filename,
        file.purpose,
        file.session_id,
        file.user_id,
        ts(file.created_at)
    ])?;
    Ok(FilePut::Stored { new_bytes })
}
