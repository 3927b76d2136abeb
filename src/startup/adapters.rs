//! The harness's hooks, answered by the service's parts: its metrics, the
//! store (approvals, artifacts) and the vault (checkpoints before a write).

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use chrono::Utc;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::{
    harness::hooks::{
        AgentCallbacks, ApprovalDecision, ApprovalGate, ApprovalRequest, ArtifactStore,
        CheckpointRequest, CheckpointStore, ClientResult, ClientResults, HookError, LongOutput,
        Steered, Steering,
    },
    metrics::Metrics,
    store,
    tools::Saved,
    vault::Vaults,
};

/// What the harness reports to the service's metrics.
pub(super) struct MetricsCallbacks(pub(super) Arc<Metrics>);

#[async_trait]
impl AgentCallbacks for MetricsCallbacks {
    async fn on_provider_error(&self, code: &str) {
        self.0.provider_error(code);
    }
}

/// Approval decisions from the store: a waiting call looks for its
/// decision when woken (a decision made in this process) and every 250 ms
/// (one made on another replica).
pub struct StoreApprovals {
    pub store: Arc<dyn store::Store>,
    pub decided: Arc<tokio::sync::Notify>,
}

#[async_trait]
impl ApprovalGate for StoreApprovals {
    async fn decide(
        &self,
        request: &ApprovalRequest,
        within: Duration,
        cancel: &CancellationToken,
    ) -> ApprovalDecision {
        let Ok(turn_id) = Uuid::parse_str(&request.turn_id) else {
            return ApprovalDecision::Denied {
                reason: "the turn has no valid id".into(),
            };
        };
        let deadline = tokio::time::Instant::now() + within;
        loop {
            // Registered before the look, so that a decision made in between
            // still wakes this wait.
            let woken = self.decided.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            match self.store.get_approval(turn_id, &request.call_id).await {
                Ok(Some((true, _))) => {
                    match self.store.approval_terms(turn_id, &request.call_id).await {
                        Ok(terms) => {
                            let (edited_arguments, arguments_sha256) = terms.unwrap_or_default();
                            return ApprovalDecision::Approved {
                                edited_arguments,
                                arguments_sha256,
                            };
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot read an approval; still waiting")
                        }
                    }
                }
                Ok(Some((false, reason))) => {
                    return ApprovalDecision::Denied {
                        reason: reason.unwrap_or_else(|| "no reason given".into()),
                    };
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "cannot read an approval; still waiting"),
            }
            tokio::select! {
                () = &mut woken => {}
                () = tokio::time::sleep(Duration::from_millis(250)) => {}
                () = tokio::time::sleep_until(deadline) => return ApprovalDecision::TimedOut,
                () = cancel.cancelled() => return ApprovalDecision::Cancelled,
            }
        }
    }
}

/// Results of the clients' own tools from the store: a waiting call looks
/// for its result when woken (one posted in this process) and every
/// 250 ms (one posted on another replica).
pub struct StoreClientResults {
    pub store: Arc<dyn store::Store>,
    pub posted: Arc<tokio::sync::Notify>,
}

#[async_trait]
impl ClientResults for StoreClientResults {
    async fn wait(
        &self,
        turn_id: Uuid,
        call_id: &str,
        within: Duration,
        cancel: &CancellationToken,
    ) -> ClientResult {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            // Registered before the look, so that a result posted in
            // between still wakes this wait.
            let woken = self.posted.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            match self.store.get_tool_result(turn_id, call_id).await {
                Ok(Some((output, is_error))) => return ClientResult::Posted { output, is_error },
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read a client's result; still waiting")
                }
            }
            tokio::select! {
                () = &mut woken => {}
                () = tokio::time::sleep(Duration::from_millis(250)) => {}
                () = tokio::time::sleep_until(deadline) => return ClientResult::TimedOut,
                () = cancel.cancelled() => return ClientResult::Cancelled,
            }
        }
    }
}

/// Messages steered into a running turn, from the store: a read first,
/// so that a step with none (nearly every step) writes nothing.
pub struct StoreSteering(pub Arc<dyn store::Store>);

#[async_trait]
impl Steering for StoreSteering {
    async fn claim(&self, turn_id: Uuid, step: u32, limit: u32) -> Result<Vec<Steered>, HookError> {
        let fail = |e: store::StoreError| HookError(e.to_string());
        if !self.0.steers_pending(turn_id, step).await.map_err(fail)? {
            return Ok(Vec::new());
        }
        let claimed = self
            .0
            .apply_steers(turn_id, step, limit)
            .await
            .map_err(fail)?;
        Ok(claimed
            .into_iter()
            .map(|steer| Steered {
                id: steer.id,
                message: steer.message,
            })
            .collect())
    }
}

/// Keeps oversized tool outputs in the `artifacts` table.
pub struct StoreArtifacts(pub Arc<dyn store::Store>);

#[async_trait]
impl ArtifactStore for StoreArtifacts {
    async fn put(&self, output: LongOutput<'_>) -> Result<String, HookError> {
        let id = format!("art_{}", Uuid::now_v7().simple());
        self.0
            .put_artifact(&store::NewArtifact {
                id: id.clone(),
                session_id: output.session_id.into(),
                turn_id: output.turn_id.to_string(),
                call_id: output.call_id.to_owned(),
                tool: output.tool.to_owned(),
                content: output.content.to_owned(),
                created_at: Utc::now(),
            })
            .await
            .map_err(HookError::new)?;
        Ok(id)
    }
}

/// Saves the notes a write is about to change (resource keys `note:…`)
/// as checkpoints in the store.
pub struct VaultCheckpoints {
    pub vaults: Arc<Vaults>,
    pub store: Arc<dyn store::Store>,
}

#[async_trait]
impl CheckpointStore for VaultCheckpoints {
    async fn snapshot(&self, request: &CheckpointRequest) -> Result<Vec<String>, HookError> {
        let earlier = self
            .store
            .call_checkpoints(&request.session_id, &request.turn_id, &request.call_id)
            .await
            .map_err(HookError::new)?;
        if !earlier.is_empty() {
            return Ok(earlier.into_iter().map(|(id, _, _)| id).collect());
        }
        let mut ids = Vec::new();
        for key in &request.resource_keys {
            let Some(path) = crate::tools::notes::path_of_key(key) else {
                continue;
            };
            let vault = self.vaults.of_session(&request.session_id);
            let (note, content) = vault.snapshot(path).await.map_err(HookError::new)?;
            let id = crate::http::vault::new_checkpoint_id();
            self.store
                .put_checkpoint(&store::NewCheckpoint {
                    id: id.clone(),
                    session_id: request.session_id.clone(),
                    turn_id: request.turn_id.clone(),
                    call_id: request.call_id.clone(),
                    tool: request.tool.clone(),
                    path: note.relative,
                    content,
                    created_at: Utc::now(),
                })
                .await
                .map_err(HookError::new)?;
            ids.push(id);
        }
        Ok(ids)
    }

    async fn saved(
        &self,
        session_id: &str,
        turn_id: &str,
        call_id: &str,
    ) -> Result<Vec<Saved>, HookError> {
        let saved = self
            .store
            .call_checkpoints(
                &crate::ids::SessionKey::from_stored(session_id),
                turn_id,
                call_id,
            )
            .await
            .map_err(HookError::new)?;
        Ok(saved
            .into_iter()
            .map(|(_, path, content)| Saved { path, content })
            .collect())
    }
}
