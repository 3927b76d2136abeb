//! `ReplayControl`: the model asking again for a call that already ran
//! successfully in this turn (same tool, same arguments) is told so instead
//! of running it twice. Failed or denied calls may be retried.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
};

use crate::providers::Arguments;

use super::prepare::canonical_json;

/// Per-turn record of completed calls, by tool and canonical arguments.
#[derive(Debug, Default)]
pub struct ReplayControl {
    completed: Mutex<HashMap<(String, String), String>>,
}

impl ReplayControl {
    fn key(tool: &str, arguments: &Arguments) -> (String, String) {
        let canonical = arguments
            .json()
            .map_or_else(|| arguments.raw().trim().to_owned(), canonical_json);
        (tool.to_owned(), canonical)
    }

    /// The call id of an earlier identical call that completed, if any.
    pub fn should_skip(&self, tool: &str, arguments: &Arguments) -> Option<String> {
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
    pub fn record_completed(&self, tool: &str, arguments: &Arguments, call_id: &str) {
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
        assert_eq!(
            replay.should_skip("search", &r#"{"q":"a","k":1}"#.into()),
            None
        );
        replay.record_completed("search", &r#"{"q":"a","k":1}"#.into(), "call_1");
        assert_eq!(
            replay
                .should_skip("search", &r#"{"k":1, "q":"a"}"#.into())
                .as_deref(),
            Some("call_1")
        );
        assert_eq!(
            replay.should_skip("search", &r#"{"q":"b","k":1}"#.into()),
            None
        );
        assert_eq!(
            replay.should_skip("other", &r#"{"q":"a","k":1}"#.into()),
            None
        );
    }
}
