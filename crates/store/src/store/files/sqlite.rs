//! [`Files`] on SQLite: each write is one job on the writer thread.

use std::{io::Read, path::Path};

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};

use super::{
    CHUNK_BYTES, DELETE_ONE, DELETE_USER, DROP_UNNAMED, FilePut, FileRecord, Files, fill,
    spooled_error,
};
use crate::store::{
    Result,
    sqlite::{SqliteStore, writer::ts},
};

#[async_trait]
impl Files for SqliteStore {
    /// The bytes go in jobs of at most [`CHUNKS_PER_JOB`] chunks, so that
    /// a large upload never holds the one writer (and every other
    /// tenant's commits) for long: its blob's row first (which reserves
    /// the quota), then its chunks, then, once they are all there, the
    /// file's row. Until then no file names the blob, and no read finds
    /// it; a process that dies in between leaves a blob that no file
    /// names, which [`Files::sweep_unfinished`] removes.
    async fn put_file(&self, file: &FileRecord, content: &Path, quota: u64) -> Result<FilePut> {
        let record = file.clone();
        let begun = self
            .writes
            .run(move |tx| begin_put(tx, &record, quota))
            .await?;
        match begun {
            Begun::Done(put) => return Ok(put),
            Begun::Writing => {}
        }
        match self.write_chunks(file, content).await {
            Ok(()) => {
                let (record, content) = (file.clone(), content.to_owned());
                self.writes
                    .run(move |tx| finish_put(tx, &record, &content))
                    .await
            }
            Err(e) => {
                let cleaned = self.drop_unnamed_blob(&file.tenant, &file.sha256).await;
                if let Err(left) = cleaned {
                    tracing::warn!(error = %left, "an unfinished upload's bytes were left");
                }
                Err(e)
            }
        }
    }

    async fn drop_unnamed_blob(&self, tenant: &str, sha256: &str) -> Result<()> {
        let (tenant, sha256) = (tenant.to_owned(), sha256.to_owned());
        self.writes
            .run(move |tx| drop_unnamed(tx, &tenant, &sha256))
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

/// Chunks one writer job writes at most (1 MiB: a few milliseconds of
/// the writer).
pub(crate) const CHUNKS_PER_JOB: usize = 4;

/// How a put began.
enum Begun {
    /// Done in the first job: the tenant holds the bytes (the file's row
    /// is written), or they would take it past its quota.
    Done(FilePut),
    /// The blob's row is there (this put's, or an unfinished one's with
    /// the same bytes): its chunks are to be written.
    Writing,
}

/// The first job of a put: the file's row at once when a file of the
/// tenant names the same bytes; else their blob's row, within the quota.
fn begin_put(tx: &Connection, file: &FileRecord, quota: u64) -> Result<Begun> {
    let blob: Option<bool> = tx
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM files f WHERE f.tenant = b.tenant \
             AND f.sha256 = b.sha256) FROM file_blobs b WHERE b.tenant = ?1 AND b.sha256 = ?2",
        )?
        .query_row(params![file.tenant, file.sha256], |row| row.get(0))
        .optional()?;
    match blob {
        Some(true) => {
            insert_file(tx, file)?;
            return Ok(Begun::Done(FilePut::Stored { new_bytes: false }));
        }
        // An unfinished put of the same bytes: its quota is taken.
        Some(false) => return Ok(Begun::Writing),
        None => {}
    }
    let used: i64 = tx
        .prepare_cached("SELECT COALESCE(SUM(bytes), 0) FROM file_blobs WHERE tenant = ?1")?
        .query_row(params![file.tenant], |row| row.get(0))?;
    let used = u64::try_from(used).unwrap_or(0);
    if used.saturating_add(u64::try_from(file.bytes).unwrap_or(u64::MAX)) > quota {
        return Ok(Begun::Done(FilePut::OverQuota { used }));
    }
    insert_blob(tx, file)?;
    Ok(Begun::Writing)
}

fn insert_blob(tx: &Connection, file: &FileRecord) -> Result<()> {
    tx.prepare_cached(
        "INSERT OR IGNORE INTO file_blobs (tenant, sha256, bytes, created_at) \
         VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![
        file.tenant,
        file.sha256,
        file.bytes,
        ts(file.created_at)
    ])?;
    Ok(())
}

/// Chunks `from`, `from + 1`, … of a blob (the same bytes an unfinished
/// put of them wrote stay as they are).
fn insert_chunks(
    tx: &Connection,
    (tenant, sha256): (&str, &str),
    from: i64,
    chunks: &[Vec<u8>],
) -> Result<()> {
    let mut insert = tx.prepare_cached(
        "INSERT OR IGNORE INTO file_chunks (tenant, sha256, idx, data) VALUES (?1, ?2, ?3, ?4)",
    )?;
    for (index, chunk) in (from..).zip(chunks) {
        insert.execute(params![tenant, sha256, index, chunk])?;
    }
    Ok(())
}

/// The last job of a put: the file's row, once its blob and every chunk
/// are there. An erase of the same bytes' last file may have removed
/// them meanwhile: then they are written again, here, from the spooled
/// copy.
fn finish_put(tx: &Connection, file: &FileRecord, content: &Path) -> Result<FilePut> {
    let (blobs, chunks, bytes): (i64, i64, i64) = tx
        .prepare_cached(
            "SELECT (SELECT COUNT(*) FROM file_blobs WHERE tenant = ?1 AND sha256 = ?2), \
             COUNT(*), COALESCE(SUM(LENGTH(data)), 0) \
             FROM file_chunks WHERE tenant = ?1 AND sha256 = ?2",
        )?
        .query_row(params![file.tenant, file.sha256], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
        })?;
    if blobs != 1 || chunks != file.chunks() || bytes != file.bytes {
        insert_blob(tx, file)?;
        let mut source = std::fs::File::open(content).map_err(spooled_error)?;
        let mut chunk = vec![0; CHUNK_BYTES];
        let mut index = 0i64;
        loop {
            let read = fill(&mut chunk, |buf| source.read(buf)).map_err(spooled_error)?;
            if read == 0 {
                break;
            }
            insert_chunks(
                tx,
                (&file.tenant, &file.sha256),
                index,
                &[chunk[..read].to_vec()],
            )?;
            index += 1;
        }
    }
    insert_file(tx, file)?;
    Ok(FilePut::Stored { new_bytes: true })
}

/// Removes a blob no file names, and its chunks (an upload that failed
/// half-way).
fn drop_unnamed(tx: &Connection, tenant: &str, sha256: &str) -> Result<()> {
    for sql in DROP_UNNAMED {
        tx.prepare_cached(sql)?.execute(params![tenant, sha256])?;
    }
    Ok(())
}

impl SqliteStore {
    /// A put's chunks, read from the spooled copy [`CHUNKS_PER_JOB`] at a
    /// time, each batch one writer job.
    async fn write_chunks(&self, file: &FileRecord, content: &Path) -> Result<()> {
        let mut source = tokio::fs::File::open(content)
            .await
            .map_err(spooled_error)?;
        let (mut index, mut total) = (0i64, 0i64);
        loop {
            let mut batch = Vec::with_capacity(CHUNKS_PER_JOB);
            while batch.len() < CHUNKS_PER_JOB {
                let mut chunk = vec![0; CHUNK_BYTES];
                let filled = super::next_chunk(&mut source, &mut chunk).await?;
                if filled == 0 {
                    break;
                }
                chunk.truncate(filled);
                total += filled as i64;
                batch.push(chunk);
            }
            if batch.is_empty() {
                break;
            }
            let (tenant, sha256, from) = (file.tenant.clone(), file.sha256.clone(), index);
            index += batch.len() as i64;
            self.writes
                .run(move |tx| insert_chunks(tx, (&tenant, &sha256), from, &batch))
                .await?;
        }
        if total != file.bytes {
            return Err(spooled_error(std::io::Error::other(format!(
                "{total} bytes, not {}",
                file.bytes
            ))));
        }
        Ok(())
    }
}

/// A file's row.
fn insert_file(tx: &Connection, file: &FileRecord) -> Result<()> {
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
    Ok(())
}
