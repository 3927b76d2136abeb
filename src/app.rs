//! The application state shared by every handler.

use std::{
    collections::{BTreeSet, HashMap},
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use tokio::time::Instant;

use uuid::Uuid;

use crate::{
    config::Settings,
    ids::{SessionKey, Tenant},
    runner::TurnRunner,
    store::{
        Store,
        audit::{AuditEntry, kinds},
    },
    tools::mcp::McpHub,
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
    /// The MCP sessions (up to 2025-11-25) this process began: their
    /// subscriptions and elicitations.
    pub mcp_sessions: McpSessions,
    /// Wakes this process's push delivery at once (a configuration was
    /// made: its task's first update need not wait for the next look).
    pub pushes_due: Arc<tokio::sync::Notify>,
    /// The event streams open here, by the key that opened them: a
    /// revoked key's end.
    pub key_streams: Arc<KeyStreams>,
    /// The MCP listens (`subscriptions/listen`, a session's `GET /mcp`)
    /// open here, by tenant.
    pub mcp_listens: Arc<McpListens>,
}

/// Listens one tenant may hold open in a process (either version's).
pub const MCP_LISTENS_PER_TENANT: usize = 16;

/// The MCP listens open in this process, by tenant: each looks at its
/// resources every second, so a tenant's are bounded
/// ([`MCP_LISTENS_PER_TENANT`]).
#[derive(Debug, Default)]
pub struct McpListens(Mutex<HashMap<String, usize>>);

impl McpListens {
    /// A place for one more listen of `tenant`, held until the guard is
    /// dropped; `None`: the tenant holds as many as it may.
    pub fn enter(self: &Arc<Self>, tenant: &str) -> Option<McpListen> {
        let mut open = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(tenant.to_owned()).or_default();
        if *count >= MCP_LISTENS_PER_TENANT {
            return None;
        }
        *count += 1;
        Some(McpListen {
            listens: self.clone(),
            tenant: tenant.to_owned(),
        })
    }
}

/// One listen's place, given back when dropped.
#[derive(Debug)]
pub struct McpListen {
    listens: Arc<McpListens>,
    tenant: String,
}

impl Drop for McpListen {
    fn drop(&mut self) {
        let mut open = self
            .listens
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.tenant) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.tenant);
            }
        }
    }
}

impl App {
    /// Records a person's decision on a call waiting for approval, and
    /// who made it in the audit trail; false when the call was already
    /// decided (the first decision stands).
    pub async fn decide_approval(
        &self,
        approval: &crate::store::NewApproval,
    ) -> Result<bool, crate::store::StoreError> {
        let recorded = self.store.decide_approval(approval).await?;
        if recorded {
            let entry = AuditEntry::new(approval.session_id.tenant(), kinds::APPROVAL_DECIDED)
                .subject(format!("{}/{}", approval.turn_id, approval.call_id))
                .outcome(if approval.approved {
                    "approved"
                } else {
                    "denied"
                });
            self.store.record(entry).await;
        }
        Ok(recorded)
    }

    /// An answer (a decision, a client's result) for a waiting call of
    /// `turn_id` is in the store: the wait is woken where it runs in this
    /// process, or the turn where it is parked (it goes on here).
    pub async fn answered(&self, turn_id: uuid::Uuid) {
        self.approvals_decided.notify_waiters();
        self.runner.wake(turn_id).await;
    }
}

/// The event streams open in this process, by the id of the key that
/// opened them: how many, and the token that ends them (`http::revocable`).
#[derive(Debug, Default)]
pub struct KeyStreams(
    Mutex<std::collections::HashMap<String, (usize, tokio_util::sync::CancellationToken)>>,
);

impl KeyStreams {
    fn lock(
        &self,
    ) -> std::sync::MutexGuard<
        '_,
        std::collections::HashMap<String, (usize, tokio_util::sync::CancellationToken)>,
    > {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One more stream of `key_id`: the token that ends it, and the guard
    /// that counts it until it ends.
    pub fn open(
        self: &Arc<Self>,
        key_id: &str,
    ) -> (tokio_util::sync::CancellationToken, KeyStreamOpen) {
        let mut keys = self.lock();
        let (count, token) = keys
            .entry(key_id.to_owned())
            .or_insert_with(|| (0, tokio_util::sync::CancellationToken::new()));
        *count += 1;
        let token = token.clone();
        drop(keys);
        (
            token,
            KeyStreamOpen {
                streams: self.clone(),
                key_id: key_id.to_owned(),
            },
        )
    }

    /// Ends the streams of `key_id` (revoked); how many there were.
    pub fn revoked(&self, key_id: &str) -> usize {
        match self.lock().remove(key_id) {
            Some((count, token)) => {
                token.cancel();
                count
            }
            None => 0,
        }
    }

    /// Whether any stream is open.
    pub fn any(&self) -> bool {
        !self.lock().is_empty()
    }
}

/// Counts a stream until it ends.
pub struct KeyStreamOpen {
    streams: Arc<KeyStreams>,
    key_id: String,
}

impl Drop for KeyStreamOpen {
    fn drop(&mut self) {
        let mut keys = self.streams.lock();
        if let Some((count, _)) = keys.get_mut(&self.key_id) {
            *count -= 1;
            if *count == 0 {
                keys.remove(&self.key_id);
            }
        }
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

/// MCP sessions a process keeps at most.
const MCP_SESSIONS_MAX: usize = 10_000;
/// MCP sessions one tenant keeps at most in a process: past it, the
/// tenant's own session idle longest goes (never another tenant's).
pub const MCP_SESSIONS_PER_TENANT: usize = 1_000;
/// The longest `Mcp-Session-Id` read: the ids this process gives are
/// UUIDs; a longer one is no session of ours.
pub const MCP_SESSION_ID_MAX: usize = 64;
/// Resources one session follows at most.
pub const MCP_URIS_MAX: usize = 100;
/// Approvals asked of one session by elicitation and not answered, at most.
const MCP_ASKED_MAX: usize = 100;
/// When full, a session neither asked nor streamed to for this long is
/// forgotten first.
const MCP_IDLE: Duration = Duration::from_secs(3600);

#[derive(Debug)]
struct Watched {
    uris: BTreeSet<String>,
    /// When the session last asked something or was streamed to.
    seen: Instant,
    /// The stream that serves it: a new `GET` ends the one before (each
    /// notification goes to one stream, as the transport says).
    stream: u64,
    /// Whether the client takes `elicitation/create` (its `initialize`
    /// said so).
    elicits: bool,
    /// The approvals asked of it by elicitation, by request id: the
    /// session, turn and call each decides.
    asked: HashMap<String, (SessionKey, Uuid, String)>,
    /// The level `logging/setLevel` set (an index of the RFC 5424 levels,
    /// debug 0): its `ask` streams carry the turn's log messages at or
    /// above it.
    log_level: Option<usize>,
}

/// The MCP sessions (up to 2025-11-25) `initialize` began in this
/// process, by tenant and session: the resources each follows
/// (`resources/subscribe`; the session's `GET /mcp` stream says when one
/// changes), and the approvals asked of its client by elicitation.
#[derive(Debug, Default)]
pub struct McpSessions(Mutex<HashMap<(String, String), Watched>>);

/// Why a subscription is not taken.
pub enum SubscribeRefused {
    /// The session was not begun by this process (or was forgotten).
    UnknownSession,
    TooMany,
}

impl McpSessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Watched>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps a session `initialize` began. A tenant keeps at most
    /// [`MCP_SESSIONS_PER_TENANT`]: past it, its own session idle longest
    /// makes room. When the process holds [`MCP_SESSIONS_MAX`], the
    /// sessions idle past [`MCP_IDLE`] go; if none is, the new session is
    /// refused (false): one tenant's `initialize` never evicts another
    /// tenant's session, nor its questions.
    pub fn begin(&self, tenant: &Tenant, session: &str, elicits: bool) -> bool {
        let mut sessions = self.lock();
        let now = Instant::now();
        let own = sessions.keys().filter(|(t, _)| *t == tenant.0).count();
        if own >= MCP_SESSIONS_PER_TENANT
            && let Some(oldest) = sessions
                .iter()
                .filter(|((t, _), _)| *t == tenant.0)
                .min_by_key(|(_, watched)| watched.seen)
                .map(|(key, _)| key.clone())
        {
            sessions.remove(&oldest);
        }
        if sessions.len() >= MCP_SESSIONS_MAX {
            // Full: the idle ones go (a sweep only then, not at every
            // `initialize`).
            sessions.retain(|_, watched| now.duration_since(watched.seen) < MCP_IDLE);
        }
        if sessions.len() >= MCP_SESSIONS_MAX {
            return false;
        }
        sessions.insert(
            (tenant.0.clone(), session.to_owned()),
            Watched {
                uris: BTreeSet::new(),
                seen: now,
                stream: 0,
                elicits,
                asked: HashMap::new(),
                log_level: None,
            },
        );
        true
    }

    /// Sets a session's log level; false: no session of this process.
    pub fn set_log_level(&self, tenant: &Tenant, session: &str, level: usize) -> bool {
        let mut sessions = self.lock();
        match sessions.get_mut(&(tenant.0.clone(), session.to_owned())) {
            Some(watched) => {
                watched.seen = Instant::now();
                watched.log_level = Some(level);
                true
            }
            None => false,
        }
    }

    /// A session's log level, if it set one.
    pub fn log_level(&self, tenant: &Tenant, session: &str) -> Option<usize> {
        let sessions = self.lock();
        sessions
            .get(&(tenant.0.clone(), session.to_owned()))
            .and_then(|watched| watched.log_level)
    }

    pub fn subscribe(
        &self,
        tenant: &Tenant,
        session: &str,
        uri: &str,
    ) -> Result<(), SubscribeRefused> {
        let mut sessions = self.lock();
        let watched = sessions
            .get_mut(&(tenant.0.clone(), session.to_owned()))
            .ok_or(SubscribeRefused::UnknownSession)?;
        watched.seen = Instant::now();
        if watched.uris.len() >= MCP_URIS_MAX && !watched.uris.contains(uri) {
            return Err(SubscribeRefused::TooMany);
        }
        watched.uris.insert(uri.to_owned());
        Ok(())
    }

    pub fn unsubscribe(&self, tenant: &Tenant, session: &str, uri: &str) {
        if let Some(watched) = self.lock().get_mut(&(tenant.0.clone(), session.to_owned())) {
            watched.seen = Instant::now();
            watched.uris.remove(uri);
        }
    }

    /// The id of an `elicitation/create` that asks the session's client
    /// to decide on `call` (session, turn, call id); `None`: the client
    /// takes no elicitation, the session is not this process's, or it has
    /// [`MCP_ASKED_MAX`] questions open.
    pub fn ask(
        &self,
        tenant: &Tenant,
        session: &str,
        call: (SessionKey, Uuid, String),
    ) -> Option<String> {
        let mut sessions = self.lock();
        let watched = sessions
            .get_mut(&(tenant.0.clone(), session.to_owned()))
            .filter(|w| w.elicits && w.asked.len() < MCP_ASKED_MAX)?;
        watched.seen = Instant::now();
        let id = format!("approval-{}", Uuid::now_v7().simple());
        watched.asked.insert(id.clone(), call);
        Some(id)
    }

    /// The call an answered `elicitation/create` of the session decides
    /// (forgotten once answered).
    pub fn answered(
        &self,
        tenant: &Tenant,
        session: &str,
        id: &str,
    ) -> Option<(SessionKey, Uuid, String)> {
        let mut sessions = self.lock();
        let watched = sessions.get_mut(&(tenant.0.clone(), session.to_owned()))?;
        watched.seen = Instant::now();
        watched.asked.remove(id)
    }

    /// Makes `stream` the session's stream; `None`: no such session.
    pub fn take(&self, key: &(String, String)) -> Option<u64> {
        let mut sessions = self.lock();
        let watched = sessions.get_mut(key)?;
        watched.stream += 1;
        watched.seen = Instant::now();
        Some(watched.stream)
    }

    /// What `stream` follows now; `None`: another stream took the
    /// session, or it was forgotten.
    pub fn followed(&self, key: &(String, String), stream: u64) -> Option<Vec<String>> {
        let mut sessions = self.lock();
        let watched = sessions.get_mut(key).filter(|w| w.stream == stream)?;
        watched.seen = Instant::now();
        Some(watched.uris.iter().cloned().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Past a tenant's share, its new session takes the place of its own
    /// session idle longest; one still in use stays, and so does its
    /// question. Another tenant's sessions are never taken (issue 63: one
    /// tenant's `initialize` calls evicted every tenant's sessions).
    #[tokio::test(start_paused = true)]
    async fn a_tenants_full_share_of_mcp_sessions_forgets_its_own_idlest() {
        let sessions = McpSessions::default();
        let tenant = Tenant("acme".into());
        let other = Tenant("globex".into());
        assert!(sessions.begin(&other, "g0", false));
        assert!(sessions.set_log_level(&other, "g0", 3));
        tokio::time::advance(Duration::from_millis(1)).await;
        for n in 0..MCP_SESSIONS_PER_TENANT {
            assert!(sessions.begin(&tenant, &format!("s{n}"), n == 0));
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        // s0 asks something: now the most recent; s1 is the idlest.
        let asked = sessions.ask(
            &tenant,
            "s0",
            (
                SessionKey::from_stored("acme/x"),
                Uuid::now_v7(),
                "c".into(),
            ),
        );
        let asked = asked.expect("s0 takes elicitation");
        for n in 0..5 {
            assert!(sessions.begin(&tenant, &format!("new{n}"), false));
        }
        assert!(sessions.subscribe(&tenant, "s1", "vault:///a.md").is_err());
        assert!(sessions.subscribe(&tenant, "s6", "vault:///a.md").is_ok());
        assert!(sessions.subscribe(&tenant, "new4", "vault:///a.md").is_ok());
        assert!(sessions.answered(&tenant, "s0", &asked).is_some());
        // The other tenant's session, the idlest of all, is still there.
        assert!(sessions.subscribe(&other, "g0", "vault:///a.md").is_ok());
        assert_eq!(sessions.log_level(&other, "g0"), Some(3));
        // Another tenant's session of the same id is not this one.
        assert!(sessions.answered(&other, "s0", &asked).is_none());
        // A level is kept only for a session this process began.
        assert!(!sessions.set_log_level(&tenant, "made-up", 0));
        assert_eq!(sessions.log_level(&tenant, "made-up"), None);
    }

    /// A full process refuses a new session rather than evict one in use.
    #[tokio::test(start_paused = true)]
    async fn a_full_process_refuses_a_new_mcp_session() {
        let sessions = McpSessions::default();
        for n in 0..MCP_SESSIONS_MAX {
            let tenant = Tenant(format!("t{}", n / MCP_SESSIONS_PER_TENANT));
            assert!(sessions.begin(&tenant, &format!("s{n}"), false));
        }
        assert!(!sessions.begin(&Tenant("late".into()), "s", false));
        // Once they are idle past an hour, they make room.
        tokio::time::advance(MCP_IDLE + Duration::from_secs(1)).await;
        assert!(sessions.begin(&Tenant("late".into()), "s", false));
    }
}
