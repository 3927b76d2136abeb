//! HTTP plumbing shared by the adapters: sending with a deadline, turning an
//! error answer into a [`ProviderError`] (an I/O failure mid-body into an
//! interrupted answer), and checking and limiting what comes back.

use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use reqwest::{RequestBuilder, Response, header};
use tokio::time::Instant;

use super::{
    ProviderError, ProviderFailure,
    stream::{SseEvent, Waits, sse_events},
};

/// The HTTP client of an adapter.
pub(super) fn client(connect_timeout: Duration) -> Result<reqwest::Client, ProviderError> {
    reqwest::Client::builder()
        .connect_timeout(connect_timeout)
        .build()
        .map_err(|e| ProviderError::Network(format!("cannot build HTTP client: {e}")))
}

/// Sends `request`, giving up at `deadline`.
pub(super) async fn send(
    request: RequestBuilder,
    deadline: Instant,
) -> Result<Response, ProviderError> {
    match tokio::time::timeout_at(deadline, request.send()).await {
        Err(_) => Err(ProviderError::Timeout(
            "no response headers before the deadline".into(),
        )),
        Ok(Err(e)) => Err(transport_error(&e)),
        Ok(Ok(response)) => Ok(response),
    }
}

/// Maps a reqwest failure to the error a caller can act on.
pub(super) fn transport_error(e: &reqwest::Error) -> ProviderError {
    if e.is_timeout() {
        ProviderError::Timeout(e.to_string())
    } else if (e.is_body() || e.is_decode()) && !e.is_connect() && broke_in_transport(e) {
        // A reset or a close mid-body (reqwest may call it a decode error
        // of the body): the answer is cut, not malformed.
        ProviderError::Interrupted(with_sources(e))
    } else if e.is_decode() || e.is_body() {
        ProviderError::Protocol(format!("reading the response failed: {}", with_sources(e)))
    } else {
        ProviderError::Network(with_sources(e))
    }
}

/// Whether an I/O error (a reset, an early EOF) is behind `e`.
fn broke_in_transport(e: &reqwest::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(inner) = source {
        if inner.downcast_ref::<std::io::Error>().is_some() {
            return true;
        }
        source = inner.source();
    }
    false
}

/// An error with its source chain: "error sending request" alone says
/// nothing.
fn with_sources(e: &reqwest::Error) -> String {
    let mut detail = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(inner) = source {
        detail.push_str(": ");
        detail.push_str(&inner.to_string());
        source = inner.source();
    }
    detail
}

/// Reads a non-2xx answer and classifies it. The body is read up to
/// [`ProviderFailure::BODY_LIMIT`] bytes.
pub(super) async fn error_from_response(response: Response) -> ProviderError {
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let body = read_prefix(response, ProviderFailure::BODY_LIMIT).await;
    let (message, code) = error_message(&body);
    let failure = ProviderFailure {
        status,
        message: message.unwrap_or_else(|| format!("HTTP {status}")),
        body,
    };
    ProviderError::from_status(status, retry_after, code.as_deref(), failure)
}

/// The provider's error message and code, from the usual JSON error shapes:
/// `{"error": {"message", "code"|"type"}}`, `{"error": "..."}`, `{"message"}`.
pub(super) fn error_message(body: &str) -> (Option<String>, Option<String>) {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(body) else {
        let trimmed = body.trim();
        return ((!trimmed.is_empty()).then(|| truncate(trimmed, 300)), None);
    };
    let error = value.get("error").unwrap_or(&value);
    if let Some(text) = error.as_str() {
        return (Some(text.to_owned()), None);
    }
    let message = error
        .get("message")
        .and_then(|m| m.as_str())
        .map(str::to_owned);
    let code = error
        .get("code")
        .and_then(|c| c.as_str())
        .or_else(|| error.get("type").and_then(|t| t.as_str()))
        .map(str::to_owned);
    (message, code)
}

async fn read_prefix(mut response: Response, limit: usize) -> String {
    let mut bytes = Vec::new();
    while bytes.len() < limit {
        match response.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    bytes.truncate(limit);
    String::from_utf8_lossy(&bytes).into_owned()
}

fn truncate(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// Refuses a 2xx answer that is not an event stream (an HTML error page
/// from a proxy, a JSON body from a server that ignored `stream: true`).
pub(super) async fn expect_event_stream(response: Response) -> Result<Response, ProviderError> {
    expect_content_type(response, &["text/event-stream"]).await
}

/// Refuses a 2xx answer whose content type is none of `accepted`.
pub(super) async fn expect_content_type(
    response: Response,
    accepted: &[&str],
) -> Result<Response, ProviderError> {
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    if accepted.iter().any(|a| content_type.starts_with(a)) {
        return Ok(response);
    }
    let body = read_prefix(response, 200).await;
    Err(ProviderError::Protocol(format!(
        "expected text/event-stream, got {:?}: {}",
        if content_type.is_empty() {
            "no content type"
        } else {
            &content_type
        },
        truncate(body.trim(), 120)
    )))
}

/// The body of `response` as byte chunks, refused past `max_bytes`.
pub(crate) fn limited_bytes(
    response: Response,
    max_bytes: usize,
) -> impl Stream<Item = Result<Bytes, ProviderError>> + Send + 'static {
    let mut seen = 0usize;
    response.bytes_stream().map(move |chunk| {
        let chunk: Bytes = chunk.map_err(|e| transport_error(&e))?;
        seen += chunk.len();
        if seen > max_bytes {
            return Err(ProviderError::Protocol(format!(
                "response exceeds {max_bytes} bytes"
            )));
        }
        Ok(chunk)
    })
}

/// Sends `request` (asking for an event stream) and returns the answer if
/// it is a success; an error answer is an error here.
pub(super) async fn open(
    request: RequestBuilder,
    deadline: Instant,
) -> Result<Response, ProviderError> {
    let response = send(
        request.header(header::ACCEPT, "text/event-stream"),
        deadline,
    )
    .await?;
    if !response.status().is_success() {
        return Err(error_from_response(response).await);
    }
    Ok(response)
}

/// Whether the answer's content type starts with `prefix`.
pub(super) fn has_content_type(response: &Response, prefix: &str) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().starts_with(prefix))
}

/// The whole body of `response`, refused past `max_bytes`; each chunk is
/// awaited for at most `idle` and never past `deadline`.
pub(super) async fn read_body(
    response: Response,
    max_bytes: usize,
    idle: Duration,
    deadline: Instant,
) -> Result<Vec<u8>, ProviderError> {
    let mut chunks = std::pin::pin!(limited_bytes(response, max_bytes));
    let mut body = Vec::new();
    let mut waits = Waits::new(idle, deadline);
    while let Some(chunk) = waits.next(&mut chunks).await? {
        body.extend_from_slice(&chunk?);
    }
    Ok(body)
}

/// The SSE events of a successful answer (see [`sse_events`]); a body
/// that is not an event stream is an error.
pub(super) async fn events_of(
    response: Response,
    deadline: Instant,
    idle: Duration,
    max_bytes: usize,
) -> Result<impl Stream<Item = Result<SseEvent, ProviderError>> + Send + 'static, ProviderError> {
    let response = expect_event_stream(response).await?;
    Ok(sse_events(
        limited_bytes(response, max_bytes),
        idle,
        deadline,
    ))
}

/// Sends `request` and returns its SSE events (see [`sse_events`]); an
/// error answer or a body that is not an event stream is an error here.
pub(super) async fn open_events(
    request: RequestBuilder,
    deadline: Instant,
    idle: Duration,
    max_bytes: usize,
) -> Result<impl Stream<Item = Result<SseEvent, ProviderError>> + Send + 'static, ProviderError> {
    events_of(open(request, deadline).await?, deadline, idle, max_bytes).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_messages_are_read_from_the_usual_shapes() {
        let (m, c) = error_message(
            r#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}"#,
        );
        assert_eq!(m.as_deref(), Some("Incorrect API key provided"));
        assert_eq!(c.as_deref(), Some("invalid_api_key"));
        let (m, _) = error_message(r#"{"error":"model not found"}"#);
        assert_eq!(m.as_deref(), Some("model not found"));
        let (m, c) = error_message("<html>bad gateway</html>");
        assert_eq!(m.as_deref(), Some("<html>bad gateway</html>"));
        assert_eq!(c, None);
    }
}
