//! A regenerate's request: the earlier turn's message, asked as it was,
//! unless the body gives another option.

use super::TurnBody;
use crate::{protocols::error::ApiError, turn::TurnRequest};

impl TurnBody {
    /// A regenerate of `earlier`: a new answer to its message, with its
    /// attachments, continuing the turn it continued, with this body's
    /// options.
    pub fn repeating(self, earlier: &crate::service::TurnRecord) -> Result<TurnRequest, ApiError> {
        for (field, given) in [
            ("message", self.message.is_some()),
            ("parent_turn_id", self.parent_turn_id.is_some()),
            ("history", self.history.is_some()),
        ] {
            if given {
                return Err(ApiError::InvalidField {
                    field: field.into(),
                    detail: format!(
                        "a regenerate repeats its turn's message on its turn's branch: `{field}` \
                         is not taken (to change the message, start a turn with `parent_turn_id`)"
                    ),
                });
            }
        }
        // An option the body does not give is the earlier turn's: the
        // same question, asked as it was (and checked again as given).
        let asked = &earlier.request;
        let mut body = self;
        body.top_k = body.top_k.or(Some(asked.top_k));
        body.web_mode = body.web_mode.or(Some(asked.web_mode));
        body.show_citations = body.show_citations.or(Some(asked.show_citations));
        body.runtime_provider = body
            .runtime_provider
            .or_else(|| asked.runtime_provider.clone());
        body.runtime_model = body.runtime_model.or_else(|| asked.runtime_model.clone());
        body.skill_context = body.skill_context.or_else(|| asked.skill_context.clone());
        body.user_id = body.user_id.or_else(|| asked.user_id.clone());
        // These two the body gives in its own shapes.
        let (tools, output) = (body.client_tools.is_none(), body.output_schema.is_none());
        let mut request = body.options()?;
        if tools {
            request.client_tools.clone_from(&asked.client_tools);
        }
        if output {
            request.output.clone_from(&asked.output);
        }
        Ok(TurnRequest {
            message: asked.message.clone(),
            attachments: asked.attachments.clone(),
            history: asked.history.clone(),
            think_level: asked.think_level,
            max_output_tokens: asked.max_output_tokens,
            metadata: asked.metadata.clone(),
            follows: Some(earlier.parent_turn_id.unwrap_or_default()),
            ..request
        })
    }
}
