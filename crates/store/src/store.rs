//! The store: sessions, turns, the event log, history and decisions.
//!
//! One trait per concern, each in its own module with its SQLite and
//! Postgres versions side by side:
//!
//! | concern | trait | module |
//! |---|---|---|
//! | the event log (append, read) | [`EventLog`] | [`event_log`] |
//! | sessions and turns (begin, liveness, queue, history) | [`Turns`] | [`turns`] |
//! | memories, background jobs, judgements | [`Jobs`] | [`jobs`] |
//! | the vault's index | [`VaultIndex`] | [`vault`] |
//! | keys, approvals, checkpoints, artifacts | [`Access`] | [`access`] |
//! | files and their bytes | [`Files`] | [`files`] |
//!
//! [`Store`] is all of them. [`sqlite::SqliteStore`] (the embedded default)
//! and [`postgres::PostgresStore`] implement each: the reads once, in the
//! trait, against a [`Reader`] (see [`reader`]); the writes each their own
//! (SQLite: one job per transaction on a writer thread; Postgres: sqlx, each
//! call bounded). One contract suite (`tests/store`) holds both to the same
//! behaviour.
//!
//! Every method that writes runs in one transaction: a failure leaves the
//! store as it was.

pub mod access;
pub mod audit;
mod deadline;
pub mod erase;
pub mod event_log;
pub mod export;
pub mod files;
pub mod forks;
pub mod jobs;
pub mod leases;
pub mod memories;
pub mod postgres;
pub mod pushes;
pub mod reader;
pub mod records;
pub mod sqlite;
pub mod steers;
pub mod tenants;
pub mod turns;
pub mod vault;
pub mod webhooks;

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

pub use access::{Access, ApiKeyRow, FoundKey};
pub use audit::{Audit, AuditEntry, AuditFilter, AuditRow};
pub use erase::{Erase, Erased};
pub use event_log::{Batch, EventLog, cursor::TurnLogCursor, step_records_as};
pub use export::{Export, Imported};
pub use files::{FilePut, FileRecord, Files};
pub use forks::{Forked, Forks};
pub use jobs::Jobs;
pub use leases::{Claim, Leases, Queue, Share};
pub use memories::{
    JobBacklog, JobOutcome, JobRecord, JobSummary, JobUsage, JudgementRecord, MemoryRecord, NewJob,
    NewMemory, ObservationRecord,
};
pub use pushes::{PushAuth, PushConfig, PushDelivery, PushProgress, Pushes};
pub use reader::{Reader, Reads};
pub use records::{
    ArtifactRecord, CheckpointRecord, DecisionRecord, Lease, MemoryQuery, MessageRecord,
    NewApproval, NewArtifact, NewCheckpoint, NewDecision, NewMessage, NewStep, NewToolResult,
    NewTurn, SessionRecord, TurnContext, TurnFilter, TurnFinish, TurnReads, TurnRecord, TurnStatus,
};
pub use steers::{NewSteer, Steer, SteerAdded, Steers};
pub use tenants::{TenantLimits, Tenants, UsageTotals};
pub use turns::Turns;
pub use vault::{IndexedNote, NoteState, VaultChunk, VaultHit, VaultIndex};
pub use webhooks::{
    DeliveryOutcome, HeldDelivery, OPERATOR_WEBHOOK_ID, Webhook, WebhookDelivery, Webhooks,
};

/// A store call's outcome: its value, or why the database layer failed.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

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
    /// Another process has taken over a turn the write was for.
    #[error("turn {0} was taken over by another process")]
    LeaseLost(Uuid),
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
    /// The session is more than one branch: the turn's history is read
    /// along its own ([`Turns::history`]).
    pub branched: bool,
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
    /// The turn the request names as its parent is not one of the
    /// session's. Nothing was written.
    #[error("no such turn to continue")]
    ParentNotFound,
    /// The tenant runs as many turns as it may (`NewTurn::max_running`).
    /// Nothing was written.
    #[error("the tenant runs as many turns as it may")]
    TenantBusy,
    /// The caller held the turn back (`NewTurn::held_back`) and it has no
    /// conflict to answer with. Nothing was written.
    #[error("the turn was held back")]
    HeldBack,
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
    /// Take-overs a turn may have: an orphan taken over this many times
    /// already ends `interrupted` (0: every orphan does). A parked
    /// turn's resumptions do not count.
    pub max_attempts: u32,
    /// Only this turn (a parked turn an answer has just woken here).
    pub only: Option<Uuid>,
    /// The running turns a tenant may have where it sets none of its
    /// own: a parked turn is taken up only while its tenant has room (else
    /// it stays parked, due again [`PARKED_RETRY`] later, spread), unless
    /// it was cancelled (it ends at once, asking no model).
    pub max_running_default: Option<u32>,
}

/// How long a parked turn waits again when its tenant runs as many turns
/// as it may: this, plus up to as much again (by the turn's id), so that
/// turns woken together are taken up apart.
pub const PARKED_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// When a parked turn that found its tenant full is due again.
pub fn parked_retry_at(turn_id: &str, now: DateTime<Utc>) -> DateTime<Utc> {
    let spread = turn_id
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)))
        % 1000;
    let retry = PARKED_RETRY.as_millis() as i64 + i64::try_from(spread).unwrap_or(0);
    now + chrono::Duration::milliseconds(retry)
}

/// A parked turn's tenant's cap ($2: the default) and how many turns it
/// runs now (counted as a begin counts them), from the turn's id ($1).
macro_rules! tenant_room {
    ($id:literal, $default:literal) => {
        concat!(
            "SELECT COALESCE((SELECT n.max_running_turns FROM tenants n \
             WHERE n.tenant = t.tenant), ",
            $default,
            "), (SELECT count(*) FROM turns r WHERE r.tenant = t.tenant \
             AND r.status = 'running' AND r.parked_until IS NULL) FROM turns t WHERE t.id = ",
            $id
        )
    };
}
pub(crate) const TENANT_ROOM: &str = tenant_room!("$1", "$2");
/// [`TENANT_ROOM`] with SQLite's parameters.
pub(crate) const TENANT_ROOM_SQLITE: &str = tenant_room!("?1", "?2");

/// What a sweep did with an orphan.
#[derive(Debug, Clone, PartialEq)]
pub enum Orphan {
    /// The caller's process holds it now, as attempt `turn.attempt`; its
    /// next event takes `next_seq`.
    Claimed {
        turn: Box<TurnRecord>,
        next_seq: i64,
        /// Its owner released it (shutdown) rather than died.
        released: bool,
        /// It was parked, waiting for an answer (which came, or its wait's
        /// deadline did): not a take-over.
        woken: bool,
    },
    /// It ended `interrupted` with this event: its take-overs ran out.
    Interrupted(Box<crate::events::StoredEvent>),
}

/// What one process tells the others about turns, as it happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Announcement {
    /// Someone asked for this turn's cancellation.
    Cancel(Uuid),
    /// Its owner gave this turn up (shutdown), or it was parked and an
    /// answer woke it: take it over.
    Released(Uuid),
    /// A message was steered into this turn (`steer`, the steer's id):
    /// its owner says `steer.accepted` in its log.
    Steered { turn: Uuid, steer: Uuid },
}

/// Announcements as they are made.
pub type Announcements = futures::stream::BoxStream<'static, Result<Announcement>>;

/// The Postgres channel announcements are made on: a cancel's payload is
/// the turn id, a release's `released:` and the turn id.
pub const CANCEL_CHANNEL: &str = "agent_harness_cancel";

/// The payload prefix of a release on [`CANCEL_CHANNEL`].
pub const RELEASED_PREFIX: &str = "released:";

/// The payload prefix of a steer on [`CANCEL_CHANNEL`]: then the turn id,
/// `:` and the steer's id.
pub const STEERED_PREFIX: &str = "steered:";

impl Announcement {
    /// The announcement a [`CANCEL_CHANNEL`] payload makes, if any.
    pub fn parse(payload: &str) -> Option<Self> {
        if let Some(ids) = payload.strip_prefix(STEERED_PREFIX) {
            let (turn, steer) = ids.split_once(':')?;
            return Some(Self::Steered {
                turn: Uuid::parse_str(turn).ok()?,
                steer: Uuid::parse_str(steer).ok()?,
            });
        }
        match payload.strip_prefix(RELEASED_PREFIX) {
            Some(id) => Uuid::parse_str(id).ok().map(Self::Released),
            None => Uuid::parse_str(payload).ok().map(Self::Cancel),
        }
    }
}

/// Whether the database answers and has every migration applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Readiness {
    pub reachable: bool,
    pub migrations_applied: bool,
}

/// The persistence interface of the service: every concern, and what the
/// database itself answers. Callers that need one concern take its trait
/// (the vault a [`VaultIndex`], the background worker [`Jobs`]).
#[async_trait]
pub trait Store:
    EventLog
    + Turns
    + Jobs
    + VaultIndex
    + Access
    + Tenants
    + Pushes
    + Webhooks
    + Erase
    + Audit
    + Export
    + Files
    + Forks
    + Steers
{
    /// `sqlite` or `postgres`.
    fn backend(&self) -> &'static str;

    /// Applies pending migrations.
    async fn migrate(&self) -> Result<()>;

    /// For `GET /readyz`.
    async fn readiness(&self) -> Readiness;
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
pub async fn connect(url: &str, limits: PoolLimits) -> Result<Arc<dyn Store>> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Arc::new(
            postgres::PostgresStore::connect(url, limits).await?,
        ))
    } else {
        Ok(Arc::new(
            sqlite::SqliteStore::connect(url, limits.max_connections).await?,
        ))
    }
}
