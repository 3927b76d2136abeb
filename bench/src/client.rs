//! The load client: the same streaming request, straight to the provider
//! or through agent-harness, timed chunk by chunk.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use serde_json::json;
use tokio::{task::JoinSet, time::Instant};

/// Where a request goes.
#[derive(Debug, Clone)]
pub enum Target {
    /// The fake provider's chat-completions endpoint.
    Direct { base: String },
    /// llm-katan's chat-completions endpoint (its echo backend): a text
    /// token is a chunk whose delta has content, as Python's `json.dumps`
    /// writes it.
    Katan { base: String },
    /// agent-harness, which calls the fake provider.
    Harness { base: String },
    /// agent-harness, each turn's message naming this file (an image) by
    /// its id after its text.
    HarnessImage { base: String, file_id: Arc<str> },
    /// Several agent-harness replicas, a request to each in turn (as a
    /// gateway spreads them).
    Gateway {
        bases: Arc<[String]>,
        next: Arc<AtomicUsize>,
    },
}

impl Target {
    pub fn gateway(bases: Vec<String>) -> Self {
        Self::Gateway {
            bases: bases.into(),
            next: Arc::new(AtomicUsize::new(0)),
        }
    }
}

/// One request's timings.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// Start to the first text token.
    pub ttft: Duration,
    /// Start to the end of the stream.
    pub total: Duration,
    /// Between consecutive text tokens (0 for tokens in the same read).
    pub gaps: Vec<Duration>,
    pub ok: bool,
    /// Why it is not ok, in a few words (an HTTP status, a cut stream).
    pub failure: Option<String>,
}

impl Sample {
    fn failed(why: impl Into<String>) -> Self {
        Self {
            failure: Some(why.into()),
            ..Self::default()
        }
    }
}

/// Markers of a text token and of the end, per target.
fn markers(target: &Target) -> (&'static [u8], &'static [u8]) {
    match target {
        Target::Direct { .. } => (b"\"content\":\"tok", b"data: [DONE]"),
        Target::Katan { .. } => (b"\"delta\": {\"content\": \"", b"data: [DONE]"),
        Target::Harness { .. } | Target::HarnessImage { .. } | Target::Gateway { .. } => {
            (b"event: message.delta", b"event: turn.completed")
        }
    }
}

fn count(haystack: &[u8], needle: &[u8]) -> usize {
    haystack
        .windows(needle.len())
        .filter(|w| *w == needle)
        .count()
}

/// A streamed turn of a new session.
fn turn(client: &reqwest::Client, base: &str, model: &str) -> reqwest::RequestBuilder {
    turn_saying(
        client,
        base,
        json!({"message": "Hi", "runtime_model": model}),
    )
}

/// A streamed turn of a new session, with this body.
fn turn_saying(
    client: &reqwest::Client,
    base: &str,
    body: serde_json::Value,
) -> reqwest::RequestBuilder {
    client
        .post(format!(
            "{base}/sessions/bench-{}/turns",
            uuid::Uuid::now_v7().simple()
        ))
        .header("accept", "text/event-stream")
        .json(&body)
}

/// Sends one request and times it.
pub async fn request(client: &reqwest::Client, target: &Target, model: &str) -> Sample {
    let started = Instant::now();
    let sent = match target {
        Target::Direct { base } => {
            let url = format!("{base}/v1/chat/completions");
            let mut messages = vec![json!({"role": "user", "content": "Hi"})];
            // A turn with a tool step asks the provider twice: its tool
            // calls, then (their results given) its answer. The provider
            // alone is asked the same two.
            if crate::fake::Spec::parse(model).tools > 0 {
                let body = json!({"model": model, "messages": messages, "stream": true});
                let called = match client.post(&url).json(&body).send().await {
                    Ok(response) if response.status().is_success() => response.bytes().await,
                    _ => return Sample::failed("tool step"),
                };
                if called.is_err() {
                    return Sample::failed("tool step");
                }
                messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_0", "type": "function", "function": {"name": "bench_sleep", "arguments": "{}"}}
                ]}));
                messages
                    .push(json!({"role": "tool", "tool_call_id": "call_0", "content": "slept"}));
            }
            client
                .post(url)
                .json(&json!({"model": model, "messages": messages, "stream": true}))
        }
        // It checks only that a key is given.
        Target::Katan { base } => client
            .post(format!("{base}/v1/chat/completions"))
            .bearer_auth("sk-bench")
            .json(&json!({"model": model, "messages": [{"role": "user", "content": "Hi"}], "stream": true})),
        Target::Harness { base } => turn(client, base, model),
        Target::HarnessImage { base, file_id } => turn_saying(
            client,
            base,
            json!({"message": [
                {"type": "text", "text": "What is this?"},
                {"type": "image", "file_id": &**file_id}
            ], "runtime_model": model}),
        ),
        Target::Gateway { bases, next } => {
            let i = next.fetch_add(1, Ordering::Relaxed) % bases.len().max(1);
            match bases.get(i) {
                Some(base) => turn(client, base, model),
                None => return Sample::failed("no replica"),
            }
        }
    };
    let mut response = match sent.send().await {
        Ok(response) => response,
        Err(e) if e.is_connect() => return Sample::failed("connect"),
        Err(e) if e.is_timeout() => return Sample::failed("timeout"),
        Err(e) => {
            // The innermost cause says what happened (a connection closed
            // under the request, a reset).
            let mut cause: &dyn std::error::Error = &e;
            while let Some(source) = cause.source() {
                cause = source;
            }
            return Sample::failed(format!("request: {cause}"));
        }
    };
    if !response.status().is_success() {
        return Sample::failed(format!("HTTP {}", response.status().as_u16()));
    }
    let (token, end) = markers(target);
    let mut sample = Sample::default();
    let mut buffer: Vec<u8> = Vec::new();
    // Where the next complete marker may start: a marker cut by a read is
    // found, once, after the read that completes it.
    let mut token_from = 0usize;
    let mut end_from = 0usize;
    let mut tokens = 0usize;
    let mut last_token: Option<Instant> = None;
    loop {
        let chunk = match response.chunk().await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => {
                sample.failure = Some(format!("ended after {tokens} tokens"));
                return sample;
            }
            Err(_) => {
                sample.failure = Some(format!("cut after {tokens} tokens"));
                return sample;
            }
        };
        let now = Instant::now();
        buffer.extend_from_slice(&chunk);
        let found = count(&buffer[token_from..], token);
        token_from = buffer.len().saturating_sub(token.len() - 1).max(token_from);
        for i in 0..found {
            if tokens == 0 {
                sample.ttft = now - started;
            } else if let Some(previous) = last_token {
                sample.gaps.push(if i == 0 {
                    now - previous
                } else {
                    Duration::ZERO
                });
            }
            tokens += 1;
            last_token = Some(now);
        }
        if count(&buffer[end_from..], end) > 0 {
            sample.total = now - started;
            sample.ok = tokens > 0;
            if !sample.ok {
                sample.failure = Some("no tokens".into());
            }
            return sample;
        }
        end_from = buffer.len().saturating_sub(end.len() - 1).max(end_from);
        if buffer.len() > 1 << 20 {
            // Keep memory flat on long streams: only the tail matters.
            let cut = buffer.len() - 64;
            buffer.drain(..cut);
            token_from = token_from.saturating_sub(cut);
            end_from = end_from.saturating_sub(cut);
        }
    }
}

/// Runs `total` requests with `concurrency` in flight, all workers starting
/// at once; returns the samples and the wall time.
pub async fn load(
    client: &reqwest::Client,
    target: &Target,
    model: &str,
    concurrency: usize,
    total: usize,
) -> (Vec<Sample>, Duration) {
    load_staggered(client, target, model, concurrency, total, Duration::ZERO).await
}

/// As [`load`], with worker `i` of `n` starting `spread * i / n` after the
/// first: requests of equal length then stay out of step, as requests of
/// independent users are, instead of starting (and ticking) together.
pub async fn load_staggered(
    client: &reqwest::Client,
    target: &Target,
    model: &str,
    concurrency: usize,
    total: usize,
    spread: Duration,
) -> (Vec<Sample>, Duration) {
    load_until(
        client,
        target,
        model,
        concurrency,
        spread,
        Stop::After(total),
    )
    .await
}

/// When a load stops starting requests.
#[derive(Debug, Clone, Copy)]
pub enum Stop {
    /// After this many requests.
    After(usize),
    /// At this instant (requests in flight then finish).
    At(Instant),
}

/// Runs requests with `concurrency` in flight until `stop`, worker `i` of
/// `n` starting `spread * i / n` after the first; returns the samples and
/// the wall time.
pub async fn load_until(
    client: &reqwest::Client,
    target: &Target,
    model: &str,
    concurrency: usize,
    spread: Duration,
    stop: Stop,
) -> (Vec<Sample>, Duration) {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = JoinSet::new();
    let concurrency = concurrency.max(1);
    for worker in 0..concurrency {
        let (client, target, model, next) = (
            client.clone(),
            target.clone(),
            model.to_owned(),
            next.clone(),
        );
        let offset = spread.mul_f64(worker as f64 / concurrency as f64);
        workers.spawn(async move {
            tokio::time::sleep_until(started + offset).await;
            let mut samples = Vec::new();
            loop {
                let go = match stop {
                    Stop::After(total) => next.fetch_add(1, Ordering::Relaxed) < total,
                    Stop::At(deadline) => Instant::now() < deadline,
                };
                if !go {
                    break;
                }
                samples.push(request(&client, &target, &model).await);
            }
            samples
        });
    }
    let mut samples = Vec::new();
    while let Some(done) = workers.join_next().await {
        samples.extend(done.unwrap_or_default());
    }
    (samples, started.elapsed())
}

/// A client for many concurrent streams.
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(10_000)
        .tcp_nodelay(true)
        .build()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{Spec, serve_on};

    /// The provider alone answers a turn with a tool step as the service
    /// has it answered: tool calls, then the text.
    #[tokio::test]
    async fn the_provider_alone_answers_a_tool_step_and_then_the_text() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(serve_on(listener));
        let http = reqwest::Client::new();
        let direct = Target::Direct { base };
        for tools in [0, 1, 3] {
            let model = Spec::parse(&format!("bench/tools={tools}/toolms=0/n=5")).model();
            let sample = request(&http, &direct, &model).await;
            assert!(sample.ok, "tools={tools}");
            assert_eq!(sample.gaps.len(), 4, "five tokens, tools={tools}");
        }
        server.abort();
    }

    /// llm-katan's stream (recorded from its echo backend, 0.22.0): each
    /// chunk with content is a token; the role and finish chunks are not.
    #[tokio::test]
    async fn an_llm_katan_stream_is_timed_token_by_token() {
        use axum::{Router, http::HeaderMap, response::IntoResponse, routing::post};
        const BODY: &str = include_str!("../fixtures/katan_echo.sse");
        let app = Router::new().route(
            "/v1/chat/completions",
            post(|headers: HeaderMap| async move {
                // As llm-katan: no key, 401.
                if headers.get("authorization").is_none() {
                    return (axum::http::StatusCode::UNAUTHORIZED, "").into_response();
                }
                ([("content-type", "text/event-stream")], BODY).into_response()
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let http = reqwest::Client::new();
        // Without a key (as the fake's requests go): refused, and said so.
        let refused = request(&http, &Target::Direct { base: base.clone() }, "bench-echo").await;
        assert!(!refused.ok);
        assert_eq!(refused.failure.as_deref(), Some("HTTP 401"));
        let sample = request(&http, &Target::Katan { base }, "bench-echo").await;
        assert!(sample.ok, "{:?}", sample.failure);
        let tokens = BODY.matches("\"delta\": {\"content\": \"").count();
        assert_eq!(tokens, 29, "the recorded stream's chunks with content");
        assert_eq!(sample.gaps.len(), tokens - 1);
        server.abort();
    }
}
