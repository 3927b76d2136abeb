//! Calls of the tools a client runs itself, as the protocols carry them.
//!
//! A turn that calls a client's tool says `tool.requested` and waits for
//! the result. The native API posts it to
//! `/sessions/{id}/turns/{turn_id}/tool-results/{call_id}`; the Responses
//! API, AG-UI and the AI SDK end their answer at the call (a
//! `function_call` item, `TOOL_CALL_*` events, `tool-input-available`) and
//! send the result in their next request, whose answer goes on with the
//! same turn after the call: a [`Segment`] of its stream.

use std::collections::HashMap;

use axum::{body::Bytes, http::HeaderMap, http::HeaderValue};
use serde_json::Value;
use uuid::Uuid;

use super::{
    Encoded, WireFormat,
    approvals::{ApprovalState, ClientDecision, approvals, decide},
    data_frame, typed,
};
use crate::{
    events::{StoredEvent, TurnEvent},
    protocols::{Shared, error::ApiError},
    service::{NewToolResult, TurnRecord, TurnStatus},
    turn::CLIENT_TOOL_PREFIX,
};

/// The client's result of one call.
#[derive(Debug, Clone)]
pub struct ClientAnswer {
    pub call_id: String,
    pub output: String,
    pub is_error: bool,
}

impl ClientAnswer {
    /// A result given as text.
    pub fn text(call_id: &str, output: String, is_error: bool) -> Self {
        Self {
            call_id: call_id.to_owned(),
            output,
            is_error,
        }
    }

    /// A result given as any JSON: a string as it is, anything else as
    /// its JSON text.
    pub fn of(call_id: &str, output: &Value, is_error: bool) -> Self {
        let output = match output {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        };
        Self::text(call_id, output, is_error)
    }
}

/// What [`answer_calls`] recorded.
#[derive(Debug)]
pub struct Answered {
    /// The seq of the latest `tool.requested` answered: the turn's stream
    /// goes on after it.
    pub after: i64,
    /// Whether every result is new (false: one was posted before, and
    /// the first stands).
    pub all_new: bool,
}

/// The client tool calls `turn` asked for, each with the seq of its
/// first `tool.requested`.
async fn requested(app: &Shared, turn: &TurnRecord) -> Result<HashMap<String, i64>, ApiError> {
    let mut asked = HashMap::new();
    app.turns
        .read_turn(turn, |stored| {
            if let Some(TurnEvent::ToolRequested { call_id, .. }) = typed(stored) {
                asked.entry(call_id.clone()).or_insert(stored.seq);
            }
            false
        })
        .await?;
    Ok(asked)
}

/// Records the client's results for calls `turn` asked for (a call it did
/// not ask for: `call_not_found`; an ended turn: `turn_not_running`) and
/// wakes the turn.
pub async fn answer_calls(
    app: &Shared,
    turn: &TurnRecord,
    answers: &[ClientAnswer],
) -> Result<Answered, ApiError> {
    if turn.status != TurnStatus::Running {
        return Err(ApiError::TurnNotRunning {
            turn_id: turn.id,
            status: turn.status,
        });
    }
    if answers.iter().any(|a| a.output.contains('\0')) {
        return Err(ApiError::InvalidField {
            field: "output".into(),
            detail: "a tool's output contains U+0000, which is not accepted".into(),
        });
    }
    let asked = requested(app, turn).await?;
    let mut after = 0;
    for answer in answers {
        let seq = asked
            .get(&answer.call_id)
            .copied()
            .ok_or(ApiError::CallNotFound)?;
        after = after.max(seq);
    }
    let mut all_new = true;
    for answer in answers {
        all_new &= app
            .turns
            .post_tool_result(&NewToolResult {
                session_id: turn.session_id.clone(),
                turn_id: turn.id,
                call_id: answer.call_id.clone(),
                output: answer.output.clone(),
                is_error: answer.is_error,
            })
            .await?;
    }
    app.turns.answered(turn.id).await;
    Ok(Answered { after, all_new })
}

/// What the next request of a protocol brings for its session's waiting
/// turn: results of calls of the client's tools, and decisions on calls
/// that wait for a person.
#[derive(Debug, Default)]
pub struct Replies {
    pub answers: Vec<ClientAnswer>,
    pub decisions: Vec<ClientDecision>,
}

impl Replies {
    pub fn is_empty(&self) -> bool {
        self.answers.is_empty() && self.decisions.is_empty()
    }
}

/// The results and decisions among `replies` for calls the running turn
/// of `session` waits for, recorded (the others, such as earlier calls of
/// the conversation a client sends back whole, are left out); the turn
/// and where its stream goes on. None of them: `call_not_found`.
pub async fn answer_waiting(
    app: &Shared,
    session: &crate::ids::SessionKey,
    replies: Replies,
) -> Result<(TurnRecord, Answered), ApiError> {
    let running = app
        .turns
        .get_session(session)
        .await?
        .and_then(|s| s.running_turn_id)
        .ok_or(ApiError::CallNotFound)?;
    let turn = app
        .turns
        .get_turn(session, running)
        .await?
        .ok_or(ApiError::CallNotFound)?;
    let asked = requested(app, &turn).await?;
    let waiting = approvals(app, &turn).await?;
    let replies = Replies {
        answers: replies
            .answers
            .into_iter()
            .filter(|a| asked.contains_key(&a.call_id))
            .collect(),
        decisions: replies
            .decisions
            .into_iter()
            .filter(|d| {
                waiting
                    .get(&d.call_id)
                    .is_some_and(|(state, _)| *state == ApprovalState::Waiting)
            })
            .collect(),
    };
    if replies.is_empty() {
        return Err(ApiError::CallNotFound);
    }
    let answered = answer_turn(app, &turn, replies).await?;
    Ok((turn, answered))
}

/// Records `replies` for `turn`: each result for a call it asked its
/// client for, each decision for a call that waits for one (else
/// `call_not_found`, or `approval_already_decided`).
pub async fn answer_turn(
    app: &Shared,
    turn: &TurnRecord,
    replies: Replies,
) -> Result<Answered, ApiError> {
    let mut answered = if replies.answers.is_empty() {
        Answered {
            after: 0,
            all_new: true,
        }
    } else {
        answer_calls(app, turn, &replies.answers).await?
    };
    if replies.decisions.is_empty() {
        return Ok(answered);
    }
    let waiting = approvals(app, turn).await?;
    for decision in &replies.decisions {
        let found = waiting.get(&decision.call_id).copied();
        decide(app, turn, found.map(|(state, _)| state), decision).await?;
        if let Some((_, seq)) = found {
            answered.after = answered.after.max(seq);
        }
    }
    Ok(answered)
}

/// Where the stream of `turn` that a client following it now wants starts:
/// after the newest call of the client's that has its result, or the
/// newest approval that was decided (0: none).
pub async fn answered_until(app: &Shared, turn: &TurnRecord) -> Result<i64, ApiError> {
    let mut after = 0;
    for (call_id, (state, seq)) in approvals(app, turn).await? {
        // Decided: resolved in the log, or (the turn not woken yet) in
        // the store.
        let decided = state != ApprovalState::Waiting
            || app.turns.get_approval(turn.id, &call_id).await?.is_some();
        if decided {
            after = after.max(seq);
        }
    }
    for (call_id, seq) in requested(app, turn).await? {
        if seq > after
            && app
                .turns
                .get_tool_result(turn.id, &call_id)
                .await?
                .is_some()
        {
            after = seq;
        }
    }
    Ok(after)
}

/// A tool's name as the client knows it, and whether the client runs it
/// (its registry name has the client prefix).
pub fn client_name(tool: &str) -> (&str, bool) {
    match tool.strip_prefix(CLIENT_TOOL_PREFIX) {
        Some(name) => (name, true),
        None => (tool, false),
    }
}

/// The encoder of a format whose answer ends at a call of the client's
/// tool, as typed events (`Chunk`s, a `data:` line each); [`Segment::encode`]
/// feeds it.
pub trait EndsAtClientCall {
    type Chunk: serde::Serialize;

    /// The events of one of the turn's events; true: the answer ends.
    fn event(&mut self, event: &TurnEvent) -> (Vec<Self::Chunk>, bool);

    /// The events of a call of the client's tool, which end the answer.
    fn client_call(&mut self, call_id: &str, tool: &str, arguments: &Value) -> Vec<Self::Chunk>;

    /// The events of a call that waits for a person's decision, which end
    /// the answer: the next request brings the decision.
    fn approval(&mut self, call_id: &str, tool: &str, arguments: &Value) -> Vec<Self::Chunk>;
}

/// The `data:` events of a format whose answer is one [`Segment`] of a
/// turn, as [`SegmentStream`] sends them.
pub trait SegmentEncoder: EndsAtClientCall + Send + 'static {
    /// Headers beside `x-turn-id`.
    fn headers(&self, _headers: &mut HeaderMap) {}

    /// The events before the first of the turn `turn_id`.
    fn start(&mut self, turn_id: Uuid) -> Vec<Self::Chunk>;

    /// The event that ends a stream whose log cannot be read.
    fn unreadable(&mut self) -> Self::Chunk;

    /// Frames after the last event.
    fn end(&mut self) -> Vec<Bytes> {
        Vec::new()
    }
}

/// One segment of the turn `turn_id`, encoded by `E`: AG-UI's run, the AI
/// SDK's UI message stream.
pub struct SegmentStream<E> {
    turn_id: Uuid,
    segment: Segment,
    encoder: E,
}

impl<E: SegmentEncoder> SegmentStream<E> {
    /// The events after `after` (0: from the turn's start).
    pub fn new(turn_id: Uuid, after: i64, encoder: E) -> Self {
        Self {
            turn_id,
            segment: Segment::after(after),
            encoder,
        }
    }
}

impl<E: SegmentEncoder> WireFormat for SegmentStream<E> {
    fn headers(&self, headers: &mut HeaderMap) {
        self.encoder.headers(headers);
        if let Ok(value) = HeaderValue::from_str(&self.turn_id.to_string()) {
            headers.insert("x-turn-id", value);
        }
    }

    fn start(&mut self) -> Vec<Bytes> {
        let events = self.encoder.start(self.turn_id);
        events.iter().map(data_frame).collect()
    }

    fn encode(&mut self, event: &StoredEvent) -> Encoded {
        self.segment.encode(event, &mut self.encoder)
    }

    fn unreadable(&mut self) -> Vec<Bytes> {
        vec![data_frame(&self.encoder.unreadable())]
    }

    fn end(&mut self) -> Vec<Bytes> {
        self.encoder.end()
    }
}

/// What a [`Segment`] makes of one stored event.
pub enum Seen<'e> {
    /// Left out: before the segment, a call asked again (a take-over), or
    /// the start or end of a call the client runs (the client ran it).
    Hidden,
    Shown(&'e TurnEvent),
    /// A call the client runs: the segment ends with it.
    Asked {
        call_id: &'e str,
        tool: &'e str,
        arguments: &'e Value,
    },
    /// A call that waits for a person: the segment ends with it.
    Approval {
        call_id: &'e str,
        tool: &'e str,
        arguments: &'e Value,
    },
}

/// The part of a turn's stream one answer of a protocol shows: the events
/// after `after` (the call its request answered; 0: from the turn's
/// start) up to the next call the client runs.
#[derive(Debug, Default)]
pub struct Segment {
    after: i64,
    /// The calls asked for so far (bounded by the turn's calls).
    asked: Vec<String>,
    /// The seq of the newest call asked for before `after`.
    previous: Option<i64>,
}

impl Segment {
    pub fn after(after: i64) -> Self {
        Self {
            after,
            ..Self::default()
        }
    }

    /// Where the segment starts (the seq it shows events after).
    pub fn start(&self) -> i64 {
        self.after
    }

    /// Where the segment before this one started: `None` for the turn's
    /// start, known once the events before this one were seen.
    pub fn previous_start(&self) -> Option<i64> {
        self.previous
    }

    /// The frames `encoder` makes of what the segment shows of `stored`.
    pub fn encode(&mut self, stored: &StoredEvent, encoder: &mut impl EndsAtClientCall) -> Encoded {
        let (events, done) = match self.see(stored) {
            Seen::Hidden => return Encoded::default(),
            Seen::Shown(event) => encoder.event(event),
            Seen::Asked {
                call_id,
                tool,
                arguments,
            } => (encoder.client_call(call_id, tool, arguments), true),
            Seen::Approval {
                call_id,
                tool,
                arguments,
            } => (encoder.approval(call_id, tool, arguments), true),
        };
        Encoded {
            frames: events.iter().map(data_frame).collect(),
            done,
        }
    }

    pub fn see<'e>(&mut self, stored: &'e StoredEvent) -> Seen<'e> {
        let Some(event) = typed(stored) else {
            return Seen::Hidden;
        };
        let (asked, approval) = match event {
            TurnEvent::ToolRequested {
                call_id,
                tool,
                arguments,
                ..
            } => ((call_id, tool, arguments), false),
            TurnEvent::ApprovalRequested {
                call_id,
                tool,
                arguments,
                ..
            } => ((call_id, tool, arguments), true),
            _ => return self.shown(stored, event),
        };
        let (call_id, tool, arguments) = asked;
        // A take-over asks again: each is shown once. Approvals apart
        // from results (a client's call may wait for both).
        let key = if approval {
            format!("approval:{call_id}")
        } else {
            call_id.clone()
        };
        if self.asked.contains(&key) {
            return Seen::Hidden;
        }
        self.asked.push(key);
        if stored.seq < self.after {
            self.previous = Some(stored.seq);
        }
        if stored.seq <= self.after {
            Seen::Hidden
        } else if approval {
            Seen::Approval {
                call_id,
                tool,
                arguments,
            }
        } else {
            Seen::Asked {
                call_id,
                tool,
                arguments,
            }
        }
    }

    /// What the segment shows of an event that asks the client nothing.
    fn shown<'e>(&self, stored: &StoredEvent, event: &'e TurnEvent) -> Seen<'e> {
        let client_call = match event {
            TurnEvent::ToolStarted { tool, .. } | TurnEvent::ToolFinished { tool, .. } => {
                tool.starts_with(CLIENT_TOOL_PREFIX)
            }
            _ => false,
        };
        if client_call || stored.seq <= self.after {
            return Seen::Hidden;
        }
        Seen::Shown(event)
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    fn log(events: Vec<TurnEvent>) -> Vec<StoredEvent> {
        let turn = uuid::Uuid::now_v7();
        events
            .into_iter()
            .zip(1..)
            .map(|(event, seq)| {
                StoredEvent::from_event("s", turn, seq, event, chrono::Utc::now()).unwrap()
            })
            .collect()
    }

    fn requested(call_id: &str) -> TurnEvent {
        TurnEvent::ToolRequested {
            step: 1,
            call_id: call_id.into(),
            tool: "get_location".into(),
            arguments: Value::Object(serde_json::Map::new()),
            expires_at: None,
        }
    }

    fn delta(text: &str) -> TurnEvent {
        TurnEvent::MessageDelta {
            step: 2,
            text: text.into(),
        }
    }

    /// What a segment shows of `log`: `text` for a delta, `?id` for a
    /// client's call it ends at, `!id` for an approval it ends at, nothing
    /// for the rest.
    fn shown(segment: &mut Segment, log: &[StoredEvent]) -> Vec<String> {
        log.iter()
            .filter_map(|stored| match segment.see(stored) {
                Seen::Hidden => None,
                Seen::Asked { call_id, .. } => Some(format!("?{call_id}")),
                Seen::Approval { call_id, .. } => Some(format!("!{call_id}")),
                Seen::Shown(TurnEvent::MessageDelta { text, .. }) => Some(text.clone()),
                Seen::Shown(_) => None,
            })
            .collect()
    }

    #[test]
    fn a_segment_shows_what_follows_its_call_and_each_call_once() {
        let started = |call: &str| TurnEvent::ToolStarted {
            step: 1,
            wave: 1,
            call_id: call.into(),
            tool: "client__get_location".into(),
            arguments: Value::Object(serde_json::Map::new()),
            edited: false,
        };
        let log = log(vec![
            delta("Let me look."),
            started("c1"),
            requested("c1"),
            // A take-over asks for the same call again.
            requested("c1"),
            delta("You are in Lyon."),
            requested("c2"),
            delta("And now in Paris."),
        ]);
        // From the turn's start, up to the first call.
        assert_eq!(
            shown(&mut Segment::default(), &log),
            [
                "Let me look.",
                "?c1",
                "You are in Lyon.",
                "?c2",
                "And now in Paris."
            ]
        );
        // After c1 (seq 3): its repeat and its start are not shown again.
        let mut after_c1 = Segment::after(3);
        assert_eq!(
            shown(&mut after_c1, &log),
            ["You are in Lyon.", "?c2", "And now in Paris."]
        );
        assert_eq!(
            after_c1.previous_start(),
            None,
            "the turn's start came before"
        );
        let mut after_c2 = Segment::after(6);
        assert_eq!(shown(&mut after_c2, &log), ["And now in Paris."]);
        assert_eq!(
            after_c2.previous_start(),
            Some(3),
            "c1's answer came before"
        );
    }

    #[test]
    fn a_segment_ends_at_an_approval_and_shows_each_once() {
        let approval = |call: &str| TurnEvent::ApprovalRequested {
            step: 1,
            call_id: call.into(),
            tool: "write_note".into(),
            arguments: Value::Object(serde_json::Map::new()),
            expires_at: None,
        };
        let log = log(vec![
            delta("Let me write."),
            approval("w1"),
            // A take-over asks again.
            approval("w1"),
            delta("Written."),
            requested("c1"),
        ]);
        assert_eq!(
            shown(&mut Segment::default(), &log),
            ["Let me write.", "!w1", "Written.", "?c1"]
        );
        let mut after_w1 = Segment::after(2);
        assert_eq!(shown(&mut after_w1, &log), ["Written.", "?c1"]);
        assert_eq!(after_w1.previous_start(), None);
    }
}
