//! `ask` up to 2025-11-25: its answer at the end of the turn, or as a
//! stream of JSON-RPC messages (its progress, the turn's log messages at
//! the session's level, the elicitations of its approvals), and the
//! client's answers to those elicitations.

use axum::{body::Bytes, http::StatusCode, response::Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::{LOG_LEVELS, json_answer};
use crate::{
    events::{StoredEvent, TurnEvent},
    ids::{SessionKey, Tenant},
    protocols::Shared,
    protocols::{
        Encoded, WireFormat,
        approvals::{ClientDecision, approvals, decide},
        error::ApiError,
        jsonrpc::{INTERNAL_ERROR, INVALID_PARAMS, error as rpc_error, result as rpc_result},
        mcp::{
            state::{McpCallGuard, McpCalls},
            tools::{self, Asked},
            wire::{
                ElicitAnswer, Elicitation, LogMessage, Notification, Progress, Request,
                message_frame,
            },
        },
        stream_for, typed,
    },
};

/// A `tools/call` of `ask`, and who made it.
pub(super) struct Call {
    pub id: Value,
    pub tenant: Tenant,
    pub mcp_session: String,
    /// `_meta.progressToken` (null: no progress wanted).
    pub progress: Value,
}

pub(super) async fn ask(
    app: &Shared,
    call: Call,
    arguments: Option<&rmcp::model::JsonObject>,
    streams: bool,
) -> Result<Response, ApiError> {
    let (session, started) = match tools::start_ask(app, &call.tenant, arguments).await {
        Asked::Started(session, started) => (session, started),
        Asked::Invalid(detail) => {
            let answer = rpc_error(&call.id, INVALID_PARAMS, &detail);
            return Ok(json_answer(StatusCode::OK, &answer));
        }
        Asked::Refused(result) => {
            return Ok(json_answer(StatusCode::OK, &rpc_result(&call.id, result)));
        }
    };
    let turn_id = started.turn_id;
    let guard = McpCalls::track(
        &app.mcp.calls,
        &call.tenant.0,
        &call.mcp_session,
        &call.id,
        (session.clone(), turn_id),
    );
    if !streams {
        let record = app.turns.wait_for_end(&session, turn_id).await?;
        drop(guard);
        let record = record.ok_or(ApiError::ShuttingDown)?;
        let answer = rpc_result(&call.id, tools::answer_of(&session, &record));
        return Ok(json_answer(StatusCode::OK, &answer));
    }
    let events = started.events(app);
    let format = AskStream {
        log_level: app.mcp.sessions.log_level(&call.tenant, &call.mcp_session),
        app: app.clone(),
        tenant: call.tenant,
        mcp_session: call.mcp_session,
        elicited: Vec::new(),
        id: call.id,
        progress: call.progress,
        done: 0,
        session,
        turn_id,
        _guard: guard,
    };
    Ok(stream_for(app, format, events))
}

/// `ask`'s answer as a stream of JSON-RPC messages: each text delta a
/// `notifications/progress` (when the call named a progress token), then
/// the call's result.
struct AskStream {
    /// The session's `logging/setLevel` (an index of [`LOG_LEVELS`]): the
    /// turn's log messages at or above it are sent.
    log_level: Option<usize>,
    app: Shared,
    tenant: Tenant,
    mcp_session: String,
    /// The calls whose approval was asked by elicitation (each once).
    elicited: Vec<String>,
    id: Value,
    progress: Value,
    done: u64,
    session: SessionKey,
    turn_id: Uuid,
    /// Untracks the call when the stream ends.
    _guard: McpCallGuard,
}

impl AskStream {
    /// A `notifications/message` of the turn, when the session asked for
    /// messages at `level` or above.
    fn log(&self, level: &'static str, data: impl Serialize) -> Encoded {
        let wanted = LOG_LEVELS
            .iter()
            .position(|l| *l == level)
            .zip(self.log_level)
            .is_some_and(|(at, least)| at >= least);
        if !wanted {
            return Encoded::default();
        }
        let note = Notification::new(
            "notifications/message",
            LogMessage {
                level,
                logger: "agent-harness",
                data,
            },
        );
        Encoded::frames(vec![message_frame(&note)])
    }
}

impl AskStream {
    /// An `elicitation/create` that asks the client to approve a call
    /// (once a call; none when the client takes no elicitation).
    fn elicit(&mut self, call_id: &str, tool: &str, arguments: &Value) -> Option<Bytes> {
        if self.elicited.iter().any(|c| c == call_id) {
            return None;
        }
        let asked = (self.session.clone(), self.turn_id, call_id.to_owned());
        let id = self
            .app
            .mcp
            .sessions
            .ask(&self.tenant, &self.mcp_session, asked)?;
        self.elicited.push(call_id.to_owned());
        let request = Request {
            jsonrpc: crate::protocols::jsonrpc::Version::V2,
            id,
            method: "elicitation/create",
            params: Elicitation::approval(format!(
                "{tool} waits for your approval; its arguments: {arguments}"
            )),
        };
        Some(message_frame(&request))
    }
}

/// The client's answer to an `elicitation/create` of this session: the
/// call it asked about is approved (`accept` with `approve: true`, the
/// form 2026-07-28's input-required asks for too) or
/// denied (anything else, with its reason). An answer to no question of
/// the session's is taken and does nothing.
pub(super) async fn elicited(
    app: &Shared,
    tenant: &Tenant,
    mcp_session: &str,
    id: &Value,
    result: Option<Value>,
) {
    let Some((session, turn_id, call_id)) = id
        .as_str()
        .and_then(|id| app.mcp.sessions.answered(tenant, mcp_session, id))
    else {
        return;
    };
    let result = result
        .and_then(|r| ElicitAnswer::deserialize(r).ok())
        .unwrap_or_default();
    let content = result.content.unwrap_or_default();
    let (approve, reason) = match result.action.as_deref() {
        Some("accept") => (
            content.approve == Value::Bool(true),
            content.reason.as_str().map(str::to_owned),
        ),
        Some("decline") => (false, Some("the person declined".to_owned())),
        _ => (false, Some("the client did not ask anyone".to_owned())),
    };
    // An edit that cannot be read, or fails the tool's schema, is logged
    // and decides nothing: the call waits on (for its deadline, or a
    // decision on another route).
    let edited = content.edited();
    let decision = ClientDecision::new(&call_id, approve, reason, "content.reason")
        .or_else(|_| ClientDecision::new(&call_id, approve, None, "content.reason"))
        .and_then(|d| {
            let edited = edited.map_err(|detail| ApiError::InvalidField {
                field: "content.arguments".into(),
                detail,
            })?;
            d.with_edit(edited, "content.arguments")
        });
    let decided = async {
        let decision = decision?;
        let turn = app
            .turns
            .get_turn(&session, turn_id)
            .await?
            .ok_or(ApiError::TurnNotFound)?;
        let state = approvals(app, &turn).await?.get(&call_id).map(|(s, _)| *s);
        decide(app, &turn, state, &decision).await
    };
    if let Err(e) = decided.await {
        tracing::debug!(error = %e, turn.id = %turn_id, "an elicited decision was not taken");
    }
}

impl WireFormat for AskStream {
    fn encode(&mut self, event: &StoredEvent) -> Encoded {
        let Some(event) = typed(event) else {
            return Encoded::default();
        };
        let ended = |result: rmcp::model::CallToolResult| {
            Encoded::last(vec![message_frame(&rpc_result(&self.id, result))])
        };
        match event {
            TurnEvent::MessageDelta { text, .. } if !self.progress.is_null() => {
                self.done += 1;
                let note = Notification::new(
                    "notifications/progress",
                    Progress {
                        progress_token: &self.progress,
                        progress: self.done,
                        message: text,
                    },
                );
                Encoded::frames(vec![message_frame(&note)])
            }
            TurnEvent::ToolStarted { call_id, tool, .. } => self.log(
                "info",
                ToolLog {
                    event: "tool.started",
                    tool,
                    call_id,
                    status: None,
                    error: None,
                },
            ),
            TurnEvent::ToolFinished {
                call_id,
                tool,
                status,
                error,
                ..
            } => {
                let level = match status {
                    crate::events::ToolStatus::Completed => "info",
                    _ => "warning",
                };
                let data = ToolLog {
                    event: "tool.finished",
                    tool,
                    call_id,
                    status: Some(*status),
                    error: error.as_deref(),
                };
                self.log(level, data)
            }
            TurnEvent::ApprovalRequested {
                call_id,
                tool,
                arguments,
                ..
            } => {
                let data = ToolLog {
                    event: "approval.requested",
                    tool,
                    call_id,
                    status: None,
                    error: None,
                };
                let mut out = self.log("notice", data);
                out.frames.extend(self.elicit(call_id, tool, arguments));
                out
            }
            TurnEvent::TurnCompleted { result } => {
                ended(tools::completed(&self.session, self.turn_id, result))
            }
            TurnEvent::TurnFailed { code, message, .. } => {
                ended(tools::text_result(&format!("{code}: {message}"), true))
            }
            TurnEvent::TurnCancelled { reason } => {
                ended(tools::text_result(&format!("cancelled: {reason}"), true))
            }
            TurnEvent::TurnInterrupted { reason } => {
                ended(tools::text_result(&format!("interrupted: {reason}"), true))
            }
            _ => Encoded::default(),
        }
    }

    fn unreadable(&mut self) -> Vec<Bytes> {
        vec![message_frame(&rpc_error(
            &self.id,
            INTERNAL_ERROR,
            "the event log cannot be read; the turn goes on: read it with get_session",
        ))]
    }
}

/// What a `notifications/message` of a tool call says.
#[derive(Debug, Serialize)]
struct ToolLog<'a> {
    call_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    event: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<crate::events::ToolStatus>,
    tool: &'a str,
}
