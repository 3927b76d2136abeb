//! A runner's shutdown: no new turns, running ones handed over or given
//! their grace, the event log flushed, and the open streams kept while
//! another replica claims what this one handed over.

use std::time::Duration;

use super::TurnRunner;
use crate::store::TurnStatus;

/// How long a process shutting down waits for another to claim a turn it
/// handed over before it stops following the turn for its clients (a
/// listening replica claims within milliseconds; on a loaded machine a
/// second was seen not to be enough).
const CLAIM_WINDOW: Duration = Duration::from_secs(3);

/// How often it looks meanwhile.
const CLAIM_POLL: Duration = Duration::from_millis(50);

impl TurnRunner {
    /// Shuts down: no new turns; running turns get `grace` to finish, then
    /// end `interrupted`; the event log is flushed; open streams end.
    pub async fn shutdown(&self, grace: Duration) {
        let inner = &self.inner;
        let began = tokio::time::Instant::now();
        inner.draining.cancel();
        inner.turns.close();
        if inner.config.max_attempts > 0 {
            // Another replica (or this service started again) goes on with
            // them: stop at the next step boundary instead of finishing.
            inner.handover.cancel();
        }
        if tokio::time::timeout(grace, inner.turns.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                running = inner.live.len(),
                "grace period over; interrupting running turns"
            );
            inner.interrupt.cancel();
            if tokio::time::timeout(Duration::from_secs(10), inner.turns.wait())
                .await
                .is_err()
            {
                tracing::error!("turns did not end after being interrupted");
            }
        }
        // Tool tasks of ended turns are bounded by their late grace.
        if tokio::time::timeout(Duration::from_secs(10), inner.harness.wait_for_tool_tasks())
            .await
            .is_err()
        {
            tracing::warn!("tool tasks still running at shutdown");
        }
        inner.stop_background.cancel();
        inner.background.close();
        if tokio::time::timeout(Duration::from_secs(10), inner.background.wait())
            .await
            .is_err()
        {
            tracing::error!("event writer did not drain in time");
        }
        if inner.store.backend() == "postgres" && !inner.streams.is_empty() {
            // The turns handed over go on in another replica, which writes
            // their events to the shared log: the streams open here follow
            // them there until they end, within what is left of the grace,
            // so that their clients (of any wire format) see the rest. When
            // no replica claims them, no one is there to write the rest.
            let deadline = began + grace;
            if self.handed_over_turns_claimed(deadline).await {
                inner.streams.close();
                if tokio::time::timeout_at(deadline, inner.streams.wait())
                    .await
                    .is_err()
                {
                    tracing::info!("streams still open when the grace period ended; closing them");
                }
            }
        }
        inner.close_streams.cancel();
    }

    /// Whether another process claimed one of the turns this one handed
    /// over, within [`CLAIM_WINDOW`] (a replica that listens claims them
    /// within milliseconds of the announcement) and before `deadline`.
    async fn handed_over_turns_claimed(&self, deadline: tokio::time::Instant) -> bool {
        let inner = &self.inner;
        let handed = std::mem::take(
            &mut *inner
                .handed_over
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        if handed.is_empty() {
            return false;
        }
        let until = deadline.min(tokio::time::Instant::now() + CLAIM_WINDOW);
        loop {
            for (session_id, turn_id, attempt) in &handed {
                match inner.store.get_turn(session_id, *turn_id).await {
                    Ok(Some(turn))
                        if turn.attempt > *attempt || turn.status != TurnStatus::Running =>
                    {
                        return true;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "cannot read a turn handed over");
                        return false;
                    }
                }
            }
            if tokio::time::Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(CLAIM_POLL).await;
        }
    }
}
