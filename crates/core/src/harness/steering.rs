//! Messages steered into a running turn (issue 66, part 5): claimed at a
//! step boundary and put in the conversation as user messages after the
//! last tool results, so the step's provider request carries them.

use super::{SinkError, step::Conversation, step::Turn};
use crate::{events::TurnEvent, providers::ChatMessage};

/// Steered messages one step takes at most (the rest wait for the next
/// step, or become the session's next turn).
const STEERS_A_STEP: u32 = 16;

impl Turn<'_> {
    /// Puts the messages steered into the turn since its last step in the
    /// conversation, before `step`'s provider call. The first step has
    /// none (a steer made during it waits for the next). A failed claim
    /// leaves them waiting: the next step, or the turn's end, takes them.
    pub(super) async fn take_steers(
        &self,
        step: u32,
        conversation: &mut Conversation,
    ) -> Result<(), SinkError> {
        let Some(steering) = &self.harness.steering else {
            return Ok(());
        };
        let flagged = self
            .request
            .steered
            .as_ref()
            .is_none_or(|steered| steered.load(std::sync::atomic::Ordering::SeqCst));
        if step <= 1 || !flagged {
            return Ok(());
        }
        let steered = match steering
            .claim(self.request.turn_id, step, STEERS_A_STEP)
            .await
        {
            Ok(steered) => steered,
            Err(e) => {
                tracing::warn!(error = %e, step, "steered messages could not be read; they wait for the next step");
                return Ok(());
            }
        };
        for steer in steered {
            self.sink
                .emit(TurnEvent::SteerApplied {
                    steer_id: steer.id.to_string(),
                    step,
                })
                .await?;
            conversation
                .messages
                .push(ChatMessage::user(steer.message.clone()));
            self.state.note_steered(steer.message);
        }
        Ok(())
    }
}
