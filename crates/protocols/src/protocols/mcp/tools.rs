//! The tools `/mcp` serves, whichever protocol version asks: their
//! definitions, and what each call answers (a tool result as JSON, or the
//! reason its arguments are refused).

use std::sync::Arc;

use rmcp::model::{CallToolResult, ContentBlock, JsonObject, Tool, ToolAnnotations};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::{
    ids::{SessionKey, Tenant},
    protocols::Shared,
    protocols::{
        endpoint::{Started, named_session},
        error::ApiError,
        jsonrpc::to_value,
        native::{checked_message, checked_user_id},
        paths::parse_session_id,
    },
    service::{StartError, TurnRecord, TurnStatus},
    tools::EffectClass,
    turn::{TurnRequest, TurnResult, WebCitation},
};

/// Sessions `list_sessions` answers at most.
const LIST_MAX: u32 = 100;

/// What a tool call answers: its result, or why its arguments are refused
/// (a JSON-RPC invalid-params error).
pub(super) type Answer = Result<CallToolResult, String>;

/// A tool result of `text`, and what it holds as JSON (none: not given).
fn result(text: String, structured: Option<Value>, is_error: bool) -> CallToolResult {
    let content = vec![ContentBlock::text(text)];
    let mut result = if is_error {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    };
    // Each protocol version says its result's type itself.
    result.result_type = None;
    result.structured_content = structured;
    result
}

/// A tool result of text.
pub(super) fn text_result(text: &str, is_error: bool) -> CallToolResult {
    result(text.to_owned(), None, is_error)
}

/// `list_sessions`' input.
const LIST_SESSIONS_INPUT: &str = r#"{
    "type": "object",
    "properties": {"limit": {"type": "integer", "minimum": 1, "maximum": 100}}
}"#;

/// `get_session`'s input. `session_id` is mirrored into
/// `Mcp-Param-Session-Id` by 2026-07-28 clients (SEP-2243), so that a
/// gateway can route a session's reads without parsing the body.
const GET_SESSION_INPUT: &str = r#"{
    "type": "object",
    "properties": {"session_id": {
        "type": "string",
        "description": "A session of the caller's",
        "x-mcp-header": "Session-Id"
    }},
    "required": ["session_id"]
}"#;

/// `ask`'s input.
const ASK_INPUT: &str = r#"{
    "type": "object",
    "properties": {
        "message": {"type": "string", "minLength": 1},
        "session_id": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$",
                       "description": "A session of the caller's"},
        "user_id": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"},
        "output_schema": {"type": "object",
                          "description": "A JSON Schema the answer must fit: the result's structuredContent.output is the parsed answer"},
        "attachments": {"type": "array", "maxItems": 32,
                        "items": {"type": "string", "maxLength": 2048},
                        "description": "Files the message carries, after its text: a file's id (file-…, uploaded to /files) or a note of the vault (vault:///…)"}
    },
    "required": ["message"]
}"#;

/// What `ask`'s `structuredContent` holds when the turn completed (a turn
/// that did not is an error result, its text the reason).
const ASK_OUTPUT: &str = r#"{
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
        "output": {"description": "The answer as JSON, when output_schema was given and it fit"}
    },
    "required": ["session_id", "turn_id", "text", "local_citations", "web_citations"]
}"#;

/// A JSON schema written above, read (each is a test's to keep valid).
fn schema(text: &str) -> Arc<JsonObject> {
    Arc::new(serde_json::from_str(text).unwrap_or_else(|e| {
        tracing::error!(error = %e, "a tool's schema is not JSON");
        JsonObject::new()
    }))
}

/// A read-only tool's annotations.
fn reader(title: &str) -> ToolAnnotations {
    ToolAnnotations::with_title(title)
        .read_only(true)
        .open_world(false)
}

/// The tools, with honest annotations: `ask` reads only when every tool
/// the turn may run reads only. The readers come first: a client that
/// tries the first tool with no arguments gets an answer.
pub(super) fn definitions(app: &Shared) -> Vec<Tool> {
    let registry = app.turns.tools();
    let effects: Vec<EffectClass> = registry
        .all()
        .filter(|(_, permitted)| *permitted)
        .map(|(tool, _)| tool.spec().effect)
        .collect();
    let writes = effects.iter().any(|e| *e != EffectClass::ReadOnly);
    let destroys = effects.contains(&EffectClass::Destructive);
    let open_world = effects.contains(&EffectClass::Network);
    vec![
        Tool::new(
            "list_sessions",
            "The caller's sessions, the most recently used first.",
            schema(LIST_SESSIONS_INPUT),
        )
        .with_title("List sessions")
        .with_annotations(reader("List sessions")),
        Tool::new(
            "get_session",
            "A session of the caller's: its turns, its running turn, and its last messages.",
            schema(GET_SESSION_INPUT),
        )
        .with_title("Get a session")
        .with_annotations(reader("Get a session")),
        Tool::new(
            "ask",
            "Runs one turn of the agent on `message` and answers its reply, with its \
             citations. `session_id` goes on with a conversation (new when absent: the answer \
             names it); `user_id` names whose memories the turn reads and keeps.",
            schema(ASK_INPUT),
        )
        .with_title("Ask the agent")
        .with_raw_output_schema(schema(ASK_OUTPUT))
        .with_annotations(
            ToolAnnotations::with_title("Ask the agent")
                .read_only(!writes)
                .destructive(destroys)
                .idempotent(false)
                .open_world(open_world),
        ),
    ]
}

/// What asking `ask` came to: its turn started, arguments refused, or a
/// turn that could not start (answered as a tool error).
pub(super) enum Asked {
    Started(SessionKey, Started),
    Invalid(String),
    Refused(CallToolResult),
}

/// `ask`'s arguments.
#[derive(Debug, Default, Deserialize)]
struct AskArguments {
    message: Option<String>,
    session_id: Option<String>,
    user_id: Option<String>,
    #[serde(default)]
    attachments: Vec<String>,
    output_schema: Option<serde_json::Value>,
}

/// A tool's arguments, read (absent: none given).
fn arguments<T: for<'de> Deserialize<'de> + Default>(
    tool: &str,
    given: Option<&JsonObject>,
) -> Result<T, String> {
    match given {
        None => Ok(T::default()),
        Some(given) => T::deserialize(given).map_err(|e| format!("`{tool}`'s arguments: {e}")),
    }
}

/// Starts the turn of an `ask` call, with the native route's checks.
pub(super) async fn start_ask(app: &Shared, tenant: &Tenant, given: Option<&JsonObject>) -> Asked {
    let checked = |e: ApiError| e.to_string();
    let asked = arguments::<AskArguments>("ask", given).and_then(|given| {
        let output = given
            .output_schema
            .map(|schema| crate::turn::OutputFormat::checked(None, Some(schema), false))
            .transpose()
            .map_err(|e| format!("`output_schema`: {e}"))?;
        let asked = TurnRequest {
            user_id: checked_user_id(given.user_id).map_err(checked)?,
            output,
            ..TurnRequest::new(checked_message(given.message).map_err(checked)?)
        };
        Ok((asked, given.session_id, given.attachments))
    });
    let (mut asked, session_id, attachments) = match asked {
        Ok(asked) => asked,
        Err(detail) => return Asked::Invalid(detail),
    };
    match attached(app, tenant, &asked.message, attachments).await {
        Ok(attachments) => asked.attachments = attachments,
        Err(detail) => return Asked::Invalid(detail),
    }
    let session = match named_session(session_id.as_deref(), "mcp", tenant) {
        Ok(session) => session,
        Err(e) => return Asked::Invalid(e.to_string()),
    };
    match Started::start(app, session.clone(), asked, None).await {
        Ok(started) => Asked::Started(session, started),
        // An attachment that cannot be read is the arguments' fault
        // (JSON-RPC -32602), as MCP says.
        Err(
            e @ (StartError::FileNotFound(_)
            | StartError::Attachment { .. }
            | StartError::InvalidAttachment { .. }
            | StartError::UnsupportedContent { .. }),
        ) => Asked::Invalid(format!("`attachments`: {e}")),
        Err(e @ StartError::InvalidOutputSchema(_)) => {
            Asked::Invalid(format!("`output_schema`: {e}"))
        }
        Err(e) => {
            let e = ApiError::from(e);
            Asked::Refused(text_result(&format!("{}: {e}", e.code()), true))
        }
    }
}

/// `ask`'s attachments, after the message's text: files by id, and the
/// vault's notes by URI (their text, as a Markdown file of the session).
async fn attached(
    app: &Shared,
    tenant: &Tenant,
    message: &str,
    given: Vec<String>,
) -> Result<Vec<crate::turn::Asked>, String> {
    use crate::turn::{AskedKind, Source};
    use base64::Engine as _;
    if given.len() > crate::turn::ATTACHMENTS_MAX {
        return Err("`attachments` has at most 32 items".into());
    }
    let mut attachments = Vec::with_capacity(given.len());
    for (i, item) in given.into_iter().enumerate() {
        let (source, filename) = if item.starts_with(super::resources::NOTE_SCHEME) {
            let Ok(read) = super::resources::read(app, tenant, &item).await else {
                return Err(format!(
                    "`attachments[{i}]`: {item} is not a note of the vault"
                ));
            };
            let text = read
                .contents
                .into_iter()
                .find_map(|content| match content {
                    rmcp::model::ResourceContents::TextResourceContents { text, .. } => Some(text),
                    _ => None,
                })
                .unwrap_or_default();
            let name = item.rsplit('/').next().unwrap_or("note.md").to_owned();
            let data = base64::engine::general_purpose::STANDARD.encode(text);
            let source = Source::Data {
                media_type: "text/markdown".into(),
                data,
            };
            (source, Some(name))
        } else if item.starts_with("file-") && item.len() <= 64 {
            (Source::FileId(item), None)
        } else {
            return Err(format!(
                "`attachments[{i}]` is a file's id (file-…) or a note's URI (vault:///…)"
            ));
        };
        attachments.push(crate::turn::Asked {
            kind: AskedKind::File,
            source,
            filename,
            detail: None,
            at: message.len(),
            url: None,
            field: format!("attachments[{i}]"),
        });
    }
    Ok(attachments)
}

/// The result of `ask` for an ended turn.
pub(super) fn answer_of(session: &SessionKey, record: &TurnRecord) -> CallToolResult {
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

/// What `ask` answers of a completed turn, as `structuredContent`.
#[derive(Debug, Serialize)]
struct AskOutput<'a> {
    session_id: &'a str,
    turn_id: Uuid,
    text: &'a str,
    local_citations: &'a [String],
    web_citations: &'a [WebCitation],
    #[serde(skip_serializing_if = "Option::is_none")]
    output: Option<&'a serde_json::Value>,
}

/// The result of `ask` for a completed turn.
pub(super) fn completed(
    session: &SessionKey,
    turn_id: Uuid,
    result: &TurnResult,
) -> CallToolResult {
    let output = AskOutput {
        session_id: session.id(),
        turn_id,
        text: &result.text,
        local_citations: &result.local_citations,
        web_citations: &result.web_citations,
        output: result.output.as_ref(),
    };
    self::result(result.text.clone(), Some(to_value(&output)), false)
}

/// `list_sessions`' arguments.
#[derive(Debug, Default, Deserialize)]
struct ListArguments {
    limit: Option<u32>,
}

pub(super) async fn list_sessions(
    app: &Shared,
    tenant: &Tenant,
    given: Option<&JsonObject>,
) -> Result<Answer, ApiError> {
    let limit = match arguments::<ListArguments>("list_sessions", given).map(|a| a.limit) {
        Ok(None) => 20,
        Ok(Some(limit)) if (1..=LIST_MAX).contains(&limit) => limit,
        Ok(Some(_)) | Err(_) => return Ok(Err("`limit` must be between 1 and 100".into())),
    };
    let sessions = app.turns.list_sessions(&tenant.0, limit).await?;
    let text = serde_json::to_string_pretty(&sessions).unwrap_or_default();
    let listed = to_value(&SessionList { sessions });
    Ok(Ok(result(text, Some(listed), false)))
}

#[derive(Debug, Serialize)]
struct SessionList<T> {
    sessions: Vec<T>,
}

/// `get_session`'s arguments.
#[derive(Debug, Default, Deserialize)]
struct GetArguments {
    session_id: Option<String>,
}

/// A message as `get_session` shows it.
#[derive(Debug, Serialize)]
struct Shown<'a> {
    content: &'a str,
    role: &'a str,
}

#[derive(Debug, Serialize)]
struct SessionView<'a, S> {
    session: S,
    messages: Vec<Shown<'a>>,
}

pub(super) async fn get_session(
    app: &Shared,
    tenant: &Tenant,
    given: Option<&JsonObject>,
) -> Result<Answer, ApiError> {
    let raw = match arguments::<GetArguments>("get_session", given) {
        Ok(GetArguments {
            session_id: Some(raw),
        }) => raw,
        Ok(_) | Err(_) => return Ok(Err("`session_id` is required".into())),
    };
    // An id that cannot be a session's names none: as one never made.
    let Ok(session_id) = parse_session_id(&raw, tenant) else {
        return Ok(Ok(text_result("session not found", true)));
    };
    let Some(session) = app.turns.get_session(&session_id).await? else {
        return Ok(Ok(text_result("session not found", true)));
    };
    let messages = app
        .turns
        .current_messages(&session_id, &session, 20)
        .await?;
    let view = SessionView {
        session,
        messages: messages
            .iter()
            .map(|m| Shown {
                content: &m.content,
                role: m.role.as_str(),
            })
            .collect(),
    };
    let text = serde_json::to_string_pretty(&view).unwrap_or_default();
    Ok(Ok(result(text, Some(to_value(&view)), false)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tool_schema_is_a_json_object() {
        for text in [
            LIST_SESSIONS_INPUT,
            GET_SESSION_INPUT,
            ASK_INPUT,
            ASK_OUTPUT,
        ] {
            let schema: JsonObject = serde_json::from_str(text).unwrap();
            assert_eq!(schema.get("type").and_then(Value::as_str), Some("object"));
        }
    }
}
