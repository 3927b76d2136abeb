//! What every protocol's handlers share: the turn service (their one way
//! to turns and sessions), the settings, the vaults, and each protocol's
//! own state in this process.

use std::{sync::Arc, time::Duration};

use crate::{config::Settings, protocols::mcp::McpState, service::TurnService, vault::Vaults};

/// The protocols' state, built once at start.
pub struct Protocols {
    /// Turns and sessions: start, follow, wait, answer, read.
    pub turns: TurnService,
    pub settings: Arc<Settings>,
    /// Each tenant's vault (MCP's resources).
    pub vaults: Arc<Vaults>,
    /// The provider names a turn may ask for in `runtime_provider`.
    pub provider_names: Vec<String>,
    /// MCP's sessions, calls and listens in this process.
    pub mcp: McpState,
    /// Wakes this process's A2A push delivery at once (a configuration
    /// was made: its task's first update need not wait for the next look).
    pub pushes_due: Arc<tokio::sync::Notify>,
}

impl Protocols {
    /// How often an idle stream sends a keep-alive.
    pub fn sse_keepalive(&self) -> Duration {
        Duration::from_secs(self.settings.server.sse_keepalive_s)
    }
}

/// A protocol handler's state: a cheap handle on [`Protocols`].
pub type Shared = Arc<Protocols>;
