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
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex},
    time::Instant,
};

use axum::{
    extract::{ConnectInfo, RawPathParams, Request, State},
    http::header,
    middleware::Next,
    response::Response,
};

use super::{OPEN_PATHS, error::ApiError};
use crate::{
    app::AppState,
    ids::{DEFAULT_TENANT, Tenant},
};

/// Token buckets by key: `per_minute` tokens, refilled steadily.
struct Buckets<K> {
    per_minute: u32,
    /// Tokens left and when they were counted, by key; at most
    /// [`MAX_BUCKETS`] (full ones are dropped first, then the rest share
    /// one bucket under `overflow`).
    buckets: Mutex<HashMap<K, (f64, Instant)>>,
    overflow: K,
}

/// The most buckets kept (a key id or an address each).
const MAX_BUCKETS: usize = 10_000;

impl<K: std::hash::Hash + Eq + Clone> Buckets<K> {
    fn new(per_minute: u32, overflow: K) -> Self {
        Self {
            per_minute,
            buckets: Mutex::new(HashMap::new()),
            overflow,
        }
    }

    /// Takes a token from `key`'s bucket (`take`), or only looks whether
    /// one is there; `Err(seconds)` to wait.
    fn spend(&self, key: &K, take: bool) -> Result<(), u64> {
        if self.per_minute == 0 {
            return Ok(());
        }
        let capacity = f64::from(self.per_minute);
        let per_second = capacity / 60.0;
        let now = Instant::now();
        let Ok(mut buckets) = self.buckets.lock() else {
            return Ok(());
        };
        let refilled = |(tokens, at): &(f64, Instant)| {
            (tokens + now.duration_since(*at).as_secs_f64() * per_second).min(capacity)
        };
        if !buckets.contains_key(key) && buckets.len() >= MAX_BUCKETS {
            buckets.retain(|_, bucket| refilled(bucket) < capacity);
        }
        let key = if buckets.contains_key(key) || buckets.len() < MAX_BUCKETS {
            key
        } else {
            &self.overflow
        };
        let bucket = buckets.entry(key.clone()).or_insert((capacity, now));
        bucket.0 = refilled(bucket);
        bucket.1 = now;
        if bucket.0 >= 1.0 {
            if take {
                bucket.0 -= 1.0;
            }
            Ok(())
        } else {
            let wait = (1.0 - bucket.0) / per_second;
            Err(wait.ceil().max(1.0) as u64)
        }
    }
}

/// Keys and their request buckets, and the failed authentications of
/// each client address.
pub(super) struct Auth {
    required: bool,
    requests: Buckets<String>,
    failures: Buckets<IpAddr>,
    /// Keys this process has verified lately, by hash: what a request
    /// that will be refused anyway is refused by (see [`authenticate`]).
    known: Mutex<HashMap<String, Known>>,
    in_flight: Arc<super::inflight::InFlight>,
}

/// A key as the store last answered for it.
#[derive(Clone)]
struct Known {
    key_id: String,
    tenant: String,
    at: Instant,
}

/// How long a verified key is remembered for refusals.
const KNOWN_FOR: std::time::Duration = std::time::Duration::from_secs(60);

impl Auth {
    pub(super) fn new(app: &AppState, in_flight: Arc<super::inflight::InFlight>) -> Arc<Self> {
        let server = &app.settings.server;
        Arc::new(Self {
            required: server.auth_required(),
            requests: Buckets::new(server.rate_limit_per_minute, String::new()),
            failures: Buckets::new(
                server.auth_failures_per_minute,
                IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
            ),
            known: Mutex::new(HashMap::new()),
            in_flight,
        })
    }

    fn known(&self) -> std::sync::MutexGuard<'_, HashMap<String, Known>> {
        self.known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The key of `hash` as verified within [`KNOWN_FOR`].
    fn recall(&self, hash: &str) -> Option<Known> {
        self.known()
            .get(hash)
            .filter(|k| k.at.elapsed() < KNOWN_FOR)
            .cloned()
    }

    /// Remembers a verified key, or forgets one the store no longer has;
    /// at most [`MAX_BUCKETS`] (when full, the stale go, then all).
    fn remember(&self, hash: &str, verified: Option<(&str, &str)>) {
        let mut known = self.known();
        let Some((key_id, tenant)) = verified else {
            known.remove(hash);
            return;
        };
        if known.len() >= MAX_BUCKETS && !known.contains_key(hash) {
            known.retain(|_, k| k.at.elapsed() < KNOWN_FOR);
            if known.len() >= MAX_BUCKETS {
                known.clear();
            }
        }
        known.insert(
            hash.to_owned(),
            Known {
                key_id: key_id.to_owned(),
                tenant: tenant.to_owned(),
                at: Instant::now(),
            },
        );
    }

    /// Takes a request from the key's bucket; `Err(seconds)` to wait.
    fn take(&self, key_id: &str) -> Result<(), u64> {
        self.requests.spend(&key_id.to_owned(), true)
    }
}

/// Who a failed authentication is counted against: the peer's address,
/// an IPv6 one by its /64 (a host usually has the whole prefix).
fn client_of(request: &Request) -> IpAddr {
    let ip = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED), |c| c.0.ip());
    match ip {
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_none() => {
            let mut segments = v6.segments();
            segments[4..].fill(0);
            IpAddr::V6(segments.into())
        }
        IpAddr::V6(v6) => IpAddr::V4(
            v6.to_ipv4_mapped()
                .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED),
        ),
        v4 => v4,
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
    // An address that keeps failing is refused before any lookup: its
    // guesses cost the database nothing.
    let client = client_of(&request);
    auth.failures
        .spend(&client, false)
        .map_err(ApiError::AuthThrottled)?;
    let failed = || {
        // The failure is counted; its answer stays 401.
        let _ = auth.failures.spend(&client, true);
        ApiError::Unauthorized
    };
    let key = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|k| !k.is_empty() && k.len() <= 256)
        .ok_or_else(failed)?;
    let hash = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(key.as_bytes()));
    // A key verified lately whose request would be refused anyway (its
    // rate, its tenant's requests in flight) is refused from what this
    // process knows: a tenant's flood costs the database nothing. Every
    // request that goes on is verified with the store, so a revoked key
    // is refused at once.
    let recalled = auth.recall(&hash);
    if let Some(known) = &recalled {
        auth.take(&known.key_id).map_err(ApiError::RateLimited)?;
        let most = super::inflight::max_streams(&app, &known.tenant).await?;
        auth.in_flight.check(&known.tenant, most)?;
    }
    let found = app.store.find_api_key(&hash).await?;
    let verified = found.as_ref().map(|(k, t)| (k.as_str(), t.as_str()));
    let same = recalled
        .as_ref()
        .is_some_and(|k| verified == Some((k.key_id.as_str(), k.tenant.as_str())));
    // What was recalled stands until it is a minute old: a request of a
    // key this process knows writes nothing here.
    if !same {
        auth.remember(&hash, verified);
    }
    let (key_id, tenant) = found.ok_or_else(failed)?;
    if !same {
        auth.take(&key_id).map_err(ApiError::RateLimited)?;
    }
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
