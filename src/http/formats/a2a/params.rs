//! What the A2A methods read from their params and messages: a task's
//! id, a history length, a message's text, and the results of the
//! client's calls a message in a waiting task gives.

use serde_json::Value;
use uuid::Uuid;

use super::{CONTENT_TYPE_NOT_SUPPORTED, RpcError, TASK_NOT_FOUND, task::TaskFold};
use crate::http::formats::{client_calls::ClientAnswer, jsonrpc::INVALID_PARAMS};

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
        n => n
            .as_u64()
            .map(|n| Some(n as usize))
            .ok_or_else(|| RpcError::new(INVALID_PARAMS, "`historyLength` must be a count")),
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
        .filter(|d| d.get("call_id").is_some())
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
