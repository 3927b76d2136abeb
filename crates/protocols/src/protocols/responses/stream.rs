//! A response as its turn's log makes it: its id (the turn's, and where
//! in the turn it starts), the fold fed from the log, the `response`
//! object as the log holds it, and its stream.

use std::sync::Arc;

use axum::{body::Bytes, response::Response};
use futures::{Stream, StreamExt};
use uuid::Uuid;

use super::{
    fold::{Head, ResponseFold},
    request,
    wire::{Numbered, ResponseObject},
};
use crate::{
    events::{StoredEvent, TurnEvent},
    ids::{SessionKey, Tenant},
    protocols::Shared,
    protocols::{
        Encoded, WireFormat,
        client_calls::{Seen, Segment},
        endpoint::name_turn,
        error::ApiError,
        stream_for, typed,
    },
    service::{StoreError, TurnRecord, TurnStatus},
    turn::TurnRequest,
};

/// The id of the response of `turn_id`.
pub(super) fn response_id(turn_id: Uuid) -> String {
    format!("resp_{}", turn_id.simple())
}

/// The id of the response of `turn_id` that goes on after the call the
/// client answered at seq `after` (0: the turn's first response).
pub(super) fn segment_id(turn_id: Uuid, after: i64) -> String {
    if after == 0 {
        response_id(turn_id)
    } else {
        format!("resp_{}_{after}", turn_id.simple())
    }
}

/// The turn of a response id and where its segment starts; `None`: not
/// one of ours.
pub(super) fn turn_of(response_id: &str) -> Option<(Uuid, i64)> {
    let id = response_id.strip_prefix("resp_")?;
    let (hex, after) = match id.split_once('_') {
        Some((hex, after)) => (hex, after.parse().ok().filter(|n: &i64| *n > 0)?),
        None => (id, 0),
    };
    (hex.len() == 32)
        .then(|| Uuid::try_parse(hex).ok().map(|turn| (turn, after)))
        .flatten()
}

/// The caller's turn a response id names and where the response starts in
/// it, or 404 `response_not_found` (another tenant's is answered as one
/// that does not exist).
pub(super) async fn find(
    app: &Shared,
    tenant: &Tenant,
    id: &str,
) -> Result<(TurnRecord, i64), ApiError> {
    let (turn_id, after) = turn_of(id).ok_or(ApiError::ResponseNotFound)?;
    let record = app
        .turns
        .find_turn(turn_id)
        .await?
        .ok_or(ApiError::ResponseNotFound)?;
    if record.session_id.clone().tenant() != tenant.0 {
        return Err(ApiError::ResponseNotFound);
    }
    Ok((record, after))
}

/// The fields of a response that come from what its turn was asked.
pub(super) fn head(turn_id: Uuid, session: &SessionKey, asked: &TurnRequest) -> Head {
    Head {
        id: response_id(turn_id),
        created_at: 0,
        model: String::new(),
        conversation: session.id().to_owned(),
        instructions: asked.skill_context.clone(),
        metadata: crate::protocols::jsonrpc::to_value(&asked.metadata),
        max_output_tokens: asked.max_output_tokens,
        previous_response_id: asked.follows.map(response_id),
        background: asked.background,
        effort: asked.think_level.map(request::effort_name),
        user: asked.user_id.clone(),
        tools: request::shown_tools(asked),
    }
}

/// The fold of one response of a turn fed with the turn's stored events:
/// it learns which model the turn asked from `turn.started`, and begins
/// with the response's first event.
pub(super) struct Folding {
    pub(super) fold: ResponseFold,
    turn_id: Uuid,
    segment: Segment,
    model: Option<String>,
    started: bool,
}

impl Folding {
    /// The response of `turn_id` that starts after seq `after`.
    pub(super) fn new(mut head: Head, turn_id: Uuid, after: i64) -> Self {
        head.id = segment_id(turn_id, after);
        Self {
            fold: ResponseFold::new(head),
            turn_id,
            segment: Segment::after(after),
            model: None,
            started: false,
        }
    }

    /// The stream events `stored` adds (the response's first ones with
    /// its first event).
    pub(super) fn feed(&mut self, stored: &StoredEvent) -> Vec<Numbered> {
        if let Some(TurnEvent::TurnStarted { model, .. }) = typed(stored) {
            self.model = Some(model.clone());
        }
        let seen = self.segment.see(stored);
        if matches!(seen, Seen::Hidden) {
            if let Some(TurnEvent::ToolStarted {
                call_id,
                tool,
                arguments,
                edited: false,
                ..
            }) = typed(stored)
                && stored.seq <= self.segment.start()
            {
                self.fold.began_earlier(call_id, tool, arguments);
            }
            return Vec::new();
        }
        let mut out = Vec::new();
        if !self.started {
            self.started = true;
            self.fold
                .begin(stored.created_at.timestamp(), self.model.as_deref());
            if self.segment.start() > 0 {
                let previous = self.segment.previous_start().unwrap_or(0);
                self.fold.follows(Some(segment_id(self.turn_id, previous)));
            }
            out = self.fold.start();
        }
        match seen {
            Seen::Shown(event) => out.extend(self.fold.event(event)),
            Seen::Asked {
                call_id,
                tool,
                arguments,
            } => out.extend(self.fold.function_call(call_id, tool, arguments)),
            Seen::Approval {
                call_id,
                tool,
                arguments,
            } => out.extend(self.fold.approval_request(call_id, tool, arguments)),
            Seen::Hidden => {}
        }
        out
    }

    /// The response once it ends (the turn's end, or a call of the
    /// client's), folded from `events`.
    pub(super) async fn until_ended(
        mut self,
        events: impl Stream<Item = Result<Arc<StoredEvent>, StoreError>>,
    ) -> Result<ResponseObject, ApiError> {
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            self.feed(&*event?);
            if self.fold.ended() {
                return Ok(self.fold.response());
            }
        }
        Err(ApiError::ShuttingDown)
    }
}

/// The Responses stream of one turn: each stream event as `event:` and
/// `data:` lines; those numbered up to `after` are left out (a resume).
struct ResponseStream {
    folding: Folding,
    after: Option<u64>,
}

impl ResponseStream {
    fn frames(&self, events: Vec<Numbered>) -> Vec<Bytes> {
        events
            .into_iter()
            .filter(|e| self.after.is_none_or(|after| e.sequence_number > after))
            .map(|e| {
                let mut frame = format!("event: {}\n", e.event.kind()).into_bytes();
                frame.extend_from_slice(&crate::protocols::data_frame(&e));
                Bytes::from(frame)
            })
            .collect()
    }
}

impl WireFormat for ResponseStream {
    fn encode(&mut self, event: &StoredEvent) -> Encoded {
        let events = self.folding.feed(event);
        Encoded {
            frames: self.frames(events),
            done: self.folding.fold.ended(),
        }
    }

    fn unreadable(&mut self) -> Vec<Bytes> {
        let error = self.folding.fold.error_event(
            crate::protocols::native::stream::UNREADABLE_LOG_CODE,
            "the event log cannot be read; resume with starting_after",
        );
        self.frames(vec![error])
    }
}

/// The response of a turn that starts after seq `after`, folded from what
/// its log holds now.
pub(super) async fn folded(
    app: &Shared,
    record: &TurnRecord,
    after: i64,
) -> Result<ResponseObject, ApiError> {
    let head = head(record.id, &record.session_id, &record.request);
    let mut folding = Folding::new(head, record.id, after);
    app.turns
        .read_turn(record, |event| {
            folding.feed(event);
            folding.fold.ended()
        })
        .await?;
    let mut response = folding.fold.response();
    if !folding.fold.ended() && record.status != TurnStatus::Running {
        // Ended without its terminal event in the log (an old interrupt).
        response.status = if record.status == TurnStatus::Cancelled {
            "cancelled"
        } else {
            "failed"
        };
    }
    Ok(response)
}

pub(super) fn streamed(
    app: &Shared,
    folding: Folding,
    after: Option<u64>,
    session: &SessionKey,
    turn_id: Uuid,
    events: impl Stream<Item = Result<Arc<StoredEvent>, StoreError>> + Send + 'static,
) -> Response {
    let format = ResponseStream { folding, after };
    name_turn(stream_for(app, format, events), Some(session), turn_id)
}
