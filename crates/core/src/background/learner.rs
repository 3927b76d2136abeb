//! The research learner: each turn's question and answer, kept as an
//! observation with the turn's end.

use async_trait::async_trait;
use chrono::Utc;

use crate::{
    hooks::{Exchange, HookError, ResearchLearner},
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
        exchange: Exchange<'_>,
    ) -> Result<Option<ObservationRecord>, HookError> {
        Ok(Some(ObservationRecord {
            id: format!("obs_{}", uuid::Uuid::now_v7().simple()),
            session_id: exchange.session_id.to_owned(),
            source_id: exchange.source_id.to_owned(),
            user_text: crate::pii::redact_if(self.redact, exchange.user_text),
            assistant_text: crate::pii::redact_if(self.redact, exchange.assistant_text),
            created_at: Utc::now(),
        }))
    }
}
