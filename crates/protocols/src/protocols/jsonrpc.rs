//! JSON-RPC 2.0 messages, for the protocols that speak it (A2A, MCP).

use serde_json::{Value, json};

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;

/// The answer of request `id`.
pub fn result(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// The error of request `id`.
pub fn error(id: &Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
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
    use serde_json::json;

    use super::*;

    #[test]
    fn only_short_strings_numbers_and_null_are_ids() {
        for id in [
            json!(null),
            json!(7),
            json!(-1.5),
            json!("a"),
            json!("é".repeat(128)),
        ] {
            assert!(valid_id(&id), "{id}");
        }
        for id in [
            json!("x".repeat(129)),
            json!([1]),
            json!({"a": 1}),
            json!(true),
        ] {
            assert!(!valid_id(&id), "{id}");
        }
    }
}
