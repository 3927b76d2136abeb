//! A judgement said in its session's log: at once, or, while a turn of
//! the session runs, by a job of its own.

use std::time::Duration;

use chrono::Utc;
use serde::{Deserialize, Serialize};

use super::{BackgroundWorker, EVENT_ATTEMPTS, payload};
use crate::{
    background::{JOB_JUDGEMENT_EVENT, new_job_id},
    events::{SESSION_TURN, StoredEvent, TurnEvent},
    store::{JobOutcome, JobRecord, JudgementRecord, NewJob},
};

/// A judgement event waiting for its session to be free. (Older versions
/// also kept an `event_turn_id`, a fresh UUID that named no turn; it is
/// not read: the event is the session's, under [`SESSION_TURN`].)
#[derive(Debug, Clone, Serialize, Deserialize)]
struct EventJob {
    session_id: String,
    event: TurnEvent,
    at: chrono::DateTime<Utc>,
}

impl BackgroundWorker {
    /// Says a judgement in its session's log: at once, or, while a turn of
    /// the session runs, by a job of its own.
    pub(super) async fn announce(&self, job: &JobRecord, judgement: &JudgementRecord) {
        let event = EventJob {
            session_id: judgement.session_id.clone(),
            event: TurnEvent::Judgement {
                judgement_id: judgement.id.clone(),
                judged_turn_id: judgement.turn_id.clone(),
                judge: judgement.judge.clone(),
                score: judgement.score,
                passed: judgement.passed,
                rationale: judgement.rationale.clone(),
            },
            at: judgement.created_at,
        };
        match self.deliver(&event).await {
            Ok(true) => {}
            // The session is busy with a turn: its event waits.
            Ok(false) | Err(_) => {
                let queued = NewJob {
                    id: new_job_id(),
                    kind: JOB_JUDGEMENT_EVENT.into(),
                    session_id: job.session_id.clone(),
                    turn_id: job.turn_id.clone(),
                    payload: serde_json::to_string(&event).unwrap_or_default(),
                    at: Utc::now(),
                };
                // Not once the judge's job is gone (its session erased).
                if let Err(e) = self.jobs.enqueue_job(&queued, Some(&job.id)).await {
                    tracing::warn!(error = %e, "a judgement's event is lost");
                }
            }
        }
    }

    /// Appends a judgement's event to its session's log; false while a
    /// turn of the session runs.
    async fn deliver(&self, event: &EventJob) -> crate::store::Result<bool> {
        let stored = StoredEvent::new(&event.session_id, SESSION_TURN, 0, &event.event, event.at)
            .map_err(|e| crate::store::StoreError::Corrupt(e.to_string()))?;
        self.log.append_session_event(&stored).await
    }

    pub(super) async fn append_event(&self, job: &JobRecord) -> JobOutcome {
        let event: EventJob = match payload(job) {
            Ok(event) => event,
            Err(outcome) => return outcome,
        };
        match self.deliver(&event).await {
            Ok(true) => JobOutcome::Done,
            Ok(false) => Self::again(
                job,
                "a turn of the session is running".into(),
                EVENT_ATTEMPTS,
                Duration::from_secs(2),
            ),
            Err(e) => Self::again(job, e.to_string(), EVENT_ATTEMPTS, Duration::from_secs(2)),
        }
    }
}
