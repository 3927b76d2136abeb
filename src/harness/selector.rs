//! `SemanticToolSelector`: when more tools are registered than
//! `max_tools_per_turn`, keep the ones most related to the query.
//!
//! Relatedness is lexical: the share of the query's words found in the
//! tool's name and description (no embedding model is available offline).
//! Ties keep registration order.

use std::{collections::HashSet, sync::Arc};

use crate::tools::Tool;

fn words(text: &str) -> HashSet<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.len() > 2)
        .map(|w| w.to_lowercase())
        .collect()
}

/// The `max` tools most related to `query`, in registration order.
pub fn select<'a>(
    tools: Vec<&'a Arc<dyn Tool>>,
    query: &str,
    max: usize,
) -> Vec<&'a Arc<dyn Tool>> {
    if tools.len() <= max {
        return tools;
    }
    let query = words(query);
    let mut scored: Vec<(usize, usize, &Arc<dyn Tool>)> = tools
        .into_iter()
        .enumerate()
        .map(|(order, tool)| {
            let spec = tool.spec();
            let mut text = words(&spec.description);
            text.extend(words(&spec.name.replace('_', " ")));
            (query.intersection(&text).count(), order, tool)
        })
        .collect();
    scored.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    scored.truncate(max);
    scored.sort_by_key(|(_, order, _)| *order);
    scored.into_iter().map(|(_, _, tool)| tool).collect()
}
