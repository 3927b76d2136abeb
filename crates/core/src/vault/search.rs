//! Finding a vault's chunks: by words (the full-text index) and, with an
//! embedder, by meaning, the two rankings fused.

use std::{collections::HashMap, sync::Arc};

use std::time::Instant;

use super::{MAX_VECTORS, VECTORS_FRESH_FOR, Vault, query_terms};
use crate::{
    providers::embeddings,
    store::{StoreError, VaultHit},
};

impl Vault {
    /// The chunks best matching `query`, at most `limit`: by words (the
    /// full-text index) and, with an embedder, by meaning too, the two
    /// rankings fused by reciprocal rank.
    pub async fn search(&self, query: &str, limit: u32) -> Result<Vec<VaultHit>, StoreError> {
        let terms = query_terms(query);
        if self.embedder.is_none() {
            return self.store.vault_search(&self.name, &terms, limit).await;
        }
        let wide = limit.saturating_mul(3).max(10);
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let mut words = self.store.vault_search(&self.name, &terms, wide).await?;
        let Some(meaning) = self
            .nearest(query, usize::try_from(wide).unwrap_or(30))
            .await
        else {
            words.truncate(limit);
            return Ok(words);
        };
        let mut scores: HashMap<i64, f64> = HashMap::new();
        for (rank, hit) in words.iter().enumerate() {
            *scores.entry(hit.id).or_default() += reciprocal_rank(rank);
        }
        for (rank, id) in meaning.iter().enumerate() {
            *scores.entry(*id).or_default() += reciprocal_rank(rank);
        }
        let missing: Vec<i64> = meaning
            .iter()
            .copied()
            .filter(|id| !words.iter().any(|hit| hit.id == *id))
            .collect();
        let mut hits = words;
        hits.extend(self.store.vault_chunks(&self.name, &missing).await?);
        for hit in &mut hits {
            hit.score = scores.get(&hit.id).copied().unwrap_or(0.0);
        }
        hits.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.id.cmp(&b.id)));
        hits.truncate(limit);
        Ok(hits)
    }

    /// The ids of the chunks nearest to `query` in meaning, best first.
    async fn nearest(&self, query: &str, k: usize) -> Option<Vec<i64>> {
        let (model, mut vectors) = self.embed(&[query.to_owned()]).await?;
        let wanted = vectors.pop()?;
        let all = {
            let mut cached = self.vectors.lock().await;
            match &*cached {
                Some((read_at, all)) if read_at.elapsed() < VECTORS_FRESH_FOR => all.clone(),
                _ => {
                    let read = self
                        .store
                        .vault_vectors(&self.name, &model, MAX_VECTORS)
                        .await
                        .map_err(
                            |e| tracing::warn!(error = %e, "cannot read the vault's embeddings"),
                        )
                        .ok()?;
                    let read = Arc::new(read);
                    *cached = Some((Instant::now(), read.clone()));
                    read
                }
            }
        };
        let mut scored: Vec<(f32, i64)> = all
            .iter()
            .map(|(id, vector)| (embeddings::cosine(&wanted, vector), *id))
            .filter(|(similarity, _)| *similarity > 0.0)
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        scored.truncate(k);
        Some(scored.into_iter().map(|(_, id)| id).collect())
    }
}

/// The contribution of a rank (0-based) to a fused score (k = 60).
fn reciprocal_rank(rank: usize) -> f64 {
    1.0 / (60.0 + rank as f64 + 1.0)
}
