//! What the MCP endpoint keeps in this process: the sessions
//! `initialize` began (up to 2025-11-25) with what they follow and were
//! asked, the `tools/call` requests still answering, and the listens open
//! by tenant. Each is bounded, and a tenant's share of it too.

use std::{
    collections::{BTreeSet, HashMap},
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use tokio::time::Instant;
use uuid::Uuid;

use crate::ids::{SessionKey, Tenant};

/// The MCP endpoint's state in this process.
#[derive(Debug, Default)]
pub struct McpState {
    /// Turns that `tools/call` requests of this process are answering.
    pub calls: Arc<McpCalls>,
    /// The sessions (up to 2025-11-25) this process began: their
    /// subscriptions and elicitations.
    pub sessions: McpSessions,
    /// The listens (`subscriptions/listen`, a session's `GET /mcp`) open
    /// here, by tenant.
    pub listens: Arc<McpListens>,
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

/// The turns MCP `tools/call` requests of this process are answering, by
/// their request (tenant, MCP session, request id): a
/// `notifications/cancelled` finds its turn here. Bounded: past
/// [`McpCalls::MAX`] calls a new one is not tracked (it runs, and cannot
/// be cancelled by notification).
#[derive(Debug, Default)]
pub struct McpCalls(Mutex<HashMap<String, (SessionKey, Uuid)>>);

impl McpCalls {
    pub const MAX: usize = 10_000;

    fn key(tenant: &str, session: &str, request: &serde_json::Value) -> String {
        format!("{tenant}\u{0}{session}\u{0}{request}")
    }

    /// Tracks a call while the returned guard lives.
    pub fn track(
        calls: &Arc<Self>,
        tenant: &str,
        session: &str,
        request: &serde_json::Value,
        turn: (SessionKey, Uuid),
    ) -> McpCallGuard {
        let key = Self::key(tenant, session, request);
        let mut held = calls.0.lock().unwrap_or_else(PoisonError::into_inner);
        let tracked = held.len() < Self::MAX && !held.contains_key(&key);
        if tracked {
            held.insert(key.clone(), turn);
        }
        drop(held);
        McpCallGuard {
            calls: calls.clone(),
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
        let calls = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        calls.get(&Self::key(tenant, session, request)).cloned()
    }
}

/// Untracks its call when dropped (the answer ended, or its client left).
pub struct McpCallGuard {
    calls: Arc<McpCalls>,
    key: Option<String>,
}

impl Drop for McpCallGuard {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            let mut calls = self.calls.0.lock().unwrap_or_else(PoisonError::into_inner);
            calls.remove(&key);
        }
    }
}

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
    /// question. Another tenant's sessions are never taken (one tenant's
    /// `initialize` calls once evicted every tenant's sessions).
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
