//! Each adapter's answer read to its end after its last event, on a real
//! socket: the connection serves the next call.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::{Stream, StreamExt};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};
use tokio_util::sync::CancellationToken;

use super::{Drains, MOST};
use crate::providers::{
    ChatMessage, ChatRequest, LlmProvider, ProviderEvent,
    anthropic::{AnthropicConfig, AnthropicProvider},
    ollama::{OllamaConfig, OllamaProvider},
    openai::{OpenAiConfig, OpenAiProvider},
};

/// A provider on loopback that answers every request with `body` (one
/// chunk), then ends the body only when `gate` is cancelled; it counts the
/// connections it accepts.
struct Server {
    url: String,
    connections: Arc<AtomicUsize>,
    stop: CancellationToken,
}

impl Server {
    #[expect(
        clippy::disallowed_methods,
        reason = "the test's own server: its accept loop ends with its token, its connections with it"
    )]
    async fn start(
        content_type: &'static str,
        body: &'static str,
        gate: CancellationToken,
    ) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let connections = Arc::new(AtomicUsize::new(0));
        let stop = CancellationToken::new();
        let (counted, stopped) = (connections.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let socket = tokio::select! {
                    () = stopped.cancelled() => return,
                    accepted = listener.accept() => accepted.unwrap().0,
                };
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve(socket, content_type, body, gate.clone()));
            }
        });
        Self {
            url,
            connections,
            stop,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Answers each request of one connection, as long as it stays open.
async fn serve(mut socket: TcpStream, content_type: &str, body: &str, gate: CancellationToken) {
    let mut buffer = Vec::new();
    loop {
        // The head, then as many bytes as its content-length says.
        let head_end = loop {
            if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            let mut chunk = [0u8; 4096];
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .map_or(0, |value| value.trim().parse().unwrap());
        while buffer.len() < head_end + length {
            let mut chunk = [0u8; 4096];
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        }
        buffer.drain(..head_end + length);
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n",
            body.len()
        );
        socket.write_all(answer.as_bytes()).await.unwrap();
        // The answer's last event is out; its body ends later.
        gate.cancelled().await;
        socket.write_all(b"0\r\n\r\n").await.unwrap();
    }
}

fn request() -> ChatRequest {
    ChatRequest::new("", vec![ChatMessage::user("Hi")], Duration::from_secs(10))
}

/// The events of one call up to its `Finished`, after which the stream is
/// dropped, as a step drops it.
async fn until_finished(provider: &dyn LlmProvider) -> Vec<ProviderEvent> {
    let mut stream = provider.stream(request()).await.unwrap();
    let mut events = Vec::new();
    while let Some(event) = stream.next().await {
        let event = event.unwrap();
        let finished = matches!(event, ProviderEvent::Finished(_));
        events.push(event);
        if finished {
            break;
        }
    }
    events
}

const OPENAI: &str = include_str!("../../../../../tests/fixtures/openai/text.sse");
const ANTHROPIC: &str = include_str!("../../../../../tests/fixtures/anthropic/text.sse");
const OLLAMA: &str = include_str!("../../../../../tests/fixtures/ollama/text.ndjson");

/// The limits every adapter here is built with.
const CONNECT: Duration = Duration::from_secs(2);
const IDLE: Duration = Duration::from_secs(10);
const MOST_BYTES: usize = 1 << 20;

#[derive(Clone, Copy)]
enum Adapter {
    OpenAi,
    Anthropic,
    Ollama,
}

impl Adapter {
    /// Its answer's content type and recorded body.
    fn answer(self) -> (&'static str, &'static str) {
        match self {
            Self::OpenAi => ("text/event-stream", OPENAI),
            Self::Anthropic => ("text/event-stream", ANTHROPIC),
            Self::Ollama => ("application/x-ndjson", OLLAMA),
        }
    }

    /// The adapter on the server at `url`, and its drains.
    fn at(self, url: &str) -> (Box<dyn LlmProvider>, Drains) {
        match self {
            Self::OpenAi => {
                let provider = OpenAiProvider::new(OpenAiConfig {
                    base_url: format!("{url}/v1"),
                    api_key: Some("sk-test".into()),
                    model: "gpt-4o-mini".into(),
                    connect_timeout: CONNECT,
                    idle_timeout: IDLE,
                    max_response_bytes: MOST_BYTES,
                })
                .unwrap();
                let drains = provider.drains.clone();
                (Box::new(provider), drains)
            }
            Self::Anthropic => {
                let provider = AnthropicProvider::new(AnthropicConfig {
                    connect_timeout: CONNECT,
                    idle_timeout: IDLE,
                    max_response_bytes: MOST_BYTES,
                    max_tokens: 1024,
                    base_url: url.to_owned(),
                    api_key: Some("sk-ant-test".into()),
                    model: "claude-sonnet-4-5".into(),
                })
                .unwrap();
                let drains = provider.drains.clone();
                (Box::new(provider), drains)
            }
            Self::Ollama => {
                let config = OllamaConfig {
                    host: url.to_owned(),
                    model: "llama3.2".into(),
                    connect_timeout: CONNECT,
                    idle_timeout: IDLE,
                    max_response_bytes: MOST_BYTES,
                };
                let provider = OllamaProvider::new(config).unwrap();
                let drains = provider.drains.clone();
                (Box::new(provider), drains)
            }
        }
    }
}

/// Two calls, the first answer's body ended only after its last event
/// was read: the call does not wait for that end, and the second call
/// goes over the first one's connection.
async fn one_connection_for_two_calls(adapter: Adapter) {
    let gate = CancellationToken::new();
    let (content_type, body) = adapter.answer();
    let server = Server::start(content_type, body, gate.clone()).await;
    let (provider, drains) = adapter.at(&server.url);
    let first = until_finished(provider.as_ref()).await;
    assert!(matches!(first.last(), Some(ProviderEvent::Finished(_))));
    assert_eq!(drains.running(), 1, "the rest of the answer is being read");
    gate.cancel();
    drains.settled().await;
    let second = until_finished(provider.as_ref()).await;
    assert_eq!(first, second);
    assert_eq!(server.connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_openai_answer_is_read_to_its_end_and_its_connection_used_again() {
    one_connection_for_two_calls(Adapter::OpenAi).await;
}

#[tokio::test]
async fn an_anthropic_answer_is_read_to_its_end_and_its_connection_used_again() {
    one_connection_for_two_calls(Adapter::Anthropic).await;
}

#[tokio::test]
async fn an_ollama_answer_is_read_to_its_end_and_its_connection_used_again() {
    one_connection_for_two_calls(Adapter::Ollama).await;
}

/// A stream that never ends, and says when it is dropped.
fn endless(dropped: &Arc<AtomicBool>) -> std::pin::Pin<Box<impl Stream<Item = ()> + Send + use<>>> {
    struct Flag(Arc<AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let flag = Flag(dropped.clone());
    Box::pin(futures::stream::pending::<()>().map(move |()| {
        let _ = &flag;
    }))
}

#[tokio::test(start_paused = true)]
async fn a_rest_that_does_not_end_is_dropped_after_the_grace() {
    let drains = Drains::new();
    let dropped = Arc::new(AtomicBool::new(false));
    drains.hand_over(endless(&dropped));
    assert_eq!(drains.running(), 1);
    tokio::time::sleep(super::GRACE - Duration::from_millis(1)).await;
    assert!(
        !dropped.load(Ordering::SeqCst),
        "still read within the grace"
    );
    drains.settled().await;
    assert!(dropped.load(Ordering::SeqCst));
    assert_eq!(drains.running(), 0);
}

#[tokio::test]
async fn past_the_most_drains_a_rest_is_dropped_at_once_and_all_stop_with_the_drains() {
    let drains = Drains::new();
    let flags: Vec<Arc<AtomicBool>> = (0..=MOST).map(|_| Arc::default()).collect();
    for flag in &flags {
        drains.hand_over(endless(flag));
    }
    assert_eq!(drains.running(), MOST);
    assert!(flags[MOST].load(Ordering::SeqCst), "the one past the bound");
    assert!(!flags[0].load(Ordering::SeqCst));
    let tracker = drains.0.as_ref().unwrap().tracker.clone();
    drop(drains);
    tracker.close();
    tracker.wait().await;
    assert!(flags.iter().all(|flag| flag.load(Ordering::SeqCst)));
}

#[test]
fn without_a_runtime_or_drains_the_rest_is_dropped() {
    let dropped = Arc::new(AtomicBool::new(false));
    Drains::new().hand_over(endless(&dropped));
    assert!(dropped.load(Ordering::SeqCst));
    let dropped = Arc::new(AtomicBool::new(false));
    Drains::default().hand_over(endless(&dropped));
    assert!(dropped.load(Ordering::SeqCst));
}
