//! The one vocabulary of a turn: [`TurnEvent`], and the envelope every
//! persisted and streamed event travels in, [`StoredEvent`].
//!
//! A turn produces `TurnEvent`s; the event log stores them and the live
//! fan-out and the SSE encoders consume them. The envelope's JSON is computed
//! once, when the event is emitted, so a replay from the log is byte-for-byte
//! what a live subscriber saw.

use chrono::{DateTime, SecondsFormat, SubsecRound, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::turn::{TurnResult, WebCitation};

/// The `turn_id` of an event that is the session's own, not a turn's (a
/// judgement): the nil UUID, which no turn has. A turn's readers (its
/// stream, `GET …/turns/{turn_id}/events`, a take-over) never see such an
/// event; the session's log and its export do, and the export format names
/// this id as the session's.
pub const SESSION_TURN: Uuid = Uuid::nil();

/// Whether an event of `event_type` is one the session owns (its
/// `turn_id` is [`SESSION_TURN`]).
pub fn is_session_type(event_type: &str) -> bool {
    event_type == "judgement"
}

/// How a tool call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ToolStatus {
    Completed,
    Failed,
    TimedOut,
    /// Refused by a gate (the event's `reason` says which).
    Denied,
    /// The call started in a process that died before it ended: whether
    /// it took effect is not known, and a call that may change something
    /// is not run again blindly (the model is told so).
    Unknown,
}

impl ToolStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::TimedOut => "timed_out",
            Self::Denied => "denied",
            Self::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for ToolStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything that happens in a turn, tagged by `type` on the wire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type")]
pub enum TurnEvent {
    /// The turn was accepted; the user message it answers.
    #[serde(rename = "turn.started")]
    TurnStarted {
        message: String,
        provider: String,
        model: String,
        /// What the turn will do otherwise than the request asked, said
        /// at once (e.g. `web_mode: on` without a search service); absent
        /// when nothing is.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        warnings: Vec<String>,
    },
    /// The prompt was rendered (only when the harness has a `prompt_id`).
    #[serde(rename = "prompt.rendered")]
    PromptRendered {
        prompt_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        prompt_version: Option<String>,
        render_hash: String,
        context_hash: String,
    },
    /// The turn goes on in another process (`owner`, its `attempt`-th
    /// take-over) from the step after `from_step`: the one that ran it
    /// died or shut down. Text of a step streamed before it and not
    /// finished is retracted first (`message.retracted`).
    #[serde(rename = "turn.resumed")]
    TurnResumed {
        owner: String,
        attempt: u32,
        from_step: u32,
    },
    /// A piece of the assistant's text, in order.
    #[serde(rename = "message.delta")]
    MessageDelta { step: u32, text: String },
    /// A piece of the model's reasoning in this step, in order (shown
    /// unless `HARNESS_REASONING=hidden`).
    #[serde(rename = "reasoning.delta")]
    ReasoningDelta { step: u32, text: String },
    /// The step's reasoning is over: about how many tokens it took (the
    /// provider's count when it gives one, else its text's length / 4).
    #[serde(rename = "reasoning.completed")]
    ReasoningCompleted { step: u32, tokens: u64 },
    /// The text of this step streamed so far is void: the provider failed
    /// mid-stream and the step starts over (a retry or the next provider).
    /// Discard every `message.delta` of `step` received before this event.
    #[serde(rename = "message.retracted")]
    MessageRetracted { step: u32, reason: String },
    /// Token counts of one provider call (`step` set), or of the whole
    /// turn (`step` absent, emitted by the finalizer when non-zero).
    #[serde(rename = "usage")]
    Usage {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step: Option<u32>,
        input_tokens: u64,
        output_tokens: u64,
        cache_read_tokens: u64,
        cache_creation_tokens: u64,
        /// Output tokens spent on reasoning (among `output_tokens`).
        #[serde(default)]
        reasoning_tokens: u64,
        /// USD, when the model is priced.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cost_usd: Option<f64>,
    },
    /// A tool call passed to the gates; `wave` numbers the waves of a step.
    #[serde(rename = "tool.started")]
    ToolStarted {
        step: u32,
        wave: u32,
        call_id: String,
        tool: String,
        #[schema(value_type = Object)]
        arguments: serde_json::Value,
        /// The call starts again with the arguments a person's approval
        /// edited (after its `approval.resolved`, `wave` 0): these run,
        /// not the ones its first `tool.started` showed.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        edited: bool,
    },
    /// A call of a tool the client runs itself: the turn waits for its
    /// result, posted to `POST
    /// /sessions/{session_id}/turns/{turn_id}/tool-results/{call_id}`
    /// (`tool` is the client's name for it, without `client__`), until
    /// `expires_at` (`HARNESS_APPROVAL_TIMEOUT` after it was asked); then
    /// the call ends `timed_out`.
    #[serde(rename = "tool.requested")]
    ToolRequested {
        step: u32,
        call_id: String,
        tool: String,
        #[schema(value_type = Object)]
        arguments: serde_json::Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expires_at: Option<chrono::DateTime<chrono::Utc>>,
    },
    /// A tool call ended: `completed`, `failed`, `timed_out` or `denied`
    /// (with `reason`: `duplicate`, `blocked`, `pre_hook`, `validation`, `budget`).
    #[serde(rename = "tool.finished")]
    ToolFinished {
        step: u32,
        call_id: String,
        tool: String,
        status: ToolStatus,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        /// What a completed call returned: its first 2,000 characters.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output: Option<String>,
        /// The whole output of a longer one, at `GET
        /// /sessions/{session_id}/artifacts/{artifact_id}`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        artifact_id: Option<String>,
        latency_ms: u64,
    },
    /// A tool call waits for a person: `POST
    /// /sessions/{session_id}/turns/{turn_id}/approvals/{call_id}` decides,
    /// until `expires_at` (`HARNESS_APPROVAL_TIMEOUT` after it was asked);
    /// then it resolves `timed_out`.
    #[serde(rename = "approval.requested")]
    ApprovalRequested {
        step: u32,
        call_id: String,
        tool: String,
        #[schema(value_type = Object)]
        arguments: serde_json::Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expires_at: Option<chrono::DateTime<chrono::Utc>>,
    },
    /// The decision on a call that waited: `approved`, `denied`,
    /// `timed_out` (its `expires_at` came first) or `cancelled`.
    #[serde(rename = "approval.resolved")]
    ApprovalResolved {
        call_id: String,
        outcome: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// Approved with these arguments instead of the asked ones (the
        /// person's edit, checked against the tool's schema).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(value_type = Option<Object>)]
        edited_arguments: Option<serde_json::Value>,
    },
    /// A message was steered into the running turn (`POST …/steer`, or
    /// `multitask: "steer"`): kept, to be applied at the turn's next step
    /// boundary, or to become the session's next turn if this one ends
    /// first.
    #[serde(rename = "steer.accepted")]
    SteerAccepted { steer_id: String },
    /// A steered message is in the conversation from this step on: the
    /// step's provider request carries it as a user message after the
    /// last tool results.
    #[serde(rename = "steer.applied")]
    SteerApplied { steer_id: String, step: u32 },
    /// A message steered into `steered_turn_id`, which ended before it
    /// took another step: this turn (the event's own) answers it.
    #[serde(rename = "steer.deferred")]
    SteerDeferred {
        steer_id: String,
        steered_turn_id: String,
    },
    /// The tenant has used more than 80% of its tokens of the UTC day
    /// (`HARNESS_TENANT_TOKENS_PER_DAY`): a turn that would start past all
    /// of them is refused (429 `quota_exceeded`).
    #[serde(rename = "quota.warning")]
    QuotaWarning {
        tokens_today: u64,
        tokens_per_day: u64,
    },
    /// A timed-out tool finished while the turn was still running; its
    /// result was discarded.
    #[serde(rename = "tool.late")]
    ToolLate {
        call_id: String,
        tool: String,
        latency_ms: u64,
    },
    /// A reflection step; `stub` when it could not run (budget, deadline, error).
    #[serde(rename = "reflection")]
    Reflection {
        step: u32,
        text: String,
        stub: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// Older messages were summarised, or the images and PDFs of older
    /// messages left out (oldest first, before any text), to fit the
    /// context window.
    #[serde(rename = "context.compacted")]
    ContextCompacted {
        step: u32,
        removed_messages: u32,
        /// Images and PDFs of earlier messages no longer sent.
        #[serde(default)]
        removed_attachments: u32,
        tokens_before: u64,
        tokens_after: u64,
    },
    /// The sources the answer cites.
    #[serde(rename = "citations")]
    Citations {
        local: Vec<String>,
        web: Vec<WebCitation>,
    },
    /// The turn's decision record (`support.chat.turn`).
    #[serde(rename = "decision")]
    Decision {
        decision_key: String,
        strategy: String,
        #[schema(value_type = crate::turn::DecisionDetails)]
        record: serde_json::Value,
    },
    /// A judge scored a turn, after it ended. This event is the session's,
    /// not a turn's: its `turn_id` is [`SESSION_TURN`] (the nil UUID), and
    /// the turn judged is `judged_turn_id` (so a turn's stream ends at its
    /// terminal event, as always).
    #[serde(rename = "judgement")]
    Judgement {
        judgement_id: String,
        judged_turn_id: String,
        judge: String,
        /// 0 to 1.
        score: f64,
        passed: bool,
        rationale: String,
    },
    /// Terminal: the turn ended with an answer; its messages, result and
    /// decision were committed in the same transaction as this event.
    #[serde(rename = "turn.completed")]
    TurnCompleted { result: TurnResult },
    /// Terminal: the turn failed; `code` is stable, `message` is for humans.
    #[serde(rename = "turn.failed")]
    TurnFailed {
        code: String,
        message: String,
        /// The first and last seq of the turn's events that the log could
        /// not keep (`event_log_unavailable` only): no stream ever showed
        /// them, and the log has nothing at those seqs.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lost_seqs: Option<[i64; 2]>,
    },
    /// Terminal: `POST .../cancel` stopped the turn.
    #[serde(rename = "turn.cancelled")]
    TurnCancelled { reason: String },
    /// Terminal: the process running the turn shut down or died.
    #[serde(rename = "turn.interrupted")]
    TurnInterrupted { reason: String },
}

impl TurnEvent {
    /// The id of the call the event is about, if it is about one.
    pub fn call_id(&self) -> Option<&str> {
        match self {
            Self::ToolStarted { call_id, .. }
            | Self::ToolRequested { call_id, .. }
            | Self::ToolFinished { call_id, .. }
            | Self::ApprovalRequested { call_id, .. }
            | Self::ApprovalResolved { call_id, .. }
            | Self::ToolLate { call_id, .. } => Some(call_id),
            _ => None,
        }
    }

    /// The wire name of the event (the `type` tag and the SSE `event:` field).
    pub fn event_type(&self) -> &'static str {
        match self {
            Self::TurnStarted { .. } => "turn.started",
            Self::PromptRendered { .. } => "prompt.rendered",
            Self::TurnResumed { .. } => "turn.resumed",
            Self::MessageDelta { .. } => "message.delta",
            Self::MessageRetracted { .. } => "message.retracted",
            Self::ReasoningDelta { .. } => "reasoning.delta",
            Self::ReasoningCompleted { .. } => "reasoning.completed",
            Self::Usage { .. } => "usage",
            Self::ToolStarted { .. } => "tool.started",
            Self::ToolRequested { .. } => "tool.requested",
            Self::ToolFinished { .. } => "tool.finished",
            Self::ToolLate { .. } => "tool.late",
            Self::QuotaWarning { .. } => "quota.warning",
            Self::SteerAccepted { .. } => "steer.accepted",
            Self::SteerApplied { .. } => "steer.applied",
            Self::SteerDeferred { .. } => "steer.deferred",
            Self::ApprovalRequested { .. } => "approval.requested",
            Self::ApprovalResolved { .. } => "approval.resolved",
            Self::Reflection { .. } => "reflection",
            Self::ContextCompacted { .. } => "context.compacted",
            Self::Citations { .. } => "citations",
            Self::Decision { .. } => "decision",
            Self::Judgement { .. } => "judgement",
            Self::TurnCompleted { .. } => "turn.completed",
            Self::TurnFailed { .. } => "turn.failed",
            Self::TurnCancelled { .. } => "turn.cancelled",
            Self::TurnInterrupted { .. } => "turn.interrupted",
        }
    }

    /// Whether this event ends its turn's stream.
    pub fn is_terminal(&self) -> bool {
        is_terminal_type(self.event_type())
    }
}

/// Whether an event type ends its turn's stream.
pub fn is_terminal_type(event_type: &str) -> bool {
    matches!(
        event_type,
        "turn.completed" | "turn.failed" | "turn.cancelled" | "turn.interrupted"
    )
}

/// One event as it is stored in the event log and sent to subscribers.
///
/// `payload` is the serialized [`TurnEvent`] (a JSON object with `type`);
/// the envelope fields live beside it so that neither path reserializes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    pub session_id: String,
    pub seq: i64,
    pub turn_id: Uuid,
    pub event_type: String,
    pub payload: String,
    pub created_at: DateTime<Utc>,
    /// The event itself beside its JSON (see [`StoredEvent::event`]).
    pub(crate) parsed: Parsed,
}

/// A [`StoredEvent`]'s typed event: set when the event was made in this
/// process, parsed from the payload at most once when it was read from the
/// log. Not part of the event's identity (a replayed event equals the live
/// one).
#[derive(Debug, Clone, Default)]
pub(crate) struct Parsed(std::sync::OnceLock<Option<TurnEvent>>);

impl PartialEq for Parsed {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Parsed {}

impl StoredEvent {
    /// Builds the stored form of `event`. The timestamp is cut to
    /// microseconds, the precision both databases keep, so that a replayed
    /// event equals the live one.
    pub fn new(
        session_id: &str,
        turn_id: Uuid,
        seq: i64,
        event: &TurnEvent,
        created_at: DateTime<Utc>,
    ) -> Result<Self, serde_json::Error> {
        Ok(Self {
            session_id: session_id.to_owned(),
            seq,
            turn_id,
            event_type: event.event_type().to_owned(),
            payload: serde_json::to_string(event)?,
            created_at: created_at.trunc_subsecs(6),
            parsed: Parsed::default(),
        })
    }

    /// An event as the log holds it: its payload is parsed when it is
    /// first asked for ([`StoredEvent::event`]).
    pub fn read(
        session_id: String,
        seq: i64,
        turn_id: Uuid,
        (event_type, payload): (String, String),
        created_at: DateTime<Utc>,
    ) -> Self {
        Self {
            session_id,
            seq,
            turn_id,
            event_type,
            payload,
            created_at,
            parsed: Parsed::default(),
        }
    }

    /// [`StoredEvent::new`], keeping `event` itself beside its JSON, so
    /// that the wire formats read it without parsing the JSON back.
    pub fn from_event(
        session_id: &str,
        turn_id: Uuid,
        seq: i64,
        event: TurnEvent,
        created_at: DateTime<Utc>,
    ) -> Result<Self, serde_json::Error> {
        let stored = Self::new(session_id, turn_id, seq, &event, created_at)?;
        let _ = stored.parsed.0.set(Some(event));
        Ok(stored)
    }

    /// The event, typed: the one it was made from, else its payload parsed
    /// (once). `None`: the payload is not an event this build knows (one
    /// written by a newer version, say).
    pub fn event(&self) -> Option<&TurnEvent> {
        self.parsed
            .0
            .get_or_init(|| serde_json::from_str(&self.payload).ok())
            .as_ref()
    }

    pub fn is_terminal(&self) -> bool {
        is_terminal_type(&self.event_type)
    }

    /// The JSON of the envelope: `seq`, `session_id`, `turn_id`, `created_at`
    /// and then the event's own fields (including `type`), in one object.
    pub fn envelope_json(&self) -> String {
        let mut out = String::with_capacity(self.envelope_len_hint());
        self.write_envelope(&mut out);
        out
    }

    /// About how long [`Self::envelope_json`] is, to size a buffer.
    pub fn envelope_len_hint(&self) -> usize {
        self.payload.len() + self.session_id.len() + 128
    }

    /// Appends [`Self::envelope_json`] to `out`, without building it apart.
    pub fn write_envelope(&self, out: &mut String) {
        use std::fmt::Write as _;
        // The payload is always a non-empty JSON object (serde's internally
        // tagged enum), so splicing after its `{` yields one valid object.
        let body = self.payload.strip_prefix('{').unwrap_or("}");
        // Writing to a String cannot fail.
        let _ = write!(out, "{{\"seq\":{},\"session_id\":", self.seq);
        push_json_string(out, crate::ids::client_session_id(&self.session_id));
        let _ = write!(
            out,
            ",\"turn_id\":\"{}\",\"created_at\":\"{}\",",
            self.turn_id,
            self.created_at.to_rfc3339_opts(SecondsFormat::Micros, true)
        );
        out.push_str(body);
    }
}

/// Appends `text` as a JSON string.
fn push_json_string(out: &mut String, text: &str) {
    let plain = text.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\');
    if plain {
        out.push('"');
        out.push_str(text);
        out.push('"');
    } else {
        out.push_str(&serde_json::Value::String(text.to_owned()).to_string());
    }
}

/// The envelope as documented in the OpenAPI description (the SSE `data:`
/// and the items of `GET /sessions/{id}/events`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EventEnvelope {
    /// Monotonic per session; also the SSE `id:`.
    pub seq: i64,
    pub session_id: String,
    pub turn_id: Uuid,
    pub created_at: DateTime<Utc>,
    #[serde(flatten)]
    pub event: TurnEvent,
}

#[cfg(test)]
mod tests;
