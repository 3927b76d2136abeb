//! Built-in tools over the store: `get_context_pack` and `local_search`.
//!
//! Until the vault exists, the knowledge they search is the session's own
//! stored history: past questions and answers that match the query. Anchors
//! are `messages/{id}`.

use std::{collections::HashSet, sync::Arc};

use async_trait::async_trait;
use serde_json::{Value, json};

use super::{
    Citation, EffectClass, Tool, ToolContext, ToolError, ToolErrorKind, ToolOutput, ToolSpec,
};
use crate::store::{MessageRecord, Store};

/// Common words that say nothing about what to look for.
const STOPWORDS: &[&str] = &[
    "the", "and", "for", "are", "but", "not", "you", "your", "with", "have", "this", "that",
    "what", "when", "where", "which", "who", "how", "why", "was", "were", "can", "could", "would",
    "should", "about", "from", "into", "there", "their", "them", "they", "then", "than", "been",
    "being", "does", "did", "done", "just", "like", "some", "any", "all", "my", "me", "our", "its",
    "it's", "is", "of", "to", "in", "on", "a", "an", "do",
];

/// The words of a query worth searching for, lower-case, deduplicated.
pub fn query_terms(query: &str) -> Vec<String> {
    let mut seen = HashSet::new();
    query
        .split(|c: char| !c.is_alphanumeric())
        .map(str::to_lowercase)
        .filter(|w| w.chars().count() > 2 && !STOPWORDS.contains(&w.as_str()))
        .filter(|w| seen.insert(w.clone()))
        .collect()
}

/// Stored messages of the session matching `query`, best first (most
/// terms, then newest).
async fn search(
    store: &dyn Store,
    ctx: &ToolContext,
    query: &str,
    top_k: usize,
) -> Result<Vec<(usize, MessageRecord)>, ToolError> {
    let terms = query_terms(query);
    // A session's first turn has nothing stored to search: its history is
    // written when a turn completes.
    if terms.is_empty() || ctx.turn_number <= 1 {
        return Ok(Vec::new());
    }
    let session_id = ctx.session_id.as_str();
    let turn = ctx.turn_id.to_string();
    let exclude_turn = Some(turn.as_str());
    let candidates = store
        .search_messages(session_id, &terms, 200)
        .await
        .map_err(|e| ToolError::new(ToolErrorKind::Unavailable, e.to_string(), true))?;
    let mut scored: Vec<(usize, MessageRecord)> = candidates
        .into_iter()
        .filter(|m| exclude_turn.is_none_or(|t| m.turn_id.to_string() != t))
        .map(|m| {
            let text = m.content.to_lowercase();
            (
                terms.iter().filter(|t| text.contains(t.as_str())).count(),
                m,
            )
        })
        .collect();
    // Candidates come newest first; a stable sort keeps that among equals.
    scored.sort_by_key(|(hits, _)| std::cmp::Reverse(*hits));
    scored.truncate(top_k);
    Ok(scored)
}

fn anchor(message: &MessageRecord) -> String {
    format!("messages/{}", message.id)
}

fn snippet(text: &str, max: usize) -> String {
    let flat = text.replace('\n', " ");
    match flat.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &flat[..at]),
        None => flat,
    }
}

fn query_schema(description: &str) -> Value {
    json!({
        "type": "object",
        "properties": {
            "query": {"type": "string", "minLength": 1, "description": description},
            "top_k": {"type": "integer", "minimum": 1, "maximum": 50, "description": "How many results (default: the turn's top_k)."}
        },
        "required": ["query"],
        "additionalProperties": false
    })
}

fn parse_query(arguments: &Value, ctx: &ToolContext) -> Result<(String, usize), ToolError> {
    let query = arguments["query"]
        .as_str()
        .filter(|q| !q.trim().is_empty())
        .ok_or_else(|| ToolError::new(ToolErrorKind::InvalidInput, "`query` is required", true))?;
    let top_k = arguments["top_k"]
        .as_u64()
        .unwrap_or(u64::from(ctx.top_k))
        .clamp(1, 50);
    Ok((query.to_owned(), usize::try_from(top_k).unwrap_or(8)))
}

/// `get_context_pack`: the facts relevant to a query, as a JSON pack.
pub struct GetContextPack {
    store: Arc<dyn Store>,
    spec: ToolSpec,
}

impl GetContextPack {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self {
            store,
            spec: ToolSpec::new(
                "get_context_pack",
                "Get a pack of stored facts relevant to a query, as JSON: relevant_facts \
                 (anchor, role, text) and preferences.",
                query_schema("What the facts should be about."),
                EffectClass::ReadOnly,
            ),
        }
    }
}

#[async_trait]
impl Tool for GetContextPack {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, ctx: ToolContext, arguments: Value) -> Result<ToolOutput, ToolError> {
        let (query, top_k) = parse_query(&arguments, &ctx)?;
        let found = search(self.store.as_ref(), &ctx, &query, top_k).await?;
        let facts: Vec<Value> = found
            .iter()
            .map(|(_, m)| json!({"anchor": anchor(m), "role": m.role, "text": snippet(&m.content, 600)}))
            .collect();
        Ok(ToolOutput {
            content: json!({ "relevant_facts": facts, "preferences": [] }).to_string(),
            citations: found
                .iter()
                .map(|(_, m)| Citation::Local { anchor: anchor(m) })
                .collect(),
        })
    }
}

/// `local_search`: search the stored knowledge for a query.
pub struct LocalSearch {
    store: Arc<dyn Store>,
    spec: ToolSpec,
}

impl LocalSearch {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self {
            store,
            spec: ToolSpec::new(
                "local_search",
                "Search the stored notes and past conversation of this session for a query; \
                 returns matching passages with their anchors.",
                query_schema("Words to look for."),
                EffectClass::ReadOnly,
            ),
        }
    }
}

#[async_trait]
impl Tool for LocalSearch {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, ctx: ToolContext, arguments: Value) -> Result<ToolOutput, ToolError> {
        let (query, top_k) = parse_query(&arguments, &ctx)?;
        let found = search(self.store.as_ref(), &ctx, &query, top_k).await?;
        if found.is_empty() {
            return Ok(ToolOutput::text(format!("No results for {query:?}.")));
        }
        let content = found
            .iter()
            .map(|(_, m)| {
                format!(
                    "- [{}] ({}) {}",
                    anchor(m),
                    m.role,
                    snippet(&m.content, 400)
                )
            })
            .collect::<Vec<_>>()
            .join("\n");
        Ok(ToolOutput {
            content,
            citations: found
                .iter()
                .map(|(_, m)| Citation::Local { anchor: anchor(m) })
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_terms_drop_short_and_common_words() {
        assert_eq!(
            query_terms("What are my open loops for the Paris project? Paris!"),
            ["open", "loops", "paris", "project"]
        );
    }
}
