//! The tools `/mcp` serves, whichever protocol version asks: their
//! definitions, and what each call answers (a tool result as JSON, or the
//! reason its arguments are refused).

use std::collections::BTreeMap;

use serde_json::{Value, json};
use uuid::Uuid;

use crate::{
    ids::{SessionKey, Tenant},
    protocols::Shared,
    protocols::{
        endpoint::{Started, named_session},
        error::ApiError,
        native::{checked_message, checked_user_id},
        paths::parse_session_id,
    },
    service::{TurnRecord, TurnStatus},
    tools::EffectClass,
    turn::{TurnRequest, TurnResult},
};

/// Sessions `list_sessions` answers at most.
const LIST_MAX: u32 = 100;

/// What a tool call answers: its result, or why its arguments are refused
/// (a JSON-RPC invalid-params error).
pub(super) type Answer = Result<Value, String>;

/// A tool result of text.
pub(super) fn text_result(text: &str, is_error: bool) -> Value {
    json!({"content": [{"type": "text", "text": text}], "isError": is_error})
}

/// What `ask`'s `structuredContent` holds when the turn completed (a turn
/// that did not is an error result, its text the reason).
fn ask_output() -> Value {
    json!({
        "type": "object",
        "properties": {
            "session_id": {"type": "string", "description": "The session the turn ran in"},
            "turn_id": {"type": "string", "format": "uuid"},
            "text": {"type": "string", "description": "The agent's answer"},
            "local_citations": {"type": "array", "items": {"type": "string"},
                                "description": "The notes the answer cites (their anchors)"},
            "web_citations": {"type": "array", "description": "The web pages the answer cites",
                              "items": {"type": "object", "required": ["title", "url"],
                                        "properties": {"title": {"type": "string"},
                                                       "url": {"type": "string"}}}},
        },
        "required": ["session_id", "turn_id", "text", "local_citations", "web_citations"],
    })
}

/// The tools, with honest annotations: `ask` reads only when every tool
/// the turn may run reads only. The readers come first: a client that
/// tries the first tool with no arguments gets an answer.
pub(super) fn definitions(app: &Shared) -> Vec<Value> {
    let registry = app.turns.tools();
    let effects: Vec<EffectClass> = registry
        .all()
        .filter(|(_, permitted)| *permitted)
        .map(|(tool, _)| tool.spec().effect)
        .collect();
    let writes = effects.iter().any(|e| *e != EffectClass::ReadOnly);
    let destroys = effects.contains(&EffectClass::Destructive);
    let open_world = effects.contains(&EffectClass::Network);
    let session_id = json!({"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$",
                            "description": "A session of the caller's"});
    vec![
        json!({
            "name": "list_sessions",
            "title": "List sessions",
            "description": "The caller's sessions, the most recently used first.",
            "inputSchema": {
                "type": "object",
                "properties": {"limit": {"type": "integer", "minimum": 1, "maximum": LIST_MAX}},
            },
            "annotations": {"title": "List sessions", "readOnlyHint": true, "openWorldHint": false},
        }),
        json!({
            "name": "get_session",
            "title": "Get a session",
            "description": "A session of the caller's: its turns, its running turn, and its \
                            last messages.",
            "inputSchema": {
                "type": "object",
                // Mirrored into `Mcp-Param-Session-Id` by 2026-07-28
                // clients (SEP-2243), so that a gateway can route a
                // session's reads without parsing the body.
                "properties": {"session_id": {
                    "type": "string",
                    "description": "A session of the caller's",
                    "x-mcp-header": "Session-Id",
                }},
                "required": ["session_id"],
            },
            "annotations": {"title": "Get a session", "readOnlyHint": true, "openWorldHint": false},
        }),
        json!({
            "name": "ask",
            "title": "Ask the agent",
            "description": "Runs one turn of the agent on `message` and answers its reply, \
                            with its citations. `session_id` goes on with a conversation \
                            (new when absent: the answer names it); `user_id` names whose \
                            memories the turn reads and keeps.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "message": {"type": "string", "minLength": 1},
                    "session_id": session_id,
                    "user_id": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"},
                },
                "required": ["message"],
            },
            "outputSchema": ask_output(),
            "annotations": {
                "title": "Ask the agent",
                "readOnlyHint": !writes,
                "destructiveHint": destroys,
                "idempotentHint": false,
                "openWorldHint": open_world,
            },
        }),
    ]
}

/// What asking `ask` came to: its turn started, arguments refused, or a
/// turn that could not start (answered as a tool error).
pub(super) enum Asked {
    Started(SessionKey, Started),
    Invalid(String),
    Refused(Value),
}

/// Starts the turn of an `ask` call, with the native route's checks.
pub(super) async fn start_ask(app: &Shared, tenant: &Tenant, arguments: &Value) -> Asked {
    let text = |field: &str| match &arguments[field] {
        Value::Null => Ok(None),
        Value::String(text) => Ok(Some(text.clone())),
        _ => Err(format!(
            "`ask` takes message, session_id, user_id: `{field}` must be a string"
        )),
    };
    let asked = text("message").and_then(|message| {
        let user_id = text("user_id")?;
        let checked = |e: ApiError| e.to_string();
        Ok(TurnRequest {
            user_id: checked_user_id(user_id).map_err(checked)?,
            ..TurnRequest::new(checked_message(message).map_err(checked)?)
        })
    });
    let asked = match asked {
        Ok(asked) => asked,
        Err(detail) => return Asked::Invalid(detail),
    };
    let session = match named_session(arguments["session_id"].as_str(), "mcp", tenant) {
        Ok(session) => session,
        Err(e) => return Asked::Invalid(e.to_string()),
    };
    match Started::start(app, session.clone(), asked, None).await {
        Ok(started) => Asked::Started(session, started),
        Err(e) => {
            let e = ApiError::from(e);
            Asked::Refused(text_result(&format!("{}: {e}", e.code()), true))
        }
    }
}

/// The result of `ask` for an ended turn.
pub(super) fn answer_of(session: &SessionKey, record: &TurnRecord) -> Value {
    match (&record.status, &record.result) {
        (TurnStatus::Completed, Some(result)) => completed(session, record.id, result),
        (status, _) => {
            let why = record
                .error_message
                .clone()
                .unwrap_or_else(|| format!("the turn ended {status}"));
            text_result(&why, true)
        }
    }
}

/// The result of `ask` for a completed turn.
pub(super) fn completed(session: &SessionKey, turn_id: Uuid, result: &TurnResult) -> Value {
    json!({
        "content": [{"type": "text", "text": result.text}],
        "structuredContent": {
            "session_id": session.id(),
            "turn_id": turn_id,
            "text": result.text,
            "local_citations": result.local_citations,
            "web_citations": result.web_citations,
        },
        "isError": false,
    })
}

pub(super) async fn list_sessions(
    app: &Shared,
    tenant: &Tenant,
    arguments: &Value,
) -> Result<Answer, ApiError> {
    let limit = match &arguments["limit"] {
        Value::Null => 20,
        limit => match limit
            .as_u64()
            .filter(|l| (1..=u64::from(LIST_MAX)).contains(l))
        {
            Some(limit) => limit as u32,
            None => return Ok(Err("`limit` must be between 1 and 100".into())),
        },
    };
    let sessions = app.turns.list_sessions(&tenant.0, limit).await?;
    let sessions: Vec<Value> = sessions
        .into_iter()
        .map(|mut session| {
            session.id = SessionKey::from_stored(&session.id).id().to_owned();
            json!(session)
        })
        .collect();
    let text = serde_json::to_string_pretty(&sessions).unwrap_or_default();
    Ok(Ok(json!({
        "content": [{"type": "text", "text": text}],
        "structuredContent": {"sessions": sessions},
        "isError": false,
    })))
}

pub(super) async fn get_session(
    app: &Shared,
    tenant: &Tenant,
    arguments: &Value,
) -> Result<Answer, ApiError> {
    let Some(raw) = arguments["session_id"].as_str() else {
        return Ok(Err("`session_id` is required".into()));
    };
    // An id that cannot be a session's names none: as one never made.
    let Ok(session_id) = parse_session_id(raw, tenant) else {
        return Ok(Ok(text_result("session not found", true)));
    };
    let Some(mut session) = app.turns.get_session(&session_id).await? else {
        return Ok(Ok(text_result("session not found", true)));
    };
    session.id = session_id.id().to_owned();
    let messages = app.turns.recent_messages(&session_id, 20).await?;
    let messages: Vec<BTreeMap<&str, Value>> = messages
        .iter()
        .map(|m| BTreeMap::from([("role", json!(m.role)), ("content", json!(m.content))]))
        .collect();
    let view = json!({"session": session, "messages": messages});
    let text = serde_json::to_string_pretty(&view).unwrap_or_default();
    Ok(Ok(
        json!({"content": [{"type": "text", "text": text}], "structuredContent": view, "isError": false}),
    ))
}
