//! The embedded SQLite backend: one file, WAL, one writer connection.
//!
//! Writes go through a pool of exactly one connection, so writers queue in
//! the process instead of spinning on `SQLITE_BUSY`; each write transaction
//! still starts with `BEGIN IMMEDIATE` so that a second process on the same
//! file (a `migrate` run, an operator's shell) waits on the busy timeout
//! instead of failing with `SQLITE_BUSY_SNAPSHOT`. Reads use a separate pool
//! and see committed data through WAL without blocking the writer.

use std::{str::FromStr, time::Duration};

use sqlx::{
    Sqlite, Transaction,
    migrate::Migrator,
    sqlite::{
        SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
    },
};

use super::StoreError;

/// SQLite implementation of [`super::Store`].
#[derive(Debug, Clone)]
pub struct SqliteStore {
    writer: SqlitePool,
    reader: SqlitePool,
}

impl SqliteStore {
    pub(super) const MIGRATOR: Migrator = sqlx::migrate!("./migrations/sqlite");

    /// Opens (creating if missing) the database file named by `url`, e.g.
    /// `sqlite://./data/agent-harness.db`. The parent folder is created too.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, StoreError> {
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
            .pragma("cache_size", "-32768");
        let path = options.get_filename();
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
        Ok(Self { writer, reader })
    }

    fn writer(&self) -> &SqlitePool {
        &self.writer
    }

    fn reader(&self) -> &SqlitePool {
        &self.reader
    }

    async fn begin_write(&self) -> Result<Transaction<'static, Sqlite>, sqlx::Error> {
        self.writer.begin_with("BEGIN IMMEDIATE").await
    }
}

super::sql::impl_store!(SqliteStore, Sqlite, "sqlite");
super::sql::impl_sql_writes!(SqliteStore, Sqlite);
