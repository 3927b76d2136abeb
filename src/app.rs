//! The application state shared by every handler.

use std::{sync::Arc, time::Duration};

use uuid::Uuid;

use crate::{
    config::Settings, ids::SessionKey, runner::TurnRunner, store::Store, tools::mcp::McpHub,
    vault::Vaults,
};

/// What handlers need, built once at start.
pub struct App {
    pub settings: Settings,
    pub store: Arc<dyn Store>,
    pub runner: TurnRunner,
    /// The notes folder and its index.
    /// Each tenant's vault.
    pub vaults: Arc<Vaults>,
    /// The MCP servers whose tools are in the registry.
    pub mcp: Arc<McpHub>,
    /// Wakes tool calls waiting in this process, for an approval or for a
    /// client's result.
    pub approvals_decided: Arc<tokio::sync::Notify>,
    /// The provider names a turn may ask for in `runtime_provider`.
    pub provider_names: Vec<String>,
    /// Turns that MCP `tools/call` requests of this process are answering.
    pub mcp_calls: McpCalls,
    pub mcp_log_levels: McpLogLevels,
}

/// The log level each MCP session (the versions up to 2025-11-25, with
/// their `Mcp-Session-Id`) set with `logging/setLevel`, by tenant and
/// session: its `ask` streams carry the turn's log messages at or above
/// it. Kept by this process; bounded: past [`McpLogLevels::MAX`] sessions
/// a new one's level is not kept (it gets no log messages).
#[derive(Debug, Default)]
pub struct McpLogLevels(std::sync::Mutex<std::collections::HashMap<String, usize>>);

impl McpLogLevels {
    pub const MAX: usize = 10_000;

    fn key(tenant: &str, session: &str) -> String {
        format!("{tenant}\u{0}{session}")
    }

    /// Sets a session's level (an index of the RFC 5424 levels, debug 0).
    pub fn set(&self, tenant: &str, session: &str, level: usize) {
        let mut levels = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let key = Self::key(tenant, session);
        if levels.len() < Self::MAX || levels.contains_key(&key) {
            levels.insert(key, level);
        }
    }

    /// A session's level, if it set one.
    pub fn get(&self, tenant: &str, session: &str) -> Option<usize> {
        let levels = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        levels.get(&Self::key(tenant, session)).copied()
    }
}

/// The turns MCP `tools/call` requests of this process are answering, by
/// their request (tenant, MCP session, request id): a
/// `notifications/cancelled` finds its turn here. Bounded: past
/// [`McpCalls::MAX`] calls a new one is not tracked (it runs, and cannot
/// be cancelled by notification).
#[derive(Debug, Default)]
pub struct McpCalls(std::sync::Mutex<std::collections::HashMap<String, (SessionKey, Uuid)>>);

impl McpCalls {
    pub const MAX: usize = 10_000;

    fn key(tenant: &str, session: &str, request: &serde_json::Value) -> String {
        format!("{tenant}\u{0}{session}\u{0}{request}")
    }

    /// Tracks a call of `app` while the returned guard lives.
    pub fn track(
        app: &AppState,
        tenant: &str,
        session: &str,
        request: &serde_json::Value,
        turn: (SessionKey, Uuid),
    ) -> McpCallGuard {
        let key = Self::key(tenant, session, request);
        let mut calls = app
            .mcp_calls
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let tracked = calls.len() < Self::MAX && !calls.contains_key(&key);
        if tracked {
            calls.insert(key.clone(), turn);
        }
        McpCallGuard {
            app: app.clone(),
            key: tracked.then_some(key),
        }
    }

    /// The turn of a call still answering.
    pub fn find(
        &self,
        tenant: &str,
        session: &str,
        request: &serde_json::Value,
    ) -> Option<(SessionKey, Uuid)> {
        let calls = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        calls.get(&Self::key(tenant, session, request)).cloned()
    }
}

/// Untracks its call when dropped (the answer ended, or its client left).
pub struct McpCallGuard {
    app: AppState,
    key: Option<String>,
}

impl Drop for McpCallGuard {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            let mut calls = self
                .app
                .mcp_calls
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            calls.remove(&key);
        }
    }
}

impl App {
    pub fn sse_keepalive(&self) -> Duration {
        Duration::from_secs(self.settings.server.sse_keepalive_s)
    }
}

/// Axum state: a cheap handle on [`App`].
pub type AppState = Arc<App>;
