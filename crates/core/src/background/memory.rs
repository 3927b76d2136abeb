//! Memory: retrieval for stage 1 of a turn (the scope's facts relevant to
//! the message, and its preferences), and extraction queued as a job.

use std::{collections::HashMap, sync::Arc};

use async_trait::async_trait;
use chrono::Utc;
use serde::{Deserialize, Serialize};

use super::{JOB_MEMORY, new_job_id};
use crate::{
    hooks::{HookError, MemoryContext, MemoryExtractor, MemoryRetriever, MemoryTurn},
    providers::embeddings::{Embedder, cosine},
    store::{Jobs, MemoryQuery, MemoryRecord, NewJob, memories::MEMORIES_PER_SCOPE},
    vault::query_terms,
};

/// Preferences merged into a turn's context pack, at most.
const PREFERENCES_MAX: u32 = 20;

/// What a memory extraction job needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtractionJob {
    pub scope: String,
    pub session_id: String,
    pub turn_id: String,
    pub user_message: String,
    pub assistant_message: String,
    pub provider: String,
    pub model: String,
}

/// Memory retrieval for stage 1: the scope's facts relevant to the
/// message (full text; fused with meaning when an embedder is set) and its
/// preferences.
pub struct StoreMemory {
    store: Arc<dyn Jobs>,
    embedder: Option<Arc<dyn Embedder>>,
    top_k: u32,
}

impl StoreMemory {
    pub fn new(store: Arc<dyn Jobs>, embedder: Option<Arc<dyn Embedder>>, top_k: u32) -> Self {
        Self {
            store,
            embedder,
            top_k,
        }
    }

    /// The ids of the scope's memories nearest `query` in meaning.
    async fn nearest(&self, scope: &str, query: &str) -> Vec<String> {
        let Some(embedder) = &self.embedder else {
            return Vec::new();
        };
        let wanted = match embedder.embed(&[query.to_owned()]).await {
            Ok(mut vectors) => vectors.pop().unwrap_or_default(),
            Err(e) => {
                tracing::warn!(error = %e, "memory retrieval by meaning unavailable");
                return Vec::new();
            }
        };
        let vectors = match self.store.memory_vectors(scope, embedder.model_id()).await {
            Ok(vectors) => vectors,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the memories' embeddings");
                return Vec::new();
            }
        };
        let mut scored: Vec<(f32, String)> = vectors
            .into_iter()
            .map(|(id, vector)| (cosine(&wanted, &vector), id))
            .filter(|(similarity, _)| *similarity > 0.3)
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        scored.truncate(self.top_k as usize);
        scored.into_iter().map(|(_, id)| id).collect()
    }
}

#[async_trait]
impl MemoryRetriever for StoreMemory {
    async fn retrieve_for_context(
        &self,
        scope: &str,
        query: &str,
    ) -> Result<MemoryContext, HookError> {
        let wanted = MemoryQuery {
            scope: scope.to_owned(),
            terms: query_terms(query),
            limit: self.top_k,
            preferences: PREFERENCES_MAX,
        };
        let (read, by_meaning) = tokio::join!(
            self.store.memories_for_turn(&wanted),
            self.nearest(scope, query),
        );
        self.fuse(scope, read.map_err(HookError::new)?, by_meaning)
            .await
    }

    fn store_query(&self, scope: &str, query: &str) -> Option<MemoryQuery> {
        Some(MemoryQuery {
            scope: scope.to_owned(),
            terms: query_terms(query),
            limit: self.top_k,
            preferences: PREFERENCES_MAX,
        })
    }

    async fn retrieve_with(
        &self,
        scope: &str,
        query: &str,
        read: (Vec<MemoryRecord>, Vec<MemoryRecord>),
    ) -> Result<MemoryContext, HookError> {
        let by_meaning = self.nearest(scope, query).await;
        self.fuse(scope, read, by_meaning).await
    }
}

impl StoreMemory {
    /// The context from the matches by words and the preferences (`read`)
    /// and the ids nearest in meaning.
    async fn fuse(
        &self,
        scope: &str,
        read: (Vec<MemoryRecord>, Vec<MemoryRecord>),
        by_meaning: Vec<String>,
    ) -> Result<MemoryContext, HookError> {
        let (by_words, preferences) = read;
        // Reciprocal-rank fusion of the two rankings.
        let mut scores: HashMap<String, f64> = HashMap::new();
        for (rank, memory) in by_words.iter().enumerate() {
            *scores.entry(memory.id.clone()).or_default() += 1.0 / (61.0 + rank as f64);
        }
        for (rank, id) in by_meaning.iter().enumerate() {
            *scores.entry(id.clone()).or_default() += 1.0 / (61.0 + rank as f64);
        }
        let mut facts = by_words;
        if by_meaning
            .iter()
            .any(|id| !facts.iter().any(|m| &m.id == id))
        {
            let all = self
                .store
                .list_memories(
                    scope,
                    None,
                    u32::try_from(MEMORIES_PER_SCOPE).unwrap_or(1000),
                )
                .await
                .map_err(HookError::new)?;
            facts.extend(
                all.into_iter()
                    .filter(|m| by_meaning.contains(&m.id) && !facts.iter().any(|f| f.id == m.id))
                    .collect::<Vec<_>>(),
            );
        }
        facts.retain(|m| m.kind == "fact");
        facts.sort_by(|a, b| {
            let score = |id: &str| scores.get(id).copied().unwrap_or(0.0);
            score(&b.id).total_cmp(&score(&a.id)).then(a.id.cmp(&b.id))
        });
        facts.truncate(self.top_k as usize);
        let text = if facts.is_empty() {
            String::new()
        } else {
            let lines: Vec<String> = facts.iter().map(|m| format!("- {}", m.content)).collect();
            format!(
                "What you remember about the user from earlier conversations (it may be out of date):\n{}",
                lines.join("\n")
            )
        };
        Ok(MemoryContext {
            text,
            preferences: preferences.into_iter().map(|m| m.content).collect(),
        })
    }
}

/// Memory extraction: a job for the worker, which asks the model once the
/// turn's end (and the job with it) is stored.
pub struct QueuedExtraction;

#[async_trait]
impl MemoryExtractor for QueuedExtraction {
    async fn extract_turn(&self, turn: &MemoryTurn) -> Result<Option<NewJob>, HookError> {
        let job = ExtractionJob {
            scope: turn.scope.clone(),
            session_id: turn.session_id.as_str().to_owned(),
            turn_id: turn.turn_id.clone(),
            user_message: turn.user_message.clone(),
            assistant_message: turn.assistant_message.clone(),
            provider: turn.provider.clone(),
            model: turn.model.clone(),
        };
        Ok(Some(NewJob {
            id: new_job_id(),
            kind: JOB_MEMORY.into(),
            session_id: turn.session_id.as_str().to_owned(),
            turn_id: turn.turn_id.clone(),
            payload: serde_json::to_string(&job).map_err(HookError::new)?,
            at: Utc::now(),
        }))
    }
}
