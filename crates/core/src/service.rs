//! The turn service: the one door through which the protocols reach turns
//! and sessions. A protocol starts a turn, follows it, waits for its end,
//! cancels it, answers its waiting calls and reads a turn, a session or a
//! page of a log here; it never holds the store or the runner.
//!
//! The records a protocol reads are the store's own types, named here so
//! that a protocol imports them from its door.

mod approvals;

pub use approvals::ApprovalTerms;

use std::{collections::HashMap, sync::Arc};

use chrono::Utc;
use futures::Stream;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

pub use crate::runner::{
    CancelError, CancelOutcome, LiveStart, QueuedStartError, StartError, StartedTurn, SteerError,
};
pub use crate::store::{
    MessageRecord, NewApproval, NewToolResult, NoteState, PushAuth, PushConfig, SessionRecord,
    StoreError, TurnFilter, TurnRecord, TurnStatus, pushes::PUSH_CONFIGS_PER_TASK,
};
use crate::{
    events::StoredEvent,
    ids::SessionKey,
    metrics::Metrics,
    runner::TurnRunner,
    store::{
        Store, TurnLogCursor,
        audit::{AuditEntry, kinds},
    },
    tools::ToolRegistry,
    turn::TurnRequest,
};

/// Turns and sessions, as the protocols see them.
#[derive(Clone)]
pub struct TurnService {
    runner: TurnRunner,
    store: Arc<dyn Store>,
    /// Wakes tool calls waiting in this process, for an approval or for a
    /// client's result.
    approvals_decided: Arc<tokio::sync::Notify>,
}

type Result<T, E = StoreError> = std::result::Result<T, E>;

impl TurnService {
    pub fn new(runner: TurnRunner, approvals_decided: Arc<tokio::sync::Notify>) -> Self {
        Self {
            store: runner.store().clone(),
            runner,
            approvals_decided,
        }
    }

    // Starting, following, waiting, cancelling.

    /// Begins a turn of a session and starts it in the background.
    pub async fn start(
        &self,
        session_id: &SessionKey,
        request: TurnRequest,
        idempotency_key: Option<String>,
    ) -> Result<StartedTurn, StartError> {
        self.runner
            .start(session_id, request, idempotency_key)
            .await
    }

    /// Begins a turn after the session's queued ones (`multitask:
    /// enqueue`), giving up at `deadline`.
    pub async fn start_queued(
        &self,
        session_id: &SessionKey,
        request: TurnRequest,
        idempotency_key: Option<String>,
        deadline: tokio::time::Instant,
    ) -> Result<StartedTurn, QueuedStartError> {
        self.runner
            .start_queued(session_id, request, idempotency_key, deadline)
            .await
    }

    /// A turn's events after `after`, replayed, then followed live to its
    /// terminal event.
    pub fn subscribe(
        &self,
        session_id: SessionKey,
        turn_id: Uuid,
        after: i64,
    ) -> impl Stream<Item = Result<Arc<StoredEvent>>> + Send + 'static {
        self.runner.subscribe(session_id, turn_id, after)
    }

    /// A turn this process just started, from its first event.
    pub fn subscribe_started(
        &self,
        session_id: SessionKey,
        start: LiveStart,
    ) -> impl Stream<Item = Result<Arc<StoredEvent>>> + Send + 'static {
        self.runner.subscribe_started(session_id, start)
    }

    /// The turn's record once it is no longer running; `None` when the
    /// process stops first.
    pub async fn wait_for_end(
        &self,
        session_id: &SessionKey,
        turn_id: Uuid,
    ) -> Result<Option<TurnRecord>> {
        self.runner.wait_for_end(session_id, turn_id).await
    }

    pub async fn cancel(
        &self,
        session_id: &SessionKey,
        turn_id: Uuid,
    ) -> Result<CancelOutcome, CancelError> {
        self.runner.cancel(session_id, turn_id).await
    }

    /// Steers `message` into the running turn (see [`TurnRunner::steer`]).
    pub async fn steer(
        &self,
        session_id: &SessionKey,
        turn_id: Uuid,
        message: String,
    ) -> Result<Uuid, crate::runner::SteerError> {
        self.runner.steer(session_id, turn_id, message).await
    }

    /// Cancelled when the process closes its streams (shutdown).
    pub fn streams_closed(&self) -> CancellationToken {
        self.runner.streams_closed()
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        self.runner.metrics()
    }

    /// The tools a turn may call.
    pub fn tools(&self) -> &ToolRegistry {
        self.runner.harness().tools()
    }

    /// The provider and model a turn asking for `provider` and `model`
    /// runs on.
    pub fn resolve_provider_model(
        &self,
        provider: Option<&str>,
        model: Option<&str>,
    ) -> (String, String) {
        self.runner
            .harness()
            .resolve_provider_model(provider, model)
    }

    // Reading turns and sessions.

    pub async fn get_turn(
        &self,
        session_id: &SessionKey,
        turn_id: Uuid,
    ) -> Result<Option<TurnRecord>> {
        self.store.get_turn(session_id, turn_id).await
    }

    /// A turn by its id alone (a task id), unless hidden.
    pub async fn find_turn(&self, turn_id: Uuid) -> Result<Option<TurnRecord>> {
        self.store.find_turn(turn_id).await
    }

    /// Hides a turn from every read (a deleted response); false when it
    /// was not there.
    pub async fn hide_turn(&self, turn_id: Uuid) -> Result<bool> {
        self.store.hide_turn(turn_id, Utc::now()).await
    }

    /// A page of a tenant's turns, newest first, and how many match.
    pub async fn list_tenant_turns(
        &self,
        tenant: &str,
        filter: &TurnFilter,
        before: Option<Uuid>,
        limit: u32,
    ) -> Result<(Vec<TurnRecord>, u64)> {
        self.store
            .list_tenant_turns(tenant, filter, before, limit)
            .await
    }

    /// The turns that continue the same turn as `turn` (itself among
    /// them), oldest first.
    pub async fn sibling_turns(&self, turn: &TurnRecord, limit: u32) -> Result<Vec<TurnRecord>> {
        self.store.sibling_turns(turn, limit).await
    }

    /// The last `limit` messages of the branch that ends at `turn_id` (its
    /// own and its ancestors'), oldest first.
    pub async fn branch_history(
        &self,
        session_id: &SessionKey,
        turn_id: Uuid,
        limit: u32,
    ) -> Result<Vec<MessageRecord>> {
        self.store.history(session_id, turn_id, true, limit).await
    }

    /// A session's newest turn: the head of its current branch.
    pub async fn newest_turn(&self, session_id: &SessionKey) -> Result<Option<Uuid>> {
        self.store.newest_turn(session_id).await
    }

    /// The newest turn of a session its client named `run_id`.
    pub async fn turn_of_run(&self, session_id: &SessionKey, run_id: &str) -> Result<Option<Uuid>> {
        self.store.turn_of_run(session_id, run_id).await
    }

    pub async fn get_session(&self, session_id: &SessionKey) -> Result<Option<SessionRecord>> {
        self.store.get_session(session_id).await
    }

    pub async fn list_sessions(&self, tenant: &str, limit: u32) -> Result<Vec<SessionRecord>> {
        self.store.list_sessions(tenant, limit).await
    }

    /// The last `limit` messages of `session`'s current branch (its
    /// newest turn's), oldest first.
    pub async fn current_messages(
        &self,
        session_id: &SessionKey,
        session: &SessionRecord,
        limit: u32,
    ) -> Result<Vec<MessageRecord>> {
        let head = match session.branched {
            true => self.store.newest_turn(session_id).await?,
            false => None,
        };
        match head {
            Some(head) => self.store.history(session_id, head, true, limit).await,
            None => self.store.recent_messages(session_id, limit).await,
        }
    }

    /// A page of a session's log after `after` (of one turn, or all).
    pub async fn list_events(
        &self,
        session_id: &SessionKey,
        turn_id: Option<Uuid>,
        after: i64,
        limit: u32,
    ) -> Result<Vec<StoredEvent>> {
        self.store
            .list_events(session_id, turn_id, after, limit)
            .await
    }

    /// Feeds `feed` the events a turn's log holds now, in order, a page at
    /// a time, until they run out or `feed` says it has what it needs
    /// (true).
    pub async fn read_turn(
        &self,
        turn: &TurnRecord,
        feed: impl FnMut(&StoredEvent) -> bool,
    ) -> Result<()> {
        TurnLogCursor::of(turn)
            .each(self.store.as_ref(), feed)
            .await
    }

    /// The notes of a vault the index holds, by path.
    pub async fn vault_notes(&self, vault: &str) -> Result<HashMap<String, NoteState>> {
        self.store.vault_notes(vault).await
    }

    // Answering a waiting call.

    /// The decision on a call, if one was made: approved, and why not.
    pub async fn get_approval(
        &self,
        turn_id: Uuid,
        call_id: &str,
    ) -> Result<Option<(bool, Option<String>)>> {
        self.store.get_approval(turn_id, call_id).await
    }

    /// What a client posted for a call: its output, and whether it is an
    /// error.
    pub async fn get_tool_result(
        &self,
        turn_id: Uuid,
        call_id: &str,
    ) -> Result<Option<(String, bool)>> {
        self.store.get_tool_result(turn_id, call_id).await
    }

    /// Records a client's result for a call; false when one was already
    /// there (the first stands).
    pub async fn post_tool_result(&self, result: &NewToolResult) -> Result<bool> {
        self.store.post_tool_result(result).await
    }

    /// Records a person's decision on a call waiting for approval, and
    /// who made it in the audit trail; false when the call was already
    /// decided (the first decision stands).
    pub async fn decide_approval(&self, approval: &NewApproval) -> Result<bool> {
        let recorded = self.store.decide_approval(approval).await?;
        if recorded {
            let entry = AuditEntry::new(approval.session_id.tenant(), kinds::APPROVAL_DECIDED)
                .subject(format!("{}/{}", approval.turn_id, approval.call_id))
                .outcome(match (approval.approved, &approval.edited_arguments) {
                    (true, Some(_)) => "approved_with_edits",
                    (true, None) => "approved",
                    (false, _) => "denied",
                });
            self.store.record(entry).await;
        }
        Ok(recorded)
    }

    /// An answer (a decision, a client's result) for a waiting call of
    /// `turn_id` is in the store: the wait is woken where it runs in this
    /// process, or the turn where it is parked (it goes on here).
    pub async fn answered(&self, turn_id: Uuid) {
        self.approvals_decided.notify_waiters();
        self.runner.wake(turn_id).await;
    }

    // A2A push configurations (the outbox delivers them).

    pub async fn push_configs(&self, task_id: Uuid) -> Result<Vec<PushConfig>> {
        self.store.push_configs(task_id).await
    }

    pub async fn push_config(&self, task_id: Uuid, id: &str) -> Result<Option<PushConfig>> {
        self.store.push_config(task_id, id).await
    }

    /// Stores a task's configuration, its deliveries starting after
    /// `sent_seq`; false when the task holds as many as it may.
    pub async fn put_push_config(
        &self,
        config: &PushConfig,
        session_id: &SessionKey,
        sent_seq: i64,
    ) -> Result<bool> {
        self.store
            .put_push_config(config, session_id, sent_seq)
            .await
    }

    pub async fn delete_push_config(&self, task_id: Uuid, id: &str) -> Result<bool> {
        self.store.delete_push_config(task_id, id).await
    }
}
