//! Embeddings of texts from a provider's embeddings endpoint: the
//! OpenAI-compatible `POST {base}/embeddings` or Ollama's `POST
//! {host}/api/embed`. The vault uses them to rank by meaning beside words.

use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::json;

/// Texts per request.
pub const BATCH: usize = 64;

/// Characters of a text sent (a longer one is cut: embedding models take
/// a few thousand tokens).
pub const MAX_TEXT_CHARS: usize = 8000;

/// Turns texts into vectors.
#[async_trait]
pub trait Embedder: Send + Sync {
    /// `provider:model`, kept beside the vectors it made.
    fn model_id(&self) -> &str;

    /// One vector per text, in order.
    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, String>;
}

/// Which wire format an [`HttpEmbedder`] speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmbeddingsApi {
    OpenAi,
    Ollama,
}

/// An embeddings endpoint over HTTP.
pub struct HttpEmbedder {
    api: EmbeddingsApi,
    client: reqwest::Client,
    url: String,
    api_key: Option<String>,
    model: String,
    id: String,
}

impl HttpEmbedder {
    /// `base`: the OpenAI base URL (`…/v1`) or the Ollama host.
    pub fn new(
        api: EmbeddingsApi,
        base: &str,
        api_key: Option<String>,
        model: &str,
    ) -> Result<Self, String> {
        let base = base.trim_end_matches('/');
        let (url, provider) = match api {
            EmbeddingsApi::OpenAi => (format!("{base}/embeddings"), "openai"),
            EmbeddingsApi::Ollama => (format!("{base}/api/embed"), "ollama"),
        };
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Self {
            api,
            client,
            url,
            api_key,
            model: model.to_owned(),
            id: format!("{provider}:{model}"),
        })
    }

    async fn embed_batch(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, String> {
        let input: Vec<String> = texts
            .iter()
            .map(|t| t.chars().take(MAX_TEXT_CHARS).collect())
            .collect();
        let mut request = self
            .client
            .post(&self.url)
            .json(&json!({"model": self.model, "input": input}));
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let response = request
            .send()
            .await
            .map_err(|e| format!("the embeddings request failed: {}", e.without_url()))?;
        let status = response.status();
        let body = response
            .bytes()
            .await
            .map_err(|e| format!("the embeddings answer broke off: {}", e.without_url()))?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
            let text: String = text.chars().take(300).collect();
            return Err(format!("the embeddings endpoint answered {status}: {text}"));
        }
        let vectors = match self.api {
            EmbeddingsApi::OpenAi => {
                #[derive(Deserialize)]
                struct Answer {
                    data: Vec<Item>,
                }
                #[derive(Deserialize)]
                struct Item {
                    index: usize,
                    embedding: Vec<f32>,
                }
                let mut answer: Answer = serde_json::from_slice(&body)
                    .map_err(|e| format!("the embeddings answer is not the OpenAI format: {e}"))?;
                answer.data.sort_by_key(|item| item.index);
                answer.data.into_iter().map(|item| item.embedding).collect()
            }
            EmbeddingsApi::Ollama => {
                #[derive(Deserialize)]
                struct Answer {
                    embeddings: Vec<Vec<f32>>,
                }
                let answer: Answer = serde_json::from_slice(&body)
                    .map_err(|e| format!("the embeddings answer is not Ollama's format: {e}"))?;
                answer.embeddings
            }
        };
        let vectors: Vec<Vec<f32>> = vectors;
        if vectors.len() != texts.len() {
            return Err(format!(
                "the embeddings endpoint gave {} vectors for {} texts",
                vectors.len(),
                texts.len()
            ));
        }
        Ok(vectors)
    }
}

#[async_trait]
impl Embedder for HttpEmbedder {
    fn model_id(&self) -> &str {
        &self.id
    }

    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, String> {
        let mut vectors = Vec::with_capacity(texts.len());
        for batch in texts.chunks(BATCH) {
            vectors.extend(self.embed_batch(batch).await?);
        }
        Ok(vectors)
    }
}

/// Cosine similarity; 0 for vectors of other lengths or no length.
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() || a.is_empty() {
        return 0.0;
    }
    let (mut dot, mut na, mut nb) = (0.0f32, 0.0f32, 0.0f32);
    for (x, y) in a.iter().zip(b) {
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    if na == 0.0 || nb == 0.0 {
        return 0.0;
    }
    dot / (na.sqrt() * nb.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cosine_is_one_for_the_same_direction_and_zero_for_nonsense() {
        assert!((cosine(&[1.0, 2.0], &[2.0, 4.0]) - 1.0).abs() < 1e-6);
        assert_eq!(cosine(&[1.0, 0.0], &[0.0, 1.0]), 0.0);
        assert_eq!(cosine(&[1.0], &[1.0, 2.0]), 0.0);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 2.0]), 0.0);
    }
}
