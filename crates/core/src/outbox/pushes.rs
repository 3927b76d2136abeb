//! A2A push notifications: each configuration is a cursor over its task's
//! log. A delivery reads the log after the cursor, folds it into what
//! the protocol pushes ([`TaskPushes`], A2A's own), POSTs each push in
//! order, and moves the cursor after each event whose pushes all went;
//! the first failure stops the round and is tried again after the
//! outbox's backoff. A running task is looked at again while it speaks,
//! less often while it is quiet.

use std::{sync::Arc, time::Duration};

use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{Deliveries, Outbound, retry_after, since, unreachable};
use crate::{
    events::StoredEvent,
    ids::SessionKey,
    store::{
        PushAuth, PushConfig, PushDelivery, PushProgress, Queue, Store, StoreError, TurnLogCursor,
    },
};

/// A running task's next look, once what it said is delivered.
const RUNNING_AGAIN: Duration = Duration::from_millis(500);
/// The longest wait between two looks at a quiet running task.
const QUIET_AGAIN_MAX: Duration = Duration::from_secs(10);
/// A delivery whose task's log cannot be read is looked at again after
/// this.
const UNREADABLE_AGAIN: Duration = Duration::from_secs(30);

/// What a task's log says to its push configurations: the protocol's
/// fold of it.
pub trait TaskPushes: Send + Sync + 'static {
    /// A fold of the task `task_id` of `session`, whose pushes after seq
    /// `after` are wanted.
    fn fold(&self, task_id: Uuid, session: &SessionKey, after: i64) -> Box<dyn PushFold>;
}

/// A task's log, folded one event at a time into what it pushes.
pub trait PushFold: Send {
    /// Takes the log's next event; true once the task has ended (nothing
    /// after it is read).
    fn feed(&mut self, stored: &StoredEvent) -> bool;

    /// The pushes of each event after the cursor, by seq, in order, and
    /// whether the task ended.
    fn said(self: Box<Self>) -> Said;
}

/// What a folded log pushes.
#[derive(Debug, Default)]
pub struct Said {
    /// Each event's pushes (none for most), in seq order.
    pub events: Vec<(i64, Vec<Value>)>,
    pub ended: bool,
}

/// Delivers pushes until `stop`: this replica's part. `wake`: a new
/// configuration's first update need not wait for the next look.
pub async fn deliver(
    store: Arc<dyn Store>,
    pushes: Arc<dyn TaskPushes>,
    (instance, trust): (&str, &crate::outbox::Trust),
    wake: Arc<tokio::sync::Notify>,
    stop: CancellationToken,
) {
    let outbound = match Outbound::new(trust) {
        Ok(outbound) => outbound,
        Err(e) => {
            tracing::error!(error = %e, "push notifications cannot be sent: no HTTP client");
            return;
        }
    };
    let owner = format!("{instance}:{}", Uuid::now_v7());
    let pusher = Arc::new(Pusher {
        store: store.clone(),
        outbound,
        pushes,
    });
    super::run(store, pusher, owner, Some(wake), stop).await;
}

struct Pusher {
    store: Arc<dyn Store>,
    outbound: Outbound,
    pushes: Arc<dyn TaskPushes>,
}

#[async_trait::async_trait]
impl Deliveries for Pusher {
    type Item = PushDelivery;
    const QUEUE: Queue = Queue::Pushes;

    fn share_key(item: &PushDelivery) -> &str {
        item.session_id.tenant()
    }

    async fn held(&self, claim: &str) -> Result<Vec<PushDelivery>, StoreError> {
        self.store.held_pushes(claim).await
    }

    async fn put_back(&self, claim: &str, item: PushDelivery, next_at: DateTime<Utc>) {
        let progress = PushProgress {
            sent_seq: item.sent_seq,
            attempts: item.attempts,
            failing_since: item.failing_since,
            next_at,
            done: false,
            last_error: None,
        };
        self.record(claim, &item.config, &progress, true).await;
    }

    /// Sends what one configuration has not acknowledged yet, then
    /// records where it got and gives its lease back.
    async fn deliver(&self, claim: &str, delivery: PushDelivery) {
        let config = &delivery.config;
        let progress = match self.read(&delivery).await {
            Ok(Some((said, last_at))) => self.send(claim, &delivery, said, last_at).await,
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
                    next_at: Utc::now() + since(UNREADABLE_AGAIN),
                    done: false,
                    last_error: Some(e.to_string()),
                }
            }
        };
        self.record(claim, config, &progress, true).await;
    }
}

impl Pusher {
    async fn record(
        &self,
        claim: &str,
        config: &PushConfig,
        progress: &PushProgress,
        release: bool,
    ) {
        let recorded = self
            .store
            .record_push(config.task_id, &config.id, claim, progress, release)
            .await;
        if let Err(e) = recorded {
            tracing::warn!(task_id = %config.task_id, error = %e, "push: progress not recorded");
        }
    }

    /// The task's pushes after the cursor, and when its newest event was
    /// written; `None`: no such task.
    async fn read(
        &self,
        delivery: &PushDelivery,
    ) -> Result<Option<(Said, Option<DateTime<Utc>>)>, StoreError> {
        let task_id = delivery.config.task_id;
        let Some(record) = self.store.find_turn(task_id).await? else {
            return Ok(None);
        };
        let mut fold = self
            .pushes
            .fold(task_id, &record.session_id, delivery.sent_seq);
        let mut last_at = None;
        TurnLogCursor::of(&record)
            .each(self.store.as_ref(), |stored| {
                last_at = last_at.max(Some(stored.created_at));
                fold.feed(stored)
            })
            .await?;
        Ok(Some((fold.said(), last_at)))
    }

    /// POSTs the pushes in order; the cursor moves after each event
    /// whose pushes all went. The first failure stops the round.
    async fn send(
        &self,
        claim: &str,
        delivery: &PushDelivery,
        said: Said,
        last_at: Option<DateTime<Utc>>,
    ) -> PushProgress {
        let config = &delivery.config;
        let mut sent_seq = delivery.sent_seq;
        for (seq, pushes) in &said.events {
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
        let now = Utc::now();
        PushProgress {
            sent_seq,
            attempts: 0,
            failing_since: None,
            next_at: now + again_after(last_at, now),
            done: said.ended,
            last_error: None,
        }
    }

    async fn post(&self, config: &PushConfig, body: &Value) -> Result<(), String> {
        let url = self.outbound.checked(&config.url)?;
        let mut request = self.outbound.client.post(url).json(body);
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
            Err(e) => Err(format!("the URL could not be reached: {}", unreachable(e))),
        }
    }
}

/// When a running task is looked at again, once what it said is sent:
/// [`RUNNING_AGAIN`] while it speaks, less often the longer it has been
/// quiet (a tenth of its silence, at most [`QUIET_AGAIN_MAX`]): a task
/// that waits for a person for hours is not read twice a second.
fn again_after(last_at: Option<DateTime<Utc>>, now: DateTime<Utc>) -> chrono::Duration {
    let quiet = last_at.map_or(chrono::Duration::zero(), |at| now - at);
    (quiet / 10).clamp(since(RUNNING_AGAIN), since(QUIET_AGAIN_MAX))
}

/// A delivery's state after a failed push: tried again after the
/// outbox's backoff, until it has failed for [`super::GIVE_UP_AFTER`].
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
    let (next_at, given_up) = retry_after(attempts, failing_since, now);
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
        next_at,
        done: given_up,
        last_error: Some(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    /// 10 s (a task waiting for hours was once read twice a second).
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
