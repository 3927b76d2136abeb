//! The web tools, offered only to turns with `web_mode: on`:
//! `web_search` (a SearXNG-compatible JSON endpoint) and `fetch_url` (a
//! page as readable text, kept whole in the artifact store).
//!
//! `fetch_url` connects only to public addresses ([`guard`]): the URL, each
//! redirect and each resolved address are checked, unless the operator
//! allowed the host or network.

pub mod guard;
pub mod html;

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use chrono::Utc;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{
    Citation, EffectClass, Tool, ToolContext, ToolError, ToolErrorKind, ToolOutput, ToolSpec,
};
use crate::store::{Access, NewArtifact};
use guard::{GuardedResolver, NetGuard, Refused};

/// The tools a turn is offered only with `web_mode: on`.
pub const WEB_TOOLS: &[&str] = &["web_search", "fetch_url"];

/// Most redirects `fetch_url` follows.
pub const MAX_REDIRECTS: usize = 5;

/// Characters of a fetched page the model is shown (the whole text is
/// in the artifact store).
pub const PAGE_SHOWN_CHARS: usize = 8000;

/// Largest search answer read, in bytes.
const SEARCH_MAX_BYTES: usize = 2 * 1024 * 1024;

/// How the web tools reach the web.
#[derive(Debug, Clone)]
pub struct WebConfig {
    /// The SearXNG-compatible endpoint; `web_search` exists only with one.
    pub search_url: Option<String>,
    /// Largest page read, in bytes (a longer one is cut there).
    pub fetch_max_bytes: usize,
    /// Longest a fetch or a search may take.
    pub timeout: Duration,
    /// Hosts and networks `fetch_url` may reach although internal.
    pub guard: NetGuard,
}

fn user_agent() -> String {
    format!("agent-harness/{}", env!("CARGO_PKG_VERSION"))
}

/// Reads at most `max` bytes of a response; true when it had more.
async fn read_capped(
    mut response: reqwest::Response,
    max: usize,
) -> Result<(Vec<u8>, bool), reqwest::Error> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let room = max.saturating_sub(body.len());
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            return Ok((body, true));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body, false))
}

/// The reason a request failed, as the model should hear it: a refusal of
/// the guard is named as such.
fn request_error(e: &reqwest::Error) -> ToolError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(error) = source {
        if let Some(refused) = error.downcast_ref::<Refused>() {
            return ToolError::new(
                ToolErrorKind::PermissionDenied,
                format!("refused: {refused}"),
                true,
            );
        }
        source = error.source();
    }
    if e.is_timeout() {
        return ToolError::new(ToolErrorKind::Unavailable, "the request timed out", true);
    }
    ToolError::new(
        ToolErrorKind::Unavailable,
        format!("the request failed: {e}"),
        true,
    )
}

/// A search result as SearXNG's JSON format gives it.
#[derive(Debug, Deserialize)]
struct SearchAnswer {
    #[serde(default)]
    results: Vec<SearchResult>,
}

#[derive(Debug, Deserialize)]
struct SearchResult {
    url: String,
    #[serde(default)]
    title: String,
    #[serde(default)]
    content: Option<String>,
}

/// `web_search`: title, URL and snippet of the best results.
pub struct WebSearch {
    client: reqwest::Client,
    endpoint: reqwest::Url,
    spec: ToolSpec,
}

impl WebSearch {
    /// `base`: the instance (`https://searx.example`) or its search path.
    pub fn new(base: &str, timeout: Duration) -> Result<Self, String> {
        let mut endpoint = reqwest::Url::parse(base).map_err(|e| format!("not a URL: {e}"))?;
        if !endpoint.path().ends_with("/search") {
            let path = format!("{}/search", endpoint.path().trim_end_matches('/'));
            endpoint.set_path(&path);
        }
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .user_agent(user_agent())
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Self {
            client,
            endpoint,
            spec: ToolSpec::new(
                "web_search",
                "Search the web; returns the title, URL and a snippet of the best results. \
                 Read a page with fetch_url.",
                json!({
                    "type": "object",
                    "properties": {
                        "query": {"type": "string", "minLength": 1},
                        "max_results": {"type": "integer", "minimum": 1, "maximum": 10, "description": "Default 5."}
                    },
                    "required": ["query"],
                    "additionalProperties": false
                }),
                EffectClass::ReadOnly,
            )
            .with_timeout(timeout + Duration::from_secs(5)),
        })
    }
}

#[async_trait]
impl Tool for WebSearch {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, ctx: ToolContext, arguments: Value) -> Result<ToolOutput, ToolError> {
        let query = arguments["query"]
            .as_str()
            .filter(|q| !q.trim().is_empty())
            .ok_or_else(|| {
                ToolError::new(ToolErrorKind::InvalidInput, "`query` is required", true)
            })?;
        let max = arguments["max_results"].as_u64().unwrap_or(5).clamp(1, 10);
        let mut endpoint = self.endpoint.clone();
        endpoint
            .query_pairs_mut()
            .append_pair("q", query)
            .append_pair("format", "json");
        let request = self.client.get(endpoint).send();
        let response = tokio::select! {
            response = request => response.map_err(|e| request_error(&e))?,
            () = ctx.cancel.cancelled() => {
                return Err(ToolError::new(ToolErrorKind::Cancelled, "cancelled", true));
            }
        };
        if !response.status().is_success() {
            return Err(ToolError::new(
                ToolErrorKind::Unavailable,
                format!("the search service answered {}", response.status()),
                true,
            ));
        }
        let (body, _) = read_capped(response, SEARCH_MAX_BYTES)
            .await
            .map_err(|e| request_error(&e))?;
        let answer: SearchAnswer = serde_json::from_slice(&body).map_err(|e| {
            ToolError::new(
                ToolErrorKind::Unavailable,
                format!("the search service's answer is not its JSON format: {e}"),
                true,
            )
        })?;
        let results: Vec<&SearchResult> = answer
            .results
            .iter()
            .filter(|r| r.url.starts_with("http://") || r.url.starts_with("https://"))
            .take(usize::try_from(max).unwrap_or(5))
            .collect();
        if results.is_empty() {
            return Ok(ToolOutput::text(format!("No web results for {query:?}.")));
        }
        let lines: Vec<String> = results
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let snippet = r.content.as_deref().unwrap_or_default().trim();
                format!(
                    "{}. {}\n   {}\n   {}",
                    i + 1,
                    r.title.trim(),
                    r.url,
                    snippet
                )
            })
            .collect();
        Ok(ToolOutput {
            content: lines.join("\n"),
            citations: results
                .iter()
                .map(|r| Citation::Web {
                    title: r.title.trim().to_owned(),
                    url: r.url.clone(),
                })
                .collect(),
        })
    }
}

/// `fetch_url`: a page as readable text.
pub struct FetchUrl {
    client: reqwest::Client,
    guard: Arc<NetGuard>,
    store: Arc<dyn Access>,
    max_bytes: usize,
    spec: ToolSpec,
}

impl FetchUrl {
    pub fn new(config: &WebConfig, store: Arc<dyn Access>) -> Result<Self, String> {
        let guard = Arc::new(config.guard.clone());
        let redirects = guard.clone();
        let client = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.timeout.min(Duration::from_secs(10)))
            .user_agent(user_agent())
            // A proxy would connect for us, past the guard.
            .no_proxy()
            .dns_resolver(Arc::new(GuardedResolver(guard.clone())))
            .redirect(reqwest::redirect::Policy::custom(move |attempt| {
                if attempt.previous().len() >= MAX_REDIRECTS {
                    return attempt.error(Refused(format!("more than {MAX_REDIRECTS} redirects")));
                }
                match redirects.check_url(attempt.url()) {
                    Ok(()) => attempt.follow(),
                    Err(refused) => {
                        let to = attempt.url().to_string();
                        attempt.error(Refused(format!("a redirect to {to}: {refused}")))
                    }
                }
            }))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Self {
            client,
            guard,
            store,
            max_bytes: config.fetch_max_bytes,
            spec: ToolSpec::new(
                "fetch_url",
                "Fetch a web page (http or https) and return its readable text; the whole \
                 text is kept as a rendered copy.",
                json!({
                    "type": "object",
                    "properties": {
                        "url": {"type": "string", "minLength": 1}
                    },
                    "required": ["url"],
                    "additionalProperties": false
                }),
                EffectClass::Network,
            )
            .with_timeout(config.timeout + Duration::from_secs(5)),
        })
    }
}

#[expect(
    clippy::too_many_lines,
    reason = "one fetch's steps in their order: URL, guard, request, redirects, answer"
)]
#[async_trait]
impl Tool for FetchUrl {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, ctx: ToolContext, arguments: Value) -> Result<ToolOutput, ToolError> {
        let raw = arguments["url"].as_str().unwrap_or_default().trim();
        let url = reqwest::Url::parse(raw).map_err(|e| {
            ToolError::new(
                ToolErrorKind::InvalidInput,
                format!("{raw:?} is not a URL: {e}"),
                true,
            )
        })?;
        self.guard.check_url(&url).map_err(|refused| {
            ToolError::new(
                ToolErrorKind::PermissionDenied,
                format!("refused: {refused}"),
                true,
            )
        })?;
        let response = tokio::select! {
            response = self.client.get(url).send() => response.map_err(|e| request_error(&e))?,
            () = ctx.cancel.cancelled() => {
                return Err(ToolError::new(ToolErrorKind::Cancelled, "cancelled", true));
            }
        };
        let final_url = response.url().to_string();
        if !response.status().is_success() {
            return Err(ToolError::new(
                ToolErrorKind::Failed,
                format!("{final_url} answered {}", response.status()),
                true,
            ));
        }
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        let kind = content_type
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_owned();
        let is_html = kind.is_empty() || kind == "text/html" || kind == "application/xhtml+xml";
        let is_text = kind.starts_with("text/")
            || kind.ends_with("+xml")
            || kind.ends_with("+json")
            || matches!(kind.as_str(), "application/json" | "application/xml");
        if !(is_html || is_text) {
            return Err(ToolError::new(
                ToolErrorKind::InvalidInput,
                format!("{final_url} is not a text page ({kind})"),
                true,
            ));
        }
        let read = tokio::select! {
            read = read_capped(response, self.max_bytes) => read.map_err(|e| request_error(&e))?,
            () = ctx.cancel.cancelled() => {
                return Err(ToolError::new(ToolErrorKind::Cancelled, "cancelled", true));
            }
        };
        let (body, truncated) = read;
        let raw_text = String::from_utf8_lossy(&body);
        let (title, text) = if is_html {
            (html::title(&raw_text), html::to_text(&raw_text))
        } else {
            (None, raw_text.trim().to_owned())
        };
        let title = title.unwrap_or_else(|| final_url.clone());
        let id = format!("art_{}", uuid::Uuid::now_v7().simple());
        let rendered = format!(
            "/sessions/{}/artifacts/{id}",
            crate::ids::client_session_id(&ctx.session_id)
        );
        self.store
            .put_artifact(&NewArtifact {
                id,
                session_id: ctx.session_id.clone(),
                turn_id: ctx.turn_id.to_string(),
                call_id: ctx.call_id.clone(),
                tool: self.spec.name.clone(),
                content: format!("URL: {final_url}\nTitle: {title}\n\n{text}"),
                created_at: Utc::now(),
            })
            .await
            .map_err(|e| ToolError::new(ToolErrorKind::Unavailable, e.to_string(), true))?;
        let total = text.chars().count();
        let shown: String = text.chars().take(PAGE_SHOWN_CHARS).collect();
        let mut notes = Vec::new();
        if truncated {
            notes.push(format!("the page was cut at {} bytes", self.max_bytes));
        }
        if total > PAGE_SHOWN_CHARS {
            notes.push(format!(
                "the first {PAGE_SHOWN_CHARS} of {total} characters are shown"
            ));
        }
        let notes = if notes.is_empty() {
            String::new()
        } else {
            format!(" ({})", notes.join("; "))
        };
        Ok(ToolOutput {
            content: format!(
                "Title: {title}\nURL: {final_url}\nRendered copy: {rendered}{notes}\n\n{shown}"
            ),
            citations: vec![
                Citation::Web {
                    title,
                    url: final_url,
                },
                Citation::Rendered { path: rendered },
            ],
        })
    }
}
