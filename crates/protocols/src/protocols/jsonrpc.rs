//! JSON-RPC 2.0 messages, for the protocols that speak it (A2A, MCP).

use serde::Serialize;
use serde_json::Value;

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;

/// `"jsonrpc": "2.0"`.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub enum Version {
    #[default]
    #[serde(rename = "2.0")]
    V2,
}

/// The answer of a request.
#[derive(Debug, Serialize)]
pub struct Answer<'a, T> {
    pub jsonrpc: Version,
    pub id: &'a Value,
    pub result: T,
}

/// The error of a request.
#[derive(Debug, Serialize)]
pub struct Failure<'a> {
    pub jsonrpc: Version,
    pub id: &'a Value,
    pub error: ErrorObject<'a>,
}

/// A JSON-RPC error's code and message, and what more it says.
#[derive(Debug, Serialize)]
pub struct ErrorObject<'a> {
    pub code: i64,
    pub message: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

/// JSON written in the source (a form's or a schema's text), said as it
/// is written: borrowed, never parsed into a `Value` to be printed again.
/// A test of each constant's holds it to be JSON.
#[derive(Debug, Clone, Copy)]
pub struct JsonText(pub &'static str);

impl Serialize for JsonText {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let raw: &serde_json::value::RawValue =
            serde_json::from_str(self.0).map_err(serde::ser::Error::custom)?;
        raw.serialize(serializer)
    }
}

/// A result with nothing in it: `{}`.
#[derive(Debug, Default, Serialize)]
pub struct Empty {}

/// The answer of request `id`.
pub fn result(id: &Value, result: impl Serialize) -> Value {
    to_value(&Answer {
        jsonrpc: Version::V2,
        id,
        result,
    })
}

/// The error of request `id`.
pub fn error(id: &Value, code: i64, message: &str) -> Value {
    error_with(id, code, message, None)
}

/// The error of request `id`, with its `data`.
pub fn error_with(id: &Value, code: i64, message: &str, data: Option<Value>) -> Value {
    to_value(&Failure {
        jsonrpc: Version::V2,
        id,
        error: ErrorObject {
            code,
            message,
            data,
        },
    })
}

/// A typed message as a JSON value. Every type serialised here has
/// string keys only, so this cannot fail; if it ever did, the message is
/// `null` and the failure is logged.
pub fn to_value(message: &impl Serialize) -> Value {
    serde_json::to_value(message).unwrap_or_else(|e| {
        tracing::error!(error = %e, "a message could not be serialised");
        Value::Null
    })
}

/// Whether `message` is a JSON-RPC 2.0 message (an object whose `jsonrpc`
/// is `"2.0"`).
pub fn is_message(message: &Value) -> bool {
    message.get("jsonrpc").and_then(Value::as_str) == Some("2.0")
}

/// The longest string id (or MCP `progressToken`) taken: every answer and
/// every streamed frame of a request echoes its id.
pub const MAX_ID_CHARS: usize = 128;

/// Whether `id` may be echoed: a string of at most [`MAX_ID_CHARS`]
/// characters, a number or null. (Unbounded, a 900 KB id came back on
/// every frame of a stream.)
pub fn valid_id(id: &Value) -> bool {
    match id {
        Value::Null | Value::Number(_) => true,
        Value::String(id) => id.chars().count() <= MAX_ID_CHARS,
        _ => false,
    }
}

/// The error for an id [`valid_id`] refuses, answered with `id: null`.
pub fn invalid_id() -> Value {
    error(
        &Value::Null,
        INVALID_REQUEST,
        &format!("`id` must be a string of at most {MAX_ID_CHARS} characters, a number or null"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_short_strings_numbers_and_null_are_ids() {
        for id in [
            Value::Null,
            Value::from(7),
            Value::from(-1.5),
            Value::from("a"),
            Value::from("é".repeat(128)),
        ] {
            assert!(valid_id(&id), "{id}");
        }
        let object = Value::Object([("a".to_owned(), Value::from(1))].into_iter().collect());
        for id in [
            Value::from("x".repeat(129)),
            Value::from(vec![1]),
            object,
            Value::Bool(true),
        ] {
            assert!(!valid_id(&id), "{id}");
        }
    }
}
