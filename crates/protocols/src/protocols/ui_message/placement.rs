//! Where a `useChat` request's turn goes in its chat's tree.

use super::UiChatRequest;
use crate::{
    ids::Tenant,
    protocols::{Shared, endpoint::Placement, error::ApiError},
};

impl UiChatRequest {
    /// Where the turn goes in the chat's tree: a regenerate continues the
    /// turn the regenerated answer continued, on its stored branch; any
    /// other turn continues the turn of the client's last answer (the
    /// newest, or an earlier one when the client edited a message).
    pub(super) async fn placement(
        &self,
        app: &Shared,
        tenant: &Tenant,
    ) -> Result<Placement, ApiError> {
        match self.trigger.as_deref() {
            None | Some("submit-message") => Ok(Placement {
                after_turn: self.last_answer(),
                ..Placement::default()
            }),
            Some("regenerate-message") => {
                let session = crate::protocols::paths::parse_session_id(&self.id, tenant)?;
                // The answer replaced: the one `messageId` names (an
                // assistant message's id is its turn's), else the last.
                // A user message's id (the client names its own): a new
                // answer to it, after the last answer the client holds.
                let replaced = match self.message_id.as_deref() {
                    None => app.turns.newest_turn(&session).await?,
                    Some(id) => uuid::Uuid::parse_str(id).ok(),
                };
                let parent = match replaced {
                    Some(turn) => match app.turns.get_turn(&session, turn).await? {
                        Some(turn) => turn.parent_turn_id,
                        None => return Err(ApiError::TurnNotFound),
                    },
                    None => match self.last_answer() {
                        Some(turn) => app.turns.get_turn(&session, turn).await?.map(|t| t.id),
                        None => None,
                    },
                };
                Ok(Placement {
                    branch_from: Some(parent.unwrap_or_default()),
                    ..Placement::default()
                })
            }
            Some(other) => Err(ApiError::InvalidField {
                field: "trigger".into(),
                detail: format!(
                    "`trigger` is `submit-message` or `regenerate-message`, not {other:?}"
                ),
            }),
        }
    }

    /// The turn of the last answer the client holds (an assistant
    /// message's id is its turn's).
    fn last_answer(&self) -> Option<uuid::Uuid> {
        self.messages
            .iter()
            .rev()
            .find(|m| m.role == "assistant")
            .and_then(|m| m.id.as_deref())
            .and_then(|id| uuid::Uuid::parse_str(id).ok())
    }
}
