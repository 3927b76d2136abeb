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

use std::{str::FromStr, sync::Arc, time::Duration};

use sqlx::{
    Sqlite,
    migrate::Migrator,
    sqlite::{
        SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
    },
};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{
    BeganTurn, BeginTurnError, IndexedNote, JobOutcome, JobRecord, JobUsage, JudgementRecord,
    MemoryRecord, NewArtifact, NewCheckpoint, NewJob, NewMemory, NewTurn, OrphanScope, StoreError,
    TurnFinish, VaultHit,
};
use crate::events::StoredEvent;

mod writer;

/// The scope's memories matching an FTS5 query, by BM25: `$1` the query
/// ([`any_of`]), `$2` the scope, `$3` the limit.
const SEARCH_MEMORY_TEXT: &str = "SELECT m.id, m.scope, m.kind, m.key, m.content, \
     m.source_session_id, m.source_turn_id, m.created_at, m.updated_at \
     FROM memories_fts JOIN memories m ON m.rowid = memories_fts.rowid \
     WHERE memories_fts MATCH $1 AND m.scope = $2 \
     ORDER BY bm25(memories_fts), m.updated_at DESC LIMIT $3";

/// An FTS5 query matching any of `terms` (cleaned: no quotes).
fn any_of(terms: &[String]) -> String {
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
    writes: writer::Writer,
}

impl SqliteStore {
    pub(super) const MIGRATOR: Migrator = sqlx::migrate!("./migrations/sqlite");
    /// No read before the begin: the writer thread runs begins one at a
    /// time, so a replay or a double text costs a refused insert (the
    /// unique indexes find it) and then the read that names it, while the
    /// usual begin saves a read and its hand-off to sqlx's reader thread
    /// (about a tenth of a turn's CPU, BENCHMARKS.md "Issue 23").
    pub(super) const READ_BEFORE_BEGIN: bool = false;

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

    fn writer(&self) -> &SqlitePool {
        &self.writer
    }

    fn reader(&self) -> &SqlitePool {
        &self.reader
    }
}

super::sql::impl_store!(SqliteStore, Sqlite, "sqlite");

/// The write half: each operation is one job on the writer thread.
impl SqliteStore {
    /// `StoreError::Conflict` when a unique index refused the turn.
    async fn write_begin_turn(&self, turn: &NewTurn) -> Result<BeganTurn, BeginTurnError> {
        self.writes
            .begin_turn(turn.clone())
            .await?
            .ok_or(BeginTurnError::SessionNotFound)
    }

    async fn write_batch_of(
        &self,
        events: &[Arc<StoredEvent>],
        finishes: &[&TurnFinish],
    ) -> Result<Vec<bool>, StoreError> {
        let finishes = finishes.iter().map(|f| (*f).clone()).collect();
        self.writes.write_batch(events.to_vec(), finishes).await
    }

    async fn write_artifact(&self, artifact: &NewArtifact) -> Result<(), StoreError> {
        self.writes.put_artifact(artifact.clone()).await
    }

    /// One process owns a SQLite file's turns in practice: cancels arrive
    /// locally, and the heartbeat finds the flag otherwise.
    async fn cancel_listener(&self) -> Result<Option<super::CancelRequests>, StoreError> {
        Ok(None)
    }

    async fn write_vault_note(&self, note: &IndexedNote) -> Result<(), StoreError> {
        self.writes.put_vault_note(note.clone()).await
    }

    async fn write_vault_removals(&self, paths: &[String]) -> Result<u64, StoreError> {
        self.writes.remove_vault_notes(paths.to_vec()).await
    }

    /// FTS5 over heading and text, any of the terms, ranked by BM25 with
    /// the heading weighing four times the text.
    async fn search_vault(
        &self,
        terms: &[String],
        limit: u32,
    ) -> Result<Vec<VaultHit>, StoreError> {
        let query = terms
            .iter()
            .map(|t| format!("\"{t}\""))
            .collect::<Vec<_>>()
            .join(" OR ");
        let rows: Vec<(i64, String, String, String, String, f64)> = sqlx::query_as(
            "SELECT c.id, c.path, c.heading, c.anchor, c.text, -bm25(vault_fts, 4.0, 1.0) AS score \
             FROM vault_fts JOIN vault_chunks c ON c.id = vault_fts.rowid \
             WHERE vault_fts MATCH $1 ORDER BY bm25(vault_fts, 4.0, 1.0), c.id LIMIT $2",
        )
        .bind(query)
        .bind(i64::from(limit))
        .fetch_all(self.reader())
        .await?;
        Ok(rows
            .into_iter()
            .map(|(id, path, heading, anchor, text, score)| VaultHit {
                id,
                path,
                heading,
                anchor,
                text,
                score,
            })
            .collect())
    }

    async fn write_checkpoint(&self, checkpoint: &NewCheckpoint) -> Result<(), StoreError> {
        self.writes.put_checkpoint(checkpoint.clone()).await
    }

    async fn write_checkpoint_restored(
        &self,
        id: &str,
        at: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        self.writes
            .mark_checkpoint_restored(id.to_owned(), at)
            .await
    }

    async fn write_memory(&self, memory: &NewMemory) -> Result<(), StoreError> {
        self.writes.put_memory(memory.clone()).await
    }

    /// The two parts read side by side (the reader pool has connections to
    /// spare; SQLite answers in-process).
    async fn read_memories_for_turn(
        &self,
        scope: &str,
        terms: &[String],
        limit: u32,
        preferences: u32,
    ) -> Result<(Vec<MemoryRecord>, Vec<MemoryRecord>), StoreError> {
        use super::Store as _;
        tokio::try_join!(
            self.search_memory_text(scope, terms, limit),
            self.list_memories(scope, Some("preference"), preferences)
        )
    }

    /// FTS5 over the scope's memories, any of the terms, by BM25.
    async fn search_memory_text(
        &self,
        scope: &str,
        terms: &[String],
        limit: u32,
    ) -> Result<Vec<MemoryRecord>, StoreError> {
        Ok(sqlx::query_as::<_, MemoryRecord>(SEARCH_MEMORY_TEXT)
            .bind(any_of(terms))
            .bind(scope)
            .bind(i64::from(limit))
            .fetch_all(self.reader())
            .await?)
    }

    async fn write_memory_deletion(
        &self,
        scope: &str,
        id: Option<&str>,
    ) -> Result<u64, StoreError> {
        self.writes
            .delete_memories(scope.to_owned(), id.map(str::to_owned))
            .await
    }

    async fn write_job(&self, job: &NewJob) -> Result<(), StoreError> {
        self.writes.put_job(job.clone()).await
    }

    async fn write_job_claim(
        &self,
        now: DateTime<Utc>,
        stale_before: DateTime<Utc>,
    ) -> Result<Option<JobRecord>, StoreError> {
        self.writes.claim_job(now, stale_before).await
    }

    async fn write_job_outcome(
        &self,
        id: &str,
        outcome: &JobOutcome,
        usage: &JobUsage,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.writes
            .finish_job(id.to_owned(), outcome.clone(), *usage, now)
            .await
    }

    async fn write_judgement(&self, judgement: &JudgementRecord) -> Result<(), StoreError> {
        self.writes.put_judgement(judgement.clone()).await
    }

    async fn write_session_event(&self, event: StoredEvent) -> Result<bool, StoreError> {
        self.writes.append_session_event(event).await
    }

    async fn write_api_key(
        &self,
        id: &str,
        tenant: &str,
        key_hash: &str,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let (id, tenant, key_hash) = (id.to_owned(), tenant.to_owned(), key_hash.to_owned());
        self.writes.api_key(id, tenant, key_hash, at).await
    }

    async fn write_job_shedding(
        &self,
        kind: &str,
        keep: u64,
        why: &str,
        now: DateTime<Utc>,
    ) -> Result<u64, StoreError> {
        self.writes
            .shed_jobs(kind.to_owned(), keep, why.to_owned(), now)
            .await
    }

    async fn write_queue_ticket(
        &self,
        session_id: &str,
        now_ms: i64,
        stale_ms: i64,
    ) -> Result<i64, StoreError> {
        self.writes
            .queue_ticket(session_id.to_owned(), now_ms, stale_ms)
            .await
    }

    async fn write_ticket_alive(&self, ticket: i64, now_ms: i64) -> Result<(), StoreError> {
        self.writes.ticket_alive(ticket, now_ms).await
    }

    async fn write_ticket_removal(&self, ticket: i64) -> Result<(), StoreError> {
        self.writes.ticket_removal(ticket).await
    }

    async fn write_api_key_revocation(
        &self,
        id: &str,
        at: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        self.writes.revoke_api_key(id.to_owned(), at).await
    }

    async fn write_approval(
        &self,
        session_id: &str,
        turn_id: Uuid,
        call_id: &str,
        approved: bool,
        reason: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.writes
            .decide_approval(
                session_id.to_owned(),
                turn_id,
                call_id.to_owned(),
                approved,
                reason.map(str::to_owned),
            )
            .await
    }

    async fn write_cancel_request(&self, turn_id: Uuid) -> Result<bool, StoreError> {
        self.writes.request_cancel(turn_id).await
    }

    async fn write_heartbeat(
        &self,
        turn_ids: &[Uuid],
        now: DateTime<Utc>,
    ) -> Result<Vec<Uuid>, StoreError> {
        if turn_ids.is_empty() {
            return Ok(Vec::new());
        }
        self.writes.heartbeat(turn_ids.to_vec(), now).await
    }

    async fn write_orphan_interrupts(
        &self,
        scope: &OrphanScope,
        reason: &str,
        now: DateTime<Utc>,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        self.writes
            .interrupt_orphans(scope.clone(), reason.to_owned(), now)
            .await
    }
}
