//! `ToolArgValidator`: arguments are checked against the tool's JSON schema;
//! an invalid call is repaired where the intent is unambiguous, at most
//! [`MAX_REPAIR_ATTEMPTS`] times per call, and denied otherwise with the
//! list of what is wrong, so the model can correct itself.
//!
//! Repairs, each one attempt: arguments sent as a JSON string are parsed;
//! scalars of the wrong type are coerced where lossless (`"5"` → `5`,
//! `"true"` → `true`, `5` → `"5"`); properties the schema forbids
//! (`additionalProperties: false`) are dropped.

use serde_json::{Map, Value};

use super::state::TurnRuntimeState;
use crate::{providers::Arguments, tools::ToolSpec};

/// Repair attempts per call before it is denied.
pub const MAX_REPAIR_ATTEMPTS: u32 = 2;

/// The arguments to run with, or why the call is denied.
pub fn validate(
    state: &TurnRuntimeState,
    call_id: &str,
    spec: &ToolSpec,
    arguments: &Arguments,
) -> Result<Value, String> {
    let schema = &spec.parameters;
    let validator = spec
        .validator()
        .map_err(|e| format!("the tool's schema is invalid: {e}"))?;
    let mut arguments = match (arguments.json(), arguments.error()) {
        (Some(value), _) => value.clone(),
        (None, e) => {
            let e = e.unwrap_or_default();
            return Err(format!(
                "arguments are not valid JSON ({e}); send a JSON object"
            ));
        }
    };
    loop {
        let errors: Vec<String> = validator
            .iter_errors(&arguments)
            .map(|e| {
                let path = e.instance_path().to_string();
                if path.is_empty() {
                    e.to_string()
                } else {
                    format!("{path}: {e}")
                }
            })
            .collect();
        if errors.is_empty() {
            return Ok(arguments);
        }
        if state.repair_count(call_id) >= MAX_REPAIR_ATTEMPTS {
            return Err(describe(&errors));
        }
        state.count_repair(call_id);
        match repair(schema, &arguments) {
            Some(repaired) if repaired != arguments => arguments = repaired,
            _ => return Err(describe(&errors)),
        }
    }
}

/// The arguments a person's edit makes (see
/// [`crate::service::ApprovalTerms`]), checked as a model's call is, its
/// repairs included, outside any turn.
pub fn check(spec: &ToolSpec, arguments: &Arguments) -> Result<Value, String> {
    let state = TurnRuntimeState::new(
        crate::ids::SessionKey::from_stored(""),
        super::budget::TurnBudget::create(super::budget::BudgetLimits::default()),
    );
    validate(&state, "edit", spec, arguments)
}

/// The SHA-256 of arguments, hex: of their JSON with every object's keys
/// in order, so that equal arguments hash alike however their keys came.
pub fn arguments_sha256(arguments: &Value) -> String {
    use sha2::{Digest, Sha256};
    fn canonical(value: &Value, out: &mut String) {
        match value {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                out.push('{');
                for (n, key) in keys.into_iter().enumerate() {
                    if n > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(key.clone()).to_string());
                    out.push(':');
                    if let Some(item) = map.get(key) {
                        canonical(item, out);
                    }
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (n, item) in items.iter().enumerate() {
                    if n > 0 {
                        out.push(',');
                    }
                    canonical(item, out);
                }
                out.push(']');
            }
            scalar => out.push_str(&scalar.to_string()),
        }
    }
    let mut text = String::new();
    canonical(arguments, &mut text);
    hex::encode(Sha256::digest(text.as_bytes()))
}

fn describe(errors: &[String]) -> String {
    format!(
        "invalid arguments: {}. Fix the arguments to match the tool's schema and call it again.",
        errors.join("; ")
    )
}

/// One repair pass, `None` when nothing could be repaired.
fn repair(schema: &Value, arguments: &Value) -> Option<Value> {
    if let Value::String(text) = arguments
        && let Ok(parsed @ Value::Object(_)) = serde_json::from_str::<Value>(text)
    {
        return Some(parsed);
    }
    let Value::Object(map) = arguments else {
        return None;
    };
    let properties = schema.get("properties").and_then(Value::as_object);
    let closed = schema.get("additionalProperties") == Some(&Value::Bool(false));
    let mut repaired = Map::new();
    for (key, value) in map {
        let property = properties.and_then(|p| p.get(key));
        match property {
            None if closed => continue,
            None => {
                repaired.insert(key.clone(), value.clone());
            }
            Some(property) => {
                let coerced = property
                    .get("type")
                    .and_then(Value::as_str)
                    .and_then(|ty| coerce(value, ty))
                    .unwrap_or_else(|| value.clone());
                repaired.insert(key.clone(), coerced);
            }
        }
    }
    let repaired = Value::Object(repaired);
    (&repaired != arguments).then_some(repaired)
}

/// A lossless conversion of `value` to the JSON type `ty`.
fn coerce(value: &Value, ty: &str) -> Option<Value> {
    match (ty, value) {
        ("integer", Value::String(s)) => s.trim().parse::<i64>().ok().map(Value::from),
        ("integer", Value::Number(n)) => n
            .as_f64()
            .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
            .map(|f| Value::from(f as i64)),
        ("number", Value::String(s)) => s
            .trim()
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map(Value::Number),
        ("boolean", Value::String(s)) => match s.trim() {
            "true" => Some(Value::Bool(true)),
            "false" => Some(Value::Bool(false)),
            _ => None,
        },
        ("string", Value::Number(n)) => Some(Value::String(n.to_string())),
        ("string", Value::Bool(b)) => Some(Value::String(b.to_string())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::budget::{BudgetLimits, TurnBudget};
    use serde_json::json;

    fn state() -> TurnRuntimeState {
        TurnRuntimeState::new("s", TurnBudget::create(BudgetLimits::default()))
    }

    fn schema() -> ToolSpec {
        ToolSpec::new(
            "search",
            "",
            schema_json(),
            crate::tools::EffectClass::ReadOnly,
        )
    }

    fn schema_json() -> Value {
        json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1},
                "top_k": {"type": "integer", "minimum": 1},
                "exact": {"type": "boolean"}
            },
            "required": ["query"],
            "additionalProperties": false
        })
    }

    /// The schema is compiled once for a tool and its clones, not at every
    /// call (before, every validated call compiled it again).
    #[test]
    fn a_tools_schema_is_compiled_once() {
        let spec = schema();
        let clone = spec.clone();
        let first: *const jsonschema::Validator = spec.validator().unwrap();
        let again: *const jsonschema::Validator = clone.validator().unwrap();
        assert!(std::ptr::eq(first, again));
        let state = state();
        validate(&state, "c1", &clone, &r#"{"query":"x"}"#.into()).unwrap();
        assert!(std::ptr::eq(first, spec.validator().unwrap()));
    }

    #[test]
    fn valid_arguments_pass_untouched() {
        let state = state();
        let args = validate(
            &state,
            "c1",
            &schema(),
            &r#"{"query":"x","top_k":3}"#.into(),
        )
        .unwrap();
        assert_eq!(args, json!({"query": "x", "top_k": 3}));
        assert_eq!(state.repair_count("c1"), 0);
    }

    #[test]
    fn wrong_scalar_types_and_extra_fields_are_repaired_once() {
        let state = state();
        let args = validate(
            &state,
            "c1",
            &schema(),
            &r#"{"query":"x","top_k":"3","exact":"true","mood":"happy"}"#.into(),
        )
        .unwrap();
        assert_eq!(args, json!({"query": "x", "top_k": 3, "exact": true}));
        assert_eq!(state.repair_count("c1"), 1);
    }

    #[test]
    fn arguments_sent_as_a_json_string_are_parsed() {
        let state = state();
        let raw = serde_json::to_string(&json!(r#"{"query":"x"}"#)).unwrap();
        assert_eq!(
            validate(&state, "c1", &schema(), &raw.into()).unwrap(),
            json!({"query": "x"})
        );
    }

    #[test]
    fn what_cannot_be_repaired_is_denied_with_the_reasons() {
        let state = state();
        let err = validate(&state, "c1", &schema(), &r#"{"top_k":"many"}"#.into()).unwrap_err();
        assert!(err.contains("\"query\" is a required property"), "{err}");
        assert!(err.contains("/top_k"), "{err}");
        assert!(state.repair_count("c1") <= MAX_REPAIR_ATTEMPTS);
    }

    #[test]
    fn repairs_stop_at_the_limit() {
        let state = state();
        state.count_repair("c1");
        state.count_repair("c1");
        let err = validate(
            &state,
            "c1",
            &schema(),
            &r#"{"query":"x","top_k":"3"}"#.into(),
        )
        .unwrap_err();
        assert!(err.contains("/top_k"), "{err}");
        assert_eq!(state.repair_count("c1"), MAX_REPAIR_ATTEMPTS);
    }

    #[test]
    fn broken_json_is_denied() {
        let state = state();
        let err = validate(&state, "c1", &schema(), &r#"{"query": "#.into()).unwrap_err();
        assert!(err.contains("not valid JSON"), "{err}");
    }
}
