//! A turn's cancel, and the wait for a turn's end.

use std::time::Duration;

use uuid::Uuid;

use super::{CancelError, CancelOutcome, TurnRunner};
use crate::{
    ids::SessionKey,
    store::{StoreError, TurnRecord, TurnStatus},
};

impl TurnRunner {
    /// Stops a running turn.
    pub async fn cancel(
        &self,
        session_id: &SessionKey,
        turn_id: Uuid,
    ) -> Result<CancelOutcome, CancelError> {
        let store = &self.inner.store;
        let record = store
            .get_turn(session_id, turn_id)
            .await?
            .ok_or(CancelError::NotFound)?;
        if record.status != TurnStatus::Running {
            return Err(CancelError::NotRunning(record.status));
        }
        if let Some(live) = self.inner.live.get(turn_id) {
            live.cancel.cancel();
            // The turn commits its end promptly once cancelled; wait for it
            // so the answer can carry the final status.
            let _ = tokio::time::timeout(Duration::from_secs(5), live.closed.cancelled()).await;
        } else if !store.request_cancel(turn_id).await? {
            let record = store.get_turn(session_id, turn_id).await?;
            return Err(CancelError::NotRunning(
                record.map_or(TurnStatus::Interrupted, |r| r.status),
            ));
        } else {
            // Parked: no process runs it; this one takes it over, and it
            // ends cancelled at once. Whoever takes it up (this call, this
            // process's sweep, another replica that heard of the wake), the
            // answer waits for its end, as for a turn that runs here. A
            // turn that runs on another replica (not parked) is asked: 202.
            if !self.wake(turn_id).await {
                return Ok(CancelOutcome::Requested);
            }
            let ended = tokio::time::timeout(
                Duration::from_secs(5),
                self.wait_for_end(session_id, turn_id),
            )
            .await;
            return match ended {
                Ok(Ok(Some(record))) => Ok(CancelOutcome::Ended(Box::new(record))),
                Ok(Err(e)) => Err(e.into()),
                // Not ended in time (or shutting down): asked, and it ends
                // once a process takes it up.
                Ok(Ok(None)) | Err(_) => Ok(CancelOutcome::Requested),
            };
        }
        let record = store
            .get_turn(session_id, turn_id)
            .await?
            .ok_or(CancelError::NotFound)?;
        Ok(CancelOutcome::Ended(Box::new(record)))
    }

    /// Waits until the turn is no longer running and returns its record;
    /// `None` if the service shuts down first.
    pub async fn wait_for_end(
        &self,
        session_id: &SessionKey,
        turn_id: Uuid,
    ) -> Result<Option<TurnRecord>, StoreError> {
        if let Some(live) = self.inner.live.get(turn_id) {
            tokio::select! {
                () = live.closed.cancelled() => {}
                () = self.inner.close_streams.cancelled() => {}
            }
        }
        loop {
            let record = self.inner.store.get_turn(session_id, turn_id).await?;
            match record {
                Some(r) if r.status == TurnStatus::Running => {}
                other => return Ok(other),
            }
            if self.inner.close_streams.is_cancelled() {
                return Ok(None);
            }
            tokio::select! {
                () = tokio::time::sleep(self.inner.config.poll_interval) => {}
                () = self.inner.close_streams.cancelled() => {}
            }
        }
    }
}
