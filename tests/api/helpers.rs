//! `spawn_app` and the typed helpers the API tests use.

use std::time::Duration;

use agent_harness::startup::{Application, StartupError, build_provider};
use harness_core::config::Settings;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::{
    fake_provider::{FakeProvider, Reply},
    support::{Backend, TestDb, listening},
};

/// How long a test waits for anything before it fails instead of hanging.
pub const PATIENCE: Duration = Duration::from_secs(15);

pub struct TestApp {
    pub address: String,
    pub client: reqwest::Client,
    pub provider: FakeProvider,
    pub db: TestDb,
    shutdown: CancellationToken,
    server: Option<JoinHandle<Result<(), StartupError>>>,
}

/// Settings of a test app: loopback, the fake provider, quick heartbeats.
pub fn test_settings(provider: &FakeProvider) -> Settings {
    let mut settings = Settings::default();
    settings.server.listen = "127.0.0.1:0".parse().unwrap();
    settings.server.instance_id = "test-instance".into();
    settings.server.shutdown_grace_s = 5;
    settings.providers.openai_base_url = provider.base_url.parse().unwrap();
    settings.providers.openai_api_key = Some("sk-test-key".into());
    settings.providers.model = "gpt-4o-mini".into();
    // One try per provider: each test scripts exactly the replies it
    // wants; the chain tests turn retries on.
    settings.providers.max_attempts = 1;
    settings.providers.retry_base_ms = 10;
    settings.providers.retry_max_ms = 200;
    // Each test scripts its provider's replies: no extraction calls
    // unless a test asks for them.
    settings.memory.extraction = false;
    // No vault unless a test gives it one.
    settings.vault.dir = "/nonexistent/agent-harness-test-vault".into();
    settings
}

/// What a provider request asks: the text of its last user message, and
/// whether a tool has answered since (the model asked for a call, and it
/// ended).
pub fn asked_and_answered(body: &Value) -> (String, bool) {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let asked = messages
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .map(|m| m["content"].to_string())
        .unwrap_or_default();
    let answered = messages
        .iter()
        .rev()
        .take_while(|m| m["role"] != "user")
        .any(|m| m["role"] == "tool");
    (asked, answered)
}

/// A vault folder holding `notes` (path, text).
pub fn vault_of(notes: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in notes {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    dir
}

/// An app whose vault is `vault`, indexed before it is returned.
pub async fn spawn_app_with_vault(backend: Backend, vault: &std::path::Path) -> TestApp {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.vault.dir = vault.to_owned();
    let app = spawn_app_with(TestDb::new(backend).await, provider, settings).await;
    let (status, report) = app.post_json("/vault/reindex").await;
    assert_eq!(status, 200, "{report}");
    app
}

pub async fn spawn_app(backend: Backend) -> TestApp {
    let provider = FakeProvider::start().await;
    let db = TestDb::new(backend).await;
    let settings = test_settings(&provider);
    spawn_app_with(db, provider, settings).await
}

pub async fn spawn_app_with(db: TestDb, provider: FakeProvider, settings: Settings) -> TestApp {
    spawn_app_with_tools(db, provider, settings, Vec::new()).await
}

/// [`spawn_app_with`] with tools beyond the built-in ones.
pub async fn spawn_app_with_tools(
    db: TestDb,
    provider: FakeProvider,
    settings: Settings,
    tools: Vec<std::sync::Arc<dyn harness_core::tools::Tool>>,
) -> TestApp {
    let store = db.open().await;
    spawn_app_on(db, store, provider, settings, tools).await
}

/// [`spawn_app_with_tools`] on a store the test opened itself.
pub async fn spawn_app_on(
    db: TestDb,
    store: std::sync::Arc<dyn harness_store::store::Store>,
    provider: FakeProvider,
    settings: Settings,
    tools: Vec<std::sync::Arc<dyn harness_core::tools::Tool>>,
) -> TestApp {
    settings.validate().expect("valid test settings");
    let llm = build_provider(&settings).expect("providers");
    let application = Application::build_with_tools(settings, store.clone(), llm, tools)
        .await
        .expect("build app");
    let address = format!("http://127.0.0.1:{}", application.port());
    let shutdown = application.shutdown_token();
    let server = tokio::spawn(application.run_until_stopped());
    TestApp {
        address,
        client: reqwest::Client::new(),
        provider,
        db,

        shutdown,
        server: Some(server),
    }
}

impl TestApp {
    /// One turn in which the model calls the tool `name` with
    /// `arguments`, then answers: the `tool.finished` event and the tool
    /// message the model got.
    pub async fn call_tool(&self, name: &str, arguments: Value) -> (Value, String) {
        self.provider.enqueue([
            Reply::openai_tool_call("call_t1", name, &arguments),
            Reply::sse("openai/text.sse"),
        ]);
        let mut stream = self
            .post_turn_sse("s-tool", json!({"message": "Use the tool."}))
            .await;
        let events = stream.read_to_end().await;
        assert_eq!(types(&events).last(), Some(&"turn.completed"));
        let finished = events
            .iter()
            .find(|e| e.event == "tool.finished")
            .unwrap()
            .json();
        let requests = self.provider.requests();
        let messages = requests.last().unwrap().body["messages"]
            .as_array()
            .unwrap()
            .clone();
        let message = messages.iter().rev().find(|m| m["role"] == "tool").unwrap()["content"]
            .as_str()
            .unwrap()
            .to_owned();
        (finished, message)
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    pub async fn post_turn(&self, session: &str, body: Value) -> reqwest::Response {
        self.client
            .post(self.url(&format!("/sessions/{session}/turns")))
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    pub async fn post_turn_sse(&self, session: &str, body: Value) -> SseStream {
        let response = self
            .client
            .post(self.url(&format!("/sessions/{session}/turns")))
            .header("accept", "text/event-stream")
            .json(&body)
            .send()
            .await
            .unwrap();
        SseStream::new(response).await
    }

    pub async fn turn_events(
        &self,
        session: &str,
        turn: &str,
        last_event_id: Option<i64>,
    ) -> SseStream {
        let mut request = self
            .client
            .get(self.url(&format!("/sessions/{session}/turns/{turn}/events")));
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id.to_string());
        }
        SseStream::new(request.send().await.unwrap()).await
    }

    pub async fn get_json(&self, path: &str) -> (u16, Value) {
        let response = self.client.get(self.url(path)).send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// `GET path`, its body as text.
    pub async fn get_text(&self, path: &str) -> String {
        let response = self.client.get(self.url(path)).send().await.unwrap();
        response.text().await.unwrap()
    }

    /// `GET /metrics`, as text.
    pub async fn metrics(&self) -> String {
        self.get_text("/metrics").await
    }

    /// The value of one sample of `GET /metrics`: `name` with its labels,
    /// as the exposition writes them.
    pub async fn metric(&self, name: &str) -> f64 {
        let metrics = self.metrics().await;
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {metrics}"))
    }

    /// The value of `name` once it is `want`, or the last one read after
    /// 5 s. A gauge or counter the process moves just after the change
    /// a test saw through another route (a turn's record) may lag it.
    pub async fn metric_settled(&self, name: &str, want: f64) -> f64 {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let value = self.metric(name).await;
            if value == want || tokio::time::Instant::now() >= deadline {
                return value;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// `POST path` with `body` as JSON; the answer's body as text (a
    /// whole stream, for the streaming formats).
    pub async fn post_text(&self, path: &str, body: Value) -> String {
        let response = self.client.post(self.url(path)).json(&body);
        response.send().await.unwrap().text().await.unwrap()
    }

    /// `POST path` with `body` as JSON: the status, and the answer as text
    /// (an event stream, a problem).
    pub async fn post_for_text(&self, path: &str, body: &Value) -> (u16, String) {
        let response = self
            .client
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    }

    /// `POST path` with `body` as JSON: the status, and the answer's
    /// JSON (`null` when it has none).
    pub async fn post_body(&self, path: &str, body: Value) -> (u16, Value) {
        let response = self
            .client
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    pub async fn post_json(&self, path: &str) -> (u16, Value) {
        let response = self.client.post(self.url(path)).send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// Polls the turn until it is no longer running.
    pub async fn wait_turn_end(&self, session: &str, turn: &str) -> Value {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let (status, body) = self
                .get_json(&format!("/sessions/{session}/turns/{turn}"))
                .await;
            assert_eq!(status, 200, "{body}");
            if body["status"] != "running" {
                return body;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "turn {turn} still running"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts graceful shutdown and waits for the server to stop.
    pub async fn stop(&mut self) {
        self.shutdown.cancel();
        if let Some(server) = self.server.take() {
            tokio::time::timeout(PATIENCE + Duration::from_secs(30), server)
                .await
                .expect("server stops")
                .expect("server task")
                .expect("server result");
        }
    }

    /// The shutdown token, to stop the app while a test still reads from it.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// One SSE event as received.
#[derive(Debug, Clone, PartialEq)]
pub struct SseEvent {
    pub id: Option<String>,
    pub event: String,
    pub data: String,
}

impl SseEvent {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap_or_else(|e| panic!("{e}: {}", self.data))
    }

    pub fn seq(&self) -> i64 {
        self.id
            .as_deref()
            .expect("an id")
            .parse()
            .expect("numeric id")
    }

    pub fn is_terminal(&self) -> bool {
        matches!(
            self.event.as_str(),
            "turn.completed" | "turn.failed" | "turn.cancelled" | "turn.interrupted"
        )
    }
}

/// A minimal SSE reader over a reqwest response.
pub struct SseStream {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    response: reqwest::Response,
    buffer: String,
    pub comments: usize,
}

impl SseStream {
    /// The turn the stream's response names (`x-turn-id`).
    pub fn turn_id(&self) -> String {
        self.headers["x-turn-id"].to_str().unwrap().to_owned()
    }

    pub async fn new(response: reqwest::Response) -> Self {
        Self {
            status: response.status().as_u16(),
            headers: response.headers().clone(),
            response,
            buffer: String::new(),
            comments: 0,
        }
    }

    /// The next event, `None` at the end of the stream.
    pub async fn next(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let frame: String = self.buffer.drain(..end + 2).collect();
                let mut event = SseEvent {
                    id: None,
                    event: "message".into(),
                    data: String::new(),
                };
                let mut has_field = false;
                for line in frame.lines() {
                    if line.starts_with(':') {
                        self.comments += 1;
                        continue;
                    }
                    let (field, value) = line.split_once(':').unwrap_or((line, ""));
                    let value = value.strip_prefix(' ').unwrap_or(value);
                    has_field = true;
                    match field {
                        "id" => event.id = Some(value.to_owned()),
                        "event" => event.event = value.to_owned(),
                        "data" => {
                            if !event.data.is_empty() {
                                event.data.push('\n');
                            }
                            event.data.push_str(value);
                        }
                        _ => {}
                    }
                }
                if has_field {
                    return Some(event);
                }
                continue;
            }
            let chunk = tokio::time::timeout(PATIENCE, self.response.chunk())
                .await
                .expect("the stream went silent")
                .expect("stream error")?;
            self.buffer
                .push_str(std::str::from_utf8(&chunk).expect("utf-8"));
        }
    }

    /// Reads until the terminal event (inclusive); asserts the stream ends there.
    pub async fn read_to_end(&mut self) -> Vec<SseEvent> {
        let mut events = Vec::new();
        while let Some(event) = self.next().await {
            let terminal = event.is_terminal();
            events.push(event);
            if terminal {
                assert!(
                    self.next().await.is_none(),
                    "the stream ends after its terminal event"
                );
                return events;
            }
        }
        panic!("stream ended without a terminal event: {events:?}");
    }

    /// Reads events until one of type `event_type` (inclusive).
    pub async fn read_until(&mut self, event_type: &str) -> Vec<SseEvent> {
        let mut events = Vec::new();
        while let Some(event) = self.next().await {
            let found = event.event == event_type;
            events.push(event);
            if found {
                return events;
            }
        }
        panic!("no {event_type} before the end: {events:?}");
    }
}

/// Event types of a list of events.
/// The first event of type `event` among `events`, as JSON.
pub fn first_event(events: &[SseEvent], event: &str) -> Value {
    events
        .iter()
        .find(|e| e.event == event)
        .unwrap_or_else(|| panic!("no {event} among {:?}", types(events)))
        .json()
}

/// The user's and the assistant's texts the provider's last request held
/// (a conversation's branch, as the model was sent it).
pub fn sent_history(app: &TestApp) -> Vec<String> {
    let requests = app.provider.requests();
    let body = &requests.last().unwrap().body;
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user" || m["role"] == "assistant")
        .map(|m| match &m["content"] {
            Value::String(text) => text.clone(),
            parts => parts[0]["text"].as_str().unwrap_or_default().to_owned(),
        })
        .collect()
}

/// The ids of a turn's siblings (`GET …/siblings`), in the order listed.
pub async fn sibling_ids(app: &TestApp, session: &str, turn: &str) -> Vec<String> {
    let (status, siblings) = app
        .get_json(&format!("/sessions/{session}/turns/{turn}/siblings"))
        .await;
    assert_eq!(status, 200, "{siblings}");
    siblings["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["turn_id"].as_str().unwrap().to_owned())
        .collect()
}

pub fn types(events: &[SseEvent]) -> Vec<&str> {
    events.iter().map(|e| e.event.as_str()).collect()
}

/// The text of the `message.delta` events, concatenated.
pub fn streamed_text(events: &[SseEvent]) -> String {
    events
        .iter()
        .filter(|e| e.event == "message.delta")
        .map(|e| e.json()["text"].as_str().unwrap().to_owned())
        .collect()
}

/// One `agent-harness` process, as it runs in production: its own
/// settings from the environment, the fake provider, a database URL.
pub struct ServiceProcess {
    child: std::process::Child,
    pub base: String,
    /// Where its logs go unless the test named a file.
    _logs: tempfile::TempDir,
}

impl ServiceProcess {
    /// Starts the binary on `database_url` with `env` on top of the test
    /// settings, under an open-file limit of `fd_limit` when given, and
    /// waits until it is ready.
    pub async fn start(
        database_url: &str,
        provider: &FakeProvider,
        env: &[(&str, &str)],
        fd_limit: Option<u32>,
    ) -> Self {
        Self::start_logging(database_url, provider, env, fd_limit, None).await
    }

    /// [`Self::start`], its standard output and error into `logs`.
    pub async fn start_logging(
        database_url: &str,
        provider: &FakeProvider,
        env: &[(&str, &str)],
        fd_limit: Option<u32>,
        logs: Option<&std::path::Path>,
    ) -> Self {
        use std::process::Command;
        let dir = tempfile::tempdir().unwrap();
        let log = logs.map_or_else(|| dir.path().join("service.log"), std::path::Path::to_owned);
        let (stdout, stderr) = listening::log_file(&log);
        let binary = env!("CARGO_BIN_EXE_agent-harness");
        let mut command = match fd_limit {
            Some(limit) => {
                let mut shell = Command::new("sh");
                shell
                    .arg("-c")
                    .arg(format!("ulimit -n {limit} && exec \"$0\""))
                    .arg(binary);
                shell
            }
            None => Command::new(binary),
        };
        let child = command
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("DATABASE_URL", database_url)
            .env("OPENAI_BASE_URL", &provider.base_url)
            .env("OPENAI_API_KEY", "sk-test-key")
            .env("HARNESS_MODEL", "gpt-4o-mini")
            .env("HARNESS_PROVIDER_MAX_ATTEMPTS", "1")
            .env("HARNESS_MEMORY_EXTRACTION", "false")
            .env("HARNESS_VAULT_DIR", "/nonexistent/agent-harness-test-vault")
            .envs(env.iter().copied())
            .envs(listening::ANY_PORT)
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .unwrap();
        let process = Self {
            child,
            base: listening::listening_at(&log).await,
            _logs: dir,
        };
        let client = reqwest::Client::new();
        for _ in 0..400 {
            if let Ok(response) = client.get(process.url("/readyz")).send().await
                && response.status() == 200
            {
                return process;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("the service process did not become ready");
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The body of a GET of `path`, as text.
    pub async fn get_text(&self, path: &str) -> String {
        let response = reqwest::get(self.url(path)).await.unwrap();
        response.text().await.unwrap()
    }

    /// `host:port` to connect to.
    pub fn addr(&self) -> &str {
        self.base.trim_start_matches("http://")
    }

    /// SIGTERM: the service shuts down as it would on a deploy; returns
    /// once the process has exited.
    pub async fn terminate(&mut self) {
        let status = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
        for _ in 0..400 {
            if self.child.try_wait().unwrap().is_some() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("the service did not exit within 10 s of SIGTERM");
    }

    /// SIGSTOP (`false`) or SIGCONT (`true`): a process frozen as by a
    /// long pause or a partition, then woken.
    pub fn run(&self, running: bool) {
        let signal = if running { "-CONT" } else { "-STOP" };
        let status = std::process::Command::new("kill")
            .arg(signal)
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process has exited (reaped if so).
    pub fn exited(&mut self) -> bool {
        self.child.try_wait().unwrap().is_some()
    }

    /// SIGKILL: no shutdown, no last write.
    pub fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for ServiceProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes `notes/a.md` under `vault` until `stream` (an MCP stream that
/// follows it) says `notifications/resources/updated` of it: a change is
/// one the stream saw the note without, and its first look may come
/// after the first write.
pub async fn note_changes_said(vault: &std::path::Path, stream: &mut SseStream) {
    let mut updated = Value::Null;
    for n in 0..8 {
        let text = format!("# A\n\nChanged {n} times.\n");
        std::fs::write(vault.join("notes/a.md"), text).unwrap();
        let next = tokio::time::timeout(std::time::Duration::from_millis(1500), stream.next());
        if let Ok(event) = next.await {
            updated = event.unwrap().json();
            break;
        }
    }
    assert_eq!(
        updated["method"], "notifications/resources/updated",
        "{updated}"
    );
    assert_eq!(updated["params"]["uri"], "vault:///notes/a.md");
}

/// A field of a form: its name, its file's name and content type when it
/// is a file, its bytes.
pub type FormPart<'a> = (&'a str, Option<&'a str>, Option<&'a str>, &'a [u8]);

/// A `multipart/form-data` body of `parts`: the body's content type and
/// its bytes.
pub fn form(parts: &[FormPart<'_>]) -> (String, Vec<u8>) {
    let boundary = "harness-test-boundary-7d1c";
    let mut body = Vec::new();
    for (name, filename, content_type, bytes) in parts {
        body.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
        let mut disposition = format!("Content-Disposition: form-data; name=\"{name}\"");
        if let Some(filename) = filename {
            disposition.push_str(&format!("; filename=\"{filename}\""));
        }
        body.extend_from_slice(disposition.as_bytes());
        body.extend_from_slice(b"\r\n");
        if let Some(content_type) = content_type {
            body.extend_from_slice(format!("Content-Type: {content_type}\r\n").as_bytes());
        }
        body.extend_from_slice(b"\r\n");
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

impl TestApp {
    /// `POST path` of a form (see [`form`]) with `client`: the status and
    /// the answer's JSON.
    pub async fn upload_with(
        &self,
        client: &reqwest::Client,
        path: &str,
        parts: &[FormPart<'_>],
    ) -> (u16, Value) {
        let (content_type, body) = form(parts);
        let response = client
            .post(self.url(path))
            .header("content-type", content_type)
            .body(body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// Uploads `bytes` as a file of `name` and `content_type` to `/files`.
    pub async fn upload(&self, name: &str, content_type: &str, bytes: &[u8]) -> (u16, Value) {
        let parts = [("file", Some(name), Some(content_type), bytes)];
        self.upload_with(&self.client, "/files", &parts).await
    }

    /// `GET path`: the status, the content type and the bytes.
    pub async fn get_bytes(&self, path: &str) -> (u16, String, Vec<u8>) {
        let response = self.client.get(self.url(path)).send().await.unwrap();
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        (
            status,
            content_type,
            response.bytes().await.unwrap().to_vec(),
        )
    }
}

/// `n` bytes of a PNG: its signature, then bytes that repeat rarely.
pub fn png_of(n: usize) -> Vec<u8> {
    let mut bytes = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut x: u32 = 2_463_534_242;
    while bytes.len() < n {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        bytes.push((x >> 24) as u8);
    }
    bytes.truncate(n);
    bytes
}
