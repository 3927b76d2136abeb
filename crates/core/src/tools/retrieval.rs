//! The retrieval tools: `get_context_pack` (the facts stage 1 of a turn
//! puts in the prompt) and `local_search`, over the vault's full-text index
//! and, for `local_search`, the session's past conversation.
//!
//! Anchors: `notes/project.md#Open loops` for a vault chunk,
//! `messages/{id}` for a stored message. They become the turn's local
//! citations.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};

use super::{
    Citation, EffectClass, Tool, ToolContext, ToolError, ToolErrorKind, ToolOutput, ToolSpec,
};
use crate::{
    store::{MessageRecord, Turns, VaultHit},
    vault::{Vault, Vaults, query_terms},
};

/// Stored messages of the session matching `query`, best first (most
/// terms, then newest).
async fn search_messages(
    store: &dyn Turns,
    ctx: &ToolContext,
    query: &str,
    top_k: usize,
) -> Result<Vec<MessageRecord>, ToolError> {
    let terms = query_terms(query);
    // A session's first turn has nothing stored to search: its history is
    // written when a turn completes.
    if terms.is_empty() || ctx.turn_number <= 1 {
        return Ok(Vec::new());
    }
    let turn = ctx.turn_id.to_string();
    let candidates = store
        .search_messages(&ctx.session_id, &terms, 200)
        .await
        .map_err(unavailable)?;
    let mut scored: Vec<(usize, MessageRecord)> = candidates
        .into_iter()
        .filter(|m| m.turn_id.to_string() != turn)
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
    Ok(scored.into_iter().map(|(_, m)| m).collect())
}

fn unavailable(e: impl std::fmt::Display) -> ToolError {
    ToolError::new(ToolErrorKind::Unavailable, e.to_string(), true)
}

async fn search_vault(
    vault: &Vault,
    query: &str,
    top_k: usize,
) -> Result<Vec<VaultHit>, ToolError> {
    vault
        .search(query, u32::try_from(top_k).unwrap_or(50))
        .await
        .map_err(unavailable)
}

fn message_anchor(message: &MessageRecord) -> String {
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

/// `get_context_pack`: the vault's facts relevant to a query, as a JSON
/// pack (`relevant_facts`: anchor, heading, text, score; `preferences`).
pub struct GetContextPack {
    vaults: Arc<Vaults>,
    spec: ToolSpec,
}

impl GetContextPack {
    pub fn new(vaults: Arc<Vaults>) -> Self {
        Self {
            vaults,
            spec: ToolSpec::new(
                "get_context_pack",
                "Get a pack of facts from the user's notes relevant to a query, as JSON: \
                 relevant_facts (anchor, heading, text, score) and preferences.",
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
        let vault = self.vaults.of_session(&ctx.session_id);
        let hits = search_vault(&vault, &query, top_k).await?;
        let facts: Vec<Value> = hits
            .iter()
            .map(|hit| {
                json!({
                    "anchor": hit.anchor,
                    "heading": hit.heading,
                    "text": snippet(&hit.text, 600),
                    "score": (hit.score * 1000.0).round() / 1000.0,
                })
            })
            .collect();
        Ok(ToolOutput {
            content: json!({ "relevant_facts": facts, "preferences": [] }).to_string(),
            citations: hits
                .into_iter()
                .map(|hit| Citation::Local { anchor: hit.anchor })
                .collect(),
        })
    }
}

/// `local_search`: the notes and the session's past conversation matching
/// a query.
pub struct LocalSearch {
    store: Arc<dyn Turns>,
    vaults: Arc<Vaults>,
    spec: ToolSpec,
}

impl LocalSearch {
    pub fn new(store: Arc<dyn Turns>, vaults: Arc<Vaults>) -> Self {
        Self {
            store,
            vaults,
            spec: ToolSpec::new(
                "local_search",
                "Search the user's notes and the past conversation of this session for a \
                 query; returns matching passages with their anchors (read a whole note with \
                 read_note).",
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
        let vault = self.vaults.of_session(&ctx.session_id);
        let (notes, messages) = tokio::join!(
            search_vault(&vault, &query, top_k),
            search_messages(self.store.as_ref(), &ctx, &query, top_k)
        );
        let (notes, messages) = (notes?, messages?);
        if notes.is_empty() && messages.is_empty() {
            return Ok(ToolOutput::text(format!("No results for {query:?}.")));
        }
        let lines = notes
            .iter()
            .map(|hit| format!("- [{}] {}", hit.anchor, snippet(&hit.text, 400)))
            .chain(messages.iter().map(|m| {
                format!(
                    "- [{}] ({}) {}",
                    message_anchor(m),
                    m.role,
                    snippet(&m.content, 400)
                )
            }))
            .collect::<Vec<_>>();
        let citations = notes
            .into_iter()
            .map(|hit| hit.anchor)
            .chain(messages.iter().map(message_anchor))
            .map(|anchor| Citation::Local { anchor })
            .collect();
        Ok(ToolOutput {
            content: lines.join("\n"),
            citations,
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

    #[test]
    fn a_snippet_is_cut_at_a_character() {
        assert_eq!(snippet("héllo\nwörld", 7), "héllo w…");
        assert_eq!(snippet("short", 7), "short");
    }
}
