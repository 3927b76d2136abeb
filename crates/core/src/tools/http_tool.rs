//! Tools that call an HTTP API, declared in the settings: a name, a
//! description, an argument schema, a method, a URL template whose `{arg}`
//! placeholders take the call's arguments, headers (a value may name an
//! environment variable, `${TOKEN}`, read at start), an effect class and a
//! timeout.
//!
//! The URL's scheme, host and port are the operator's: placeholders may
//! stand only in its path and query, so a call cannot point the tool
//! elsewhere. Arguments not used in the URL go in the query string (`GET`,
//! `DELETE`) or a JSON body (`POST`, `PUT`, `PATCH`).

use std::{collections::BTreeMap, fmt, str::FromStr, time::Duration};

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::{EffectClass, Tool, ToolContext, ToolError, ToolErrorKind, ToolOutput, ToolSpec};
use crate::providers::redact::Redactor;

/// Largest answer read, in bytes.
const MAX_ANSWER_BYTES: usize = 256 * 1024;

/// One declared HTTP tool, as written in the settings.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpToolConfig {
    pub name: String,
    pub description: String,
    /// JSON schema of the arguments (default: an object of anything).
    #[serde(default = "any_object")]
    pub parameters: Value,
    #[serde(default = "get")]
    pub method: String,
    pub url: String,
    /// Header values; `${NAME}` is replaced by the environment variable.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default = "network")]
    pub effect: EffectClass,
    #[serde(default)]
    pub timeout_s: Option<u64>,
    /// The API applies a request once per `Idempotency-Key` (every call
    /// sends one, made of the turn and the call): a call that started in
    /// a process that died is sent again, with the same key.
    #[serde(default)]
    pub idempotent: bool,
    /// Follow the API's redirects, to the same origin only (default:
    /// none is followed, and a 3xx is the tool's answer).
    #[serde(default)]
    pub follow_redirects: bool,
}

fn any_object() -> Value {
    json!({"type": "object"})
}

fn get() -> String {
    "GET".to_owned()
}

fn network() -> EffectClass {
    EffectClass::Network
}

/// Header values never print: they hold tokens.
impl fmt::Debug for HttpToolConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpToolConfig")
            .field("name", &self.name)
            .field("method", &self.method)
            .field("url", &self.url)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("effect", &self.effect)
            .finish_non_exhaustive()
    }
}

/// The declared tools: a JSON array of [`HttpToolConfig`] (a
/// `[[tools.http]]` table per tool in the settings file).
#[derive(Debug, Clone, Default)]
pub struct HttpToolList(pub Vec<HttpToolConfig>);

impl FromStr for HttpToolList {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let tools: Vec<HttpToolConfig> =
            serde_json::from_str(s).map_err(|e| format!("expected a list of HTTP tools: {e}"))?;
        let mut seen = std::collections::HashSet::new();
        for tool in &tools {
            check(tool).map_err(|e| format!("HTTP tool {:?}: {e}", tool.name))?;
            if !seen.insert(tool.name.as_str()) {
                return Err(format!("HTTP tool {:?} is declared twice", tool.name));
            }
        }
        Ok(Self(tools))
    }
}

/// Whether `name` may name a tool: what every provider accepts.
pub fn is_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn check(tool: &HttpToolConfig) -> Result<(), String> {
    if !is_tool_name(&tool.name) {
        return Err("the name must be 1-64 letters, digits, `_` or `-`".into());
    }
    if tool
        .name
        .to_ascii_lowercase()
        .starts_with(crate::turn::CLIENT_TOOL_PREFIX)
    {
        return Err("names beginning with `client__` are reserved for client tools".into());
    }
    if tool.description.trim().is_empty() {
        return Err("the description must not be empty".into());
    }
    reqwest::Method::from_str(&tool.method.to_ascii_uppercase())
        .ok()
        .filter(|m| matches!(m.as_str(), "GET" | "POST" | "PUT" | "PATCH" | "DELETE"))
        .ok_or("the method must be GET, POST, PUT, PATCH or DELETE")?;
    let Some(after_scheme) = tool.url.split_once("://").map(|(_, rest)| rest) else {
        return Err("the URL must be http or https".into());
    };
    let authority = after_scheme
        .split(['/', '?', '#'])
        .next()
        .unwrap_or_default();
    if authority.contains(['{', '}']) {
        return Err("placeholders may stand only in the URL's path and query".into());
    }
    let sample = fill(&tool.url, &Map::new(), true).map_err(|e| e.message)?;
    match reqwest::Url::parse(&sample) {
        Ok(url) if matches!(url.scheme(), "http" | "https") => {}
        _ => return Err("the URL must be an http or https URL".into()),
    }
    if !tool.parameters.is_object() {
        return Err("the parameters must be a JSON schema object".into());
    }
    for (header, value) in &tool.headers {
        reqwest::header::HeaderName::from_str(header)
            .map_err(|_| format!("{header:?} is not a header name"))?;
        for name in variables(value) {
            if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!("${{{name}}} is not an environment variable"));
            }
        }
    }
    Ok(())
}

/// The `${NAME}` references of a header value.
fn variables(value: &str) -> Vec<&str> {
    let mut found = Vec::new();
    let mut rest = value;
    while let Some(at) = rest.find("${") {
        let Some(end) = rest[at..].find('}') else {
            break;
        };
        found.push(&rest[at + 2..at + end]);
        rest = &rest[at + end + 1..];
    }
    found
}

/// `value` with each `${NAME}` replaced by the variable.
pub(crate) fn expand(value: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = value.to_owned();
    for name in variables(value) {
        let found = env(name)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| format!("the environment variable {name} is not set"))?;
        out = out.replace(&format!("${{{name}}}"), &found);
    }
    Ok(out)
}

/// The URL with `{arg}` placeholders filled (percent-encoded); with
/// `sample`, every placeholder takes `x` (to check the template).
///
/// A value in the path must be one segment: not empty, `.` or `..`, and
/// without `/` (a `{name*}` placeholder takes several segments, none of
/// them empty, `.` or `..`). A URL parser resolves `..` (and `%2E%2E`),
/// so `tickets/{id}` with `id: ".."` would otherwise reach the template's
/// parent.
fn fill(template: &str, arguments: &Map<String, Value>, sample: bool) -> Result<String, ToolError> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let close = rest[open..].find('}').ok_or_else(|| {
            ToolError::new(ToolErrorKind::Internal, "an unclosed `{` in the URL", false)
        })?;
        let placeholder = &rest[open + 1..open + close];
        let (name, segments) = match placeholder.strip_suffix('*') {
            Some(name) => (name, true),
            None => (placeholder, false),
        };
        let in_path = !out.contains(['?', '#']);
        let value = if sample {
            "x".to_owned()
        } else {
            match arguments.get(name) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Number(n)) => n.to_string(),
                Some(Value::Bool(b)) => b.to_string(),
                _ => {
                    return Err(ToolError::new(
                        ToolErrorKind::InvalidInput,
                        format!("`{name}` is required (a string, number or boolean)"),
                        true,
                    ));
                }
            }
        };
        if in_path {
            out.push_str(&path_value(name, &value, segments)?);
        } else {
            out.push_str(&percent_encode(&value));
        }
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// A path placeholder's value, encoded: one segment, or with `segments`,
/// several joined by `/`; none empty, `.` or `..`.
fn path_value(name: &str, value: &str, segments: bool) -> Result<String, ToolError> {
    let parts: Vec<&str> = if segments {
        value.split('/').collect()
    } else {
        vec![value]
    };
    let bad = |why: &str| {
        Err(ToolError::new(
            ToolErrorKind::InvalidInput,
            format!("`{name}` {why}"),
            true,
        ))
    };
    for part in &parts {
        match *part {
            "" => return bad("must not be empty (nor hold an empty path segment)"),
            "." | ".." => return bad("must not be `.` or `..`"),
            part if part.contains('/') => return bad("must not hold `/`"),
            _ => {}
        }
    }
    Ok(parts
        .iter()
        .map(|part| percent_encode(part))
        .collect::<Vec<_>>()
        .join("/"))
}

/// The fixed start of a template's path: up to its first placeholder,
/// cut back to the last `/` (the URL a call sends begins with it).
fn fixed_prefix(template: &str) -> Option<String> {
    let fixed = &template[..template.find(['{', '?', '#']).unwrap_or(template.len())];
    let path = reqwest::Url::parse(fixed).ok()?.path().to_owned();
    let cut = path.rfind('/').map_or(0, |i| i + 1);
    Some(path[..cut].to_owned())
}

fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// An error and its causes, as one line (a refused redirect says why only
/// in its cause).
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    // Bounded: a chain of causes is short and ends.
    for _ in 0..8 {
        let Some(next) = cause else { break };
        text.push_str(&format!(": {next}"));
        cause = next.source();
    }
    text
}

/// The argument names of a URL template's placeholders.
fn placeholders(template: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}') else {
            break;
        };
        let placeholder = &rest[open + 1..open + close];
        found.push(placeholder.trim_end_matches('*').to_owned());
        rest = &rest[open + close + 1..];
    }
    found
}

/// A declared HTTP tool, ready to call.
pub struct HttpTool {
    client: reqwest::Client,
    method: reqwest::Method,
    url: String,
    /// Where every URL a call sends begins.
    prefix: String,
    headers: reqwest::header::HeaderMap,
    /// Masks the header values (tokens) in what a call says.
    redactor: Redactor,
    spec: ToolSpec,
}

impl HttpTool {
    /// Builds the tool; header variables are read from `env` now.
    pub fn new(
        config: &HttpToolConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, String> {
        check(config)?;
        let mut headers = reqwest::header::HeaderMap::new();
        let mut secrets = Vec::new();
        for (name, value) in &config.headers {
            let value = expand(value, &env)?;
            // The whole value, and its token alone (`Bearer <token>`), as
            // an API may quote either.
            secrets.extend(value.split_whitespace().last().map(str::to_owned));
            secrets.push(value.clone());
            let mut value = reqwest::header::HeaderValue::from_str(&value)
                .map_err(|_| format!("the value of {name} is not a header value"))?;
            value.set_sensitive(true);
            headers.insert(
                reqwest::header::HeaderName::from_str(name)
                    .map_err(|_| format!("{name:?} is not a header name"))?,
                value,
            );
        }
        let timeout = Duration::from_secs(config.timeout_s.unwrap_or(30).clamp(1, 600));
        let origin =
            reqwest::Url::parse(&fill(&config.url, &Map::new(), true).map_err(|e| e.message)?)
                .map_err(|e| e.to_string())?
                .origin();
        let redirects = if config.follow_redirects {
            reqwest::redirect::Policy::custom(move |attempt| {
                if attempt.previous().len() >= 5 {
                    attempt.error("more than 5 redirects")
                } else if attempt.url().origin() == origin {
                    attempt.follow()
                } else {
                    let to = attempt.url().origin().ascii_serialization();
                    attempt.error(format!(
                        "a redirect to another origin ({to}) is not followed"
                    ))
                }
            })
        } else {
            reqwest::redirect::Policy::none()
        };
        let client = reqwest::Client::builder()
            .redirect(redirects)
            .timeout(timeout)
            .user_agent(format!("agent-harness/{}", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Self {
            client,
            method: reqwest::Method::from_str(&config.method.to_ascii_uppercase())
                .map_err(|e| e.to_string())?,
            url: config.url.clone(),
            prefix: fixed_prefix(&config.url).ok_or("the URL must be an http or https URL")?,
            headers,
            redactor: Redactor::new(secrets, None),
            spec: ToolSpec::new(
                &config.name,
                &config.description,
                config.parameters.clone(),
                config.effect,
            )
            .with_timeout(timeout + Duration::from_secs(2))
            .with_source("http")
            .with_idempotent(config.idempotent),
        })
    }
}

#[async_trait]
impl Tool for HttpTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, ctx: ToolContext, arguments: Value) -> Result<ToolOutput, ToolError> {
        self.send(ctx, arguments)
            .await
            .map_err(|e| ToolError::new(e.kind, self.redactor.text(&e.message), e.retryable))
    }
}

impl HttpTool {
    #[expect(
        clippy::too_many_lines,
        reason = "one request's steps in their order: arguments, URL, guard, headers, body, answer"
    )]
    async fn send(&self, ctx: ToolContext, arguments: Value) -> Result<ToolOutput, ToolError> {
        let arguments = arguments.as_object().cloned().unwrap_or_default();
        let url = fill(&self.url, &arguments, false)?;
        let used = placeholders(&self.url);
        let rest: Map<String, Value> = arguments
            .into_iter()
            .filter(|(k, _)| !used.contains(k))
            .collect();
        let mut url = reqwest::Url::parse(&url).map_err(|e| {
            ToolError::new(ToolErrorKind::InvalidInput, format!("not a URL: {e}"), true)
        })?;
        // What `fill` refuses keeps this true; checked all the same, as
        // the last word before anything is sent.
        if !url.path().starts_with(&self.prefix) {
            return Err(ToolError::new(
                ToolErrorKind::InvalidInput,
                format!("the arguments lead out of {}", self.prefix),
                true,
            ));
        }
        let with_body = matches!(
            self.method,
            reqwest::Method::POST | reqwest::Method::PUT | reqwest::Method::PATCH
        );
        // No arguments left: no query string at all (not a bare `?`).
        if !with_body && !rest.is_empty() {
            let mut query = url.query_pairs_mut();
            for (key, value) in &rest {
                let text = match value {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                query.append_pair(key, &text);
            }
        }
        // One key per call, the same in every process that runs it.
        let mut request = self
            .client
            .request(self.method.clone(), url)
            .headers(self.headers.clone())
            .header(
                "idempotency-key",
                format!("{}:{}", ctx.turn_id, ctx.call_id),
            );
        if with_body {
            request = request.json(&Value::Object(rest));
        }
        let response = tokio::select! {
            response = request.send() => response.map_err(|e| {
                let what = if e.is_timeout() { "timed out".to_owned() } else { format!("failed: {}", chain(&e)) };
                ToolError::new(ToolErrorKind::Unavailable, format!("the request {what}"), true)
            })?,
            () = ctx.cancel.cancelled() => {
                return Err(ToolError::new(ToolErrorKind::Cancelled, "cancelled", true));
            }
        };
        let status = response.status();
        let mut body = Vec::new();
        let mut response = response;
        let mut cut = false;
        while let Some(chunk) = response.chunk().await.map_err(|e| {
            ToolError::new(
                ToolErrorKind::Unavailable,
                format!("the answer broke off: {e}"),
                true,
            )
        })? {
            let room = MAX_ANSWER_BYTES.saturating_sub(body.len());
            if chunk.len() > room {
                body.extend_from_slice(&chunk[..room]);
                cut = true;
                break;
            }
            body.extend_from_slice(&chunk);
        }
        let mut text = String::from_utf8_lossy(&body).into_owned();
        if cut {
            text.push_str(&format!(
                "\n[the answer was cut at {MAX_ANSWER_BYTES} bytes]"
            ));
        }
        if !status.is_success() {
            // Refused credentials stay refused this turn; anything else
            // may go better with other arguments or a moment later.
            let retryable = !matches!(status.as_u16(), 401 | 403);
            return Err(ToolError::new(
                if status.as_u16() == 404 {
                    ToolErrorKind::NotFound
                } else if matches!(status.as_u16(), 401 | 403) {
                    ToolErrorKind::PermissionDenied
                } else {
                    ToolErrorKind::Failed
                },
                format!("the API answered {status}: {text}"),
                retryable,
            ));
        }
        Ok(ToolOutput::text(format!("HTTP {status}\n{text}")))
    }
}

#[cfg(test)]
mod tests;
