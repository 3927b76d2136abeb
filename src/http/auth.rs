//! Who is asking: API keys, their request budgets, and the tenant every
//! session belongs to.
//!
//! [`authenticate`] runs before routing: it checks the key (when keys are
//! required) and puts the caller's [`Tenant`] into the request. After
//! routing, [`check_owner`] looks at the route's `session_id` or
//! `checkpoint_id`: a session of another tenant is answered exactly as a
//! session that does not exist. Starting a turn checks again, in the same
//! statement that makes or updates the session (see `Store::begin_turn`),
//! so no race makes a session change hands.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Instant,
};

use axum::{
    extract::{RawPathParams, Request, State},
    http::{Method, header},
    middleware::Next,
    response::Response,
};

use super::error::ApiError;
use crate::{app::AppState, ids::DEFAULT_TENANT};

/// Paths anyone may ask for: probes, metrics, the contract and the page.
pub(super) const OPEN_PATHS: &[&str] = &["/", "/healthz", "/readyz", "/metrics", "/openapi.yaml"];

/// How many sessions' tenants are remembered (a session never changes
/// tenant, so an entry never goes stale); the map starts over when full.
const OWNERS_CACHED: usize = 10_000;

/// The tenant of the request: its key's, or [`DEFAULT_TENANT`] when keys
/// are not required.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant(pub String);

/// Keys, their request buckets and the sessions' tenants.
pub(super) struct Auth {
    required: bool,
    per_minute: u32,
    /// Tokens left and when they were counted, by key id (one entry per
    /// key that was used: at most as many as the keys made).
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
    /// Tenant by session id, for sessions that exist.
    owners: Mutex<HashMap<String, String>>,
}

impl Auth {
    pub(super) fn new(app: &AppState) -> Arc<Self> {
        Arc::new(Self {
            required: app.settings.server.auth_required(),
            per_minute: app.settings.server.rate_limit_per_minute,
            buckets: Mutex::new(HashMap::new()),
            owners: Mutex::new(HashMap::new()),
        })
    }

    /// Takes a request from the key's bucket; `Err(seconds)` to wait.
    fn take(&self, key_id: &str) -> Result<(), u64> {
        if self.per_minute == 0 {
            return Ok(());
        }
        let capacity = f64::from(self.per_minute);
        let per_second = capacity / 60.0;
        let now = Instant::now();
        let Ok(mut buckets) = self.buckets.lock() else {
            return Ok(());
        };
        let (tokens, at) = buckets.entry(key_id.to_owned()).or_insert((capacity, now));
        *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * per_second).min(capacity);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            let wait = (1.0 - *tokens) / per_second;
            Err(wait.ceil().max(1.0) as u64)
        }
    }

    /// The tenant of a session; `None`: no such session.
    async fn session_tenant(
        &self,
        app: &AppState,
        session_id: &str,
    ) -> Result<Option<String>, ApiError> {
        if let Some(tenant) = self
            .owners
            .lock()
            .ok()
            .and_then(|owners| owners.get(session_id).cloned())
        {
            return Ok(Some(tenant));
        }
        let tenant = app.store.session_tenant(session_id).await?;
        if let (Some(tenant), Ok(mut owners)) = (&tenant, self.owners.lock()) {
            if owners.len() >= OWNERS_CACHED {
                owners.clear();
            }
            owners.insert(session_id.to_owned(), tenant.clone());
        }
        Ok(tenant)
    }
}

/// Checks the request's API key (when keys are required) and its request
/// budget; the tenant goes into the request's extensions.
pub(super) async fn authenticate(
    State((app, auth)): State<(AppState, Arc<Auth>)>,
    mut request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    if !auth.required {
        request
            .extensions_mut()
            .insert(Tenant(DEFAULT_TENANT.to_owned()));
        return Ok(next.run(request).await);
    }
    if OPEN_PATHS.contains(&request.uri().path()) {
        return Ok(next.run(request).await);
    }
    let key = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|k| !k.is_empty() && k.len() <= 256)
        .ok_or(ApiError::Unauthorized)?;
    let hash = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(key.as_bytes()));
    let (key_id, tenant) = app
        .store
        .find_api_key(&hash)
        .await?
        .ok_or(ApiError::Unauthorized)?;
    auth.take(&key_id).map_err(ApiError::RateLimited)?;
    request.extensions_mut().insert(Tenant(tenant));
    Ok(next.run(request).await)
}

/// After routing: the session (or checkpoint) the route names must be the
/// caller's. Another tenant's is `session_not_found`
/// (`checkpoint_not_found`), as if it did not exist; so is a session that
/// does not exist, except where a turn makes it.
pub(super) async fn check_owner(
    State((app, auth)): State<(AppState, Arc<Auth>)>,
    params: Result<RawPathParams, axum::extract::rejection::RawPathParamsRejection>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    // Not a route of ours that names a resource (or the path parameters
    // are not text: the handler refuses those).
    let Ok(params) = params else {
        return Ok(next.run(request).await);
    };
    let Some(tenant) = request.extensions().get::<Tenant>().map(|t| t.0.clone()) else {
        // Only open paths go without a tenant, and none of them names a
        // resource.
        return Ok(next.run(request).await);
    };
    // Posting a turn is checked where the turn begins, in the statement
    // that makes or updates the session (and a running turn or a used
    // idempotency key is only reported to the session's tenant): no read
    // here on the busiest route.
    let begins_turn = request.method() == Method::POST && request.uri().path().ends_with("/turns");
    for (name, value) in &params {
        match name {
            "session_id" if !begins_turn => {
                // An invalid id gets its own error from the handler.
                if crate::ids::SessionId::parse(value).is_err() {
                    continue;
                }
                match auth.session_tenant(&app, value).await? {
                    Some(owner) if owner == tenant => {}
                    _ => return Err(ApiError::SessionNotFound),
                }
            }
            "checkpoint_id" => match app.store.checkpoint_tenant(value).await? {
                Some(owner) if owner != tenant => return Err(ApiError::CheckpointNotFound),
                _ => {}
            },
            _ => {}
        }
    }
    Ok(next.run(request).await)
}
