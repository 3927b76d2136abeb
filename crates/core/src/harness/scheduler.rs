//! `ToolScheduler`: splits a step's tool calls into waves.
//!
//! | rule | waves |
//! |---|---|
//! | one call, or parallel disabled | one sequential wave per call |
//! | READ_ONLY calls with disjoint resource keys | one parallel wave |
//! | READ_ONLY calls whose keys overlap | split: a new wave at the overlap |
//! | LOCAL_WRITE / NETWORK / DESTRUCTIVE (or unknown) | one call per wave |
//!
//! Waves run in call order, so effects happen in the order the model asked.

use std::collections::HashSet;

use serde_json::Value;

use crate::{
    providers::ToolCall,
    tools::{EffectClass, ToolRegistry},
};

/// A set of calls that run together; `calls` are indices into the step's calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wave {
    pub calls: Vec<usize>,
    pub parallel: bool,
}

/// Plans the waves of `calls`.
pub fn schedule(calls: &[ToolCall], registry: &ToolRegistry, parallel_enabled: bool) -> Vec<Wave> {
    if calls.len() <= 1 || !parallel_enabled {
        return (0..calls.len())
            .map(|i| Wave {
                calls: vec![i],
                parallel: false,
            })
            .collect();
    }
    let mut waves = Vec::new();
    let mut group: Vec<usize> = Vec::new();
    let mut keys: HashSet<String> = HashSet::new();
    let close = |group: &mut Vec<usize>, keys: &mut HashSet<String>, waves: &mut Vec<Wave>| {
        if !group.is_empty() {
            waves.push(Wave {
                parallel: group.len() > 1,
                calls: std::mem::take(group),
            });
            keys.clear();
        }
    };
    for (i, call) in calls.iter().enumerate() {
        let tool = registry.get(&call.name);
        let read_only = tool.is_some_and(|t| t.spec().effect == EffectClass::ReadOnly);
        if !read_only {
            close(&mut group, &mut keys, &mut waves);
            waves.push(Wave {
                calls: vec![i],
                parallel: false,
            });
            continue;
        }
        let arguments = call.arguments.json().unwrap_or(&Value::Null);
        let call_keys = tool.map(|t| t.resource_keys(arguments)).unwrap_or_default();
        if call_keys.iter().any(|k| keys.contains(k)) {
            close(&mut group, &mut keys, &mut waves);
        }
        keys.extend(call_keys);
        group.push(i);
    }
    close(&mut group, &mut keys, &mut waves);
    waves
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::{PermissionMode, Tool, ToolContext, ToolError, ToolOutput, ToolSpec};
    use async_trait::async_trait;
    use serde_json::json;
    use std::sync::Arc;

    struct Probe(ToolSpec);

    #[async_trait]
    impl Tool for Probe {
        fn spec(&self) -> &ToolSpec {
            &self.0
        }
        fn resource_keys(&self, arguments: &Value) -> Vec<String> {
            arguments["key"]
                .as_str()
                .map(|k| vec![k.to_owned()])
                .unwrap_or_default()
        }
        async fn call(&self, _: ToolContext, _: Value) -> Result<ToolOutput, ToolError> {
            Ok(ToolOutput::default())
        }
    }

    fn registry() -> ToolRegistry {
        let tool = |name: &str, effect| Arc::new(Probe(ToolSpec::new(name, "", json!({}), effect)));
        ToolRegistry::new(PermissionMode::Auto)
            .register(tool("read", EffectClass::ReadOnly))
            .register(tool("write", EffectClass::LocalWrite))
            .register(tool("fetch", EffectClass::Network))
            .register(tool("delete", EffectClass::Destructive))
    }

    fn call(name: &str, key: &str) -> ToolCall {
        ToolCall {
            id: format!("{name}-{key}"),
            name: name.into(),
            arguments: json!({ "key": key }).to_string().into(),
        }
    }

    fn plan(calls: &[ToolCall], parallel: bool) -> Vec<(Vec<usize>, bool)> {
        schedule(calls, &registry(), parallel)
            .into_iter()
            .map(|w| (w.calls, w.parallel))
            .collect()
    }

    #[test]
    fn a_single_call_is_sequential() {
        assert_eq!(plan(&[call("read", "a")], true), [(vec![0], false)]);
    }

    #[test]
    fn parallel_disabled_runs_everything_one_by_one() {
        let calls = [call("read", "a"), call("read", "b")];
        assert_eq!(plan(&calls, false), [(vec![0], false), (vec![1], false)]);
    }

    #[test]
    fn disjoint_reads_share_one_parallel_wave() {
        let calls = [call("read", "a"), call("read", "b"), call("read", "c")];
        assert_eq!(plan(&calls, true), [(vec![0, 1, 2], true)]);
    }

    #[test]
    fn overlapping_reads_are_split() {
        let calls = [
            call("read", "a"),
            call("read", "b"),
            call("read", "a"),
            call("read", "c"),
        ];
        assert_eq!(plan(&calls, true), [(vec![0, 1], true), (vec![2, 3], true)]);
    }

    #[test]
    fn effects_run_alone_and_in_order() {
        let calls = [
            call("read", "a"),
            call("read", "b"),
            call("write", "a"),
            call("fetch", "x"),
            call("read", "c"),
            call("delete", "d"),
            call("unknown", "e"),
        ];
        assert_eq!(
            plan(&calls, true),
            [
                (vec![0, 1], true),
                (vec![2], false),
                (vec![3], false),
                (vec![4], false),
                (vec![5], false),
                (vec![6], false),
            ]
        );
    }
}
