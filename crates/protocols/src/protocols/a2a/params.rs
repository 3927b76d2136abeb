//! What the A2A methods read from their typed params ([`super::wire`]):
//! a task's id, a history length, a message's text, and the results of
//! the client's calls a message in a waiting task gives.

use serde::{Deserialize, de::DeserializeOwned};
use serde_json::Value;
use uuid::Uuid;

use super::{
    CONTENT_TYPE_NOT_SUPPORTED, RpcError, TASK_NOT_FOUND,
    task::TaskFold,
    wire::{CallData, ListTasksRequest, MessageIn, PartIn, TaskState},
};
use crate::{
    ids::Tenant,
    protocols::{client_calls::ClientAnswer, jsonrpc::INVALID_PARAMS, paths::parse_session_id},
    service::{TurnFilter, TurnStatus},
};

/// Tasks a `ListTasks` page holds at most, and by default.
const PAGE_MAX: u32 = 100;
const PAGE_DEFAULT: u32 = 50;

/// What a `ListTasks` asks for.
#[derive(Debug)]
pub(super) struct ListQuery {
    pub filter: TurnFilter,
    /// The state a listed task must be in, when the stored status alone
    /// does not say (a running turn works or waits); `Some(None)` for a
    /// state no turn is left in: nothing is listed.
    pub state: Option<Option<TaskState>>,
    /// The page token: the last task of the page before.
    pub before: Option<Uuid>,
    pub size: u32,
    pub history: Option<usize>,
    pub artifacts: bool,
}

pub(super) fn invalid(message: impl Into<String>) -> RpcError {
    RpcError::new(INVALID_PARAMS, message)
}

/// A method's params, deserialized (absent `params` are `{}`).
pub(super) fn parse<T: DeserializeOwned>(params: Value) -> Result<T, RpcError> {
    let params = match params {
        Value::Null => Value::Object(serde_json::Map::new()),
        given => given,
    };
    serde_path_to_error::deserialize(params).map_err(|e| {
        let path = e.path().to_string();
        invalid(format!("`{path}`: {}", e.into_inner()))
    })
}

/// A `ListTasks`'s params, checked.
pub(super) fn list_query(
    params: &ListTasksRequest,
    tenant: &Tenant,
) -> Result<ListQuery, RpcError> {
    let session = match params.context_id.as_deref().filter(|c| !c.is_empty()) {
        Some(context) => Some(parse_session_id(context, tenant)?),
        None => None,
    };
    // A state asked for: the stored statuses that may hold it, and for a
    // running turn, the state its fold must be in (working or waiting).
    let (statuses, state) = match params.status {
        None | Some(TaskState::Unspecified) => (Vec::new(), None),
        Some(running @ (TaskState::Working | TaskState::InputRequired)) => {
            (vec![TurnStatus::Running], Some(Some(running)))
        }
        Some(TaskState::Completed) => (vec![TurnStatus::Completed], None),
        Some(TaskState::Failed) => (vec![TurnStatus::Failed, TurnStatus::Interrupted], None),
        Some(TaskState::Canceled) => (vec![TurnStatus::Cancelled], None),
        // States a turn is never left in: nothing matches.
        Some(TaskState::Submitted | TaskState::Rejected | TaskState::AuthRequired) => {
            (Vec::new(), Some(None))
        }
    };
    let changed_since = match params.status_timestamp_after.as_deref() {
        None => None,
        Some(at) => Some(
            chrono::DateTime::parse_from_rfc3339(at)
                .map_err(|_| invalid("`statusTimestampAfter` must be an RFC 3339 timestamp"))?
                .to_utc(),
        ),
    };
    let size = match params.page_size {
        None => PAGE_DEFAULT,
        Some(n) if (1..=PAGE_MAX).contains(&n) => n,
        Some(_) => return Err(invalid(format!("`pageSize` must be 1-{PAGE_MAX}"))),
    };
    let before = match params.page_token.as_deref().filter(|t| !t.is_empty()) {
        Some(token) => {
            Some(Uuid::try_parse(token).map_err(|_| invalid("`pageToken` is not one we gave"))?)
        }
        None => None,
    };
    Ok(ListQuery {
        filter: TurnFilter {
            session,
            statuses,
            changed_since,
        },
        state,
        before,
        size,
        history: history_length(params.history_length)?,
        artifacts: params.include_artifacts.unwrap_or(false),
    })
}

/// The longest reason a decision may give (as on the native route).
const MAX_REASON_CHARS: usize = 1000;

/// A person's decision on one pending call.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Decision {
    pub call_id: String,
    pub approve: bool,
    pub reason: Option<String>,
}

/// A task's id as the protocol names it.
pub(super) fn task_id(id: Option<&str>) -> Result<Uuid, RpcError> {
    let raw = id.ok_or_else(|| invalid("`id` (the task's id) is required"))?;
    Uuid::try_parse(raw).map_err(|_| RpcError::new(TASK_NOT_FOUND, "task not found"))
}

/// `historyLength`, when given: an int32 in the proto.
pub(super) fn history_length(given: Option<u32>) -> Result<Option<usize>, RpcError> {
    match given {
        None => Ok(None),
        Some(n) if n <= i32::MAX.unsigned_abs() => Ok(usize::try_from(n).ok()),
        Some(_) => Err(invalid("`historyLength` must be a count (int32)")),
    }
}

/// The text of a message's parts; parts that are not text are refused.
pub(super) fn message_text(message: &MessageIn) -> Result<String, RpcError> {
    if message.parts.is_empty() {
        return Err(invalid("`message.parts` must hold a part"));
    }
    let mut texts = Vec::new();
    for part in &message.parts {
        match part {
            PartIn::Text { text } => texts.push(text.as_str()),
            PartIn::Raw { .. } | PartIn::Url { .. } | PartIn::Data { .. } | PartIn::Other(_) => {
                return Err(RpcError::new(
                    CONTENT_TYPE_NOT_SUPPORTED,
                    "only text parts are taken here (text/plain)",
                ));
            }
        }
    }
    Ok(texts.join("\n"))
}

/// What a message that begins a task says: its text, and its files
/// (`raw` and `url` parts) where they stood. A data part, or a part of no
/// kind A2A defines, is refused with `ContentTypeNotSupportedError`.
pub(super) fn message_content(message: &MessageIn) -> Result<crate::turn::Joined, RpcError> {
    use crate::turn::{AskedKind, Source};
    if message.parts.is_empty() {
        return Err(invalid("`message.parts` must hold a part"));
    }
    if message.parts.len() > crate::turn::PARTS_MAX {
        return Err(invalid("a message has at most 64 parts"));
    }
    let kind = |media_type: &Option<String>| match media_type {
        Some(t) if t.starts_with("image/") => AskedKind::Image,
        _ => AskedKind::File,
    };
    let mut joined = crate::turn::Joined::default();
    for (i, part) in message.parts.iter().enumerate() {
        let field = format!("message.parts[{i}]");
        match part {
            PartIn::Text { text } => joined.text(text),
            PartIn::Raw {
                raw,
                media_type,
                filename,
            } => {
                let source = Source::Data {
                    media_type: media_type
                        .clone()
                        .unwrap_or_else(|| "application/octet-stream".to_owned()),
                    data: raw.clone(),
                };
                joined.attach(&field, kind(media_type), source, filename.clone(), None);
            }
            PartIn::Url {
                url,
                media_type,
                filename,
            } => {
                let source =
                    crate::protocols::parts::from_url(&field, url.clone(), media_type.as_deref())?;
                joined.attach(&field, kind(media_type), source, filename.clone(), None);
            }
            PartIn::Data { .. } | PartIn::Other(_) => {
                return Err(RpcError::new(
                    CONTENT_TYPE_NOT_SUPPORTED,
                    "a task begins with text, raw and url parts (text, images, PDFs, text \
                     files); data parts answer a waiting task",
                ));
            }
        }
    }
    Ok(joined)
}

/// The data parts of a message that name a call, read.
fn call_data(message: &MessageIn) -> impl Iterator<Item = CallData> + '_ {
    message
        .parts
        .iter()
        .filter_map(|p| match p {
            PartIn::Data { data } => CallData::deserialize(data).ok(),
            PartIn::Text { .. } | PartIn::Raw { .. } | PartIn::Url { .. } | PartIn::Other(_) => {
                None
            }
        })
        .filter(|d| d.call_id.is_some())
}

/// The results of the client's calls a message in a waiting task gives:
/// a data part `{call_id, output, is_error}` for each, or when one call
/// alone waits (and no approval), the message's text. Empty when the
/// message answers none (an approval's answer).
pub(super) fn client_answers(
    message: &MessageIn,
    fold: &TaskFold,
) -> Result<Vec<ClientAnswer>, RpcError> {
    let waiting = fold.client_calls();
    let data: Vec<CallData> = call_data(message).filter(|d| d.approve.is_none()).collect();
    if data.is_empty() {
        return match (waiting, fold.pending().is_empty()) {
            ([call_id], true) => Ok(vec![ClientAnswer::text(
                call_id,
                message_text(message)?,
                false,
            )]),
            ([], _) => Ok(Vec::new()),
            _ => Err(invalid(
                "more than one call waits: answer each with a data part {call_id, output}",
            )),
        };
    }
    data.into_iter()
        .map(|d| {
            let call_id = d.call_id.unwrap_or_default();
            if !waiting.contains(&call_id) {
                return Err(invalid(format!(
                    "the task does not wait for a call {call_id:?}"
                )));
            }
            Ok(ClientAnswer::of(
                &call_id,
                &d.output,
                d.is_error.unwrap_or(false),
            ))
        })
        .collect()
}

/// The decisions a message in a waiting task gives on its `pending`
/// approvals: a data part `{call_id, approve, reason?}` for each call it
/// decides, or a message whose whole text is `approve` or `deny` (any
/// case) for every pending call. Anything else decides nothing and is
/// refused, so the calls keep waiting: a person's "nothing to add" is no
/// denial, and "yesterday's plan is fine" no approval.
pub(super) fn decisions(
    message: &MessageIn,
    pending: &[String],
) -> Result<Vec<Decision>, RpcError> {
    let data: Vec<CallData> = call_data(message).filter(|d| d.approve.is_some()).collect();
    if data.is_empty() {
        let text = message_text(message)?;
        let approve = match text.trim().to_lowercase().as_str() {
            "approve" => true,
            "deny" => false,
            _ => {
                return Err(invalid(
                    "decide a pending call with a message whose whole text is approve or deny, \
                     or a data part {call_id, approve, reason}; the call still waits",
                ));
            }
        };
        return Ok(pending
            .iter()
            .map(|call_id| Decision {
                call_id: call_id.clone(),
                approve,
                reason: None,
            })
            .collect());
    }
    data.into_iter()
        .map(|d| {
            let call_id = d.call_id.unwrap_or_default();
            if !pending.contains(&call_id) {
                return Err(invalid(format!(
                    "the task does not wait for a decision on a call {call_id:?}"
                )));
            }
            let Some(Value::Bool(approve)) = d.approve else {
                return Err(invalid("`approve` must be true or false"));
            };
            let reason = match d.reason {
                None | Some(Value::Null) => None,
                Some(Value::String(r))
                    if r.chars().count() <= MAX_REASON_CHARS && !r.contains('\0') =>
                {
                    Some(r.trim().to_owned()).filter(|r| !r.is_empty())
                }
                Some(_) => {
                    return Err(invalid(format!(
                        "`reason` must be text of at most {MAX_REASON_CHARS} characters \
                         without U+0000"
                    )));
                }
            };
            Ok(Decision {
                call_id,
                approve,
                reason,
            })
        })
        .collect()
}

/// The JSON-RPC error of a problem (a part the agent does not read, or
/// bytes of no type it takes: `ContentTypeNotSupportedError`).
impl From<crate::protocols::error::ApiError> for RpcError {
    fn from(e: crate::protocols::error::ApiError) -> Self {
        match e.status() {
            // What a part is that the agent does not read, or a file's
            // bytes that are no type it takes.
            axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE => {
                Self::new(super::CONTENT_TYPE_NOT_SUPPORTED, e.to_string())
            }
            _ if matches!(e, crate::protocols::error::ApiError::FileNotFound) => {
                Self::new(super::INVALID_PARAMS, e.to_string())
            }
            axum::http::StatusCode::NOT_FOUND => Self::new(super::TASK_NOT_FOUND, e.to_string()),
            s if s.is_client_error() => Self::new(super::INVALID_PARAMS, e.to_string()),
            _ => Self::new(super::INTERNAL_ERROR, e.to_string()),
        }
    }
}

impl From<crate::service::StoreError> for RpcError {
    fn from(e: crate::service::StoreError) -> Self {
        crate::protocols::error::ApiError::from(e).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(text: &str) -> MessageIn {
        MessageIn {
            parts: vec![PartIn::Text {
                text: text.to_owned(),
            }],
            context_id: None,
            task_id: None,
        }
    }

    fn data(data: &str) -> MessageIn {
        MessageIn {
            parts: vec![PartIn::Data {
                data: serde_json::from_str(data).unwrap(),
            }],
            context_id: None,
            task_id: None,
        }
    }

    #[test]
    fn proto_names_are_read_as_json_names_outside_the_clients_data() {
        let request: super::super::wire::SendMessageRequest = parse(
            serde_json::from_str(
                r#"{"message": {"context_id": "c", "task_id": "t1",
                     "parts": [{"data": {"call_id": "x"}}]},
                    "configuration": {"return_immediately": true, "history_length": 2,
                     "task_push_notification_config": {"url": "u",
                       "authentication": {"scheme": "Bearer"}}},
                    "metadata": {"clientTools": []}}"#,
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(request.message.task_id.as_deref(), Some("t1"));
        assert_eq!(request.message.context_id.as_deref(), Some("c"));
        let PartIn::Data { data } = &request.message.parts[0] else {
            panic!("a data part: {:?}", request.message.parts[0]);
        };
        assert_eq!(data.get("call_id").and_then(Value::as_str), Some("x"));
        assert!(request.configuration.return_immediately);
        assert_eq!(request.configuration.history_length, Some(2));
        let push = request.configuration.task_push_notification_config.unwrap();
        assert_eq!(push.url, "u");
        assert!(request.metadata.client_tools.is_some());
        // The client's own data is read as it is: metadata's fields are
        // not renamed.
        let snake: super::super::wire::SendMessageRequest = parse(
            serde_json::from_str(r#"{"message": {"parts": []}, "metadata": {"client_tools": []}}"#)
                .unwrap(),
        )
        .unwrap();
        assert!(snake.metadata.client_tools.is_none());
        // A field named both ways is refused, as protobuf's parsers refuse
        // it: no guess which one the client meant.
        let both = parse::<super::super::wire::TaskQuery>(
            serde_json::from_str(r#"{"id": "t", "historyLength": 1, "history_length": 2}"#)
                .unwrap(),
        );
        let RpcError(code, message) = both.unwrap_err();
        assert_eq!(code, INVALID_PARAMS);
        assert!(message.contains("historyLength"), "{message}");
    }

    #[test]
    fn only_the_whole_words_approve_or_deny_decide_by_text() {
        let pending = vec!["c1".to_owned(), "c2".to_owned()];
        for (said, approve) in [("approve", true), (" Deny\n", false), ("APPROVE", true)] {
            let decided = decisions(&text(said), &pending).unwrap();
            assert_eq!(decided.len(), 2, "{said:?}");
            assert!(
                decided
                    .iter()
                    .all(|d| d.approve == approve && d.reason.is_none())
            );
        }
        for said in [
            "nothing to add",
            "yesterday's plan is fine",
            "yes",
            "no",
            "approve it",
            "deny, please",
        ] {
            assert!(decisions(&text(said), &pending).is_err(), "{said:?}");
        }
    }

    #[test]
    fn a_data_part_decides_its_own_call_with_a_bounded_reason() {
        let pending = vec!["c1".to_owned(), "c2".to_owned()];
        let decided = decisions(
            &data(r#"{"call_id": "c2", "approve": false, "reason": " not now "}"#),
            &pending,
        )
        .unwrap();
        assert_eq!(
            decided,
            [Decision {
                call_id: "c2".into(),
                approve: false,
                reason: Some("not now".into()),
            }]
        );
        let long = format!(
            r#"{{"call_id": "c1", "approve": false, "reason": "{}"}}"#,
            "x".repeat(1001)
        );
        for refused in [
            r#"{"call_id": "c9", "approve": true}"#,
            r#"{"call_id": "c1", "approve": "yes"}"#,
            &long,
            r#"{"call_id": "c1", "approve": false, "reason": "a\u0000b"}"#,
            r#"{"call_id": "c1", "approve": false, "reason": 3}"#,
        ] {
            assert!(decisions(&data(refused), &pending).is_err(), "{refused}");
        }
    }
}
