//! The delivery of a task's updates to its push configurations: at
//! least once, in order per task and configuration, from the task's log
//! (see the parent module).

use std::{sync::Arc, time::Duration};

use chrono::Utc;
use serde_json::{Value, json};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::guard;
use crate::{
    protocols::Shared,
    protocols::{a2a::task::TaskFold, typed},
    service::{PushAuth, PushConfig, PushDelivery, PushProgress, Share, StoreError},
};

/// How often a replica looks for pushes (and webhooks) that are due.
const POLL: Duration = Duration::from_millis(250);
/// How long a replica holds the configurations it took.
const LEASE: Duration = Duration::from_secs(30);
/// Deliveries a replica runs at once, and of them, one tenant's at most
/// (pushes and webhooks alike).
const IN_FLIGHT: usize = 32;
const PER_TENANT: usize = 4;
/// A push's wait for its answer.
const PUSH_TIMEOUT: Duration = Duration::from_secs(10);
/// A running task's next look, once what it said is delivered.
const RUNNING_AGAIN: Duration = Duration::from_millis(500);
/// The longest wait between two looks at a quiet running task.
const QUIET_AGAIN_MAX: Duration = Duration::from_secs(10);
/// The longest wait between two tries of a failing push.
const BACKOFF_MAX: Duration = Duration::from_secs(600);
/// How long a failing push is tried before it is given up.
pub const GIVE_UP_AFTER: Duration = Duration::from_secs(25 * 3600);

/// The pushes of each event of a task's log after `after`: its status
/// updates as they come (text deltas are not pushed), and before the
/// end, the answer as one whole artifact.
struct Outbox {
    /// When the task's newest event was written: a task quiet for long is
    /// looked at less often ([`again_after`]).
    last_at: Option<chrono::DateTime<Utc>>,
    fold: TaskFold,
    after: i64,
    events: Vec<(i64, Vec<Value>)>,
}

impl Outbox {
    fn feed(&mut self, stored: &crate::events::StoredEvent) -> bool {
        self.last_at = self.last_at.max(Some(stored.created_at));
        let Some(event) = typed(stored) else {
            return self.fold.ended();
        };
        let said = self.fold.event(stored, event);
        if stored.seq > self.after {
            let mut pushes = Vec::new();
            for update in said {
                if update.get("artifactUpdate").is_some() {
                    continue;
                }
                if self.fold.ended() && update.get("statusUpdate").is_some() {
                    pushes.extend(self.whole_answer());
                }
                pushes.push(update);
            }
            self.events.push((stored.seq, pushes));
        }
        self.fold.ended()
    }

    /// The task's artifacts, each whole.
    fn whole_answer(&self) -> Vec<Value> {
        let task = self.fold.task(None);
        task["artifacts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|artifact| {
                json!({"artifactUpdate": {
                    "taskId": task["id"],
                    "contextId": task["contextId"],
                    "artifact": artifact,
                    "append": false,
                    "lastChunk": true,
                }})
            })
            .collect()
    }
}

/// Delivers pushes until `stop`: this replica's part of every tenant's.
pub async fn deliver(app: Shared, stop: CancellationToken) {
    let Some(client) = http_client(&app) else {
        return;
    };
    let owner = format!("{}:{}", app.settings.server.instance_id, Uuid::now_v7());
    let wake = app.pushes_due.clone();
    run_outbox(Arc::new(Pusher { app, client }), owner, Some(wake), stop).await;
}

/// Work that replicas share through leases: each looks for what is due,
/// claims some of it, and delivers it ([`run_outbox`]): push
/// notifications, webhooks.
#[async_trait::async_trait]
pub(crate) trait Leased: Send + Sync + 'static {
    type Item: Send + 'static;

    /// Whose it is.
    fn tenant(item: &Self::Item) -> String;

    /// Up to `free` items that are due, taken as `claim`, within each
    /// tenant's `share`.
    async fn claim(
        &self,
        claim: &str,
        now: chrono::DateTime<Utc>,
        free: usize,
        share: &Share,
    ) -> Vec<Self::Item>;

    /// Gives an item back untried, due again at `next_at`.
    async fn put_back(&self, claim: &str, item: Self::Item, next_at: chrono::DateTime<Utc>);

    /// Delivers one item and records how it went.
    async fn deliver(&self, claim: &str, item: Self::Item);

    /// Gives up every lease of `owner` (a replica that stops).
    async fn release(&self, owner: &str);
}

/// Runs `outbox` until `stop`: every [`POLL`], up to [`IN_FLIGHT`]
/// deliveries at once, at most [`PER_TENANT`] of one tenant's (another's
/// slow receivers do not hold up its own). Each claim has its own owner,
/// `{owner}:{n}`, so that it reads back only what it took.
pub(crate) async fn run_outbox<O: Leased>(
    outbox: Arc<O>,
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
        let now = Utc::now();
        claims += 1;
        let claim = format!("{owner}:{claims}");
        let share = tenants.share();
        for item in outbox.claim(&claim, now, free, &share).await {
            let Some(slot) = tenants.take(&O::tenant(&item)) else {
                outbox.put_back(&claim, item, now + since(POLL)).await;
                continue;
            };
            let (outbox, claim) = (outbox.clone(), claim.clone());
            running.spawn(async move {
                let _slot = slot;
                outbox.deliver(&claim, item).await;
            });
        }
    }
    running.abort_all();
    while running.join_next().await.is_some() {}
    // What this replica held goes to the others now.
    outbox.release(&owner).await;
}

#[async_trait::async_trait]
impl Leased for Pusher {
    type Item = PushDelivery;

    fn tenant(item: &PushDelivery) -> String {
        item.session_id.tenant().to_owned()
    }

    async fn claim(
        &self,
        claim: &str,
        now: chrono::DateTime<Utc>,
        free: usize,
        share: &Share,
    ) -> Vec<PushDelivery> {
        Pusher::claim(self, claim, now, free, share).await
    }

    async fn put_back(&self, claim: &str, item: PushDelivery, next_at: chrono::DateTime<Utc>) {
        let progress = PushProgress::unchanged(&item, next_at);
        self.record(claim, &item.config, &progress, true).await;
    }

    async fn deliver(&self, claim: &str, item: PushDelivery) {
        self.deliver_one(claim, item).await;
    }

    async fn release(&self, owner: &str) {
        // Each cursor stays where the last acknowledged push left it.
        if let Err(e) = self.app.turns.release_pushes(owner).await {
            tracing::warn!(error = %e, "push: leases not given back; they run out");
        }
    }
}

/// The deliveries in flight in this replica, by tenant (pushes here,
/// webhooks in `http::webhooks::delivery`).
#[derive(Default)]
struct InFlight(std::sync::Mutex<std::collections::HashMap<String, usize>>);

impl InFlight {
    /// What a claim may take: [`PER_TENANT`] a tenant, less what it has
    /// in flight here.
    fn share(&self) -> Share {
        let counts = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Share {
            per_tenant: PER_TENANT as u32,
            busy: counts
                .iter()
                .map(|(tenant, count)| (tenant.clone(), *count as u32))
                .collect(),
        }
    }

    /// A slot for one more delivery of `tenant`, unless it has its share.
    fn take(self: &Arc<Self>, tenant: &str) -> Option<Slot> {
        let mut counts = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
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
        let mut counts = self
            .in_flight
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(count) = counts.get_mut(&self.tenant) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                counts.remove(&self.tenant);
            }
        }
    }
}

struct Pusher {
    app: Shared,
    client: reqwest::Client,
}

impl PushProgress {
    /// A delivery given back as it was, tried again at `next_at`.
    fn unchanged(delivery: &PushDelivery, next_at: chrono::DateTime<Utc>) -> Self {
        Self {
            sent_seq: delivery.sent_seq,
            attempts: delivery.attempts,
            failing_since: delivery.failing_since,
            next_at,
            done: false,
            last_error: None,
        }
    }
}

/// The client pushes go out with ([`super::outbound_client`]).
fn http_client(app: &Shared) -> Option<reqwest::Client> {
    let client = super::outbound_client(app, PUSH_TIMEOUT);
    match client.build() {
        Ok(client) => Some(client),
        Err(e) => {
            tracing::error!(error = %e, "push notifications cannot be sent: no HTTP client");
            None
        }
    }
}

impl Pusher {
    /// Takes up to `free` deliveries that are due, as `claim`: none when
    /// none is due (a read, no write) or the store fails (logged).
    async fn claim(
        &self,
        claim: &str,
        now: chrono::DateTime<Utc>,
        free: usize,
        share: &Share,
    ) -> Vec<PushDelivery> {
        match self.app.turns.pushes_due(now).await {
            Ok(true) => {}
            Ok(false) => return Vec::new(),
            Err(e) => {
                tracing::warn!(error = %e, "push notifications: the due ones cannot be read");
                return Vec::new();
            }
        }
        let limit = u32::try_from(free).unwrap_or(u32::MAX);
        match self
            .app
            .turns
            .claim_pushes(claim, now, now + LEASE, limit, share)
            .await
        {
            Ok(claimed) => claimed,
            Err(e) => {
                tracing::warn!(error = %e, "push notifications: the due ones cannot be taken");
                Vec::new()
            }
        }
    }

    /// Sends what one configuration has not acknowledged yet, then
    /// records where it got and gives its lease back.
    async fn deliver_one(&self, claim: &str, delivery: PushDelivery) {
        let config = &delivery.config;
        let progress = match self.outbox(&delivery).await {
            Ok(Some(outbox)) => self.send(claim, &delivery, outbox).await,
            // The task is gone: nothing more to say.
            Ok(None) => PushProgress {
                sent_seq: delivery.sent_seq,
                attempts: 0,
                failing_since: None,
                next_at: Utc::now(),
                done: true,
                last_error: None,
            },
            Err(e) => {
                tracing::warn!(task_id = %config.task_id, error = %e, "push: the task's log cannot be read");
                PushProgress {
                    sent_seq: delivery.sent_seq,
                    attempts: delivery.attempts,
                    failing_since: delivery.failing_since,
                    next_at: Utc::now() + LEASE,
                    done: false,
                    last_error: Some(e.to_string()),
                }
            }
        };
        self.record(claim, config, &progress, true).await;
    }

    async fn record(
        &self,
        claim: &str,
        config: &PushConfig,
        progress: &PushProgress,
        release: bool,
    ) {
        let recorded = self
            .app
            .turns
            .record_push(config.task_id, &config.id, claim, progress, release)
            .await;
        if let Err(e) = recorded {
            tracing::warn!(task_id = %config.task_id, error = %e, "push: progress not recorded");
        }
    }

    /// The task's pushes after the cursor; `None`: no such task.
    async fn outbox(&self, delivery: &PushDelivery) -> Result<Option<Outbox>, StoreError> {
        let task_id = delivery.config.task_id;
        let Some(record) = self.app.turns.find_turn(task_id).await? else {
            return Ok(None);
        };
        let mut outbox = Outbox {
            last_at: None,
            fold: TaskFold::new(task_id.to_string(), record.session_id.id().to_owned()),
            after: delivery.sent_seq,
            events: Vec::new(),
        };
        self.app
            .turns
            .read_turn(&record, |stored| outbox.feed(stored))
            .await?;
        Ok(Some(outbox))
    }

    /// POSTs the outbox's pushes in order; the cursor moves after each
    /// event whose pushes all went. The first failure stops the round.
    async fn send(&self, claim: &str, delivery: &PushDelivery, outbox: Outbox) -> PushProgress {
        let config = &delivery.config;
        let mut sent_seq = delivery.sent_seq;
        for (seq, pushes) in &outbox.events {
            for push in pushes {
                if let Err(error) = self.post(config, push).await {
                    return failed(delivery, sent_seq, error);
                }
            }
            if !pushes.is_empty() && *seq > sent_seq {
                sent_seq = *seq;
                let progress = PushProgress {
                    sent_seq,
                    attempts: 0,
                    failing_since: None,
                    next_at: Utc::now(),
                    done: false,
                    last_error: None,
                };
                self.record(claim, config, &progress, false).await;
            }
            sent_seq = sent_seq.max(*seq);
        }
        let ended = outbox.fold.ended();
        let now = Utc::now();
        PushProgress {
            sent_seq,
            attempts: 0,
            failing_since: None,
            next_at: now + again_after(outbox.last_at, now),
            done: ended,
            last_error: None,
        }
    }

    async fn post(&self, config: &PushConfig, body: &Value) -> Result<(), String> {
        let url = reqwest::Url::parse(&config.url).map_err(|e| e.to_string())?;
        if let Some(guard) = guard(&self.app) {
            guard.check_url(&url).map_err(|e| e.to_string())?;
        }
        let mut request = self.client.post(url).json(body);
        if let Some(token) = &config.token {
            request = request.header("X-A2A-Notification-Token", token);
        }
        if let Some(PushAuth {
            scheme,
            credentials: Some(credentials),
        }) = &config.auth
        {
            request = request.header("Authorization", format!("{scheme} {credentials}"));
        }
        match request.send().await {
            Ok(response) if response.status().is_success() => Ok(()),
            Ok(response) => Err(format!("the URL answered {}", response.status())),
            Err(e) => Err(format!(
                "the URL could not be reached: {}",
                super::unreachable(e)
            )),
        }
    }
}

/// When a running task is looked at again, once what it said is sent:
/// [`RUNNING_AGAIN`] while it speaks, less often the longer it has been
/// quiet (a tenth of its silence, at most [`QUIET_AGAIN_MAX`]): a task
/// that waits for a person for hours is not read twice a second.
fn again_after(
    last_at: Option<chrono::DateTime<Utc>>,
    now: chrono::DateTime<Utc>,
) -> chrono::Duration {
    let quiet = last_at.map_or(chrono::Duration::zero(), |at| now - at);
    (quiet / 10).clamp(since(RUNNING_AGAIN), since(QUIET_AGAIN_MAX))
}

/// A delivery's state after a failed push: tried again with backoff,
/// until it has failed for [`GIVE_UP_AFTER`].
fn failed(delivery: &PushDelivery, sent_seq: i64, error: String) -> PushProgress {
    let now = Utc::now();
    let (attempts, failing_since) = if sent_seq > delivery.sent_seq {
        // Something went through this round: a fresh failure.
        (1, now)
    } else {
        (
            delivery.attempts.saturating_add(1),
            delivery.failing_since.unwrap_or(now),
        )
    };
    let given_up = now - failing_since >= since(GIVE_UP_AFTER);
    let config = &delivery.config;
    if given_up {
        tracing::warn!(task_id = %config.task_id, config = %config.id, %error, "push: given up");
    } else {
        tracing::info!(task_id = %config.task_id, config = %config.id, attempts, %error, "push failed; tried again later");
    }
    PushProgress {
        sent_seq,
        attempts,
        failing_since: Some(failing_since),
        next_at: now + backoff(attempts),
        done: given_up,
        last_error: Some(error),
    }
}

pub(crate) fn since(duration: Duration) -> chrono::Duration {
    chrono::Duration::from_std(duration).unwrap_or(chrono::Duration::MAX)
}

/// The wait before try `attempts + 1`: 1 s, doubling, at most
/// [`BACKOFF_MAX`].
pub(crate) fn backoff(attempts: u32) -> chrono::Duration {
    let doubled = Duration::from_secs(1).saturating_mul(1 << attempts.min(16));
    since(doubled.min(BACKOFF_MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_up_to_its_most() {
        assert_eq!(backoff(0), chrono::Duration::seconds(1));
        assert_eq!(backoff(3), chrono::Duration::seconds(8));
        assert_eq!(backoff(40), chrono::Duration::seconds(600));
    }

    #[test]
    fn a_push_failing_for_a_day_and_an_hour_is_given_up() {
        let config = PushConfig {
            task_id: Uuid::now_v7(),
            id: "c".into(),
            url: "https://example.com/hook".into(),
            token: None,
            auth: None,
            created_at: Utc::now(),
        };
        let delivery = |failing_since| PushDelivery {
            config: config.clone(),
            session_id: "s".into(),
            sent_seq: 4,
            attempts: 9,
            failing_since: Some(failing_since),
        };
        let recent = failed(
            &delivery(Utc::now() - chrono::Duration::hours(24)),
            4,
            "503".into(),
        );
        assert!(!recent.done);
        assert_eq!(recent.attempts, 10);
        let old = failed(
            &delivery(Utc::now() - chrono::Duration::hours(26)),
            4,
            "503".into(),
        );
        assert!(old.done);
        let moved = failed(
            &delivery(Utc::now() - chrono::Duration::hours(26)),
            6,
            "503".into(),
        );
        assert!(
            !moved.done,
            "a push that went through starts the clock again"
        );
        assert_eq!(moved.attempts, 1);
    }

    /// A running task is looked at again in half a second while it
    /// speaks, less often the longer it has been quiet, at most every
    /// 10 s (issue 63: a task waiting for hours was read twice a second).
    #[test]
    fn a_quiet_task_is_looked_at_less_often() {
        let now = Utc::now();
        let again = |quiet_s: i64| again_after(Some(now - chrono::Duration::seconds(quiet_s)), now);
        assert_eq!(again(0), chrono::Duration::milliseconds(500));
        assert_eq!(again(2), chrono::Duration::milliseconds(500));
        assert_eq!(again(30), chrono::Duration::seconds(3));
        assert_eq!(again(3600), chrono::Duration::seconds(10));
        assert_eq!(again_after(None, now), chrono::Duration::milliseconds(500));
    }
}
