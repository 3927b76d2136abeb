//! The application state shared by every handler.

use std::{sync::Arc, time::Duration};

use crate::{config::Settings, runner::TurnRunner, store::Store, tools::mcp::McpHub, vault::Vault};

/// What handlers need, built once at start.
pub struct App {
    pub settings: Settings,
    pub store: Arc<dyn Store>,
    pub runner: TurnRunner,
    /// The notes folder and its index.
    pub vault: Arc<Vault>,
    /// The MCP servers whose tools are in the registry.
    pub mcp: Arc<McpHub>,
    /// Wakes tool calls waiting for approval in this process.
    pub approvals_decided: Arc<tokio::sync::Notify>,
    /// The provider names a turn may ask for in `runtime_provider`.
    pub provider_names: Vec<String>,
}

impl App {
    pub fn sse_keepalive(&self) -> Duration {
        Duration::from_secs(self.settings.server.sse_keepalive_s)
    }
}

/// Axum state: a cheap handle on [`App`].
pub type AppState = Arc<App>;
