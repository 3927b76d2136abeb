//! What the store keeps beside turns: memories, the background jobs that
//! make them (and judge turns), judgements and the research learner's
//! observations.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Most memories kept per scope; past it the least recently updated go.
pub const MEMORIES_PER_SCOPE: i64 = 1000;

/// A fact or a preference to keep (it replaces the one with its key).
#[derive(Debug, Clone, PartialEq)]
pub struct NewMemory {
    pub id: String,
    /// `user:{id}` or `session:{id}`.
    pub scope: String,
    /// `fact` or `preference`.
    pub kind: String,
    /// What it is about, normalised: one memory per key and scope.
    pub key: String,
    pub content: String,
    pub source_session_id: String,
    pub source_turn_id: String,
    pub embedding: Option<Vec<f32>>,
    pub embedding_model: Option<String>,
    pub at: DateTime<Utc>,
}

/// A memory as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct MemoryRecord {
    pub id: String,
    #[serde(serialize_with = "crate::ids::as_client_id")]
    pub scope: String,
    /// `fact` or `preference`.
    pub kind: String,
    pub key: String,
    pub content: String,
    #[serde(serialize_with = "crate::ids::as_client_id")]
    pub source_session_id: String,
    pub source_turn_id: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A job to run after a turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewJob {
    pub id: String,
    /// `memory_extraction` or `judge`.
    pub kind: String,
    pub session_id: String,
    pub turn_id: String,
    /// What the job needs, as JSON.
    pub payload: String,
    pub at: DateTime<Utc>,
}

/// A job claimed to run.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct JobRecord {
    pub id: String,
    pub kind: String,
    pub session_id: String,
    pub turn_id: String,
    pub payload: String,
    /// Tries so far, this one included.
    pub attempts: i64,
}

/// How a job run ended.
#[derive(Debug, Clone, PartialEq)]
pub enum JobOutcome {
    Done,
    /// Try again at `after`.
    Retry {
        error: String,
        after: DateTime<Utc>,
    },
    /// Given up.
    Failed {
        error: String,
    },
}

/// The jobs waiting to run: how many, and since when the oldest.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct JobBacklog {
    pub pending: u64,
    pub oldest: Option<DateTime<Utc>>,
}

/// The model usage one run of a job took (paid for, whether the run
/// succeeded or not); a job's totals are the sum of its runs'.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct JobUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// `None`: the model has no price (nothing is added).
    pub cost_usd: Option<f64>,
}

/// A job as listed (for an operator, and the tests).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct JobSummary {
    pub id: String,
    pub kind: String,
    pub turn_id: String,
    /// `pending`, `running`, `done` or `failed`.
    pub status: String,
    pub attempts: i64,
    pub last_error: Option<String>,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cost_usd: Option<f64>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A judge's score of a turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct JudgementRecord {
    pub id: String,
    #[serde(serialize_with = "crate::ids::as_client_id")]
    pub session_id: String,
    pub turn_id: String,
    pub judge: String,
    pub prompt_id: String,
    pub prompt_version: String,
    /// 0 to 1.
    pub score: f64,
    /// Whether the score reaches the judge's threshold.
    pub passed: bool,
    pub rationale: String,
    pub provider: String,
    pub model: String,
    pub created_at: DateTime<Utc>,
}

/// A research learner's observation of a turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct ObservationRecord {
    pub id: String,
    #[serde(serialize_with = "crate::ids::as_client_id")]
    pub session_id: String,
    /// `chat_message:{assistant message id}`: the stored answer.
    pub source_id: String,
    pub user_text: String,
    pub assistant_text: String,
    pub created_at: DateTime<Utc>,
}
