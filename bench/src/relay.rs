//! `bench relay`: the floor under the service's cost per token. It relays
//! a provider's stream to its client and does nothing else: no store, no
//! turn task, no writer, no event log, no tenant, no limit. It reads the
//! environment `bench compare` gives a binary (`HARNESS_LISTEN`,
//! `OPENAI_BASE_URL`, `OPENAI_API_KEY`), takes `POST /sessions/{id}/turns`
//! as the service does, asks the provider for a chat-completions stream
//! with reqwest (the service's HTTP client), and writes each text delta as
//! a native `message.delta` frame of the same shape and about the same
//! size as the service's, then `turn.completed`.
//!
//! Per token it does what the issue counts as the least a relay does: a
//! socket read, an SSE parse and a JSON parse of the chunk, a JSON encode
//! of the event and a socket write, across the two tasks that own the two
//! connections (the provider's, and the client's, which polls the relayed
//! stream itself). What the service spends per paced token above this, on
//! the same host in the same run, is what its design costs; what this
//! spends is what no design on this host can take out (issue 42's eighth
//! pass). On a fast stream it is not a floor: it writes what each read of
//! the provider brings, where the service writes what each commit holds.

use std::{net::SocketAddr, time::Duration};

use axum::{
    Json, Router,
    body::{Body, Bytes},
    extract::{Path, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::{get, post},
    serve::ListenerExt as _,
};
use futures::{Stream, StreamExt as _};
use serde_json::{Value, json};

/// What the relay needs to reach its provider.
#[derive(Clone)]
struct Upstream {
    http: reqwest::Client,
    /// `{OPENAI_BASE_URL}/chat/completions`.
    url: String,
    key: Option<String>,
    /// CPU spent on each relayed token besides the relay's own
    /// (`BENCH_RELAY_BURN_US`): the floor made as costly as a binary, to
    /// see what that cost alone does to the gaps.
    burn: Duration,
    /// A thread of its own that every provider read's frames pass through
    /// before they are sent (`BENCH_RELAY_HOP_US`), as the service's
    /// events pass through its writer thread: the hop alone, without the
    /// service's store.
    hop: Option<Hop>,
}

/// Where a relay's frames go to cross the hop's thread.
type Hop = tokio::sync::mpsc::Sender<HopJob>;

/// One provider read's frames, on their way through the hop.
struct HopJob {
    frames: Vec<u8>,
    tokens: u32,
    back: tokio::sync::oneshot::Sender<Vec<u8>>,
}

/// Jobs that may wait for the hop's thread, and the most it takes at once
/// (the service's writer thread's queue and group).
const HOP_QUEUE: usize = 1024;
const HOP_GROUP: usize = 256;

/// Starts the hop's thread: it takes what is waiting (up to
/// [`HOP_GROUP`] jobs), spends `per_token` of CPU on each of their tokens,
/// and only then hands every job back, as the writer answers a group's
/// jobs once their shared commit is done. It ends when every sender is
/// dropped.
fn start_hop(per_token: Duration) -> Result<Hop, String> {
    let (jobs, mut queue) = tokio::sync::mpsc::channel::<HopJob>(HOP_QUEUE);
    std::thread::Builder::new()
        .name("relay-hop".into())
        .spawn(move || {
            let mut group = Vec::with_capacity(HOP_GROUP);
            while let Some(first) = queue.blocking_recv() {
                group.push(first);
                while group.len() < HOP_GROUP {
                    match queue.try_recv() {
                        Ok(job) => group.push(job),
                        Err(_) => break,
                    }
                }
                let tokens: u32 = group.iter().map(|job: &HopJob| job.tokens).sum();
                spin(per_token * tokens);
                for job in group.drain(..) {
                    let _ = job.back.send(job.frames);
                }
            }
        })
        .map_err(|e| format!("cannot start the hop's thread: {e}"))?;
    Ok(jobs)
}

/// `frames` back from the hop's thread, or as they are without a hop.
async fn through(hop: Option<&Hop>, frames: Vec<u8>, tokens: u32) -> std::io::Result<Vec<u8>> {
    let Some(hop) = hop else {
        return Ok(frames);
    };
    let (back, answer) = tokio::sync::oneshot::channel();
    let gone = || std::io::Error::other("the hop's thread stopped");
    hop.send(HopJob {
        frames,
        tokens,
        back,
    })
    .await
    .map_err(|_| gone())?;
    answer.await.map_err(|_| gone())
}

/// Serves the relay on `HARNESS_LISTEN` until the process is stopped.
pub async fn serve() -> Result<(), String> {
    let listen: SocketAddr = std::env::var("HARNESS_LISTEN")
        .map_err(|_| "HARNESS_LISTEN is not set".to_owned())?
        .parse()
        .map_err(|e| format!("HARNESS_LISTEN: {e}"))?;
    let base =
        std::env::var("OPENAI_BASE_URL").map_err(|_| "OPENAI_BASE_URL is not set".to_owned())?;
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
    let upstream = Upstream {
        http,
        url: format!("{}/chat/completions", base.trim_end_matches('/')),
        key: std::env::var("OPENAI_API_KEY").ok(),
        burn: match std::env::var("BENCH_RELAY_BURN_US") {
            Ok(us) => Duration::from_micros(
                us.parse()
                    .map_err(|e| format!("BENCH_RELAY_BURN_US={us}: {e}"))?,
            ),
            Err(_) => Duration::ZERO,
        },
        hop: match std::env::var("BENCH_RELAY_HOP_US") {
            Ok(us) => Some(start_hop(Duration::from_micros(
                us.parse()
                    .map_err(|e| format!("BENCH_RELAY_HOP_US={us}: {e}"))?,
            ))?),
            Err(_) => None,
        },
    };
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("{listen}: {e}"))?;
    // As the service's own connections: a token is written at once, not
    // held for the last one's acknowledgement.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app(upstream))
        .await
        .map_err(|e| e.to_string())
}

fn app(upstream: Upstream) -> Router {
    Router::new()
        .route("/readyz", get(|| async { "ready" }))
        .route("/sessions/{id}/turns", post(turn))
        .with_state(upstream)
}

async fn turn(
    State(upstream): State<Upstream>,
    Path(session): Path<String>,
    Json(body): Json<Value>,
) -> Response {
    let (Some(model), Some(message)) = (body["runtime_model"].as_str(), body["message"].as_str())
    else {
        return (
            StatusCode::BAD_REQUEST,
            "the relay needs `message` and `runtime_model` (the model the provider answers as)",
        )
            .into_response();
    };
    let mut request = upstream.http.post(&upstream.url).json(&json!({
        "model": model,
        "messages": [{"role": "user", "content": message}],
        "stream": true,
        "stream_options": {"include_usage": true},
    }));
    if let Some(key) = &upstream.key {
        request = request.bearer_auth(key);
    }
    let response = match request.send().await {
        Ok(response) if response.status().is_success() => response,
        Ok(response) => {
            return (StatusCode::BAD_GATEWAY, response.status().to_string()).into_response();
        }
        Err(e) => return (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    };
    let turn_id = uuid::Uuid::now_v7();
    let frames = relayed(response, session, turn_id, upstream.burn, upstream.hop);
    (
        [(header::CONTENT_TYPE, "text/event-stream")],
        Body::from_stream(frames),
    )
        .into_response()
}

/// The provider's stream as native frames, polled by the client's
/// connection task.
fn relayed(
    response: reqwest::Response,
    session: String,
    turn: uuid::Uuid,
    burn: Duration,
    hop: Option<Hop>,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    let mut body = response.bytes_stream();
    async_stream::stream! {
        let mut lines = Lines::default();
        let mut seq = 0u64;
        while let Some(chunk) = body.next().await {
            let Ok(chunk) = chunk else {
                yield Err(std::io::Error::other("the provider's stream broke"));
                return;
            };
            if let Err(e) = lines.feed(&chunk) {
                yield Err(e);
                return;
            }
            let mut out = Vec::new();
            let mut tokens = 0u32;
            while let Some(data) = lines.next_data() {
                let data = &lines.buffer[data];
                if data == b"[DONE]" {
                    seq += 1;
                    frame(&mut out, &Envelope {
                        status: Some("completed"),
                        ..Envelope::new(&session, turn, seq, "turn.completed")
                    });
                    yield through(hop.as_ref(), out, tokens).await.map(Bytes::from);
                    return;
                }
                let Ok(chunk) = serde_json::from_slice::<Chunk>(data) else {
                    yield Err(std::io::Error::other("a chunk is not JSON"));
                    return;
                };
                for text in chunk.choices.iter().filter_map(|c| c.delta.content.as_deref()) {
                    if !text.is_empty() {
                        spin(burn);
                        tokens += 1;
                        seq += 1;
                        frame(&mut out, &Envelope {
                            step: Some(1),
                            text: Some(text),
                            ..Envelope::new(&session, turn, seq, "message.delta")
                        });
                    }
                }
            }
            if !out.is_empty() {
                match through(hop.as_ref(), out, tokens).await {
                    Ok(out) => yield Ok(Bytes::from(out)),
                    Err(e) => {
                        yield Err(e);
                        return;
                    }
                }
            }
        }
    }
}

/// Keeps this thread busy for `time`.
fn spin(time: Duration) {
    if time.is_zero() {
        return;
    }
    let started = std::time::Instant::now();
    while started.elapsed() < time {
        std::hint::spin_loop();
    }
}

/// Writes one native frame (`id:`, `event:`, `data:` the envelope) to `out`.
fn frame(out: &mut Vec<u8>, envelope: &Envelope<'_>) {
    use std::io::Write as _;
    // Writing to a Vec cannot fail.
    let _ = write!(
        out,
        "id: {}\nevent: {}\ndata: ",
        envelope.seq, envelope.kind
    );
    let _ = serde_json::to_writer(&mut *out, envelope);
    out.extend_from_slice(b"\n\n");
}

/// The envelope of a native event, as the service writes it: the event's
/// fields beside the envelope's.
#[derive(serde::Serialize)]
struct Envelope<'a> {
    seq: u64,
    session_id: &'a str,
    turn_id: uuid::Uuid,
    created_at: chrono::DateTime<chrono::Utc>,
    #[serde(rename = "type")]
    kind: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<&'a str>,
}

impl<'a> Envelope<'a> {
    fn new(session_id: &'a str, turn_id: uuid::Uuid, seq: u64, kind: &'a str) -> Self {
        Self {
            seq,
            session_id,
            turn_id,
            created_at: chrono::Utc::now(),
            kind,
            step: None,
            text: None,
            status: None,
        }
    }
}

/// The part of a chat-completions chunk the relay reads.
#[derive(serde::Deserialize)]
struct Chunk<'a> {
    #[serde(default, borrow)]
    choices: Vec<Choice<'a>>,
}

#[derive(serde::Deserialize)]
struct Choice<'a> {
    #[serde(borrow)]
    delta: ChunkDelta<'a>,
}

#[derive(serde::Deserialize)]
struct ChunkDelta<'a> {
    #[serde(default, borrow)]
    content: Option<std::borrow::Cow<'a, str>>,
}

/// `data:` lines read in place from byte chunks (the provider's events are
/// one `data:` line each).
#[derive(Default)]
struct Lines {
    buffer: Vec<u8>,
    /// Where the unread part of `buffer` begins.
    read: usize,
}

/// The longest a line of the provider's stream may grow before the relay
/// gives up on it (its buffer is bounded).
const LINE_MAX: usize = 1 << 20;

impl Lines {
    /// Adds `chunk` after what is unread; refused when the line it
    /// continues is already past [`LINE_MAX`].
    fn feed(&mut self, chunk: &[u8]) -> std::io::Result<()> {
        self.buffer.drain(..self.read);
        self.read = 0;
        if self.buffer.len() + chunk.len() > LINE_MAX && !chunk.contains(&b'\n') {
            return Err(std::io::Error::other(format!(
                "a line of the provider's stream is over {LINE_MAX} bytes"
            )));
        }
        self.buffer.extend_from_slice(chunk);
        Ok(())
    }

    /// Where the next `data:` line's value lies in `buffer`.
    fn next_data(&mut self) -> Option<std::ops::Range<usize>> {
        while let Some(at) = self.buffer[self.read..].iter().position(|b| *b == b'\n') {
            let (start, end) = (self.read, self.read + at);
            self.read = end + 1;
            let line = &self.buffer[start..end];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if let Some(value) = line.strip_prefix(b"data:") {
                let skip = usize::from(value.first() == Some(&b' '));
                let from = start + 5 + skip;
                return Some(from..start + line.len());
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{Target, request};
    use crate::fake::{Spec, serve_on};

    /// The fake provider and a relay in front of it spending `burn` a
    /// token; the relay's base URL.
    async fn relay(burn: Duration, hop: Option<Hop>) -> (String, [tokio::task::JoinHandle<()>; 2]) {
        let provider = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let provider_base = format!("http://{}", provider.local_addr().unwrap());
        let fake = tokio::spawn(async move { serve_on(provider).await.unwrap() });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let upstream = Upstream {
            http: reqwest::Client::new(),
            url: format!("{provider_base}/v1/chat/completions"),
            key: None,
            burn,
            hop,
        };
        let server = tokio::spawn(async move {
            axum::serve(listener, app(upstream)).await.unwrap();
        });
        (base, [fake, server])
    }

    /// Lines are read in place across chunks, and a line that never ends
    /// is refused once it passes [`LINE_MAX`], not kept growing.
    #[test]
    fn lines_are_read_across_chunks_and_bounded() {
        let mut lines = Lines::default();
        lines.feed(b"data: {\"a\"").unwrap();
        assert_eq!(lines.next_data(), None);
        lines.feed(b":1}\r\n\n: comment\ndata:[DONE]\n").unwrap();
        let first = lines.next_data().unwrap();
        assert_eq!(&lines.buffer[first], b"{\"a\":1}");
        let done = lines.next_data().unwrap();
        assert_eq!(&lines.buffer[done], b"[DONE]");
        assert_eq!(lines.next_data(), None);
        let long = vec![b'x'; LINE_MAX / 2 + 1];
        lines.feed(&long).unwrap();
        assert!(lines.feed(&long).is_err());
    }

    /// The relay passes every token of the fake's stream to the client as
    /// the service's frames, and ends with `turn.completed`.
    #[tokio::test]
    async fn the_relay_passes_every_token_on() {
        let (base, tasks) = relay(Duration::ZERO, None).await;
        let http = reqwest::Client::new();
        let through = Target::Harness { base: base.clone() };
        for n in [1, 7, 40] {
            let model = Spec::parse(&format!("bench/n={n}")).model();
            let sample = request(&http, &through, &model).await;
            assert!(sample.ok, "n={n}: {:?}", sample.failure);
            assert_eq!(sample.gaps.len(), n - 1, "n={n}: every token relayed once");
        }
        // Each frame is the service's: `id:` the seq, `event:` the type,
        // `data:` the envelope with the event's fields beside its own.
        let body = http
            .post(format!("{base}/sessions/s-1/turns"))
            .json(&json!({"message": "Hi", "runtime_model": Spec::parse("bench/n=3").model()}))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let frames: Vec<&str> = body.split_terminator("\n\n").collect();
        assert_eq!(frames.len(), 4, "{body}");
        for (i, frame) in frames.iter().enumerate() {
            let seq = i as u64 + 1;
            let lines: Vec<&str> = frame.lines().collect();
            let kind = if seq == 4 {
                "turn.completed"
            } else {
                "message.delta"
            };
            assert_eq!(lines[0], format!("id: {seq}"));
            assert_eq!(lines[1], format!("event: {kind}"));
            let data: Value =
                serde_json::from_str(lines[2].strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(data["seq"], seq);
            assert_eq!(data["type"], kind);
            assert_eq!(data["session_id"], "s-1");
            if seq < 4 {
                assert!(
                    data["text"].as_str().is_some_and(|t| !t.is_empty()),
                    "{data}"
                );
            } else {
                assert_eq!(data["status"], "completed");
            }
        }
        // A turn that names no model is refused, not relayed as model "".
        let refused = http
            .post(format!("{base}/sessions/s-2/turns"))
            .json(&json!({"message": "Hi"}))
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), reqwest::StatusCode::BAD_REQUEST);
        tasks.iter().for_each(tokio::task::JoinHandle::abort);
    }

    /// `BENCH_RELAY_BURN_US`: each relayed token costs the relay that much
    /// more (here a turn of 5 tokens at 20 ms each cannot end sooner than
    /// 100 ms).
    #[tokio::test]
    async fn a_burning_relay_spends_its_time_on_every_token() {
        let (base, tasks) = relay(Duration::from_millis(20), None).await;
        let model = Spec::parse("bench/n=5").model();
        let sample = request(&reqwest::Client::new(), &Target::Harness { base }, &model).await;
        assert!(sample.ok, "{:?}", sample.failure);
        assert!(
            sample.total >= Duration::from_millis(100),
            "{:?}",
            sample.total
        );
        tasks.iter().for_each(tokio::task::JoinHandle::abort);
    }

    /// `BENCH_RELAY_HOP_US`: every token crosses the hop's thread, which
    /// spends its time on each before it hands them back (5 tokens at
    /// 20 ms each there: not sooner than 100 ms), and none is lost.
    #[tokio::test]
    async fn a_relay_with_a_hop_passes_every_token_through_its_thread() {
        let hop = start_hop(Duration::from_millis(20)).unwrap();
        let (base, tasks) = relay(Duration::ZERO, Some(hop)).await;
        let model = Spec::parse("bench/n=5").model();
        let sample = request(&reqwest::Client::new(), &Target::Harness { base }, &model).await;
        assert!(sample.ok, "{:?}", sample.failure);
        assert_eq!(sample.gaps.len(), 4);
        assert!(
            sample.total >= Duration::from_millis(100),
            "{:?}",
            sample.total
        );
        tasks.iter().for_each(tokio::task::JoinHandle::abort);
    }
}
