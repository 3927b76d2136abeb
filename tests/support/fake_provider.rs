//! A fake LLM provider on a real loopback socket: answers any POST (OpenAI's
//! `/v1/chat/completions`, Anthropic's `/v1/messages`, Ollama's `/api/chat`)
//! with scripted fixture bodies, and records every request it receives.
//! Its embeddings endpoints (OpenAI's `/v1/embeddings`, Ollama's
//! `/api/embed`) answer in their wire formats with vectors made from the
//! words of each text, a few synonyms sharing a dimension (`automobile`,
//! `vehicle` and `car`), so that meaning can find what words miss.

#![allow(dead_code, reason = "shared by several test binaries")]

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    Router,
    body::{Body, Bytes},
    extract::State,
    http::{HeaderMap, StatusCode},
    response::Response,
    routing::post,
};
use tokio_util::sync::CancellationToken;

/// One scripted answer.
#[derive(Clone)]
pub struct Reply {
    status: u16,
    content_type: String,
    headers: Vec<(String, String)>,
    chunks: Vec<Bytes>,
    /// Send this many chunks, then wait for the token before the rest.
    hold: Option<(usize, CancellationToken)>,
    /// Send this many chunks, then break the connection mid-body.
    abort_after: Option<usize>,
    /// Wait for the token before answering at all (no headers).
    hold_head: Option<CancellationToken>,
    /// The pause before each chunk (1 ms unless set).
    pace: Duration,
}

pub fn fixture(name: &str) -> String {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("fixture {path}: {e}"))
}

impl Reply {
    /// A 200 event stream from an `.sse` fixture, one chunk per event.
    pub fn sse(name: &str) -> Self {
        Self::raw_sse(&fixture(name))
    }

    /// A 200 NDJSON stream from a fixture, one chunk per line (Ollama).
    pub fn ndjson(name: &str) -> Self {
        Self::raw_ndjson(&fixture(name))
    }

    /// A 200 event stream from literal text.
    pub fn raw_sse(body: &str) -> Self {
        Self {
            chunks: body
                .split_inclusive("\n\n")
                .map(|event| Bytes::from(event.to_owned()))
                .collect(),
            ..Self::sse_empty()
        }
    }

    /// An OpenAI text answer, streamed in the recorded shape of
    /// `openai/text.sse` (the same chunks, with this text in two deltas).
    pub fn openai_text(text: &str) -> Self {
        let half = text
            .char_indices()
            .nth(text.chars().count() / 2)
            .map_or(text.len(), |(i, _)| i);
        Self::openai_deltas(&[&text[..half], &text[half..]])
    }

    /// An Anthropic text answer in the recorded shape of
    /// `anthropic/text.sse` (the same events, this text in its first delta).
    pub fn anthropic_text(text: &str) -> Self {
        let text = serde_json::to_string(text).unwrap();
        let body = fixture("anthropic/text.sse")
            .replace(r#""text":"Hello""#, &format!(r#""text":{text}"#))
            .replace(r#""text":"! How can I""#, r#""text":"""#)
            .replace(r#""text":" help you today?""#, r#""text":"""#);
        Self::raw_sse(&body)
    }

    /// An OpenAI text answer in the recorded shape of `openai/text.sse`,
    /// one content delta per piece.
    pub fn openai_deltas(pieces: &[&str]) -> Self {
        let chunk = |choices: serde_json::Value, usage: serde_json::Value| {
            let chunk = serde_json::json!({
                "id": "chatcmpl-CWq2hVnYt8o4Qm1sKxR7uJd3Lbe9F",
                "object": "chat.completion.chunk",
                "created": 1763790000,
                "model": "gpt-4o-mini-2024-07-18",
                "service_tier": "default",
                "system_fingerprint": "fp_560af6e559",
                "choices": choices,
                "usage": usage,
            });
            format!("data: {chunk}\n\n")
        };
        let delta = |content: &str| {
            chunk(
                serde_json::json!([{"index": 0, "delta": {"content": content}, "logprobs": null, "finish_reason": null}]),
                serde_json::Value::Null,
            )
        };
        let body = [
            chunk(
                serde_json::json!([{"index": 0, "delta": {"role": "assistant", "content": "", "refusal": null}, "logprobs": null, "finish_reason": null}]),
                serde_json::Value::Null,
            ),
            pieces.iter().map(|piece| delta(piece)).collect(),
            chunk(
                serde_json::json!([{"index": 0, "delta": {}, "logprobs": null, "finish_reason": "stop"}]),
                serde_json::Value::Null,
            ),
            chunk(
                serde_json::json!([]),
                serde_json::json!({"prompt_tokens": 120, "completion_tokens": 40, "total_tokens": 160, "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0}, "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}}),
            ),
            "data: [DONE]\n\n".to_owned(),
        ]
        .concat();
        Self::raw_sse(&body)
    }

    /// One OpenAI tool call, streamed in the recorded shape of
    /// `openai/tool_call_local_search.sse` (the same chunks, with this
    /// call's id, name and arguments).
    pub fn openai_tool_call(call_id: &str, name: &str, arguments: &serde_json::Value) -> Self {
        let chunk = |choices: serde_json::Value, usage: serde_json::Value| {
            let chunk = serde_json::json!({
                "id": "chatcmpl-CWr01kXb7Qe2LmNp4Rs9TuVw3Yz5A",
                "object": "chat.completion.chunk",
                "created": 1763790100,
                "model": "gpt-4o-mini-2024-07-18",
                "service_tier": "default",
                "system_fingerprint": "fp_560af6e559",
                "choices": choices,
                "usage": usage,
            });
            format!("data: {chunk}\n\n")
        };
        let body = [
            chunk(
                serde_json::json!([{"index": 0, "delta": {"role": "assistant", "content": null, "tool_calls": [{"index": 0, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}], "refusal": null}, "logprobs": null, "finish_reason": null}]),
                serde_json::Value::Null,
            ),
            chunk(
                serde_json::json!([{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": arguments.to_string()}}]}, "logprobs": null, "finish_reason": null}]),
                serde_json::Value::Null,
            ),
            chunk(
                serde_json::json!([{"index": 0, "delta": {}, "logprobs": null, "finish_reason": "tool_calls"}]),
                serde_json::Value::Null,
            ),
            chunk(
                serde_json::json!([]),
                serde_json::json!({"prompt_tokens": 212, "completion_tokens": 18, "total_tokens": 230, "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0}, "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}}),
            ),
            "data: [DONE]\n\n".to_owned(),
        ]
        .concat();
        Self::raw_sse(&body)
    }

    /// One Ollama tool call without an id, in the recorded shape of
    /// `ollama/tool_call_local_search.ndjson` (the same lines, with this
    /// call's name and arguments).
    pub fn ollama_tool_call(name: &str, arguments: &serde_json::Value) -> Self {
        let call = serde_json::json!({"model": "llama3.2", "created_at": "2025-11-20T10:20:01.118044Z", "message": {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": name, "arguments": arguments}}]}, "done": false});
        let done = serde_json::json!({"model": "llama3.2", "created_at": "2025-11-20T10:20:01.401355Z", "message": {"role": "assistant", "content": ""}, "done_reason": "stop", "done": true, "total_duration": 612345678, "load_duration": 2811234, "prompt_eval_count": 402, "prompt_eval_duration": 120000000, "eval_count": 22, "eval_duration": 480000000});
        Self::raw_ndjson(&format!("{call}\n{done}\n"))
    }

    /// A 200 NDJSON stream from literal text.
    pub fn raw_ndjson(body: &str) -> Self {
        Self {
            content_type: "application/x-ndjson".into(),
            chunks: body
                .split_inclusive('\n')
                .map(|line| Bytes::from(line.to_owned()))
                .collect(),
            ..Self::sse_empty()
        }
    }

    fn sse_empty() -> Self {
        Self {
            status: 200,
            content_type: "text/event-stream; charset=utf-8".into(),
            headers: Vec::new(),
            chunks: Vec::new(),
            hold: None,
            abort_after: None,
            hold_head: None,
            pace: Duration::from_millis(1),
        }
    }

    /// A complete body with this status and content type.
    pub fn body(status: u16, content_type: &str, name: &str) -> Self {
        Self {
            status,
            content_type: content_type.into(),
            headers: Vec::new(),
            chunks: vec![Bytes::from(fixture(name))],
            hold: None,
            abort_after: None,
            hold_head: None,
            pace: Duration::from_millis(1),
        }
    }

    /// A complete body given as text.
    pub fn text(status: u16, content_type: &str, body: &str) -> Self {
        Self {
            status,
            content_type: content_type.into(),
            headers: Vec::new(),
            chunks: vec![Bytes::from(body.to_owned())],
            hold: None,
            abort_after: None,
            hold_head: None,
            pace: Duration::from_millis(1),
        }
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Sends `chunks` chunks, then breaks the connection (the body is never
    /// finished: a reset mid-answer as a client sees it).
    pub fn abort_after(mut self, chunks: usize) -> Self {
        self.abort_after = Some(chunks);
        self
    }

    /// Answers nothing, not even headers, until `gate` is cancelled.
    pub fn hold_head(mut self, gate: &CancellationToken) -> Self {
        self.hold_head = Some(gate.clone());
        self
    }

    /// Pauses `pace` before each chunk.
    pub fn pace(mut self, pace: Duration) -> Self {
        self.pace = pace;
        self
    }

    /// Only keep-alive comments (`: ping`), `count` of them.
    pub fn comments_only(count: usize) -> Self {
        Self {
            chunks: (0..count)
                .map(|_| Bytes::from_static(b": ping\n\n"))
                .collect(),
            ..Self::sse_empty()
        }
    }

    /// Sends `chunks` chunks, then waits until `gate` is cancelled.
    pub fn hold_after(mut self, chunks: usize, gate: &CancellationToken) -> Self {
        self.hold = Some((chunks, gate.clone()));
        self
    }
}

/// A request the fake received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub path: String,
    pub headers: HeaderMap,
    pub body: serde_json::Value,
}

/// Answers a request (its JSON body) when the script is empty.
pub type Responder = Arc<dyn Fn(&serde_json::Value) -> Reply + Send + Sync>;

#[derive(Default)]
struct Shared {
    script: Mutex<VecDeque<Reply>>,
    responder: Mutex<Option<Responder>>,
    requests: Mutex<Vec<Recorded>>,
    embedding_requests: Mutex<Vec<Recorded>>,
    embeddings_fail: std::sync::atomic::AtomicBool,
}

/// Dimensions of the fake's embeddings.
const DIMENSIONS: usize = 32;

/// A vector of the words of `text`: one dimension per word (hashed), the
/// synonyms of `car` on one.
pub fn fake_vector(text: &str) -> Vec<f32> {
    let mut vector = vec![0.0f32; DIMENSIONS];
    for word in text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.len() > 2)
        .map(str::to_lowercase)
    {
        let word = match word.as_str() {
            "automobile" | "vehicle" | "cars" => "car".to_owned(),
            _ => word,
        };
        let hash = word.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        vector[(hash % DIMENSIONS as u64) as usize] += 1.0;
    }
    vector
}

async fn embeddings(
    State(shared): State<Arc<Shared>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    shared.embedding_requests.lock().unwrap().push(Recorded {
        path: uri.to_string(),
        headers,
        body: body.clone(),
    });
    if shared
        .embeddings_fail
        .load(std::sync::atomic::Ordering::SeqCst)
    {
        return Response::builder()
            .status(StatusCode::SERVICE_UNAVAILABLE)
            .body(Body::from(
                r#"{"error": {"message": "overloaded", "type": "server_error"}}"#,
            ))
            .unwrap();
    }
    let inputs: Vec<String> = body["input"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|t| t.as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default();
    let vectors: Vec<Vec<f32>> = inputs.iter().map(|t| fake_vector(t)).collect();
    let tokens: usize = inputs.iter().map(|t| t.split_whitespace().count()).sum();
    let answer = if uri.path() == "/api/embed" {
        serde_json::json!({
            "model": body["model"],
            "embeddings": vectors,
            "total_duration": 14_143_917,
            "load_duration": 1_019_500,
            "prompt_eval_count": tokens,
        })
    } else {
        serde_json::json!({
            "object": "list",
            "data": vectors.iter().enumerate().map(|(index, embedding)| serde_json::json!({
                "object": "embedding", "index": index, "embedding": embedding,
            })).collect::<Vec<_>>(),
            "model": body["model"],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        })
    };
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from(answer.to_string()))
        .unwrap()
}

/// The running fake; stops when dropped.
pub struct FakeProvider {
    /// Base URL to configure as `OPENAI_BASE_URL`.
    pub base_url: String,
    /// `http://host:port`, for `ANTHROPIC_BASE_URL` and `OLLAMA_HOST`.
    pub root: String,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

impl FakeProvider {
    pub async fn start() -> Self {
        let shared = Arc::new(Shared::default());
        let app = Router::new()
            .route("/v1/embeddings", post(embeddings))
            .route("/api/embed", post(embeddings))
            .fallback(post(answer))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let root = format!("http://{}", listener.local_addr().unwrap());
        let base_url = format!("{root}/v1");
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move { stopped.cancelled().await })
                .await
                .unwrap();
        });
        Self {
            base_url,
            root,
            shared,
            stop,
        }
    }

    /// Answers every request the script does not, by its body: a provider
    /// whose answer depends on the conversation, as a model's does (a step
    /// asked again gets the same answer).
    pub fn respond_with(&self, responder: Responder) {
        *self.shared.responder.lock().unwrap() = Some(responder);
    }

    /// Queues answers, served in order, one per request.
    pub fn enqueue(&self, replies: impl IntoIterator<Item = Reply>) {
        self.shared.script.lock().unwrap().extend(replies);
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// The embeddings requests received (they are not in [`Self::requests`]).
    pub fn embedding_requests(&self) -> Vec<Recorded> {
        self.shared.embedding_requests.lock().unwrap().clone()
    }

    /// Makes the embeddings endpoints answer 503 (or serve again).
    pub fn fail_embeddings(&self, fail: bool) {
        self.shared
            .embeddings_fail
            .store(fail, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn answer(
    State(shared): State<Arc<Shared>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    let responder = shared.responder.lock().unwrap().clone();
    let scripted = shared.script.lock().unwrap().pop_front();
    let reply = scripted.or_else(|| responder.map(|respond| respond(&body)));
    shared.requests.lock().unwrap().push(Recorded {
        path: uri.to_string(),
        headers,
        body,
    });
    let Some(reply) = reply else {
        return Response::builder()
            .status(StatusCode::INTERNAL_SERVER_ERROR)
            .body(Body::from("the fake provider has no scripted reply left"))
            .unwrap();
    };
    let Reply {
        status,
        content_type,
        headers,
        chunks,
        hold,
        abort_after,
        hold_head,
        pace,
    } = reply;
    if let Some(gate) = hold_head {
        gate.cancelled().await;
    }
    let stream = async_stream::stream! {
        for (i, chunk) in chunks.into_iter().enumerate() {
            if let Some((after, gate)) = &hold
                && i == *after
            {
                gate.cancelled().await;
            }
            if abort_after == Some(i) {
                yield Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "scripted reset"));
                return;
            }
            // A tiny pause between events, as a real provider has.
            tokio::time::sleep(pace).await;
            yield Ok::<_, std::io::Error>(chunk);
        }
    };
    let mut response = Response::builder()
        .status(status)
        .header("content-type", content_type);
    for (name, value) in headers {
        response = response.header(name, value);
    }
    response.body(Body::from_stream(stream)).unwrap()
}
