//! Tools of MCP servers, through the official Rust SDK (rmcp): servers run
//! as a child process speaking stdio, or are reached over streamable HTTP.
//!
//! At start each server is connected and its tools listed; they join the
//! registry as `{server}__{tool}`, with an effect class from the tool's
//! annotations (unknown means the worst: `DESTRUCTIVE`). A call has the
//! server's timeout. A server that crashes, closes its transport or does
//! not answer within the timeout gives tool failures and is restarted (or
//! reconnected) in the background with a growing delay (1 s, doubled, at
//! most 60 s); it never takes the service down. A server that cannot be
//! reached at start contributes no tools (start-up says so and goes on).

use std::{
    collections::{BTreeMap, HashMap},
    fmt,
    str::FromStr,
    sync::Arc,
    time::Duration,
};

use async_trait::async_trait;
use rmcp::{
    RoleClient, ServiceExt,
    model::{CallToolRequestParams, ClientConfig},
    service::{Peer, RunningService, ServiceError},
    transport::{
        StreamableHttpClientTransport, TokioChildProcess,
        streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use serde::Deserialize;
use serde_json::Value;
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use super::{
    EffectClass, Tool, ToolContext, ToolError, ToolErrorKind, ToolOutput, ToolSpec,
    http_tool::{expand, is_tool_name},
};

/// How long a server has to start and list its tools.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(15);

/// The first and the longest delay before a restart.
const RESTART_FIRST: Duration = Duration::from_secs(1);
const RESTART_MAX: Duration = Duration::from_secs(60);

/// How often a connected server is checked for a closed transport.
const HEALTH_EVERY: Duration = Duration::from_secs(1);

/// One MCP server, as written in the settings.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// The prefix of its tools' names.
    pub name: String,
    /// A program to run, speaking MCP on its standard input and output.
    #[serde(default)]
    pub command: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    /// The program's environment (`${NAME}` is read from the service's).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Or a streamable HTTP endpoint.
    #[serde(default)]
    pub url: Option<String>,
    /// Headers sent to it (`${NAME}` is read from the environment).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Longest a call may take, in seconds (default 30).
    #[serde(default)]
    pub timeout_s: Option<u64>,
    /// Its tools have the effect of one call however often a call is made
    /// (the operator says so): one that started in a process that died is
    /// made again, not ended `unknown`.
    #[serde(default)]
    pub idempotent: bool,
}

/// Values of `env` and `headers` never print: they hold tokens.
impl fmt::Debug for McpServerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpServerConfig")
            .field("name", &self.name)
            .field("command", &self.command)
            .field("args", &self.args)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("url", &self.url)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("timeout_s", &self.timeout_s)
            .finish()
    }
}

impl McpServerConfig {
    fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_s.unwrap_or(30).clamp(1, 600))
    }

    fn check(&self) -> Result<(), String> {
        if !is_tool_name(&self.name) || self.name.len() > 32 || self.name.contains("__") {
            return Err("the name must be 1-32 letters, digits, `_` or `-`, without `__`".into());
        }
        // Its tools would be `client__…`, the names of a client's own.
        if self.name.eq_ignore_ascii_case("client") {
            return Err("`client` is reserved: client tools are offered as `client__…`".into());
        }
        match (&self.command, &self.url) {
            (Some(command), None) if !command.trim().is_empty() => Ok(()),
            (None, Some(url)) => match reqwest::Url::parse(url) {
                Ok(u) if matches!(u.scheme(), "http" | "https") => Ok(()),
                _ => Err("the url must be an http or https URL".into()),
            },
            _ => Err("give either a command or a url".into()),
        }
    }
}

/// The declared servers: a JSON list of [`McpServerConfig`] (a
/// `[[tools.mcp]]` table per server in the settings file).
#[derive(Debug, Clone, Default)]
pub struct McpServerList(pub Vec<McpServerConfig>);

impl FromStr for McpServerList {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let servers: Vec<McpServerConfig> =
            serde_json::from_str(s).map_err(|e| format!("expected a list of MCP servers: {e}"))?;
        let mut seen = std::collections::HashSet::new();
        for server in &servers {
            server
                .check()
                .map_err(|e| format!("MCP server {:?}: {e}", server.name))?;
            if !seen.insert(server.name.as_str()) {
                return Err(format!("MCP server {:?} is declared twice", server.name));
            }
        }
        Ok(Self(servers))
    }
}

/// The effect class of an MCP tool, from its annotations (hints). Unknown
/// means the worst: writes, destructive, open world.
pub fn effect_of(annotations: Option<&rmcp::model::ToolAnnotations>) -> EffectClass {
    let hint = |f: fn(&rmcp::model::ToolAnnotations) -> Option<bool>| annotations.and_then(f);
    if hint(|a| a.read_only_hint) == Some(true) {
        return EffectClass::ReadOnly;
    }
    if hint(|a| a.destructive_hint) != Some(false) {
        return EffectClass::Destructive;
    }
    if hint(|a| a.open_world_hint) == Some(false) {
        EffectClass::LocalWrite
    } else {
        EffectClass::Network
    }
}

/// The registry name of `tool` of `server`: `{server}__{tool}`, with what
/// a provider refuses in a name replaced by `_`, at most 64 characters.
pub fn tool_name(server: &str, tool: &str) -> String {
    format!("{server}__{tool}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect()
}

type Service = RunningService<RoleClient, ClientConfig>;

/// Where `${NAME}` values are read from.
type Environment = dyn Fn(&str) -> Option<String> + Send + Sync;

/// Opens a connection to a server (spawning it when it is a command).
async fn connect(config: &McpServerConfig, env: &Environment) -> Result<Service, String> {
    match (&config.command, &config.url) {
        (Some(command), _) => {
            let mut process = tokio::process::Command::new(command);
            process.args(&config.args).kill_on_drop(true);
            for (name, value) in &config.env {
                process.env(name, expand(value, env)?);
            }
            let (transport, _) = TokioChildProcess::builder(process)
                .stderr(std::process::Stdio::null())
                .spawn()
                .map_err(|e| format!("cannot start {command}: {e}"))?;
            ClientConfig::default()
                .serve(transport)
                .await
                .map_err(|e| format!("the server did not initialize: {e}"))
        }
        (None, Some(url)) => {
            let mut headers = HashMap::new();
            for (name, value) in &config.headers {
                let name = reqwest::header::HeaderName::from_str(name)
                    .map_err(|_| format!("{name:?} is not a header name"))?;
                let mut value = reqwest::header::HeaderValue::from_str(&expand(value, env)?)
                    .map_err(|_| format!("the value of {name} is not a header value"))?;
                value.set_sensitive(true);
                headers.insert(name, value);
            }
            let transport = StreamableHttpClientTransport::from_config(
                StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(headers),
            );
            ClientConfig::default()
                .serve(transport)
                .await
                .map_err(|e| format!("the server did not initialize: {e}"))
        }
        (None, None) => Err("give either a command or a url".into()),
    }
}

/// What the service knows of a server now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerStatus {
    pub connected: bool,
    /// Restarts (or reconnections) since start.
    pub restarts: u64,
    pub last_error: Option<String>,
}

/// A connected server: its session, and the supervisor's signal.
pub struct McpServer {
    config: McpServerConfig,
    env: Box<Environment>,
    /// The live session; `None` while the server restarts.
    session: tokio::sync::Mutex<Option<Service>>,
    peer: std::sync::RwLock<Option<Peer<RoleClient>>>,
    restart: tokio::sync::Notify,
    status: std::sync::Mutex<ServerStatus>,
}

impl McpServer {
    pub fn name(&self) -> &str {
        &self.config.name
    }

    pub fn status(&self) -> ServerStatus {
        self.status.lock().map(|s| s.clone()).unwrap_or_default()
    }

    fn set_status(&self, change: impl FnOnce(&mut ServerStatus)) {
        if let Ok(mut status) = self.status.lock() {
            change(&mut status);
        }
    }

    fn peer(&self) -> Option<Peer<RoleClient>> {
        self.peer.read().ok().and_then(|p| p.clone())
    }

    async fn install(&self, service: Service) {
        if let Ok(mut peer) = self.peer.write() {
            *peer = Some(service.peer().clone());
        }
        *self.session.lock().await = Some(service);
        self.set_status(|s| s.connected = true);
    }

    /// Takes the server out of use and asks the supervisor to restart it.
    fn failed(&self, why: String) {
        tracing::warn!(server = %self.config.name, reason = %why, "MCP server failed; restarting it");
        if let Ok(mut peer) = self.peer.write() {
            *peer = None;
        }
        self.set_status(|s| {
            s.connected = false;
            s.last_error = Some(why);
        });
        self.restart.notify_one();
    }

    /// Ends the session (a child process is killed).
    async fn close(&self) {
        if let Some(service) = self.session.lock().await.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), service.cancel()).await;
        }
    }

    /// Calls `tool` with `arguments`, within the server's timeout.
    async fn call(
        &self,
        tool: &str,
        arguments: serde_json::Map<String, Value>,
        cancel: &CancellationToken,
    ) -> Result<ToolOutput, ToolError> {
        let name = &self.config.name;
        let peer = self.peer().ok_or_else(|| {
            ToolError::new(
                ToolErrorKind::Unavailable,
                format!("the MCP server {name} is restarting; try again shortly"),
                true,
            )
        })?;
        let timeout = self.config.timeout();
        let call =
            peer.call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments));
        let answer = tokio::select! {
            answer = tokio::time::timeout(timeout, call) => answer,
            () = cancel.cancelled() => {
                return Err(ToolError::new(ToolErrorKind::Cancelled, "cancelled", true));
            }
        };
        let result = match answer {
            Err(_) => {
                self.failed(format!("no answer within {} s", timeout.as_secs()));
                return Err(ToolError::new(
                    ToolErrorKind::Unavailable,
                    format!(
                        "the MCP server {name} did not answer within {} s; it is being restarted",
                        timeout.as_secs()
                    ),
                    true,
                ));
            }
            Ok(Err(ServiceError::McpError(error))) => {
                return Err(ToolError::new(
                    ToolErrorKind::Failed,
                    format!("the MCP server {name} refused the call: {}", error.message),
                    true,
                ));
            }
            Ok(Err(error)) => {
                self.failed(error.to_string());
                return Err(ToolError::new(
                    ToolErrorKind::Unavailable,
                    format!("the MCP server {name} failed ({error}); it is being restarted"),
                    true,
                ));
            }
            Ok(Ok(result)) => result,
        };
        let mut parts = Vec::new();
        for block in &result.content {
            let block = serde_json::to_value(block).unwrap_or(Value::Null);
            match block["type"].as_str() {
                Some("text") => parts.push(block["text"].as_str().unwrap_or_default().to_owned()),
                Some("resource") => parts.push(
                    block["resource"]["text"]
                        .as_str()
                        .map_or_else(|| "[a binary resource]".to_owned(), str::to_owned),
                ),
                Some(other) => parts.push(format!("[{other} content]")),
                None => {}
            }
        }
        if parts.is_empty()
            && let Some(structured) = &result.structured_content
        {
            parts.push(structured.to_string());
        }
        let text = parts.join("\n");
        if result.is_error == Some(true) {
            return Err(ToolError::new(ToolErrorKind::Failed, text, true));
        }
        Ok(ToolOutput::text(text))
    }

    /// Restarts the server whenever it fails, with a growing delay, until
    /// `stop`.
    async fn supervise(self: Arc<Self>, stop: CancellationToken) {
        loop {
            // Wait for a failure, noticing a closed transport by itself.
            let closed = async {
                loop {
                    tokio::time::sleep(HEALTH_EVERY).await;
                    // A service whose loop ended (the child exited, the
                    // stream closed) is not `is_closed` until cancelled;
                    // its peer's channel to that loop is closed at once.
                    let closed = match self.session.lock().await.as_ref() {
                        Some(service) => service.is_closed() || service.is_transport_closed(),
                        None => true,
                    };
                    if closed {
                        return;
                    }
                }
            };
            tokio::select! {
                () = self.restart.notified() => {}
                () = closed => self.failed("the connection closed".into()),
                () = stop.cancelled() => break,
            }
            self.close().await;
            let mut delay = RESTART_FIRST;
            loop {
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = stop.cancelled() => return,
                }
                let attempt =
                    tokio::time::timeout(STARTUP_TIMEOUT, connect(&self.config, &*self.env));
                let outcome = tokio::select! {
                    outcome = attempt => outcome,
                    () = stop.cancelled() => return,
                };
                match outcome {
                    Ok(Ok(service)) => {
                        self.install(service).await;
                        self.set_status(|s| s.restarts += 1);
                        // A failure reported meanwhile is about the old session.
                        let _ = tokio::time::timeout(Duration::ZERO, self.restart.notified()).await;
                        tracing::info!(server = %self.config.name, "MCP server restarted");
                        break;
                    }
                    Ok(Err(e)) => self.set_status(|s| s.last_error = Some(e)),
                    Err(_) => self.set_status(|s| {
                        s.last_error = Some("it did not start within the start-up timeout".into());
                    }),
                }
                delay = (delay * 2).min(RESTART_MAX);
            }
        }
        self.close().await;
    }
}

/// A tool of an MCP server.
pub struct McpTool {
    server: Arc<McpServer>,
    remote: String,
    spec: ToolSpec,
}

#[async_trait]
impl Tool for McpTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, ctx: ToolContext, arguments: Value) -> Result<ToolOutput, ToolError> {
        let arguments = match arguments {
            Value::Object(map) => map,
            Value::Null => serde_json::Map::new(),
            _ => {
                return Err(ToolError::new(
                    ToolErrorKind::InvalidInput,
                    "the arguments must be an object",
                    true,
                ));
            }
        };
        self.server.call(&self.remote, arguments, &ctx.cancel).await
    }
}

/// The MCP servers of the service and their supervisors.
pub struct McpHub {
    servers: Vec<Arc<McpServer>>,
    tasks: TaskTracker,
    stop: CancellationToken,
}

impl McpHub {
    /// Connects every server, lists its tools, and starts its supervisor.
    /// A server that cannot be reached is logged and left out.
    pub async fn start(
        configs: &[McpServerConfig],
        env: impl Fn(&str) -> Option<String> + Clone + Send + Sync + 'static,
    ) -> (Self, Vec<Arc<dyn Tool>>) {
        let hub = Self {
            servers: Vec::new(),
            tasks: TaskTracker::new(),
            stop: CancellationToken::new(),
        };
        let started = futures::future::join_all(configs.iter().map(|config| {
            let env = env.clone();
            async move {
                let connected = tokio::time::timeout(STARTUP_TIMEOUT, async {
                    let service = connect(config, &env).await?;
                    let tools = service
                        .list_all_tools()
                        .await
                        .map_err(|e| format!("cannot list its tools: {e}"))?;
                    Ok::<_, String>((service, tools))
                })
                .await
                .unwrap_or_else(|_| Err("it did not start within 15 s".into()));
                (config, env, connected)
            }
        }))
        .await;
        let mut hub = hub;
        let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
        let mut names = std::collections::HashSet::new();
        for (config, env, connected) in started {
            let (service, listed) = match connected {
                Ok(found) => found,
                Err(e) => {
                    tracing::error!(server = %config.name, error = %e, "MCP server unavailable; its tools are left out");
                    continue;
                }
            };
            let server = Arc::new(McpServer {
                config: config.clone(),
                env: Box::new(env),
                session: tokio::sync::Mutex::new(None),
                peer: std::sync::RwLock::new(None),
                restart: tokio::sync::Notify::new(),
                status: std::sync::Mutex::new(ServerStatus::default()),
            });
            server.install(service).await;
            let timeout = config.timeout();
            for remote in listed {
                let name = tool_name(&config.name, &remote.name);
                if !names.insert(name.clone()) {
                    tracing::warn!(tool = %name, "two MCP tools share a name; the second is left out");
                    continue;
                }
                let parameters = Value::Object((*remote.input_schema).clone());
                let description = remote
                    .description
                    .as_deref()
                    .map_or_else(|| remote.name.to_string(), str::to_owned);
                tools.push(Arc::new(McpTool {
                    server: server.clone(),
                    remote: remote.name.to_string(),
                    spec: ToolSpec::new(
                        &name,
                        &description,
                        parameters,
                        effect_of(remote.annotations.as_ref()),
                    )
                    .with_timeout(timeout + Duration::from_secs(2))
                    .with_source(format!("mcp:{}", config.name))
                    .with_idempotent(config.idempotent),
                }));
            }
            tracing::info!(server = %config.name, tools = tools.len(), "MCP server connected");
            hub.tasks.spawn(server.clone().supervise(hub.stop.clone()));
            hub.servers.push(server);
        }
        hub.tasks.close();
        (hub, tools)
    }

    pub fn servers(&self) -> &[Arc<McpServer>] {
        &self.servers
    }

    /// Stops the supervisors and ends every session (child processes are
    /// killed).
    pub async fn shutdown(&self) {
        self.stop.cancel();
        self.tasks.wait().await;
    }
}

#[cfg(test)]
mod tests;
