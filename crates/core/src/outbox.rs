//! The outbox: what the service sends to other people's URLs when
//! something happens, at least once, from every replica. Webhook messages
//! ([`webhooks`]) and A2A push notifications ([`pushes`]) are its two
//! users; a user says how one of its rows is delivered, and this module
//! runs the rest, the same for each:
//!
//! - which rows are due, and the lease a replica takes on some of them
//!   ([`crate::store::Leases`]: one claim and one release statement per
//!   backend, whatever the queue);
//! - how many deliveries run at once, and each tenant's share of them
//!   (one tenant's slow receivers do not hold up another's);
//! - the retries: one policy ([`crate::retry::Backoff`]), and a delivery
//!   failing for [`GIVE_UP_AFTER`] is given up;
//! - the HTTP client: no proxy, no redirects, bounded waits, and the
//!   outbound guard on every address ([`Outbound`]).
//!
//! Which rows an event makes is decided in the event log's own
//! transaction (`store::webhooks::routes`; a push configuration is a
//! cursor over its task's log), so an event the log holds is never
//! without them.

pub mod pushes;
pub mod webhooks;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use chrono::{DateTime, Utc};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::{
    retry::Backoff,
    store::{Claim, Queue, Share, Store, StoreError},
    tools::web::guard::{GuardedResolver, NetGuard},
};

/// How often a replica looks for deliveries that are due.
const POLL: Duration = Duration::from_millis(250);
/// How long a replica holds the rows it took.
const LEASE: Duration = Duration::from_secs(30);
/// Deliveries a replica runs at once (of each queue), and of them, one
/// tenant's at most.
const IN_FLIGHT: usize = 32;
const PER_TENANT: usize = 4;
/// A delivery's wait for its answer.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a failing delivery is tried before it is given up.
pub const GIVE_UP_AFTER: Duration = Duration::from_secs(25 * 3600);
/// The waits between tries of a failing delivery: 1 s, doubling, at most
/// 10 min, jittered.
pub const RETRY: Backoff = Backoff {
    first: Duration::from_secs(1),
    most: Duration::from_secs(600),
};

/// One user of the outbox: how its rows are read, given back and
/// delivered.
#[async_trait::async_trait]
pub trait Deliveries: Send + Sync + 'static {
    type Item: Send + 'static;

    /// The queue its rows are in.
    const QUEUE: Queue;

    /// The tenant a row is counted for (its `share_key`).
    fn share_key(item: &Self::Item) -> &str;

    /// The rows `claim` holds (what a claim took).
    async fn held(&self, claim: &str) -> Result<Vec<Self::Item>, StoreError>;

    /// Gives a row back untried, due again at `next_at`.
    async fn put_back(&self, claim: &str, item: Self::Item, next_at: DateTime<Utc>);

    /// Delivers one row and records how it went (its lease given back).
    async fn deliver(&self, claim: &str, item: Self::Item);
}

/// Runs `deliveries` until `stop`: every [`POLL`] (or at once when
/// `wake` is notified), up to [`IN_FLIGHT`] deliveries at once, at most
/// [`PER_TENANT`] of one tenant's. Each claim has its own owner,
/// `{owner}:{n}`, so that it reads back only what it took; when it
/// stops, what this replica held goes to the others at once.
pub async fn run<D: Deliveries>(
    store: Arc<dyn Store>,
    deliveries: Arc<D>,
    owner: String,
    wake: Option<Arc<tokio::sync::Notify>>,
    stop: CancellationToken,
) {
    let mut running: JoinSet<()> = JoinSet::new();
    let tenants = Arc::new(InFlight::default());
    let mut claims = 0u64;
    let woken = async |wake: &Option<Arc<tokio::sync::Notify>>| match wake {
        Some(wake) => wake.notified().await,
        None => std::future::pending().await,
    };
    // Bounded: each round waits for the poll, a wake or the stop.
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(POLL) => {}
            () = woken(&wake) => {}
        }
        while running.try_join_next().is_some() {}
        let free = IN_FLIGHT.saturating_sub(running.len());
        if free == 0 {
            continue;
        }
        claims += 1;
        let claim = format!("{owner}:{claims}");
        let now = Utc::now();
        for item in claim_due(
            store.as_ref(),
            deliveries.as_ref(),
            &claim,
            now,
            free,
            &tenants,
        )
        .await
        {
            let Some(slot) = tenants.take(D::share_key(&item)) else {
                deliveries.put_back(&claim, item, now + since(POLL)).await;
                continue;
            };
            let (deliveries, claim) = (deliveries.clone(), claim.clone());
            running.spawn(async move {
                let _slot = slot;
                deliveries.deliver(&claim, item).await;
            });
        }
    }
    running.abort_all();
    while running.join_next().await.is_some() {}
    // Each row stays where its last recorded try left it.
    if let Err(e) = store.release(D::QUEUE, &owner).await {
        tracing::warn!(queue = ?D::QUEUE, error = %e, "outbox: leases not given back; they run out");
    }
}

/// Takes up to `free` rows that are due, as `claim`: none when none is
/// due (a read, no write) or the store fails (logged).
async fn claim_due<D: Deliveries>(
    store: &dyn Store,
    deliveries: &D,
    claim: &str,
    now: DateTime<Utc>,
    free: usize,
    tenants: &InFlight,
) -> Vec<D::Item> {
    let queue = D::QUEUE;
    let claimed = async {
        if !store.due(queue, now).await? {
            return Ok(Vec::new());
        }
        let taking = Claim {
            owner: claim,
            now,
            until: now + since(LEASE),
            limit: u32::try_from(free).unwrap_or(u32::MAX),
        };
        if store.claim(queue, taking, &tenants.share()).await? == 0 {
            return Ok(Vec::new());
        }
        deliveries.held(claim).await
    };
    claimed.await.unwrap_or_else(|e: StoreError| {
        tracing::warn!(?queue, error = %e, "outbox: the due deliveries cannot be taken");
        Vec::new()
    })
}

/// The deliveries in flight in this replica, by tenant.
#[derive(Default)]
struct InFlight(Mutex<HashMap<String, usize>>);

impl InFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What a claim may take: [`PER_TENANT`] a tenant, less what it has
    /// in flight here.
    fn share(&self) -> Share {
        Share {
            per_tenant: PER_TENANT as u32,
            busy: self
                .lock()
                .iter()
                .map(|(tenant, count)| (tenant.clone(), *count as u32))
                .collect(),
        }
    }

    /// A slot for one more delivery of `tenant`, unless it has its share.
    fn take(self: &Arc<Self>, tenant: &str) -> Option<Slot> {
        let mut counts = self.lock();
        let count = counts.entry(tenant.to_owned()).or_default();
        if *count >= PER_TENANT {
            return None;
        }
        *count += 1;
        Some(Slot {
            in_flight: self.clone(),
            tenant: tenant.to_owned(),
        })
    }
}

/// One delivery's place in [`InFlight`], given back when dropped.
struct Slot {
    in_flight: Arc<InFlight>,
    tenant: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.in_flight.lock();
        if let Some(count) = counts.get_mut(&self.tenant) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                counts.remove(&self.tenant);
            }
        }
    }
}

/// How the outbox reaches other people's URLs: its client (no proxy,
/// which would connect for us past the guard; no redirects; waits
/// bounded by [`SEND_TIMEOUT`]; the guard's resolver) and the guard that
/// refuses private addresses unless the operator allows them.
#[derive(Clone)]
pub struct Outbound {
    pub client: reqwest::Client,
    guard: Option<Arc<NetGuard>>,
}

/// Whom the outbox's requests may reach, and whose certificates they
/// trust besides the system's.
#[derive(Debug, Clone, Default)]
pub struct Trust {
    /// Private addresses too (`HARNESS_OUTBOUND_ALLOW_PRIVATE`).
    pub allow_private: bool,
    /// Certificates trusted as roots besides the system's
    /// (`HARNESS_OUTBOUND_CA_FILE`: a private CA's).
    pub roots: Vec<reqwest::Certificate>,
}

impl Trust {
    /// `allow_private`, and the certificates of the PEM file `ca_file`;
    /// why it cannot be read.
    pub fn load(allow_private: bool, ca_file: Option<&std::path::Path>) -> Result<Self, String> {
        let roots = match ca_file {
            None => Vec::new(),
            Some(path) => {
                let pem = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
                let roots = reqwest::Certificate::from_pem_bundle(&pem)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                if roots.is_empty() {
                    return Err(format!("{}: no PEM certificate in it", path.display()));
                }
                roots
            }
        };
        Ok(Self {
            allow_private,
            roots,
        })
    }
}

impl Outbound {
    /// A client that reaches what `trust` allows.
    pub fn new(trust: &Trust) -> Result<Self, reqwest::Error> {
        let guard = (!trust.allow_private).then(|| Arc::new(NetGuard::default()));
        let client = trust
            .roots
            .iter()
            .fold(reqwest::Client::builder(), |client, root| {
                client.add_root_certificate(root.clone())
            })
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(SEND_TIMEOUT)
            .connect_timeout(SEND_TIMEOUT)
            .user_agent(concat!("agent-harness/", env!("CARGO_PKG_VERSION")));
        let client = match &guard {
            Some(guard) => client.dns_resolver(Arc::new(GuardedResolver(guard.clone()))),
            None => client,
        };
        Ok(Self {
            client: client.build()?,
            guard,
        })
    }

    /// An outbound URL, checked: http(s), no credentials in it, and an
    /// address written in it public (unless private ones are allowed);
    /// the reason when it is refused.
    pub fn checked(&self, raw: &str) -> Result<reqwest::Url, String> {
        checked_url(self.guard.is_none(), raw)
    }
}

/// An outbound URL (a push's, a webhook's), checked as
/// [`Outbound::checked`] does; what a configuration's or an endpoint's
/// URL is held to when it is registered.
pub fn checked_url(allow_private: bool, raw: &str) -> Result<reqwest::Url, String> {
    let url = reqwest::Url::parse(raw).map_err(|e| e.to_string())?;
    check(allow_private, &url)?;
    Ok(url)
}

/// Whether `url` may be sent to: http(s), no credentials in it, and an
/// address written in it public (unless private ones are allowed); the
/// reason when it is refused.
pub fn check(allow_private: bool, url: &reqwest::Url) -> Result<(), String> {
    let guard = if allow_private {
        NetGuard::parse("0.0.0.0/0,::/0").unwrap_or_default()
    } else {
        NetGuard::default()
    };
    guard.check_url(url).map_err(|refused| refused.to_string())
}

/// Why a delivery could not be sent, without what its URL carries past
/// its path (a token in the query, credentials): that text is logged and
/// kept on the row.
pub fn unreachable(mut e: reqwest::Error) -> String {
    if let Some(url) = e.url_mut() {
        url.set_query(None);
        url.set_fragment(None);
        let _ = url.set_username("");
        let _ = url.set_password(None);
    }
    e.to_string()
}

/// The wait before a failing delivery's try `attempts + 1`, and whether
/// it is given up: it has failed since `failing_since` for
/// [`GIVE_UP_AFTER`].
pub fn retry_after(
    attempts: u32,
    failing_since: DateTime<Utc>,
    now: DateTime<Utc>,
) -> (DateTime<Utc>, bool) {
    let given_up = now - failing_since >= since(GIVE_UP_AFTER);
    (now + since(RETRY.delay(attempts)), given_up)
}

pub(crate) fn since(duration: Duration) -> chrono::Duration {
    chrono::Duration::from_std(duration).unwrap_or(chrono::Duration::MAX)
}
