//! `mcp-fixture`: a small MCP server, written with rmcp, that the tests
//! (and anyone trying MCP with agent-harness) run over stdio or streamable
//! HTTP.
//!
//! ```text
//! mcp-fixture stdio          # serve on standard input and output
//! mcp-fixture http           # serve on 127.0.0.1, print `listening on http://…/mcp`
//! ```
//!
//! Tools: `echo` and `add` (read-only), `pid` (read-only: the process id,
//! to see a restart), `note` (writes, not destructive, closed world),
//! `wipe` (no annotations: the worst is assumed), `hang` (never answers),
//! `crash` (the process exits).

#![allow(
    clippy::print_stdout,
    reason = "the http mode prints where it listens; that line is its output"
)]

use std::process::ExitCode;

use rmcp::{
    ServerHandler, ServiceExt,
    handler::server::{router::tool::ToolRouter, wrapper::Parameters},
    model::{ServerCapabilities, ServerConfig},
    schemars, tool, tool_handler, tool_router,
    transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    },
};

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct Text {
    /// The text to send back.
    text: String,
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct Sum {
    a: i64,
    b: i64,
}

#[derive(Debug, Clone)]
struct Fixture {
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl Fixture {
    fn new() -> Self {
        Self {
            tool_router: Self::tool_router(),
        }
    }

    /// Sends the text back.
    #[tool(annotations(read_only_hint = true, open_world_hint = false))]
    fn echo(&self, Parameters(Text { text }): Parameters<Text>) -> String {
        format!("echo: {text}")
    }

    /// Adds two integers.
    #[tool(annotations(read_only_hint = true, open_world_hint = false))]
    fn add(&self, Parameters(Sum { a, b }): Parameters<Sum>) -> String {
        a.saturating_add(b).to_string()
    }

    /// The server's process id.
    #[tool(annotations(read_only_hint = true, open_world_hint = false))]
    fn pid(&self) -> String {
        std::process::id().to_string()
    }

    /// Keeps a note (it writes, nothing is destroyed, nothing outside is touched).
    #[tool(annotations(
        read_only_hint = false,
        destructive_hint = false,
        open_world_hint = false
    ))]
    fn note(&self, Parameters(Text { text }): Parameters<Text>) -> String {
        format!("noted: {text}")
    }

    /// Wipes something (no annotations).
    #[tool]
    fn wipe(&self) -> String {
        "wiped".to_owned()
    }

    /// Never answers.
    #[tool(annotations(read_only_hint = true))]
    async fn hang(&self) -> String {
        std::future::pending::<()>().await;
        String::new()
    }

    /// Exits the process.
    #[tool(annotations(read_only_hint = true))]
    fn crash(&self) -> String {
        std::process::exit(3)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Fixture {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

async fn stdio() -> Result<(), String> {
    let service = Fixture::new()
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| e.to_string())?;
    service.waiting().await.map_err(|e| e.to_string())?;
    Ok(())
}

async fn http() -> Result<(), String> {
    let service: StreamableHttpService<Fixture, LocalSessionManager> = StreamableHttpService::new(
        || Ok(Fixture::new()),
        Default::default(),
        StreamableHttpServerConfig::default().with_sse_keep_alive(None),
    );
    let router = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    println!("listening on http://{addr}/mcp");
    axum::serve(listener, router)
        .await
        .map_err(|e| e.to_string())
}

#[tokio::main]
async fn main() -> ExitCode {
    let mode = std::env::args().nth(1).unwrap_or_default();
    let result = match mode.as_str() {
        "stdio" => stdio().await,
        "http" => http().await,
        _ => Err("usage: mcp-fixture stdio|http".to_owned()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mcp-fixture: {e}");
            ExitCode::FAILURE
        }
    }
}
