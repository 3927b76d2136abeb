//! The embedded SQLite backend: one file, WAL, one writer.
//!
//! Writes run on one thread that owns one connection ([`writer`]), so
//! writers queue in the process instead of spinning on `SQLITE_BUSY`, and a
//! whole transaction costs one hand-off to that thread. Each write
//! transaction starts with `BEGIN IMMEDIATE`, so that a second process on
//! the same file (a `migrate` run, an operator's shell) waits on the busy
//! timeout instead of failing with `SQLITE_BUSY_SNAPSHOT`. Reads use sqlx's
//! pool and see committed data through WAL without blocking the writer; the
//! migrations run on sqlx's own connection.

use std::{str::FromStr, time::Duration};

use async_trait::async_trait;
use sqlx::{
    migrate::Migrator,
    sqlite::{
        SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
    },
};

use super::{Reader, Readiness, Reads, Store, StoreError};
use crate::store::Result;

pub(super) mod time;
pub(super) mod writer;

/// The scope's memories matching an FTS5 query, by BM25: `$1` the query
/// ([`any_of`]), `$2` the scope, `$3` the limit.
pub(super) const SEARCH_MEMORY_TEXT: &str = "SELECT m.id, m.scope, m.kind, m.key, m.content, \
     m.source_session_id, m.source_turn_id, m.created_at, m.updated_at \
     FROM memories_fts JOIN memories m ON m.rowid = memories_fts.rowid \
     WHERE memories_fts MATCH $1 AND m.scope = $2 \
     ORDER BY bm25(memories_fts), m.updated_at DESC LIMIT $3";

/// An FTS5 query matching any of `terms` (cleaned: no quotes).
pub(super) fn any_of(terms: &[String]) -> String {
    terms
        .iter()
        .map(|t| format!("\"{t}\""))
        .collect::<Vec<_>>()
        .join(" OR ")
}

/// SQLite implementation of [`super::Store`].
#[derive(Debug)]
pub struct SqliteStore {
    /// sqlx's connection for migrations.
    writer: SqlitePool,
    reader: SqlitePool,
    /// Every other write.
    pub(super) writes: writer::Writer,
}

impl SqliteStore {
    pub(super) const MIGRATOR: Migrator = sqlx::migrate!("../../migrations/sqlite");

    /// Opens (creating if missing) the database file named by `url`, e.g.
    /// `sqlite://./data/agent-harness.db`. The parent folder is created too.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // NORMAL in WAL mode is durable against process crashes; only an
            // OS crash can lose the last commits. FULL would fsync per commit.
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(5))
            .foreign_keys(true)
            // Read pages through a memory map instead of a pread() and a
            // copy each, and keep the hot indexes in a larger page cache.
            .pragma("mmap_size", "268435456")
            .pragma("cache_size", "-8192");
        let path = options.get_filename().to_path_buf();
        if let Some(parent) = path.parent()
            && !parent.as_os_str().is_empty()
        {
            std::fs::create_dir_all(parent).map_err(|e| {
                StoreError::Database(sqlx::Error::Configuration(
                    format!("cannot create {}: {e}", parent.display()).into(),
                ))
            })?;
        }
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options.clone())
            .await?;
        let reader = SqlitePoolOptions::new()
            .max_connections(max_connections.max(1))
            .connect_with(options.read_only(true))
            .await?;
        let writes = writer::Writer::open(&path)?;
        Ok(Self {
            writer,
            reader,
            writes,
        })
    }
}

/// What the runner's tests hold the writer thread with (the `testing`
/// feature, which only tests turn on).
#[cfg(any(test, feature = "testing"))]
impl SqliteStore {
    /// Holds the writer thread (see [`writer::Writer::hold`]).
    pub async fn hold_writer(&self) -> writer::Held {
        self.writes.hold().await
    }

    /// Jobs waiting for the writer thread.
    pub fn queued_writes(&self) -> usize {
        self.writes.queued()
    }
}

impl Reads for SqliteStore {
    fn reader(&self) -> Reader<'_> {
        Reader::Sqlite(&self.reader)
    }
}

#[async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    /// Migrates, then moves what a stopped process left in the event
    /// journal into the log (`event_log/journal.rs`).
    async fn migrate(&self) -> Result<()> {
        Self::MIGRATOR.run(&self.writer).await?;
        let moved = self
            .writes
            .run_logged(|tx, stage| super::event_log::journal::recover(tx, stage))
            .await?;
        if moved > 0 {
            tracing::info!(
                rows = moved,
                "moved the journaled events of the last run into the log"
            );
        }
        Ok(())
    }

    async fn readiness(&self) -> Readiness {
        self.reader().readiness(&Self::MIGRATOR).await
    }
}
