//! Files: what a tenant uploaded (`POST /files`) and what its turns'
//! messages carried inline. A file's row names its bytes by their
//! SHA-256; the bytes are kept once per tenant (a blob, in chunks of at
//! most [`CHUNK_BYTES`]) however many files hold them, and go with the
//! last file that holds them. A tenant's stored bytes are its blobs'.
//!
//! The reads are written once here; each backend's writes stand side by
//! side in `files/sqlite.rs` and `files/postgres.rs`. On Postgres every
//! write that adds or removes a tenant's blob holds the tenant's file
//! lock ([`lock_key`]) for its transaction, so that an upload that finds
//! its bytes stored is never beside an erase that removes them.

pub(super) mod postgres;
pub(super) mod sqlite;

use std::path::Path;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::reader::{Reads, args};
use crate::store::Result;

/// Bytes a chunk holds at most.
pub const CHUNK_BYTES: usize = 256 * 1024;

/// A file, as its row holds it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct FileRecord {
    pub tenant: String,
    /// `file-…`
    pub id: String,
    /// Its bytes' SHA-256, lowercase hex.
    pub sha256: String,
    pub bytes: i64,
    /// What its bytes were found to be (`image/png`, `text/plain`…).
    pub media_type: String,
    pub filename: String,
    /// What the client said it is for (`user_data`, `vision`…; `inline`:
    /// a message carried it).
    pub purpose: String,
    /// The session whose message carried it inline: erased with it.
    pub session_id: Option<String>,
    /// Who uploaded it: erased with the user.
    pub user_id: Option<String>,
    pub created_at: DateTime<Utc>,
}

impl FileRecord {
    /// How many chunks its bytes are in.
    pub fn chunks(&self) -> i64 {
        let chunk = CHUNK_BYTES as i64;
        (self.bytes.max(0) + chunk - 1) / chunk
    }
}

/// What a put did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilePut {
    /// The file's row is written; `new_bytes`: its bytes were not stored
    /// yet (else it shares a blob the tenant had).
    Stored { new_bytes: bool },
    /// Its bytes would take the tenant past its quota: nothing written.
    OverQuota { used: u64 },
}

const FILE_COLUMNS: &str = "tenant, id, sha256, bytes, media_type, filename, purpose, \
     session_id, user_id, created_at";

/// The Postgres advisory lock of a tenant's files (the argument of
/// `hashtextextended`).
pub(crate) fn lock_key(tenant: &str) -> String {
    format!("files/{tenant}")
}

/// The statements that remove the files a condition picks (said twice:
/// of a file `f`, and of a file `h`), and the blobs that no file outside
/// them holds, blobs first.
macro_rules! delete_files {
    ($f:literal, $h:literal) => {
        [
            concat!(
                "DELETE FROM file_chunks WHERE (tenant, sha256) IN (",
                delete_files!(@orphaned $f, $h),
                ")"
            ),
            concat!(
                "DELETE FROM file_blobs WHERE (tenant, sha256) IN (",
                delete_files!(@orphaned $f, $h),
                ")"
            ),
            concat!(
                "DELETE FROM files WHERE (tenant, id) IN \
                 (SELECT f.tenant, f.id FROM files f WHERE ",
                $f,
                ")"
            ),
        ]
    };
    (@orphaned $f:literal, $h:literal) => {
        concat!(
            "SELECT f.tenant, f.sha256 FROM files f WHERE ",
            $f,
            " AND NOT EXISTS (SELECT 1 FROM files g WHERE g.tenant = f.tenant \
             AND g.sha256 = f.sha256 AND (g.tenant, g.id) NOT IN \
             (SELECT h.tenant, h.id FROM files h WHERE ",
            $h,
            "))"
        )
    };
}

/// Deletes one file of a tenant (`$1`, `$2`: the tenant, the file's id).
pub(crate) const DELETE_ONE: [&str; 3] =
    delete_files!("f.tenant = $1 AND f.id = $2", "h.tenant = $1 AND h.id = $2");

/// Deletes the files a user uploaded (`$1`, `$2`: the tenant, the user).
pub(crate) const DELETE_USER: [&str; 3] = delete_files!(
    "f.tenant = $1 AND f.user_id = $2",
    "h.tenant = $1 AND h.user_id = $2"
);

/// Deletes the files a session's messages carried (`$1`: its key).
pub(crate) const DELETE_SESSION: [&str; 3] =
    delete_files!("f.session_id = $1", "h.session_id = $1");

/// Removes a tenant's blob (`$1`, `$2`: the tenant, its SHA-256) and its
/// chunks when no file names it: an upload that never finished.
pub(crate) const DROP_UNNAMED: [&str; 2] = [
    "DELETE FROM file_chunks WHERE tenant = $1 AND sha256 = $2 \
     AND NOT EXISTS (SELECT 1 FROM files WHERE tenant = $1 AND sha256 = $2)",
    "DELETE FROM file_blobs WHERE tenant = $1 AND sha256 = $2 \
     AND NOT EXISTS (SELECT 1 FROM files WHERE tenant = $1 AND sha256 = $2)",
];

/// Unfinished uploads one sweep removes at most (the next goes on).
const UNFINISHED_PER_SWEEP: i64 = 100;

/// Deletes every file of a tenant (`$1`).
pub(crate) const DELETE_TENANT: [&str; 3] = [
    "DELETE FROM file_chunks WHERE tenant = $1",
    "DELETE FROM file_blobs WHERE tenant = $1",
    "DELETE FROM files WHERE tenant = $1",
];

/// A tenant's files.
#[async_trait]
pub trait Files: Reads + Send + Sync {
    /// Writes `file`'s row and, unless the tenant holds them already, its
    /// bytes, read from `content` (exactly `file.bytes` bytes whose SHA-256
    /// is `file.sha256`). New bytes that would take the tenant's stored
    /// bytes past `quota` are refused, and nothing is written.
    async fn put_file(&self, file: &FileRecord, content: &Path, quota: u64) -> Result<FilePut>;

    /// Deletes a tenant's file (and its bytes, when no other file holds
    /// them); false when there was none.
    async fn delete_file(&self, tenant: &str, id: &str) -> Result<bool>;

    /// Deletes the files `user` uploaded in `tenant`; how many.
    async fn erase_user_files(&self, tenant: &str, user: &str) -> Result<u64>;

    /// Removes a blob and its chunks when no file names it (an upload
    /// that failed, or never finished).
    async fn drop_unnamed_blob(&self, tenant: &str, sha256: &str) -> Result<()>;

    /// Removes the bytes of uploads that never finished (a process that
    /// died while it wrote them: a blob that no file names), begun before
    /// `before`, at most [`UNFINISHED_PER_SWEEP`]; how many blobs went.
    /// They are found by a read, so that SQLite's writer only deletes.
    async fn sweep_unfinished_files(&self, before: DateTime<Utc>) -> Result<u64> {
        let sql = "SELECT b.tenant, b.sha256 FROM file_blobs b WHERE b.created_at < $1 \
                   AND NOT EXISTS (SELECT 1 FROM files f WHERE f.tenant = b.tenant \
                   AND f.sha256 = b.sha256) LIMIT $2";
        let found: Vec<(String, String)> = self
            .reader()
            .rows(sql, args![before, UNFINISHED_PER_SWEEP])
            .await?;
        for (tenant, sha256) in &found {
            self.drop_unnamed_blob(tenant, sha256).await?;
        }
        Ok(found.len() as u64)
    }

    /// One of a tenant's files.
    async fn file(&self, tenant: &str, id: &str) -> Result<Option<FileRecord>> {
        let sql = format!("SELECT {FILE_COLUMNS} FROM files WHERE tenant = $1 AND id = $2");
        self.reader()
            .row(sqlx::AssertSqlSafe(sql), args![tenant, id])
            .await
    }

    /// A tenant's files, newest first, at most `limit`, those older than
    /// the file `before` when it is given.
    async fn files(
        &self,
        tenant: &str,
        before: Option<&str>,
        limit: u32,
    ) -> Result<Vec<FileRecord>> {
        let sql = format!(
            "SELECT {FILE_COLUMNS} FROM files WHERE tenant = $1 AND ($2 IS NULL OR id < $2) \
             ORDER BY id DESC LIMIT $3"
        );
        self.reader()
            .rows(sqlx::AssertSqlSafe(sql), args![tenant, before, limit])
            .await
    }

    /// The files a session's messages carried inline, oldest first.
    async fn session_files(&self, session: &str) -> Result<Vec<FileRecord>> {
        let sql = format!(
            "SELECT {FILE_COLUMNS} FROM files WHERE session_id = $1 ORDER BY id LIMIT 1000"
        );
        self.reader()
            .rows(sqlx::AssertSqlSafe(sql), args![session])
            .await
    }

    /// The `index`th chunk of a tenant's blob, if it is there.
    async fn file_chunk(&self, tenant: &str, sha256: &str, index: i64) -> Result<Option<Vec<u8>>> {
        let sql = "SELECT data FROM file_chunks WHERE tenant = $1 AND sha256 = $2 AND idx = $3";
        let row: Option<(Vec<u8>,)> = self.reader().row(sql, args![tenant, sha256, index]).await?;
        Ok(row.map(|(data,)| data))
    }

    /// The bytes a tenant's files take (each blob once).
    async fn stored_file_bytes(&self, tenant: &str) -> Result<u64> {
        let sql =
            "SELECT CAST(COALESCE(SUM(bytes), 0) AS BIGINT) FROM file_blobs WHERE tenant = $1";
        let (bytes,): (i64,) = self.reader().row(sql, args![tenant]).await?.unwrap_or((0,));
        Ok(u64::try_from(bytes).unwrap_or(0))
    }
}

/// Reads into `buf` until it is full or the source ends; how much it read.
pub(crate) fn fill(
    buf: &mut [u8],
    mut read: impl FnMut(&mut [u8]) -> std::io::Result<usize>,
) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Reads the next chunk of an upload's spooled copy into `chunk` (at
/// most [`CHUNK_BYTES`]); how much it read (0 at its end).
pub(crate) async fn next_chunk(
    source: &mut tokio::fs::File,
    chunk: &mut [u8],
) -> crate::store::Result<usize> {
    use tokio::io::AsyncReadExt as _;
    let mut filled = 0;
    while filled < chunk.len() {
        let read = source
            .read(&mut chunk[filled..])
            .await
            .map_err(spooled_error)?;
        if read == 0 {
            break;
        }
        filled += read;
    }
    Ok(filled)
}

/// The spooled copy of an upload could not be read back.
pub(crate) fn spooled_error(e: std::io::Error) -> crate::store::StoreError {
    crate::store::StoreError::Corrupt(format!("an upload's spooled copy: {e}"))
}
