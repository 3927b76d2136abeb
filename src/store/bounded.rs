//! A store whose every call answers within a bound, for a database across
//! a network (Postgres).
//!
//! sqlx has no socket timeouts, and a connection whose peer went silent (a
//! partition, a host that died without closing its sockets) never fails:
//! a call on it waits until TCP gives up, many minutes later, holding its
//! pool slot, and a turn waiting on it stays `running` as long. Here each
//! call gets [`Bounded::limit`] to answer; past it the call fails as if the
//! database were down (transient: the event writer and a turn's end try
//! again on another connection), and the call's connection is not trusted
//! again (see [`recently_abandoned`]: the pool tests it within a bound as
//! it comes back, and drops it when it does not answer).

use std::{
    future::Future,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{
    ArtifactRecord, BeganTurn, BeginTurnError, CancelRequests, CheckpointRecord, DecisionRecord,
    IndexedNote, JobBacklog, JobOutcome, JobRecord, JobSummary, JobUsage, JudgementRecord,
    MemoryRecord, MessageRecord, NewArtifact, NewCheckpoint, NewJob, NewMemory, NewTurn, NoteState,
    ObservationRecord, OrphanScope, Readiness, SessionRecord, Store, StoreError, TurnFinish,
    TurnRecord, VaultHit,
};
use crate::events::StoredEvent;

/// When a call last gave up on its connection, in ms after [`epoch`]
/// (0: never). Process-wide: the pools' release test reads it.
static ABANDONED_AT_MS: AtomicU64 = AtomicU64::new(0);

/// How long after a call gave up the pools test connections coming back.
/// The connection of a call that was given up comes back at once (its
/// future is dropped then), so this only needs to cover a busy moment.
const ABANDONED_WINDOW: Duration = Duration::from_secs(5);

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn since_epoch_ms() -> u64 {
    u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Whether a call gave up on its connection a moment ago: a connection
/// coming back to a pool now may be that one (mid-statement on a socket
/// that does not answer), so the pool tests it within a bound instead of
/// waiting on it for as long as TCP does.
pub(crate) fn recently_abandoned() -> bool {
    let at = ABANDONED_AT_MS.load(Ordering::Relaxed);
    at != 0 && since_epoch_ms().saturating_sub(at) <= ABANDONED_WINDOW.as_millis() as u64
}

/// A [`Store`] whose calls each answer within `limit`.
pub struct Bounded {
    inner: Arc<dyn Store>,
    limit: Duration,
}

impl Bounded {
    pub fn wrap(inner: Arc<dyn Store>, limit: Duration) -> Arc<dyn Store> {
        Arc::new(Self { inner, limit })
    }

    /// The longest a call waits for the database.
    pub fn limit(&self) -> Duration {
        self.limit
    }

    async fn bound<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.limit, call).await {
            Ok(result) => result,
            Err(_) => Err(self.gave_up()),
        }
    }

    /// The error of a call that did not answer in time (its connection
    /// was given up with it).
    fn gave_up(&self) -> StoreError {
        ABANDONED_AT_MS.store(since_epoch_ms().max(1), Ordering::Relaxed);
        StoreError::Unavailable(format!(
            "the database did not answer within {} ms",
            self.limit.as_millis()
        ))
    }
}

#[async_trait]
impl Store for Bounded {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    /// Not bounded: a migration may rightly take long, and it runs before
    /// the service serves.
    async fn migrate(&self) -> Result<(), StoreError> {
        self.inner.migrate().await
    }

    async fn readiness(&self) -> Readiness {
        match tokio::time::timeout(self.limit, self.inner.readiness()).await {
            Ok(readiness) => readiness,
            Err(_) => {
                self.gave_up();
                Readiness {
                    reachable: false,
                    migrations_applied: false,
                }
            }
        }
    }

    async fn begin_turn(&self, turn: &NewTurn) -> Result<BeganTurn, BeginTurnError> {
        match tokio::time::timeout(self.limit, self.inner.begin_turn(turn)).await {
            Ok(began) => began,
            Err(_) => Err(BeginTurnError::Store(self.gave_up())),
        }
    }

    /// The listening connection is idle for as long as no one cancels, so
    /// only its setup is bounded; the heartbeat finds every request too.
    async fn cancel_requests(&self) -> Result<Option<CancelRequests>, StoreError> {
        self.bound(self.inner.cancel_requests()).await
    }

    async fn write_batch(
        &self,
        events: &[Arc<StoredEvent>],
        finishes: &[&TurnFinish],
    ) -> Result<Vec<bool>, StoreError> {
        self.bound(self.inner.write_batch(events, finishes)).await
    }

    async fn get_turn(
        &self,
        session_id: &str,
        turn_id: Uuid,
    ) -> Result<Option<TurnRecord>, StoreError> {
        self.bound(self.inner.get_turn(session_id, turn_id)).await
    }

    async fn get_session(&self, session_id: &str) -> Result<Option<SessionRecord>, StoreError> {
        self.bound(self.inner.get_session(session_id)).await
    }

    async fn session_tenant(&self, session_id: &str) -> Result<Option<String>, StoreError> {
        self.bound(self.inner.session_tenant(session_id)).await
    }

    async fn checkpoint_tenant(&self, checkpoint_id: &str) -> Result<Option<String>, StoreError> {
        self.bound(self.inner.checkpoint_tenant(checkpoint_id))
            .await
    }

    async fn list_messages(
        &self,
        session_id: &str,
        after: i64,
        limit: u32,
    ) -> Result<Vec<MessageRecord>, StoreError> {
        self.bound(self.inner.list_messages(session_id, after, limit))
            .await
    }

    async fn recent_messages(
        &self,
        session_id: &str,
        limit: u32,
    ) -> Result<Vec<MessageRecord>, StoreError> {
        self.bound(self.inner.recent_messages(session_id, limit))
            .await
    }

    async fn list_events(
        &self,
        session_id: &str,
        turn_id: Option<Uuid>,
        after: i64,
        limit: u32,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        self.bound(self.inner.list_events(session_id, turn_id, after, limit))
            .await
    }

    async fn search_messages(
        &self,
        session_id: &str,
        terms: &[String],
        limit: u32,
    ) -> Result<Vec<MessageRecord>, StoreError> {
        self.bound(self.inner.search_messages(session_id, terms, limit))
            .await
    }

    async fn list_decisions(
        &self,
        session_id: &str,
        after: Option<&str>,
        strategy: Option<&str>,
        limit: u32,
    ) -> Result<Vec<DecisionRecord>, StoreError> {
        self.bound(
            self.inner
                .list_decisions(session_id, after, strategy, limit),
        )
        .await
    }

    async fn put_artifact(&self, artifact: &NewArtifact) -> Result<(), StoreError> {
        self.bound(self.inner.put_artifact(artifact)).await
    }

    async fn get_artifact(
        &self,
        session_id: &str,
        artifact_id: &str,
    ) -> Result<Option<ArtifactRecord>, StoreError> {
        self.bound(self.inner.get_artifact(session_id, artifact_id))
            .await
    }

    async fn put_checkpoint(&self, checkpoint: &NewCheckpoint) -> Result<(), StoreError> {
        self.bound(self.inner.put_checkpoint(checkpoint)).await
    }

    async fn list_checkpoints(
        &self,
        session_id: &str,
        limit: u32,
    ) -> Result<Vec<CheckpointRecord>, StoreError> {
        self.bound(self.inner.list_checkpoints(session_id, limit))
            .await
    }

    async fn get_checkpoint(
        &self,
        id: &str,
    ) -> Result<Option<(CheckpointRecord, Option<Vec<u8>>)>, StoreError> {
        self.bound(self.inner.get_checkpoint(id)).await
    }

    async fn mark_checkpoint_restored(
        &self,
        id: &str,
        at: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        self.bound(self.inner.mark_checkpoint_restored(id, at))
            .await
    }

    async fn request_cancel(&self, turn_id: Uuid) -> Result<bool, StoreError> {
        self.bound(self.inner.request_cancel(turn_id)).await
    }

    async fn vault_notes(
        &self,
    ) -> Result<std::collections::HashMap<String, NoteState>, StoreError> {
        self.bound(self.inner.vault_notes()).await
    }

    async fn vault_put_note(&self, note: &IndexedNote) -> Result<(), StoreError> {
        self.bound(self.inner.vault_put_note(note)).await
    }

    async fn vault_remove_notes(&self, paths: &[String]) -> Result<u64, StoreError> {
        self.bound(self.inner.vault_remove_notes(paths)).await
    }

    async fn vault_search(
        &self,
        terms: &[String],
        limit: u32,
    ) -> Result<Vec<VaultHit>, StoreError> {
        self.bound(self.inner.vault_search(terms, limit)).await
    }

    async fn vault_vectors(
        &self,
        model: &str,
        limit: u32,
    ) -> Result<Vec<(i64, Vec<f32>)>, StoreError> {
        self.bound(self.inner.vault_vectors(model, limit)).await
    }

    async fn vault_chunks(&self, ids: &[i64]) -> Result<Vec<VaultHit>, StoreError> {
        self.bound(self.inner.vault_chunks(ids)).await
    }

    async fn upsert_memory(&self, memory: &NewMemory) -> Result<(), StoreError> {
        self.bound(self.inner.upsert_memory(memory)).await
    }

    async fn search_memories(
        &self,
        scope: &str,
        terms: &[String],
        limit: u32,
    ) -> Result<Vec<MemoryRecord>, StoreError> {
        self.bound(self.inner.search_memories(scope, terms, limit))
            .await
    }

    async fn memories_for_turn(
        &self,
        scope: &str,
        terms: &[String],
        limit: u32,
        preferences: u32,
    ) -> Result<(Vec<MemoryRecord>, Vec<MemoryRecord>), StoreError> {
        self.bound(
            self.inner
                .memories_for_turn(scope, terms, limit, preferences),
        )
        .await
    }

    async fn list_memories(
        &self,
        scope: &str,
        kind: Option<&str>,
        limit: u32,
    ) -> Result<Vec<MemoryRecord>, StoreError> {
        self.bound(self.inner.list_memories(scope, kind, limit))
            .await
    }

    async fn memory_vectors(
        &self,
        scope: &str,
        model: &str,
    ) -> Result<Vec<(String, Vec<f32>)>, StoreError> {
        self.bound(self.inner.memory_vectors(scope, model)).await
    }

    async fn delete_memories(&self, scope: &str, id: Option<&str>) -> Result<u64, StoreError> {
        self.bound(self.inner.delete_memories(scope, id)).await
    }

    async fn enqueue_job(&self, job: &NewJob) -> Result<(), StoreError> {
        self.bound(self.inner.enqueue_job(job)).await
    }

    async fn claim_job(
        &self,
        now: DateTime<Utc>,
        stale_before: DateTime<Utc>,
    ) -> Result<Option<JobRecord>, StoreError> {
        self.bound(self.inner.claim_job(now, stale_before)).await
    }

    async fn finish_job(
        &self,
        id: &str,
        outcome: &JobOutcome,
        usage: &JobUsage,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.bound(self.inner.finish_job(id, outcome, usage, now))
            .await
    }

    async fn list_jobs(&self, session_id: &str, limit: u32) -> Result<Vec<JobSummary>, StoreError> {
        self.bound(self.inner.list_jobs(session_id, limit)).await
    }

    async fn put_judgement(&self, judgement: &JudgementRecord) -> Result<(), StoreError> {
        self.bound(self.inner.put_judgement(judgement)).await
    }

    async fn append_session_event(
        &self,
        session_id: &str,
        event_turn_id: Uuid,
        event: &crate::events::TurnEvent,
        at: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        self.bound(
            self.inner
                .append_session_event(session_id, event_turn_id, event, at),
        )
        .await
    }

    async fn list_judgements(
        &self,
        session_id: &str,
        turn_id: Uuid,
    ) -> Result<Vec<JudgementRecord>, StoreError> {
        self.bound(self.inner.list_judgements(session_id, turn_id))
            .await
    }

    async fn list_observations(
        &self,
        session_id: &str,
        limit: u32,
    ) -> Result<Vec<ObservationRecord>, StoreError> {
        self.bound(self.inner.list_observations(session_id, limit))
            .await
    }

    async fn decide_approval(
        &self,
        session_id: &str,
        turn_id: Uuid,
        call_id: &str,
        approved: bool,
        reason: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.bound(
            self.inner
                .decide_approval(session_id, turn_id, call_id, approved, reason),
        )
        .await
    }

    async fn get_approval(
        &self,
        turn_id: Uuid,
        call_id: &str,
    ) -> Result<Option<(bool, Option<String>)>, StoreError> {
        self.bound(self.inner.get_approval(turn_id, call_id)).await
    }

    async fn create_api_key(
        &self,
        id: &str,
        tenant: &str,
        key_hash: &str,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.bound(self.inner.create_api_key(id, tenant, key_hash, at))
            .await
    }

    async fn find_api_key(&self, key_hash: &str) -> Result<Option<(String, String)>, StoreError> {
        self.bound(self.inner.find_api_key(key_hash)).await
    }

    async fn job_backlog(&self) -> Result<JobBacklog, StoreError> {
        self.bound(self.inner.job_backlog()).await
    }

    async fn shed_jobs(
        &self,
        kind: &str,
        keep: u64,
        why: &str,
        now: DateTime<Utc>,
    ) -> Result<u64, StoreError> {
        self.bound(self.inner.shed_jobs(kind, keep, why, now)).await
    }

    async fn enqueue_turn(
        &self,
        session_id: &str,
        now_ms: i64,
        stale_ms: i64,
    ) -> Result<i64, StoreError> {
        self.bound(self.inner.enqueue_turn(session_id, now_ms, stale_ms))
            .await
    }

    async fn queue_head(&self, session_id: &str, stale_ms: i64) -> Result<Option<i64>, StoreError> {
        self.bound(self.inner.queue_head(session_id, stale_ms))
            .await
    }

    async fn touch_ticket(&self, ticket: i64, now_ms: i64) -> Result<(), StoreError> {
        self.bound(self.inner.touch_ticket(ticket, now_ms)).await
    }

    async fn leave_queue(&self, ticket: i64) -> Result<(), StoreError> {
        self.bound(self.inner.leave_queue(ticket)).await
    }

    async fn revoke_api_key(&self, id: &str, at: DateTime<Utc>) -> Result<bool, StoreError> {
        self.bound(self.inner.revoke_api_key(id, at)).await
    }

    async fn list_api_keys(
        &self,
    ) -> Result<Vec<(String, String, DateTime<Utc>, Option<DateTime<Utc>>)>, StoreError> {
        self.bound(self.inner.list_api_keys()).await
    }

    async fn heartbeat(
        &self,
        turn_ids: &[Uuid],
        now: DateTime<Utc>,
    ) -> Result<Vec<Uuid>, StoreError> {
        self.bound(self.inner.heartbeat(turn_ids, now)).await
    }

    async fn interrupt_orphans(
        &self,
        scope: &OrphanScope,
        reason: &str,
        now: DateTime<Utc>,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        self.bound(self.inner.interrupt_orphans(scope, reason, now))
            .await
    }
}
