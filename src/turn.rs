//! What a turn is asked and what it answers, shared by every layer: the
//! request's [`WebMode`] and the public [`TurnResult`]. The harness produces
//! them; events, tools, the store and the HTTP edge carry them.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `web_mode` of a turn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum WebMode {
    #[default]
    Off,
    On,
}

/// The public result of a turn (the seeds' `TurnResult`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TurnResult {
    /// The final assistant response (with citations when requested).
    pub text: String,
    /// Local anchors cited this turn.
    pub local_citations: Vec<String>,
    /// Web sources cited this turn (`title`, `url`).
    pub web_citations: Vec<WebCitation>,
    /// Paths of rendered web content.
    pub rendered_content_paths: Vec<String>,
    /// The context pack used.
    #[schema(value_type = Option<Object>)]
    pub context_pack_json: Option<serde_json::Value>,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_creation_tokens: u64,
    /// Cost of this turn in USD, when its models are priced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    /// Cost of the whole session so far, this turn included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_cost_usd: Option<f64>,
}

/// A web source cited by a turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WebCitation {
    pub title: String,
    pub url: String,
}
