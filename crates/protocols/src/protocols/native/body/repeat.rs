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
        // same question, asked as it was.
        let kept = [
            self.top_k.is_none(),
            self.web_mode.is_none(),
            self.show_citations.is_none(),
            self.runtime_provider.is_none(),
            self.runtime_model.is_none(),
            self.skill_context.is_none(),
            self.user_id.is_none(),
            self.client_tools.is_none(),
            self.output_schema.is_none(),
        ];
        let mut request = self.options()?;
        let asked = &earlier.request;
        let [
            top_k,
            web_mode,
            citations,
            provider,
            model,
            skill,
            user,
            tools,
            output,
        ] = kept;
        if top_k {
            request.top_k = asked.top_k;
        }
        if web_mode {
            request.web_mode = asked.web_mode;
        }
        if citations {
            request.show_citations = asked.show_citations;
        }
        if provider {
            request.runtime_provider.clone_from(&asked.runtime_provider);
        }
        if model {
            request.runtime_model.clone_from(&asked.runtime_model);
        }
        if skill {
            request.skill_context.clone_from(&asked.skill_context);
        }
        if user {
            request.user_id.clone_from(&asked.user_id);
        }
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
