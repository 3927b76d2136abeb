//! Who is asking: API keys, their request budgets, and the tenant every
//! session belongs to.
//!
//! [`authenticate`] runs before routing: it checks the key (when keys are
//! required) and puts the caller's [`Tenant`] into the request. Session
//! ids are per tenant (see `ids::SessionKey`): a route's `session_id` can
//! only ever name one of the caller's own sessions, so no other tenant's
//! session can be reached, taken or learnt of. After routing,
//! [`check_owner`] looks at a route's `checkpoint_id` (checkpoint ids are
//! global): another tenant's is answered exactly as one that does not
//! exist.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Instant,
};

use axum::{
    extract::{RawPathParams, Request, State},
    http::header,
    middleware::Next,
    response::Response,
};

use super::error::ApiError;
use crate::{app::AppState, ids::DEFAULT_TENANT};

/// Paths anyone may ask for: probes, metrics, the contract and the page.
pub(super) const OPEN_PATHS: &[&str] = &[
    "/",
    "/healthz",
    "/readyz",
    "/metrics",
    "/openapi.yaml",
    "/.well-known/agent-card.json",
];

/// The tenant of the request: its key's, or [`DEFAULT_TENANT`] when keys
/// are not required.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant(pub String);

/// Keys and their request buckets.
pub(super) struct Auth {
    required: bool,
    per_minute: u32,
    /// Tokens left and when they were counted, by key id (one entry per
    /// key that was used: at most as many as the keys made).
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

impl Auth {
    pub(super) fn new(app: &AppState) -> Arc<Self> {
        Arc::new(Self {
            required: app.settings.server.auth_required(),
            per_minute: app.settings.server.rate_limit_per_minute,
            buckets: Mutex::new(HashMap::new()),
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

/// After routing: the checkpoint a route names must be the caller's;
/// another tenant's is `checkpoint_not_found`, as if it did not exist.
pub(super) async fn check_owner(
    State(app): State<AppState>,
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
    for (name, value) in &params {
        if name == "checkpoint_id"
            && let Some(owner) = app.store.checkpoint_tenant(value).await?
            && owner != tenant
        {
            return Err(ApiError::CheckpointNotFound);
        }
    }
    Ok(next.run(request).await)
}
