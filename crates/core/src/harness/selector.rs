//! `SemanticToolSelector`: when more tools are registered than
//! `max_tools_per_turn`, keep the ones most related to the message.
//!
//! With an embedder (`HARNESS_VAULT_EMBEDDINGS`), relatedness is the cosine of
//! the message's embedding and each tool's (its name and description;
//! each tool is embedded once and kept). Without one, or when the
//! embedder fails, it is lexical: the number of the message's words found
//! in the tool's name and description. Ties are broken by a hash of the
//! tool's name and the message, so no tool, and no source of tools (the
//! MCP and HTTP tools come last in the registry), is always the one left
//! out. The kept tools are offered in registration order.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
};

use crate::{providers::embeddings::Embedder, tools::Tool};

/// Tools whose embeddings are kept; past this many the cache starts over
/// (MCP servers may change their tools when they restart).
const CACHED_TOOLS: usize = 4096;

fn words(text: &str) -> HashSet<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.len() > 2)
        .map(|w| w.to_lowercase())
        .collect()
}

/// What a tool is embedded as.
fn tool_text(tool: &dyn Tool) -> String {
    let spec = tool.spec();
    format!("{}: {}", spec.name.replace('_', " "), spec.description)
}

/// A stable hash (FNV-1a) of a tool's name and the message.
fn tie_break(name: &str, query: &str) -> u64 {
    name.bytes()
        .chain([0])
        .chain(query.bytes())
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        })
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut dot, mut aa, mut bb) = (0.0f64, 0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (f64::from(*x), f64::from(*y));
        dot += x * y;
        aa += x * x;
        bb += y * y;
    }
    if aa == 0.0 || bb == 0.0 {
        0.0
    } else {
        dot / (aa.sqrt() * bb.sqrt())
    }
}

/// A tool's embedding: the text embedded and its vector.
type Embedded = (String, Arc<Vec<f32>>);

/// Tool embeddings, made once per tool and kept.
pub struct ToolEmbeddings {
    embedder: Arc<dyn Embedder>,
    /// By tool name.
    cache: Mutex<HashMap<String, Embedded>>,
}

impl ToolEmbeddings {
    pub fn new(embedder: Arc<dyn Embedder>) -> Self {
        Self {
            embedder,
            cache: Mutex::default(),
        }
    }

    /// The cosine of `query` and each tool; `None` when the embedder
    /// failed (the caller falls back to words).
    async fn scores(&self, tools: &[&Arc<dyn Tool>], query: &str) -> Option<Vec<f64>> {
        let texts: Vec<String> = tools.iter().map(|t| tool_text(t.as_ref())).collect();
        let missing: Vec<usize> = {
            let cache = self.cache.lock().ok()?;
            (0..tools.len())
                .filter(|&i| {
                    cache
                        .get(&tools[i].spec().name)
                        .is_none_or(|(text, _)| *text != texts[i])
                })
                .collect()
        };
        let mut wanted: Vec<String> = missing.iter().map(|&i| texts[i].clone()).collect();
        wanted.push(query.to_owned());
        let mut vectors = match self.embedder.embed(&wanted).await {
            Ok(vectors) if vectors.len() == wanted.len() => vectors,
            Ok(_) => return None,
            Err(e) => {
                tracing::warn!(error = %e, "tool embeddings unavailable; selecting by words");
                return None;
            }
        };
        let query_vector = vectors.pop()?;
        let mut cache = self.cache.lock().ok()?;
        if cache.len() + missing.len() > CACHED_TOOLS {
            cache.clear();
        }
        for (&i, vector) in missing.iter().zip(vectors) {
            cache.insert(
                tools[i].spec().name.clone(),
                (texts[i].clone(), Arc::new(vector)),
            );
        }
        Some(
            tools
                .iter()
                .map(|t| {
                    cache
                        .get(&t.spec().name)
                        .map_or(0.0, |(_, vector)| cosine(vector, &query_vector))
                })
                .collect(),
        )
    }
}

/// The `max` tools most related to `query`, in registration order.
pub async fn select<'a>(
    tools: Vec<&'a Arc<dyn Tool>>,
    query: &str,
    max: usize,
    embeddings: Option<&ToolEmbeddings>,
) -> Vec<&'a Arc<dyn Tool>> {
    if tools.len() <= max {
        return tools;
    }
    let scores = match embeddings {
        Some(embeddings) => embeddings.scores(&tools, query).await,
        None => None,
    };
    let scores = scores.unwrap_or_else(|| {
        let query = words(query);
        tools
            .iter()
            .map(|tool| {
                let spec = tool.spec();
                let mut text = words(&spec.description);
                text.extend(words(&spec.name.replace('_', " ")));
                query.intersection(&text).count() as f64
            })
            .collect()
    });
    let mut ranked: Vec<(f64, u64, usize, &Arc<dyn Tool>)> = tools
        .into_iter()
        .zip(scores)
        .enumerate()
        .map(|(order, (tool, score))| (score, tie_break(&tool.spec().name, query), order, tool))
        .collect();
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    ranked.truncate(max);
    ranked.sort_by_key(|(_, _, order, _)| *order);
    ranked.into_iter().map(|(_, _, _, tool)| tool).collect()
}
