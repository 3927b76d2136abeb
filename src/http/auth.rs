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

use super::OPEN_PATHS;
use crate::protocols::error::ApiError;
use crate::{
    app::AppState,
    ids::{Caller, DEFAULT_TENANT, Tenant},
    store::{
        FoundKey,
        audit::{AuditEntry, Owned, acting_as, kinds},
    },
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

/// The keys a throttled address may still present: the hashes of every
/// key not revoked (the first 8 bytes of each), read from the store at
/// the first need and then, at most once a second, the keys made since.
/// A key whose hash is not here cannot verify and is not looked up; one
/// that is here is verified by the store as always (a key revoked since
/// it was read is refused there). Bounded: past [`KEYS_MAX`] hashes every
/// key is looked up.
#[derive(Default)]
struct KeyIndex {
    state: tokio::sync::Mutex<IndexState>,
}

#[derive(Default)]
struct IndexState {
    hashes: std::collections::HashSet<u64>,
    /// The newest `created_at` read (the next read starts a little
    /// before it: keys of other replicas commit out of order).
    read_to: Option<chrono::DateTime<chrono::Utc>>,
    read_at: Option<Instant>,
    full: bool,
}

/// Hashes a [`KeyIndex`] keeps, at most.
const KEYS_MAX: usize = 1_000_000;

/// Hashes read from the store at a time.
const KEYS_PAGE: u32 = 10_000;

/// How far back a later read of the index starts.
const KEYS_OVERLAP: chrono::Duration = chrono::Duration::minutes(5);

/// The first 8 bytes of a key's hash (hex).
fn prefix(hash: &str) -> u64 {
    hash.get(..16)
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .unwrap_or_default()
}

impl KeyIndex {
    /// Whether the key of `hash` may verify: its hash is among the keys',
    /// as last read (read again when that was more than a second ago).
    async fn may_hold(&self, app: &AppState, hash: &str) -> bool {
        let wanted = prefix(hash);
        let mut state = self.state.lock().await;
        if state.full || state.hashes.contains(&wanted) {
            return true;
        }
        if state
            .read_at
            .is_some_and(|at| at.elapsed() < std::time::Duration::from_secs(1))
        {
            return false;
        }
        state.read_at = Some(Instant::now());
        // Bounded: at most KEYS_MAX / KEYS_PAGE full pages.
        for _ in 0..=KEYS_MAX / KEYS_PAGE as usize {
            let since = state.read_to.map(|at| at - KEYS_OVERLAP);
            let page = match app.store.api_key_hashes(since, KEYS_PAGE).await {
                Ok(page) => page,
                Err(e) => {
                    // Cannot tell: the store is asked for the key itself.
                    tracing::warn!(error = %e, "the keys' hashes cannot be read");
                    return true;
                }
            };
            let before = state.read_to;
            for (hash, at) in &page {
                state.hashes.insert(prefix(hash));
                state.read_to = state.read_to.max(Some(*at));
            }
            if state.hashes.len() >= KEYS_MAX {
                state.full = true;
                break;
            }
            // A page that was not full, or that moved nothing on (keys
            // made in one instant, more than a page of them), ends it.
            if page.len() < KEYS_PAGE as usize || state.read_to == before {
                break;
            }
        }
        state.full || state.hashes.contains(&wanted)
    }

    /// Keeps the hash of a key that verified.
    async fn verified(&self, hash: &str) {
        let mut state = self.state.lock().await;
        if state.hashes.len() < KEYS_MAX {
            state.hashes.insert(prefix(hash));
        }
    }
}

/// Keys and their request buckets, and the failed authentications of
/// each client address.
pub(super) struct Auth {
    required: bool,
    /// With keys off: callers may use the admin routes.
    local_admin: bool,
    requests: Buckets<String>,
    failures: Buckets<IpAddr>,
    /// The proxies whose `X-Forwarded-For` names the client.
    trusted: Option<crate::config::TrustedProxies>,
    /// What a throttled address may still present.
    keys: KeyIndex,
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
    admin: bool,
    at: Instant,
}

/// How long a verified key is remembered for refusals.
const KNOWN_FOR: std::time::Duration = std::time::Duration::from_secs(60);

impl Auth {
    pub(super) fn new(app: &AppState, in_flight: Arc<super::inflight::InFlight>) -> Arc<Self> {
        let server = &app.settings.server;
        Arc::new(Self {
            required: server.auth_required(),
            local_admin: server.allow_local_admin,
            requests: Buckets::new(server.rate_limit_per_minute, String::new()),
            failures: Buckets::new(
                server.auth_failures_per_minute,
                IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
            ),
            trusted: server.trusted_proxies.clone(),
            keys: KeyIndex::default(),
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
    fn remember(&self, hash: &str, verified: Option<&FoundKey>) {
        let mut known = self.known();
        let Some((key_id, tenant, admin)) = verified else {
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
                key_id: key_id.clone(),
                tenant: tenant.clone(),
                admin: *admin,
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
/// or, when the peer is a trusted proxy, the nearest address of its
/// `X-Forwarded-For` that is not one (see [`forwarded_client`]); an IPv6
/// one by its /64 (a host usually has the whole prefix).
fn client_of(request: &Request, trusted: Option<&crate::config::TrustedProxies>) -> IpAddr {
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED), |c| c.0.ip());
    let ip = match trusted {
        Some(trusted) if trusted.contains(peer) => {
            forwarded_client(request.headers(), trusted).unwrap_or(peer)
        }
        _ => peer,
    };
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

/// The client a trusted proxy's `X-Forwarded-For` names: read from the
/// right (the entry the nearest proxy added), the first address that is
/// not itself a trusted proxy; the leftmost when all are. `None` when the
/// header is missing, too long or holds something that is not an
/// address: the peer counts then.
fn forwarded_client(
    headers: &axum::http::HeaderMap,
    trusted: &crate::config::TrustedProxies,
) -> Option<IpAddr> {
    // At most this many hops are read.
    const HOPS_MAX: usize = 32;
    let mut hops = Vec::new();
    for value in headers.get_all("x-forwarded-for") {
        for entry in value.to_str().ok()?.split(',') {
            if hops.len() == HOPS_MAX {
                return None;
            }
            hops.push(hop_address(entry.trim())?);
        }
    }
    let nearest = hops.iter().rev().find(|ip| !trusted.contains(**ip));
    nearest.or(hops.first()).copied()
}

/// An `X-Forwarded-For` entry's address: `1.2.3.4`, `2001:db8::1`, or
/// with a port (`1.2.3.4:5678`, `[2001:db8::1]:5678`).
fn hop_address(entry: &str) -> Option<IpAddr> {
    if let Ok(ip) = entry.parse() {
        return Some(ip);
    }
    entry.parse::<SocketAddr>().ok().map(|a| a.ip())
}

/// Checks the request's API key (when keys are required) and its request
/// budget; the tenant goes into the request's extensions.
pub(super) async fn authenticate(
    State((app, auth)): State<(AppState, Arc<Auth>)>,
    mut request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    if !auth.required {
        let caller = Caller {
            actor: "local".to_owned(),
            admin: auth.local_admin,
        };
        request
            .extensions_mut()
            .insert(Tenant(DEFAULT_TENANT.to_owned()));
        request.extensions_mut().insert(caller);
        return Ok(acting_as("local".to_owned(), next.run(request)).await);
    }
    if OPEN_PATHS.contains(&request.uri().path()) {
        return Ok(next.run(request).await);
    }
    // An address that keeps failing is refused before any lookup of a key
    // that cannot verify: its guesses cost the database nothing. A key
    // that verifies is never refused for its address (behind a gateway,
    // many clients share one).
    let client = client_of(&request, auth.trusted.as_ref());
    let throttled = auth.failures.spend(&client, false).err();
    let key = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|k| !k.is_empty() && k.len() <= 256);
    let hash = looked_up(&app, &auth, client, throttled, key).await?;
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
    let same = recalled
        .as_ref()
        .is_some_and(|k| found.as_ref() == Some(&(k.key_id.clone(), k.tenant.clone(), k.admin)));
    // What was recalled stands until it is a minute old: a request of a
    // key this process knows writes nothing here.
    if !same {
        auth.remember(&hash, found.as_ref());
    }
    let Some((key_id, tenant, admin)) = found else {
        return Err(failed(&app, &auth, client).await);
    };
    if !same {
        auth.keys.verified(&hash).await;
        auth.take(&key_id).map_err(ApiError::RateLimited)?;
    }
    request.extensions_mut().insert(Tenant(tenant));
    request.extensions_mut().insert(Caller {
        actor: key_id.clone(),
        admin,
    });
    let response = acting_as(key_id.clone(), next.run(request)).await;
    // An event stream ends when its key is revoked.
    Ok(super::revocable::revocable(&app, &key_id, response))
}

/// The hash of the request's key, when it is to be looked up: a missing
/// key fails (or is throttled), and a throttled address's key is looked
/// up only when it may verify (see [`KeyIndex`]).
async fn looked_up(
    app: &AppState,
    auth: &Auth,
    client: IpAddr,
    throttled: Option<u64>,
    key: Option<&str>,
) -> Result<String, ApiError> {
    let Some(key) = key else {
        return Err(match throttled {
            Some(wait) => ApiError::AuthThrottled(wait),
            None => failed(app, auth, client).await,
        });
    };
    let hash = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(key.as_bytes()));
    if let Some(wait) = throttled
        && auth.recall(&hash).is_none()
        && !auth.keys.may_hold(app, &hash).await
    {
        return Err(ApiError::AuthThrottled(wait));
    }
    Ok(hash)
}

/// A failed authentication: counted against the address (its answer
/// stays 401) and in the audit trail, one row per address and minute.
async fn failed(app: &AppState, auth: &Auth, client: IpAddr) -> ApiError {
    let _ = auth.failures.spend(&client, true);
    if let Err(e) = app
        .store
        .audit_auth_failure(&client.to_string(), chrono::Utc::now())
        .await
    {
        tracing::error!(error = %e, "the failed authentication was not audited");
    }
    ApiError::Unauthorized
}

/// After routing: the checkpoint a route names must be the caller's;
/// another tenant's is `checkpoint_not_found`, as if it did not exist.
/// A request answered 404 that named another tenant's session, turn,
/// task, response, checkpoint, artifact or webhook endpoint is in the
/// audit trail (its answer is the same).
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
    let method = request.method().clone();
    for (name, value) in &params {
        if name == "checkpoint_id"
            && let Some(owner) = app.store.checkpoint_tenant(value).await?
            && owner != tenant
        {
            refused(&app, &owner, &tenant, &method, value).await;
            return Err(ApiError::CheckpointNotFound);
        }
    }
    let response = next.run(request).await;
    if response.status() == axum::http::StatusCode::NOT_FOUND {
        for (name, value) in &params {
            if let Some(owner) = owner_elsewhere(&app, &tenant, name, value).await {
                refused(&app, &owner, &tenant, &method, value).await;
            }
        }
    }
    Ok(response)
}

/// The other tenant that holds what a path parameter names, if one does.
async fn owner_elsewhere(app: &AppState, tenant: &str, name: &str, value: &str) -> Option<String> {
    let owner = match name {
        "session_id" => app.store.session_elsewhere(tenant, value).await,
        "turn_id" | "id" | "response_id" => {
            let id = value.strip_prefix("resp_").unwrap_or(value);
            let id = id.split('_').next().unwrap_or(id);
            let turn = uuid::Uuid::parse_str(id).ok()?;
            app.store.tenant_of_turn(turn).await
        }
        "webhook_id" => app.store.tenant_of(Owned::Webhook, value).await,
        "artifact_id" => app.store.tenant_of(Owned::Artifact, value).await,
        _ => return None,
    };
    owner.ok().flatten().filter(|owner| owner != tenant)
}

/// Records a refusal of `owner`'s `id` to a caller of `tenant`.
async fn refused(app: &AppState, owner: &str, tenant: &str, method: &axum::http::Method, id: &str) {
    let entry = AuditEntry::new(owner, kinds::REFUSED_OTHER_TENANT)
        .subject(id)
        .outcome(format!("{method} by tenant {tenant}"));
    app.store.record(entry).await;
}
