//! The application state shared by the HTTP edge's handlers. The
//! protocols get theirs ([`crate::protocols::Protocols`]): the turn
//! service, not the store.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
};

use crate::{
    config::Settings, protocols::Shared, runner::TurnRunner, store::Store, tools::mcp::McpHub,
    vault::Vaults,
};

/// What handlers need, built once at start.
pub struct App {
    pub settings: Arc<Settings>,
    pub store: Arc<dyn Store>,
    pub runner: TurnRunner,
    /// Each tenant's vault.
    pub vaults: Arc<Vaults>,
    /// The MCP servers whose tools are in the registry.
    pub mcp: Arc<McpHub>,
    /// The event streams open here, by the key that opened them: a
    /// revoked key's end.
    pub key_streams: Arc<KeyStreams>,
    /// What the protocols share.
    pub protocols: Shared,
}

impl axum::extract::FromRef<AppState> for Shared {
    fn from_ref(app: &AppState) -> Self {
        app.protocols.clone()
    }
}

/// The event streams open in this process, by the id of the key that
/// opened them: how many, and the token that ends them (`http::revocable`).
#[derive(Debug, Default)]
pub struct KeyStreams(Mutex<HashMap<String, (usize, tokio_util::sync::CancellationToken)>>);

impl KeyStreams {
    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, (usize, tokio_util::sync::CancellationToken)>>
    {
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

/// Axum state: a cheap handle on [`App`].
#[derive(Clone)]
pub struct AppState(Arc<App>);

impl AppState {
    pub fn new(app: App) -> Self {
        Self(Arc::new(app))
    }
}

impl std::ops::Deref for AppState {
    type Target = App;

    fn deref(&self) -> &App {
        &self.0
    }
}
