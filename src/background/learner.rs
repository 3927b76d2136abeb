//! The research learner: each turn's question and answer, kept as an
//! observation with the turn's end.

use async_trait::async_trait;
use chrono::Utc;

use crate::{
    hooks::{HookError, ResearchLearner},
    store::ObservationRecord,
};

/// The research learner: keeps each turn's question and answer, its
/// source the stored assistant message.
pub struct StoreLearner {
    /// Mask personal data in observations (`HARNESS_REDACT_LOGS`).
    pub redact: bool,
}

#[async_trait]
impl ResearchLearner for StoreLearner {
    /// Every turn is observed; the observation is stored with the turn's end.
    async fn observe_turn(
        &self,
        session_id: &str,
        user_text: &str,
        assistant_text: &str,
        source_event_id: &str,
    ) -> Result<Option<ObservationRecord>, HookError> {
        Ok(Some(ObservationRecord {
            id: format!("obs_{}", uuid::Uuid::now_v7().simple()),
            session_id: session_id.to_owned(),
            source_id: source_event_id.to_owned(),
            user_text: crate::pii::redact_if(self.redact, user_text),
            assistant_text: crate::pii::redact_if(self.redact, assistant_text),
            created_at: Utc::now(),
        }))
    }
}
