//! What the A2A methods read from their params and messages: a task's
//! id, a history length, a message's text, and the results of the
//! client's calls a message in a waiting task gives.

use serde_json::Value;
use uuid::Uuid;

use super::{CONTENT_TYPE_NOT_SUPPORTED, RpcError, TASK_NOT_FOUND, task, task::TaskFold};
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
    /// The state a listed task is in, when the stored status alone does
    /// not say (a running turn works or waits); one no turn is left in
    /// lists nothing.
    pub state: Option<&'static str>,
    /// The page token: the last task of the page before.
    pub before: Option<Uuid>,
    pub size: u32,
    pub history: Option<usize>,
    pub artifacts: bool,
}

fn invalid(message: impl Into<String>) -> RpcError {
    RpcError::new(INVALID_PARAMS, message)
}

/// A `ListTasks`'s params, read and checked.
pub(super) fn list_query(params: &Value, tenant: &Tenant) -> Result<ListQuery, RpcError> {
    let session = match params["contextId"].as_str().filter(|c| !c.is_empty()) {
        Some(context) => Some(parse_session_id(context, tenant)?),
        None => None,
    };
    // A state asked for: the stored statuses that may hold it, and for a
    // running turn, the state its fold must be in (working or waiting).
    let (statuses, state) = match params["status"].as_str().filter(|s| !s.is_empty()) {
        None | Some("TASK_STATE_UNSPECIFIED") => (Vec::new(), None),
        Some(task::WORKING) => (vec![TurnStatus::Running], Some(task::WORKING)),
        Some(task::INPUT_REQUIRED) => (vec![TurnStatus::Running], Some(task::INPUT_REQUIRED)),
        Some(task::COMPLETED) => (vec![TurnStatus::Completed], None),
        Some(task::FAILED) => (vec![TurnStatus::Failed, TurnStatus::Interrupted], None),
        Some(task::CANCELED) => (vec![TurnStatus::Cancelled], None),
        // States a turn is never left in: nothing matches.
        Some("TASK_STATE_SUBMITTED" | "TASK_STATE_REJECTED" | "TASK_STATE_AUTH_REQUIRED") => {
            (Vec::new(), Some("never"))
        }
        Some(other) => return Err(invalid(format!("`status`: {other:?} is not a task state"))),
    };
    let changed_since = match &params["statusTimestampAfter"] {
        Value::Null => None,
        at => Some(
            at.as_str()
                .and_then(|at| chrono::DateTime::parse_from_rfc3339(at).ok())
                .ok_or_else(|| invalid("`statusTimestampAfter` must be an RFC 3339 timestamp"))?
                .to_utc(),
        ),
    };
    let size = match &params["pageSize"] {
        Value::Null => PAGE_DEFAULT,
        n => n
            .as_u64()
            .filter(|n| (1..=u64::from(PAGE_MAX)).contains(n))
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| invalid(format!("`pageSize` must be 1-{PAGE_MAX}")))?,
    };
    let before = match params["pageToken"].as_str().filter(|t| !t.is_empty()) {
        Some(token) => {
            Some(Uuid::try_parse(token).map_err(|_| invalid("`pageToken` is not one we gave"))?)
        }
        None => None,
    };
    let artifacts = match &params["includeArtifacts"] {
        Value::Null => false,
        flag => flag
            .as_bool()
            .ok_or_else(|| invalid("`includeArtifacts` must be true or false"))?,
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
        history: history_length(params)?,
        artifacts,
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

/// Protobuf's JSON mapping lets a field be named by its proto name too
/// (`task_id` for `taskId`): the fields of a request's params, and of its
/// message, configuration and push configuration, are renamed to the JSON
/// names here (the contents of `metadata` and of data parts are the
/// client's and are left as they are).
pub(super) fn json_names(params: &mut Value) {
    fn rename(object: &mut Value) {
        let Some(fields) = object.as_object_mut() else {
            return;
        };
        let proto_names: Vec<String> = fields.keys().filter(|k| k.contains('_')).cloned().collect();
        for name in proto_names {
            let mut camel = String::with_capacity(name.len());
            let mut upper = false;
            for c in name.chars() {
                match (c, upper) {
                    ('_', _) => upper = true,
                    (c, true) => {
                        camel.extend(c.to_uppercase());
                        upper = false;
                    }
                    (c, false) => camel.push(c),
                }
            }
            if !fields.contains_key(&camel)
                && let Some(value) = fields.remove(&name)
            {
                fields.insert(camel, value);
            }
        }
    }
    rename(params);
    for nested in ["message", "configuration", "authentication"] {
        if let Some(object) = params.get_mut(nested) {
            rename(object);
        }
    }
    if let Some(push) = params
        .get_mut("configuration")
        .and_then(|c| c.get_mut("taskPushNotificationConfig"))
    {
        rename(push);
        if let Some(auth) = push.get_mut("authentication") {
            rename(auth);
        }
    }
}

/// The `message` of a `SendMessage`: an object, whose ids are strings
/// when given.
pub(super) fn message(params: &Value) -> Result<&Value, RpcError> {
    let message = &params["message"];
    if !message.is_object() {
        return Err(invalid("`message` is required"));
    }
    for field in ["contextId", "taskId"] {
        if !matches!(message[field], Value::Null | Value::String(_)) {
            return Err(invalid(format!("`message.{field}` must be a string")));
        }
    }
    Ok(message)
}

/// A task's id as the protocol names it.
pub(super) fn task_id(params: &Value) -> Result<Uuid, RpcError> {
    let raw = params["id"]
        .as_str()
        .ok_or_else(|| RpcError::new(INVALID_PARAMS, "`id` (the task's id) is required"))?;
    Uuid::try_parse(raw).map_err(|_| RpcError::new(TASK_NOT_FOUND, "task not found"))
}

/// `historyLength`, when given.
pub(super) fn history_length(params: &Value) -> Result<Option<usize>, RpcError> {
    match &params["historyLength"] {
        Value::Null => Ok(None),
        // An int32 in the proto.
        n => n
            .as_u64()
            .filter(|n| *n <= i32::MAX as u64)
            .and_then(|n| usize::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| {
                RpcError::new(INVALID_PARAMS, "`historyLength` must be a count (int32)")
            }),
    }
}

/// The text of a message's parts; parts that are not text are refused.
pub(super) fn message_text(message: &Value) -> Result<String, RpcError> {
    let parts = message["parts"]
        .as_array()
        .filter(|p| !p.is_empty())
        .ok_or_else(|| RpcError::new(INVALID_PARAMS, "`message.parts` must hold a part"))?;
    let mut texts = Vec::new();
    for part in parts {
        match part["text"].as_str() {
            Some(text) => texts.push(text),
            None => {
                return Err(RpcError::new(
                    CONTENT_TYPE_NOT_SUPPORTED,
                    "only text parts are taken (text/plain)",
                ));
            }
        }
    }
    Ok(texts.join("\n"))
}

/// The results of the client's calls a message in a waiting task gives:
/// a data part `{call_id, output, is_error}` for each, or when one call
/// alone waits (and no approval), the message's text. Empty when the
/// message answers none (an approval's answer).
pub(super) fn client_answers(
    message: &Value,
    fold: &TaskFold,
) -> Result<Vec<ClientAnswer>, RpcError> {
    let waiting = fold.client_calls();
    let parts = message["parts"].as_array().map_or(&[][..], Vec::as_slice);
    let data: Vec<&Value> = parts
        .iter()
        .filter_map(|p| p.get("data"))
        .filter(|d| d.get("call_id").is_some() && d.get("approve").is_none())
        .collect();
    if data.is_empty() {
        return match (waiting, fold.pending().is_empty()) {
            ([call_id], true) => Ok(vec![ClientAnswer::text(
                call_id,
                message_text(message)?,
                false,
            )]),
            ([], _) => Ok(Vec::new()),
            _ => Err(RpcError::new(
                INVALID_PARAMS,
                "more than one call waits: answer each with a data part {call_id, output}",
            )),
        };
    }
    data.into_iter()
        .map(|d| {
            let call_id = d["call_id"].as_str().unwrap_or_default();
            if !waiting.iter().any(|w| w == call_id) {
                return Err(RpcError::new(
                    INVALID_PARAMS,
                    format!("the task does not wait for a call {call_id:?}"),
                ));
            }
            let is_error = d["is_error"].as_bool().unwrap_or(false);
            Ok(ClientAnswer::of(call_id, &d["output"], is_error))
        })
        .collect()
}

/// The decisions a message in a waiting task gives on its `pending`
/// approvals: a data part `{call_id, approve, reason?}` for each call it
/// decides, or a message whose whole text is `approve` or `deny` (any
/// case) for every pending call. Anything else decides nothing and is
/// refused, so the calls keep waiting: a person's "nothing to add" is no
/// denial, and "yesterday's plan is fine" no approval.
pub(super) fn decisions(message: &Value, pending: &[String]) -> Result<Vec<Decision>, RpcError> {
    let parts = message["parts"].as_array().map_or(&[][..], Vec::as_slice);
    let data: Vec<&Value> = parts
        .iter()
        .filter_map(|p| p.get("data"))
        .filter(|d| d.get("approve").is_some())
        .collect();
    if data.is_empty() {
        let text = message_text(message)?;
        let approve = match text.trim().to_lowercase().as_str() {
            "approve" => true,
            "deny" => false,
            _ => {
                return Err(RpcError::new(
                    INVALID_PARAMS,
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
            let call_id = d["call_id"].as_str().unwrap_or_default();
            if !pending.iter().any(|p| p == call_id) {
                return Err(RpcError::new(
                    INVALID_PARAMS,
                    format!("the task does not wait for a decision on a call {call_id:?}"),
                ));
            }
            let approve = d["approve"]
                .as_bool()
                .ok_or_else(|| RpcError::new(INVALID_PARAMS, "`approve` must be true or false"))?;
            let reason = match &d["reason"] {
                Value::Null => None,
                Value::String(r) if r.chars().count() <= MAX_REASON_CHARS && !r.contains('\0') => {
                    Some(r.trim().to_owned()).filter(|r| !r.is_empty())
                }
                _ => {
                    return Err(RpcError::new(
                        INVALID_PARAMS,
                        format!(
                            "`reason` must be text of at most {MAX_REASON_CHARS} characters \
                             without U+0000"
                        ),
                    ));
                }
            };
            Ok(Decision {
                call_id: call_id.to_owned(),
                approve,
                reason,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn text(text: &str) -> Value {
        json!({"parts": [{"text": text}]})
    }

    #[test]
    fn proto_names_are_read_as_json_names_outside_the_clients_data() {
        let mut params = json!({
            "task_id": "t1",
            "history_length": 2,
            "message": {"context_id": "c", "parts": [{"data": {"call_id": "x"}}]},
            "configuration": {"return_immediately": true,
                "task_push_notification_config": {"url": "u", "authentication": {"scheme": "Bearer"}}},
            "metadata": {"client_tools": []},
        });
        json_names(&mut params);
        assert_eq!(params["taskId"], "t1");
        assert_eq!(params["historyLength"], 2);
        assert_eq!(params["message"]["contextId"], "c");
        assert_eq!(params["message"]["parts"][0]["data"]["call_id"], "x");
        assert_eq!(params["configuration"]["returnImmediately"], true);
        assert_eq!(
            params["configuration"]["taskPushNotificationConfig"]["url"],
            "u"
        );
        assert!(params["metadata"].get("client_tools").is_some());
        // The JSON name wins when both are given.
        let mut both = json!({"taskId": "json", "task_id": "proto"});
        json_names(&mut both);
        assert_eq!(both["taskId"], "json");
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
        let part = |data: Value| json!({"parts": [{"data": data}]});
        let decided = decisions(
            &part(json!({"call_id": "c2", "approve": false, "reason": " not now "})),
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
        for refused in [
            json!({"call_id": "c9", "approve": true}),
            json!({"call_id": "c1", "approve": "yes"}),
            json!({"call_id": "c1", "approve": false, "reason": "x".repeat(1001)}),
            json!({"call_id": "c1", "approve": false, "reason": "a\u{0}b"}),
            json!({"call_id": "c1", "approve": false, "reason": 3}),
        ] {
            assert!(
                decisions(&part(refused.clone()), &pending).is_err(),
                "{refused}"
            );
        }
    }
}
