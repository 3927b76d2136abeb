//! Rows of the store, shared by both backends.

use std::{fmt, str::FromStr, sync::Arc};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::StoreError;
use crate::store::Result;
use crate::{
    events::StoredEvent,
    ids::{SessionKey, client_session_id},
    turn::{TurnRequest, TurnResult},
};

/// Where a turn is in its life. Only `running` is not final.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TurnStatus {
    Running,
    Completed,
    Failed,
    Cancelled,
    Interrupted,
}

impl TurnStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
            Self::Interrupted => "interrupted",
        }
    }
}

impl fmt::Display for TurnStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TurnStatus {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "running" => Self::Running,
            "completed" => Self::Completed,
            "failed" => Self::Failed,
            "cancelled" => Self::Cancelled,
            "interrupted" => Self::Interrupted,
            other => return Err(StoreError::Corrupt(format!("turn status {other:?}"))),
        })
    }
}

/// A turn about to begin.
#[derive(Debug, Clone)]
pub struct NewTurn {
    pub id: Uuid,
    pub session_id: SessionKey,
    /// Whose session: a new session becomes the tenant's; a session of
    /// another tenant is not found.
    pub tenant: String,
    /// What the turn is asked (stored as JSON; an idempotent replay
    /// compares it).
    pub request: TurnRequest,
    pub idempotency_key: Option<String>,
    pub owner_instance: String,
    pub owner_process: String,
    pub created_at: DateTime<Utc>,
    /// The serialized `turn.started` event.
    pub started_payload: String,
    /// The trace context (W3C `traceparent`) of the turn's span, when
    /// traces are exported: a take-over links to it.
    pub traceparent: Option<String>,
    /// What the turn will read first, for a backend that answers it with
    /// the begin (see [`TurnReads`]).
    pub reads: TurnReads,
    /// The most running turns the tenant may have: the begin refuses the
    /// turn ([`super::BeginTurnError::TenantBusy`]) when it has as many.
    pub max_running: Option<u32>,
    /// The caller refuses the turn (its tenant is at a limit the caller
    /// knows of): nothing is written, and the begin answers the turn's
    /// conflict if it has one (its key's turn, the session's running
    /// one), else [`super::BeginTurnError::HeldBack`].
    pub held_back: bool,
}

/// The reads a turn makes before its first provider call. A backend may
/// answer them inside the begin's own write (SQLite's writer thread does,
/// on its connection: no hand-off to a reader thread and back for each);
/// what it leaves unanswered the turn reads itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TurnReads {
    /// The session's last messages, at most this many.
    pub history: Option<u32>,
    /// The scope's memories for the turn's message.
    pub memory: Option<MemoryQuery>,
}

/// A turn's memory read: the scope's memories matching any of `terms`
/// (at most `limit`) and its preferences (at most `preferences`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryQuery {
    pub scope: String,
    /// Search terms (the store cleans them); none left: no match is
    /// read, preferences only.
    pub terms: Vec<String>,
    pub limit: u32,
    pub preferences: u32,
}

/// What the begin answered of [`TurnReads`]; `None`: read it yourself.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TurnContext {
    /// Oldest first, as [`super::Store::recent_messages`] answers.
    pub history: Option<Vec<MessageRecord>>,
    /// As [`super::Store::memories_for_turn`] answers: (matches, preferences).
    pub memories: Option<(Vec<super::MemoryRecord>, Vec<super::MemoryRecord>)>,
}

/// A history message to append when a turn completes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewMessage {
    /// The id the harness gave the message (what the turn referred to).
    pub id: Uuid,
    pub role: String,
    pub content: String,
    /// The images and files a user's message carried, as JSON (file
    /// references, never bytes).
    pub attachments: Option<String>,
}

/// A decision record to store when a turn completes.
#[derive(Debug, Clone)]
pub struct NewDecision {
    pub id: Uuid,
    pub decision_key: String,
    pub strategy: String,
    /// The whole record as JSON.
    pub record: String,
}

/// The end of a turn: its status, result and the writes that go with it,
/// committed together with its terminal event.
#[derive(Debug, Clone)]
pub struct TurnFinish {
    pub turn_id: Uuid,
    /// The lease the finish holds: it applies only while the turn is
    /// still this attempt's.
    pub attempt: u32,
    pub session_id: SessionKey,
    pub status: TurnStatus,
    pub result: Option<String>,
    pub error_code: Option<String>,
    pub error_message: Option<String>,
    pub messages: Vec<NewMessage>,
    pub decision: Option<NewDecision>,
    /// The research learner's observation of the turn.
    pub observation: Option<super::ObservationRecord>,
    /// Jobs to run once the turn's end has landed.
    pub jobs: Vec<super::NewJob>,
    /// The turn's cost in USD, when priced.
    pub cost_usd: Option<f64>,
    /// The turn answers a background response: its end is the
    /// response's webhook message too ([`super::webhooks::routes`]).
    pub background: bool,
    pub terminal: Arc<StoredEvent>,
}

/// A running turn's lease, held by the process that runs it: its writes
/// apply only while the turn is still this attempt's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    pub turn_id: Uuid,
    pub attempt: u32,
}

/// A step's record of a running turn (`harness::durable::StepRecord`),
/// as JSON: kept until the turn ends.
#[derive(Debug, Clone, PartialEq)]
pub struct NewStep {
    pub turn_id: Uuid,
    pub step: u32,
    /// `answered` or `finished`.
    pub phase: &'static str,
    pub record: String,
    pub created_at: DateTime<Utc>,
}

/// A person's decision on a call waiting for approval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewApproval {
    pub session_id: SessionKey,
    pub turn_id: Uuid,
    pub call_id: String,
    pub approved: bool,
    /// Why not, when refused (or, approved, a note the model sees).
    pub reason: Option<String>,
    /// The arguments to run instead of the asked ones (JSON, checked
    /// against the tool's schema already), when the person edited them.
    pub edited_arguments: Option<String>,
    /// The SHA-256 of the arguments the decision is for (edited, or as
    /// asked): the call runs only with these.
    pub arguments_sha256: Option<String>,
}

/// What a client posted for a call of a tool it runs itself.
#[derive(Debug, Clone)]
pub struct NewToolResult {
    pub session_id: SessionKey,
    pub turn_id: Uuid,
    pub call_id: String,
    pub output: String,
    /// The client's tool failed: `output` says why.
    pub is_error: bool,
}

/// A tool output to keep out of the prompt.
#[derive(Debug, Clone)]
pub struct NewArtifact {
    pub id: String,
    pub session_id: SessionKey,
    pub turn_id: String,
    pub call_id: String,
    pub tool: String,
    pub content: String,
    pub created_at: DateTime<Utc>,
}

/// A note's state before a write, to keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewCheckpoint {
    pub id: String,
    pub session_id: SessionKey,
    pub turn_id: String,
    pub call_id: String,
    pub tool: String,
    /// The note's path in the vault.
    pub path: String,
    /// Its bytes; `None`: there was no note.
    pub content: Option<Vec<u8>>,
    pub created_at: DateTime<Utc>,
}

/// A checkpoint as stored (without its content).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct CheckpointRecord {
    pub id: String,
    #[serde(serialize_with = "crate::ids::as_client_id")]
    pub session_id: String,
    pub turn_id: String,
    /// The call whose write it was taken before (for a restore's own
    /// checkpoint: the checkpoint restored).
    pub call_id: String,
    pub tool: String,
    pub path: String,
    /// Whether the note existed; restoring a checkpoint of a note that
    /// did not removes it.
    pub existed: bool,
    /// Size of the saved note, in bytes.
    pub bytes: Option<i64>,
    pub created_at: DateTime<Utc>,
    pub restored_at: Option<DateTime<Utc>>,
}

/// A stored decision record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DecisionRecord {
    pub id: String,
    pub turn_id: String,
    pub decision_key: String,
    pub strategy: String,
    #[schema(value_type = crate::turn::DecisionDetails)]
    pub record: serde_json::Value,
    pub created_at: DateTime<Utc>,
}

/// A stored artifact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct ArtifactRecord {
    pub id: String,
    #[serde(serialize_with = "crate::ids::as_client_id")]
    pub session_id: String,
    pub turn_id: String,
    pub call_id: String,
    pub tool: String,
    pub content: String,
    pub created_at: DateTime<Utc>,
}

/// Which of a tenant's turns a list across its sessions holds (A2A's
/// `ListTasks`): each filter left `None` takes every turn.
#[derive(Debug, Clone, Default)]
pub struct TurnFilter {
    /// Only this session's turns.
    pub session: Option<crate::ids::SessionKey>,
    /// Only turns in one of these statuses (at most two are read).
    pub statuses: Vec<TurnStatus>,
    /// Only turns whose status changed at or after this (the end of an
    /// ended turn, the last heartbeat of a running one).
    pub changed_since: Option<DateTime<Utc>>,
}

/// A turn as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnRecord {
    pub id: Uuid,
    pub session_id: SessionKey,
    pub status: TurnStatus,
    pub request: TurnRequest,
    /// A completed turn's result.
    pub result: Option<TurnResult>,
    pub error_code: Option<String>,
    pub error_message: Option<String>,
    pub owner_instance: String,
    /// The lease: how many times the turn was taken over (0: never).
    pub attempt: u32,
    pub first_seq: i64,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// The trace context (W3C `traceparent`) of the span that began the
    /// turn, when traces are exported.
    pub traceparent: Option<String>,
    /// Parked (waiting for a person or a client, owned by no process):
    /// when it is due to go on, unanswered. `None`: not parked.
    pub parked_until: Option<DateTime<Utc>>,
    /// What its parks lasted in all: its compute deadline moves by as much.
    pub waited: std::time::Duration,
    /// Someone asked for it to stop.
    pub cancel_requested: bool,
    /// The turn whose state it continues (its parent in the session's
    /// tree); `None`: a root.
    pub parent_turn_id: Option<Uuid>,
}

// Its `id` as stored is the tenant's key; the API shows the client's id.
/// A session and a summary of its turns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = SessionView)]
pub struct SessionRecord {
    #[serde(rename = "session_id", serialize_with = "crate::ids::as_client_id")]
    pub id: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub turn_count: i64,
    /// Seq of the session's newest event.
    pub last_seq: i64,
    pub running_turn_id: Option<Uuid>,
    /// Sum of the priced turns' costs, USD.
    pub cost_usd: Option<f64>,
    /// A turn of the session continues another than the newest turn (a
    /// regenerate, an edit): its turns are more than one branch.
    pub branched: bool,
    /// A fork: the session whose branch its history begins with.
    pub forked_from: Option<String>,
    /// A fork: the turn of `forked_from` its first turn continues.
    pub forked_at: Option<Uuid>,
}

/// One message of a session's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MessageRecord {
    /// Position in the session's history (the `after` cursor).
    pub id: i64,
    /// The id the harness gave the message; absent on messages stored
    /// before message ids existed.
    pub message_id: Option<Uuid>,
    pub turn_id: Uuid,
    pub role: String,
    pub content: String,
    pub created_at: DateTime<Utc>,
    /// The images and files a user's message carried, as JSON.
    pub attachments: Option<String>,
}

pub(super) fn parse_uuid(raw: &str) -> Result<Uuid> {
    Uuid::parse_str(raw).map_err(|_| StoreError::Corrupt(format!("uuid {raw:?}")))
}

/// Raw rows, decoded the same way from both backends.
pub(super) mod rows {
    use chrono::{DateTime, Utc};

    #[derive(sqlx::FromRow)]
    pub struct TurnRow {
        pub id: String,
        pub session_id: String,
        pub status: String,
        pub request: String,
        pub result: Option<String>,
        pub error_code: Option<String>,
        pub error_message: Option<String>,
        pub owner_instance: String,
        pub attempt: i32,
        pub first_seq: i64,
        pub created_at: DateTime<Utc>,
        pub finished_at: Option<DateTime<Utc>>,
        pub traceparent: Option<String>,
        pub parked_until: Option<DateTime<Utc>>,
        pub waited_ms: i64,
        pub cancel_requested: bool,
        pub parent_turn_id: Option<String>,
    }

    #[derive(sqlx::FromRow)]
    pub struct EventRow {
        pub session_id: String,
        pub seq: i64,
        /// The last seq of a run of deltas (`event_log/runs.rs`).
        pub seq_end: Option<i64>,
        pub turn_id: String,
        #[sqlx(rename = "type")]
        pub event_type: String,
        pub payload: String,
        pub created_at: DateTime<Utc>,
    }

    #[derive(sqlx::FromRow)]
    pub struct MessageRow {
        pub id: i64,
        pub message_id: Option<String>,
        pub turn_id: String,
        pub role: String,
        pub content: String,
        pub created_at: DateTime<Utc>,
        #[sqlx(default)]
        pub attachments: Option<String>,
    }

    #[derive(sqlx::FromRow)]
    pub struct DecisionRow {
        pub id: String,
        pub turn_id: String,
        pub decision_key: String,
        pub strategy: String,
        pub record: String,
        pub created_at: DateTime<Utc>,
    }

    #[derive(sqlx::FromRow)]
    pub struct SessionRow {
        pub id: String,
        pub created_at: DateTime<Utc>,
        pub updated_at: DateTime<Utc>,
        pub turn_count: i64,
        pub last_seq: i64,
        pub running_turn_id: Option<String>,
        pub cost_usd: Option<f64>,
        pub branched: bool,
        pub forked_from: Option<String>,
        pub forked_at: Option<String>,
    }
}

impl TryFrom<rows::TurnRow> for TurnRecord {
    type Error = StoreError;
    fn try_from(r: rows::TurnRow) -> Result<Self> {
        Ok(Self {
            id: parse_uuid(&r.id)?,
            session_id: SessionKey::stored(r.session_id),
            status: r.status.parse()?,
            request: serde_json::from_str(&r.request)
                .map_err(|e| StoreError::Corrupt(format!("turn request: {e}")))?,
            result: r
                .result
                .map(|result| serde_json::from_str(&result))
                .transpose()
                .map_err(|e| StoreError::Corrupt(format!("turn result: {e}")))?,
            error_code: r.error_code,
            error_message: r.error_message,
            owner_instance: r.owner_instance,
            attempt: u32::try_from(r.attempt).unwrap_or(0),
            first_seq: r.first_seq,
            created_at: r.created_at,
            finished_at: r.finished_at,
            traceparent: r.traceparent,
            parked_until: r.parked_until,
            waited: std::time::Duration::from_millis(u64::try_from(r.waited_ms).unwrap_or(0)),
            cancel_requested: r.cancel_requested,
            parent_turn_id: r.parent_turn_id.as_deref().map(parse_uuid).transpose()?,
        })
    }
}

impl TryFrom<rows::MessageRow> for MessageRecord {
    type Error = StoreError;
    fn try_from(r: rows::MessageRow) -> Result<Self> {
        Ok(Self {
            id: r.id,
            message_id: r.message_id.as_deref().map(parse_uuid).transpose()?,
            turn_id: parse_uuid(&r.turn_id)?,
            role: r.role,
            content: r.content,
            created_at: r.created_at,
            attachments: r.attachments,
        })
    }
}

impl TryFrom<rows::DecisionRow> for DecisionRecord {
    type Error = StoreError;
    fn try_from(r: rows::DecisionRow) -> Result<Self> {
        Ok(Self {
            record: serde_json::from_str(&r.record)
                .map_err(|e| StoreError::Corrupt(format!("decision {}: {e}", r.id)))?,
            id: r.id,
            turn_id: r.turn_id,
            decision_key: r.decision_key,
            strategy: r.strategy,
            created_at: r.created_at,
        })
    }
}

impl TryFrom<rows::SessionRow> for SessionRecord {
    type Error = StoreError;
    fn try_from(r: rows::SessionRow) -> Result<Self> {
        Ok(Self {
            id: r.id,
            created_at: r.created_at,
            updated_at: r.updated_at,
            turn_count: r.turn_count,
            last_seq: r.last_seq,
            running_turn_id: r.running_turn_id.as_deref().map(parse_uuid).transpose()?,
            cost_usd: r.cost_usd,
            branched: r.branched,
            forked_from: r
                .forked_from
                .as_deref()
                .map(|key| client_session_id(key).to_owned()),
            forked_at: r.forked_at.as_deref().map(parse_uuid).transpose()?,
        })
    }
}
