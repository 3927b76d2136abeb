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
        let turn_of = |id: Option<&str>| id.and_then(|id| uuid::Uuid::parse_str(id).ok());
        match self.trigger.as_deref() {
            None | Some("submit-message") => Ok(Placement {
                after_turn: turn_of(
                    self.messages
                        .iter()
                        .rev()
                        .find(|m| m.role == "assistant")
                        .and_then(|m| m.id.as_deref()),
                ),
                ..Placement::default()
            }),
            Some("regenerate-message") => {
                let session = crate::protocols::paths::parse_session_id(&self.id, tenant)?;
                let regenerated = match turn_of(self.message_id.as_deref()) {
                    Some(turn) => app.turns.get_turn(&session, turn).await?,
                    None => None,
                };
                let Some(regenerated) = regenerated else {
                    return Err(ApiError::TurnNotFound);
                };
                Ok(Placement {
                    branch_from: Some(regenerated.parent_turn_id.unwrap_or_default()),
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
}
