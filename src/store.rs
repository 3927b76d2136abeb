//! The store: sessions, turns, the event log, history and decisions.
//!
//! [`Store`] is the one interface; [`sqlite::SqliteStore`] (the embedded
//! default) and [`postgres::PostgresStore`] implement it. Their reads are
//! one set of statements (generated for both by the macro in `sql`); their
//! writes are their own (Postgres: sqlx transactions in `postgres.rs`;
//! SQLite: one job per transaction on a writer thread). One contract suite
//! (`tests/store`) holds both to the same behaviour.
//!
//! Every method that writes runs in one transaction: a failure leaves the
//! store as it was.

pub mod bounded;
pub mod memories;
pub mod postgres;
pub mod records;
mod sql;
pub mod sqlite;
pub mod vault;

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::events::StoredEvent;
pub use memories::{
    JobBacklog, JobOutcome, JobRecord, JobSummary, JobUsage, JudgementRecord, MemoryRecord, NewJob,
    NewMemory, ObservationRecord,
};
pub use records::{
    ArtifactRecord, CheckpointRecord, DecisionRecord, MemoryQuery, MessageRecord, NewArtifact,
    NewCheckpoint, NewDecision, NewMessage, NewTurn, SessionRecord, TurnContext, TurnFinish,
    TurnReads, TurnRecord, TurnStatus,
};
pub use vault::{IndexedNote, NoteState, VaultChunk, VaultHit};

/// A failure of the database layer. Callers see it as an opaque 500/503.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migration error: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A unique index refused a write (SQLite's writer reports it so).
    #[error("a unique index refused the write")]
    Conflict,
    #[error("stored data is not valid: {0}")]
    Corrupt(String),
}

impl StoreError {
    /// Whether trying the same write again may succeed: the database was
    /// unreachable or busy, not refusing the data. A value it refuses
    /// (U+0000 in Postgres text, a broken constraint) fails the same way
    /// every time.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Unavailable(_) => true,
            Self::Database(
                sqlx::Error::Io(_)
                | sqlx::Error::PoolTimedOut
                | sqlx::Error::PoolClosed
                | sqlx::Error::WorkerCrashed,
            ) => true,
            // SQLSTATE classes: 08 connection, 40 rollback (serialization,
            // deadlock), 53 resources, 57 operator intervention (shutdown).
            Self::Database(sqlx::Error::Database(e)) => e
                .code()
                .is_some_and(|code| ["08", "40", "53", "57"].iter().any(|c| code.starts_with(c))),
            _ => false,
        }
    }
}

/// A turn that began: its first seq and what the turn needs of its session.
#[derive(Debug, Clone, PartialEq)]
pub struct BeganTurn {
    /// Seq of the `turn.started` event.
    pub first_seq: i64,
    /// 1-based number of the turn in its session.
    pub turn_number: u64,
    /// Cost of the session's earlier turns.
    pub session_cost_before: Option<f64>,
    /// What the begin read for the turn ([`NewTurn::reads`]).
    pub context: TurnContext,
}

/// Why a turn could not begin.
#[derive(Debug, thiserror::Error)]
pub enum BeginTurnError {
    /// The session already has a running turn (the database's unique index said so).
    #[error("session already has a running turn {0}")]
    AlreadyRunning(Uuid),
    /// A turn with this idempotency key exists in the session.
    #[error("a turn with this idempotency key exists")]
    IdempotencyKeyExists(Box<TurnRecord>),
    /// The session belongs to another tenant: to this one it does not
    /// exist. Nothing was written.
    #[error("no such session")]
    SessionNotFound,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Which running turns are orphans: those whose owner is gone.
#[derive(Debug, Clone)]
pub struct OrphanScope {
    /// Turns of this instance from another process are a previous life's.
    pub instance: String,
    /// This process; its own turns are never orphans by the instance rule.
    pub process: String,
    /// Turns whose heartbeat is older than this are orphans, whoever owns them.
    pub stale_before: DateTime<Utc>,
    /// Turns known to be running in the caller's process: never orphans,
    /// however late their heartbeat (a busy moment must not end them).
    pub alive: std::collections::HashSet<Uuid>,
}

/// Turn ids whose cancellation was requested, as requests are made.
pub type CancelRequests = futures::stream::BoxStream<'static, Result<Uuid, StoreError>>;

/// The Postgres channel cancel requests are announced on.
pub const CANCEL_CHANNEL: &str = "agent_harness_cancel";

/// Whether the database answers and has every migration applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Readiness {
    pub reachable: bool,
    pub migrations_applied: bool,
}

/// The persistence interface of the service.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// `sqlite` or `postgres`.
    fn backend(&self) -> &'static str;

    /// Applies pending migrations.
    async fn migrate(&self) -> Result<(), StoreError>;

    /// For `GET /readyz`.
    async fn readiness(&self) -> Readiness;

    /// Creates the session if needed, the turn as `running`, and its
    /// `turn.started` event, atomically.
    async fn begin_turn(&self, turn: &NewTurn) -> Result<BeganTurn, BeginTurnError>;

    /// Appends events and applies turn finishes in one transaction, in that
    /// order. A finish applies only while its turn is still `running`; the
    /// returned flags say which did (a finish that did not writes nothing).
    async fn write_batch(
        &self,
        events: &[Arc<StoredEvent>],
        finishes: &[&TurnFinish],
    ) -> Result<Vec<bool>, StoreError>;

    async fn get_turn(
        &self,
        session_id: &str,
        turn_id: Uuid,
    ) -> Result<Option<TurnRecord>, StoreError>;

    async fn get_session(&self, session_id: &str) -> Result<Option<SessionRecord>, StoreError>;

    /// The tenant a session belongs to; `None`: no such session.
    async fn session_tenant(&self, session_id: &str) -> Result<Option<String>, StoreError>;

    /// The tenant a checkpoint belongs to (through its session).
    async fn checkpoint_tenant(&self, checkpoint_id: &str) -> Result<Option<String>, StoreError>;

    /// History of a session in order, after message id `after`.
    async fn list_messages(
        &self,
        session_id: &str,
        after: i64,
        limit: u32,
    ) -> Result<Vec<MessageRecord>, StoreError>;

    /// The last `limit` messages of a session, oldest first.
    async fn recent_messages(
        &self,
        session_id: &str,
        limit: u32,
    ) -> Result<Vec<MessageRecord>, StoreError>;

    /// Events of a session with seq greater than `after`, in seq order,
    /// optionally of one turn. For a turn, pass an `after` of at least its
    /// `first_seq - 1`: the scan starts there.
    async fn list_events(
        &self,
        session_id: &str,
        turn_id: Option<Uuid>,
        after: i64,
        limit: u32,
    ) -> Result<Vec<StoredEvent>, StoreError>;

    /// Messages of a session containing any of `terms` (lower-case words),
    /// newest first.
    async fn search_messages(
        &self,
        session_id: &str,
        terms: &[String],
        limit: u32,
    ) -> Result<Vec<MessageRecord>, StoreError>;

    /// Decision records of a session, oldest first: after the record
    /// `after` (an id; they are UUID v7, in time order), of `strategy` if
    /// given, at most `limit`.
    async fn list_decisions(
        &self,
        session_id: &str,
        after: Option<&str>,
        strategy: Option<&str>,
        limit: u32,
    ) -> Result<Vec<DecisionRecord>, StoreError>;

    /// Stores a tool output too large for the prompt.
    async fn put_artifact(&self, artifact: &NewArtifact) -> Result<(), StoreError>;

    /// An artifact of a session.
    async fn get_artifact(
        &self,
        session_id: &str,
        artifact_id: &str,
    ) -> Result<Option<ArtifactRecord>, StoreError>;

    /// Keeps a note's state before a write.
    async fn put_checkpoint(&self, checkpoint: &NewCheckpoint) -> Result<(), StoreError>;

    /// The newest `limit` checkpoints of a session, oldest first.
    async fn list_checkpoints(
        &self,
        session_id: &str,
        limit: u32,
    ) -> Result<Vec<CheckpointRecord>, StoreError>;

    /// A checkpoint and the note's saved bytes (`None`: there was no note).
    async fn get_checkpoint(
        &self,
        id: &str,
    ) -> Result<Option<(CheckpointRecord, Option<Vec<u8>>)>, StoreError>;

    /// Marks a checkpoint restored; false when it already was (or is not).
    async fn mark_checkpoint_restored(
        &self,
        id: &str,
        at: DateTime<Utc>,
    ) -> Result<bool, StoreError>;

    /// Flags a running turn for cancellation by its owner. False when the
    /// turn is not running.
    async fn request_cancel(&self, turn_id: Uuid) -> Result<bool, StoreError>;

    /// Cancel requests as they are made, by any process (Postgres: LISTEN/
    /// NOTIFY), so that the turn's owner stops it at once rather than at
    /// its next heartbeat. `None`: the backend has no such channel (the
    /// heartbeat's flag check is then the only way). An error item is a
    /// lost connection: the next poll reconnects; requests made meanwhile
    /// are found by the heartbeat.
    async fn cancel_requests(&self) -> Result<Option<CancelRequests>, StoreError> {
        Ok(None)
    }

    /// What the index holds of each vault note, by path.
    async fn vault_notes(&self)
    -> Result<std::collections::HashMap<String, NoteState>, StoreError>;

    /// Indexes a note, replacing what was indexed at its path.
    async fn vault_put_note(&self, note: &IndexedNote) -> Result<(), StoreError>;

    /// Removes notes (and their chunks) from the index; returns how many were there.
    async fn vault_remove_notes(&self, paths: &[String]) -> Result<u64, StoreError>;

    /// Chunks matching any of `terms` (words), best first.
    async fn vault_search(&self, terms: &[String], limit: u32)
    -> Result<Vec<VaultHit>, StoreError>;

    /// The embeddings `model` made, by chunk id, at most `limit`.
    async fn vault_vectors(
        &self,
        model: &str,
        limit: u32,
    ) -> Result<Vec<(i64, Vec<f32>)>, StoreError>;

    /// Chunks by id (score 0), in no particular order; ids no longer
    /// indexed are left out.
    async fn vault_chunks(&self, ids: &[i64]) -> Result<Vec<VaultHit>, StoreError>;

    /// Keeps a memory, replacing the scope's memory of the same key; the
    /// scope keeps its newest [`memories::MEMORIES_PER_SCOPE`].
    async fn upsert_memory(&self, memory: &NewMemory) -> Result<(), StoreError>;

    /// Memories of `scope` matching any of `terms`, best first.
    async fn search_memories(
        &self,
        scope: &str,
        terms: &[String],
        limit: u32,
    ) -> Result<Vec<MemoryRecord>, StoreError>;

    /// What a turn reads of `scope`'s memories before it asks the model,
    /// in one read: the memories matching any of `terms` (best first, up
    /// to `limit`, as [`Self::search_memories`]) and its preferences
    /// (newest first, up to `preferences`).
    async fn memories_for_turn(
        &self,
        scope: &str,
        terms: &[String],
        limit: u32,
        preferences: u32,
    ) -> Result<(Vec<MemoryRecord>, Vec<MemoryRecord>), StoreError>;

    /// Memories of `scope` (of one kind, if given), newest first.
    async fn list_memories(
        &self,
        scope: &str,
        kind: Option<&str>,
        limit: u32,
    ) -> Result<Vec<MemoryRecord>, StoreError>;

    /// The embeddings `model` made of `scope`'s memories, by memory id.
    async fn memory_vectors(
        &self,
        scope: &str,
        model: &str,
    ) -> Result<Vec<(String, Vec<f32>)>, StoreError>;

    /// Forgets one memory of `scope` (`id`) or all of them; how many went.
    async fn delete_memories(&self, scope: &str, id: Option<&str>) -> Result<u64, StoreError>;

    /// Queues work to run after a turn.
    async fn enqueue_job(&self, job: &NewJob) -> Result<(), StoreError>;

    /// Claims the oldest job due at `now` (or a running one claimed before
    /// `stale_before`: its runner died); its attempts go up by one.
    async fn claim_job(
        &self,
        now: DateTime<Utc>,
        stale_before: DateTime<Utc>,
    ) -> Result<Option<JobRecord>, StoreError>;

    /// Records how a claimed job's run ended, adding the usage it took to
    /// the job's totals.
    async fn finish_job(
        &self,
        id: &str,
        outcome: &JobOutcome,
        usage: &JobUsage,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError>;

    /// The jobs waiting to run (`pending`), of every session.
    async fn job_backlog(&self) -> Result<JobBacklog, StoreError>;

    /// Gives up the oldest waiting jobs of `kind` (`failed`, with `why`)
    /// until at most `keep` jobs of any kind wait; returns how many.
    async fn shed_jobs(
        &self,
        kind: &str,
        keep: u64,
        why: &str,
        now: DateTime<Utc>,
    ) -> Result<u64, StoreError>;

    /// The newest `limit` jobs of a session, oldest first.
    async fn list_jobs(&self, session_id: &str, limit: u32) -> Result<Vec<JobSummary>, StoreError>;

    async fn put_judgement(&self, judgement: &JudgementRecord) -> Result<(), StoreError>;

    /// Appends `event` (under `event_turn_id`) to the session's log at its
    /// next seq, between turns. False, and nothing written, while a turn of
    /// the session runs (its events own the next seqs): try again later.
    async fn append_session_event(
        &self,
        session_id: &str,
        event_turn_id: Uuid,
        event: &crate::events::TurnEvent,
        at: DateTime<Utc>,
    ) -> Result<bool, StoreError>;

    /// The judgements of a turn, oldest first.
    async fn list_judgements(
        &self,
        session_id: &str,
        turn_id: Uuid,
    ) -> Result<Vec<JudgementRecord>, StoreError>;

    /// The newest `limit` observations of a session, oldest first.
    async fn list_observations(
        &self,
        session_id: &str,
        limit: u32,
    ) -> Result<Vec<ObservationRecord>, StoreError>;

    /// Records a person's decision on a call waiting for approval; false
    /// when the call was already decided (the first decision stands).
    async fn decide_approval(
        &self,
        session_id: &str,
        turn_id: Uuid,
        call_id: &str,
        approved: bool,
        reason: Option<&str>,
    ) -> Result<bool, StoreError>;

    /// The decision on a call, if one was made: approved, and why not.
    async fn get_approval(
        &self,
        turn_id: Uuid,
        call_id: &str,
    ) -> Result<Option<(bool, Option<String>)>, StoreError>;

    /// Keeps an API key's hash for `tenant`.
    async fn create_api_key(
        &self,
        id: &str,
        tenant: &str,
        key_hash: &str,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError>;

    /// The key (id, tenant) of a hash, unless revoked.
    async fn find_api_key(&self, key_hash: &str) -> Result<Option<(String, String)>, StoreError>;

    /// Revokes a key; false when there is no such key (or it already was).
    async fn revoke_api_key(&self, id: &str, at: DateTime<Utc>) -> Result<bool, StoreError>;

    /// Keys as (id, tenant, created, revoked), oldest first.
    async fn list_api_keys(
        &self,
    ) -> Result<Vec<(String, String, DateTime<Utc>, Option<DateTime<Utc>>)>, StoreError>;

    /// Takes a place in the queue of `session_id` (passing over, and
    /// removing, the session's tickets not kept alive since `stale_ms`);
    /// returns its ticket. Times are milliseconds since the epoch.
    async fn enqueue_turn(
        &self,
        session_id: &str,
        now_ms: i64,
        stale_ms: i64,
    ) -> Result<i64, StoreError>;

    /// The ticket that goes next in `session_id`'s queue: the lowest kept
    /// alive since `stale_ms`.
    async fn queue_head(&self, session_id: &str, stale_ms: i64) -> Result<Option<i64>, StoreError>;

    /// Keeps a ticket alive.
    async fn touch_ticket(&self, ticket: i64, now_ms: i64) -> Result<(), StoreError>;

    /// Leaves the queue (the turn began, or the request gave up).
    async fn leave_queue(&self, ticket: i64) -> Result<(), StoreError>;

    /// Refreshes the heartbeat of these running turns; returns those whose
    /// cancellation was requested.
    async fn heartbeat(
        &self,
        turn_ids: &[Uuid],
        now: DateTime<Utc>,
    ) -> Result<Vec<Uuid>, StoreError>;

    /// Marks orphaned running turns `interrupted`, each with a final
    /// `turn.interrupted` event; returns those events.
    async fn interrupt_orphans(
        &self,
        scope: &OrphanScope,
        reason: &str,
        now: DateTime<Utc>,
    ) -> Result<Vec<StoredEvent>, StoreError>;
}

/// How a store uses its database's connections.
#[derive(Debug, Clone, Copy)]
pub struct PoolLimits {
    pub max_connections: u32,
    /// A request waits at most this for a connection.
    pub acquire_timeout: std::time::Duration,
    /// A call waits at most this for the database to answer (Postgres; see
    /// [`bounded`]).
    pub call_timeout: std::time::Duration,
}

/// Connects to the database named by `url` (`sqlite:` or `postgres://`).
pub async fn connect(url: &str, limits: PoolLimits) -> Result<Arc<dyn Store>, StoreError> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(postgres::PostgresStore::connect(url, limits)
            .await?
            .into_store())
    } else {
        Ok(Arc::new(
            sqlite::SqliteStore::connect(url, limits.max_connections).await?,
        ))
    }
}
