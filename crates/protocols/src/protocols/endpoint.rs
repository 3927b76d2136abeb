//! What every protocol's turn has in common: the session it names, its
//! start, following it or waiting for its end, the headers that name it,
//! and what an ended turn answers.

use std::sync::Arc;

use axum::{http::HeaderValue, response::Response};
use futures::{StreamExt, stream::BoxStream};
use uuid::Uuid;

use super::{
    WireFormat, client_calls,
    error::ApiError,
    multitask::{self, Multitask},
    parts::{ToolDeclaration, declared_tools},
    paths::parse_session_id,
    stream_for,
};
use crate::{
    events::StoredEvent,
    ids::{SessionKey, Tenant},
    protocols::Shared,
    service::{StartError, StartedTurn},
    service::{StoreError, TurnRecord, TurnStatus},
    turn::{TurnRequest, TurnResult},
};

/// The problem a turn that could not start answers with.
impl From<StartError> for ApiError {
    fn from(e: StartError) -> Self {
        match e {
            StartError::AlreadyRunning(id) => Self::TurnAlreadyRunning(id),
            StartError::IdempotencyMismatch(id) => Self::IdempotencyKeyReused(id),
            StartError::ShuttingDown => Self::ShuttingDown,
            StartError::SessionNotFound => Self::SessionNotFound,
            StartError::ParentNotFound(_) => Self::TurnNotFound,
            StartError::ModelNotAllowed { model, allowed } => {
                Self::ModelNotAllowed { model, allowed }
            }
            StartError::TenantBusy(most) => Self::TenantBusy(most),
            StartError::QuotaExceeded {
                used,
                limit,
                retry_after,
            } => Self::QuotaExceeded {
                used,
                limit,
                retry_after,
            },
            e @ StartError::ClientToolsTooLarge { .. } => Self::InvalidField {
                field: "client_tools".into(),
                detail: format!("{e} (HARNESS_CLIENT_TOOLS_MAX_BYTES)"),
            },
            e @ StartError::HoldsNul(field) => Self::InvalidField {
                field: field.into(),
                detail: e.to_string(),
            },
            StartError::InvalidOutputSchema(detail) => Self::InvalidField {
                field: "output_schema".into(),
                detail,
            },
            StartError::FileNotFound(_) => Self::FileNotFound,
            StartError::Attachment { field, error } => match Self::from(error) {
                Self::InvalidField { detail, .. } => Self::InvalidField { field, detail },
                other => other,
            },
            StartError::InvalidAttachment { field, detail } => Self::InvalidField { field, detail },
            e @ StartError::UnsupportedContent { .. } => Self::UnsupportedContent(e.to_string()),
            StartError::Store(e) => e.into(),
        }
    }
}

/// The session a protocol's request names (`named`, a client's id in
/// the caller's tenant), or a new one (`{prefix}-{uuid}`) when it names
/// none.
pub fn named_session(
    named: Option<&str>,
    prefix: &str,
    tenant: &Tenant,
) -> Result<SessionKey, ApiError> {
    match named {
        Some(id) => parse_session_id(id, tenant),
        None => parse_session_id(&format!("{prefix}-{}", Uuid::now_v7().simple()), tenant),
    }
}

/// A turn a protocol started: its session and id, followed live from its
/// first event ([`Started::events`], [`Started::stream`]) or waited for
/// ([`Started::ended`]).
pub struct Started {
    pub session: SessionKey,
    pub turn_id: Uuid,
    /// The request's idempotency key named a turn that was already there.
    pub replayed: bool,
    turn: StartedTurn,
}

impl Started {
    /// Starts `request` in `session` (with the request's idempotency key,
    /// if any). A refusal is the runner's, for the protocol to answer in
    /// its own shape (`ApiError::from` for the problem+json ones).
    pub async fn start(
        app: &Shared,
        session: SessionKey,
        request: TurnRequest,
        key: Option<String>,
    ) -> Result<Self, StartError> {
        let turn = app.turns.start(&session, request, key).await?;
        Ok(Self::of(session, turn))
    }

    /// A turn the runner started (or found, by its idempotency key).
    pub fn of(session: SessionKey, turn: StartedTurn) -> Self {
        Self {
            session,
            turn_id: turn.turn_id,
            replayed: turn.replayed,
            turn,
        }
    }

    /// The turn's committed events from its start.
    pub fn events(self, app: &Shared) -> TurnEvents {
        let session = self.session.clone();
        match self.turn.live {
            Some(start) => app.turns.subscribe_started(session, start).boxed(),
            None => app
                .turns
                .subscribe(session, self.turn_id, self.turn.first_seq - 1)
                .boxed(),
        }
    }

    /// The turn streamed in `format`, its response naming its session
    /// and turn ([`name_turn`]).
    pub fn stream<F: WireFormat>(self, app: &Shared, format: F) -> Response {
        let (session, turn_id) = (self.session.clone(), self.turn_id);
        let events = self.events(app);
        name_turn(stream_for(app, format, events), Some(&session), turn_id)
    }

    /// The turn once it ended (503 `shutting_down` when the process
    /// stops first).
    pub async fn ended(&self, app: &Shared) -> Result<TurnRecord, ApiError> {
        app.turns
            .wait_for_end(&self.session, self.turn_id)
            .await?
            .ok_or(ApiError::ShuttingDown)
    }
}

/// A turn's events from its first, followed live (from the log where it
/// runs on another replica, or ended): a protocol's re-attach.
pub fn follow(app: &Shared, turn: &TurnRecord) -> TurnEvents {
    app.turns
        .subscribe(turn.session_id.clone(), turn.id, turn.first_seq - 1)
        .boxed()
}

/// A turn's events as a protocol streams or folds them.
pub type TurnEvents = BoxStream<'static, Result<Arc<StoredEvent>, StoreError>>;

/// `response` with the headers that name its turn (`x-turn-id`) and,
/// where the protocol names it, its session (`x-session-id`, the id the
/// client knows).
pub fn name_turn(mut response: Response, session: Option<&SessionKey>, turn_id: Uuid) -> Response {
    let headers = response.headers_mut();
    if let Some(session) = session
        && let Ok(value) = HeaderValue::from_str(session.id())
    {
        headers.insert("x-session-id", value);
    }
    if let Ok(value) = HeaderValue::from_str(&turn_id.to_string()) {
        headers.insert("x-turn-id", value);
    }
    response
}

/// What a turn that ended answers a caller that waited for it: its
/// result when it completed, else the problem of how it ended (502
/// `turn_failed` with its code, 409 `turn_cancelled`, 503
/// `turn_interrupted`).
pub fn completed(record: TurnRecord) -> Result<(TurnRecord, TurnResult), ApiError> {
    let turn_id = record.id;
    match record.status {
        TurnStatus::Completed => {
            let mut record = record;
            let result = record.result.take().unwrap_or_default();
            Ok((record, result))
        }
        TurnStatus::Failed => Err(ApiError::TurnFailed {
            turn_id,
            code: record.error_code.unwrap_or_else(|| "internal".into()),
            message: record
                .error_message
                .unwrap_or_else(|| "the turn failed".into()),
        }),
        TurnStatus::Cancelled => Err(ApiError::TurnCancelled(turn_id)),
        TurnStatus::Interrupted | TurnStatus::Running => Err(ApiError::TurnInterrupted(turn_id)),
    }
}

/// A client's history may carry `system` messages only when the operator
/// allows it (`HARNESS_ALLOW_CLIENT_SYSTEM_MESSAGES`): the model trusts a
/// system message, and a client's text is not to be trusted.
pub(crate) fn refuse_client_system(allowed: bool) -> Result<(), ApiError> {
    if allowed {
        return Ok(());
    }
    Err(ApiError::InvalidHistoryRole(
        "the history holds a `system` (or `developer`) message; the service takes instructions \
         only from its operator (HARNESS_ALLOW_CLIENT_SYSTEM_MESSAGES allows them)"
            .into(),
    ))
}

/// The turn a chat wire format asks for when it sends the whole
/// conversation (`messages` as role and text, at most 1,000): the newest
/// must be the user's and is the turn's message; the earlier user and
/// assistant messages are its history, and system (or developer) ones
/// too where the operator allows them (see [`refuse_client_system`]).
pub(crate) fn conversation_turn(
    messages: &[(&str, String)],
    attachments: Vec<crate::turn::Asked>,
    allow_system: bool,
) -> Result<crate::turn::TurnRequest, ApiError> {
    use crate::providers::{ChatMessage, Role};
    let invalid = |detail: &str| ApiError::InvalidField {
        field: "messages".into(),
        detail: detail.into(),
    };
    let Some(((role, message), earlier)) = messages.split_last() else {
        return Err(invalid("`messages` must not be empty"));
    };
    if messages.len() > 1000 {
        return Err(invalid("`messages` has more than 1000 messages"));
    }
    if *role != "user" {
        return Err(invalid("the last message must be the user's"));
    }
    if message.trim().is_empty() && attachments.is_empty() {
        return Err(ApiError::MessageRequired);
    }
    if attachments.len() > crate::turn::ATTACHMENTS_MAX {
        return Err(invalid("a message carries at most 32 images and files"));
    }
    if messages.iter().any(|(_, text)| text.contains('\0')) {
        return Err(invalid("a message contains U+0000"));
    }
    if earlier
        .iter()
        .any(|(role, _)| role.parse() == Ok(Role::System))
    {
        refuse_client_system(allow_system)?;
    }
    let history = earlier
        .iter()
        .filter_map(|(role, text)| {
            // A client's tool results (and unknown roles) are left out.
            let role = role
                .parse::<Role>()
                .ok()
                .filter(|r| r.is_conversational())?;
            Some(ChatMessage::new(role, text.clone()))
        })
        .collect();
    Ok(crate::turn::TurnRequest {
        history: Some(history),
        attachments,
        ..crate::turn::TurnRequest::new(message.clone())
    })
}

pub use super::lookup::{known_session, not_found_in};

/// A turn of the formats that send the whole conversation every time
/// (`/v1/ui/chat`, `/v1/agui`): started from `messages` (role and text, the
/// new user message last) in the session named `session`, or the
/// session's turn that waits for the results a request brings of calls of
/// the client's tools; followed from its first event, shown after `after`
/// (a [`client_calls::Segment`]).
pub struct ConversationTurn {
    pub session_id: SessionKey,
    pub turn_id: Uuid,
    /// The seq the answer's stream goes on after (0: the turn's start).
    pub after: i64,
    pub events: TurnEvents,
    /// The request's message was steered into this running turn: the
    /// answer is the rest of a turn another request began.
    pub steered: bool,
}

/// Where a turn of a conversation format goes in its session's tree.
#[derive(Debug, Default)]
pub(crate) struct Placement {
    /// The turn it continues, when the request names one (an AG-UI
    /// `parentRunId`, the AI SDK's regenerated message): its history is
    /// then that turn's branch as stored, not the messages the client
    /// sent; the nil id: a new root.
    pub branch_from: Option<Uuid>,
    /// The turn the client's last answer came from, when it is one of the
    /// session's: the turn continues it, with the client's messages as
    /// its history (an edit of an earlier message).
    pub after_turn: Option<Uuid>,
    /// The client's name for the turn (an AG-UI `runId`).
    pub run_id: Option<String>,
    /// What the request does when the session runs a turn (the AI SDK's
    /// `body.multitask`, AG-UI's `forwardedProps.multitask`), as on the
    /// native route.
    pub multitask: Multitask,
}

impl ConversationTurn {
    pub(crate) async fn start<'m>(
        app: &Shared,
        tenant: &Tenant,
        session: &str,
        (messages, attachments): crate::protocols::parts::Said<'m>,
        client_tools: Vec<crate::turn::ClientTool>,
        placement: Placement,
    ) -> Result<Self, ApiError> {
        let session_id = parse_session_id(session, tenant)?;
        let mut spec = conversation_turn(
            &messages,
            attachments,
            app.settings.harness.allow_client_system_messages,
        )?;
        spec.client_tools = client_tools;
        spec.run_id = placement.run_id;
        if let Some(parent) = placement.branch_from {
            spec.follows = Some(parent);
            spec.history = None;
        } else if let Some(after) = placement.after_turn
            && app.turns.get_turn(&session_id, after).await?.is_some()
        {
            spec.follows = Some(after);
        }
        let started = match placement.multitask {
            Multitask::Reject => Started::start(app, session_id.clone(), spec, None).await?,
            Multitask::Steer => {
                match multitask::start_or_steer(app, &session_id, spec, None).await? {
                    multitask::Begun::Started(turn) => Started::of(session_id.clone(), turn),
                    multitask::Begun::Steered { turn_id, .. } => {
                        return Self::steered(app, session_id, turn_id).await;
                    }
                }
            }
            asked => {
                let turn = multitask::start_as_asked(app, &session_id, spec, None, asked).await?;
                Started::of(session_id.clone(), turn)
            }
        };
        let turn_id = started.turn_id;
        Ok(Self {
            session_id,
            turn_id,
            after: 0,
            events: started.events(app),
            steered: false,
        })
    }

    /// The running turn `turn_id` a request's message was steered into,
    /// from now on: the answer goes on there (the step that takes the
    /// message, or the end that makes it the next turn).
    async fn steered(
        app: &Shared,
        session_id: SessionKey,
        turn_id: Uuid,
    ) -> Result<Self, ApiError> {
        let record = app
            .turns
            .get_turn(&session_id, turn_id)
            .await?
            .ok_or(ApiError::TurnNotFound)?;
        let after = app
            .turns
            .get_session(&session_id)
            .await?
            .map_or(0, |session| session.last_seq);
        Ok(Self {
            events: follow(app, &record),
            session_id,
            turn_id,
            after,
            steered: true,
        })
    }

    /// The turn a request of a format that sends the whole conversation
    /// asks for: the session's waiting turn given `replies` (the results
    /// of its client's calls and the decisions on its calls that wait for
    /// a person, that the request brings), or else a new turn of
    /// `messages` that may call the client's `tools`.
    pub(crate) async fn open<'m>(
        app: &Shared,
        tenant: &Tenant,
        session: &str,
        said: crate::protocols::parts::Said<'m>,
        replies: client_calls::Replies,
        tools: (&str, Vec<ToolDeclaration>),
        placement: Placement,
    ) -> Result<Self, ApiError> {
        if !replies.is_empty() {
            return Self::answered(app, tenant, session, replies).await;
        }
        let (field, tools) = tools;
        let tools = declared_tools(field, tools)?;
        Self::start(app, tenant, session, said, tools, placement).await
    }

    /// The turn of `session` that waits for `replies`, given them.
    pub(crate) async fn answered(
        app: &Shared,
        tenant: &Tenant,
        session: &str,
        replies: client_calls::Replies,
    ) -> Result<Self, ApiError> {
        let session_id = parse_session_id(session, tenant)?;
        let (turn, answered) = client_calls::answer_waiting(app, &session_id, replies).await?;
        let events = follow(app, &turn);
        Ok(Self {
            session_id,
            turn_id: turn.id,
            after: answered.after,
            events,
            steered: false,
        })
    }
}
