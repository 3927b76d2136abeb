//! `ReplayControl`: the model asking again for a call that already ran
//! successfully in this turn (same tool, same arguments) is told so instead
//! of running it twice. Failed or denied calls may be retried.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
};

use serde_json::Value;

use super::prepare::canonical_json;

/// Per-turn record of completed calls, by tool and canonical arguments.
#[derive(Debug, Default)]
pub struct ReplayControl {
    completed: Mutex<HashMap<(String, String), String>>,
}

impl ReplayControl {
    fn key(tool: &str, arguments: &str) -> (String, String) {
        let canonical = serde_json::from_str::<Value>(arguments)
            .map(|v| canonical_json(&v))
            .unwrap_or_else(|_| arguments.trim().to_owned());
        (tool.to_owned(), canonical)
    }

    /// The call id of an earlier identical call that completed, if any.
    pub fn should_skip(&self, tool: &str, arguments: &str) -> Option<String> {
        self.completed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&Self::key(tool, arguments))
            .cloned()
    }

    /// Every completed call, `(tool, canonical arguments, call id)`, sorted.
    pub fn completed(&self) -> Vec<(String, String, String)> {
        let mut calls: Vec<_> = self
            .completed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|((tool, arguments), call)| (tool.clone(), arguments.clone(), call.clone()))
            .collect();
        calls.sort();
        calls
    }

    /// The gate as [`Self::completed`] left it.
    pub fn restore(calls: &[(String, String, String)]) -> Self {
        let completed = calls
            .iter()
            .map(|(tool, arguments, call)| ((tool.clone(), arguments.clone()), call.clone()))
            .collect();
        Self {
            completed: std::sync::Mutex::new(completed),
        }
    }

    /// Records a completed call.
    pub fn record_completed(&self, tool: &str, arguments: &str, call_id: &str) {
        self.completed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(Self::key(tool, arguments))
            .or_insert_with(|| call_id.to_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_calls_match_whatever_the_key_order() {
        let replay = ReplayControl::default();
        assert_eq!(replay.should_skip("search", r#"{"q":"a","k":1}"#), None);
        replay.record_completed("search", r#"{"q":"a","k":1}"#, "call_1");
        assert_eq!(
            replay
                .should_skip("search", r#"{"k":1, "q":"a"}"#)
                .as_deref(),
            Some("call_1")
        );
        assert_eq!(replay.should_skip("search", r#"{"q":"b","k":1}"#), None);
        assert_eq!(replay.should_skip("other", r#"{"q":"a","k":1}"#), None);
    }
}
