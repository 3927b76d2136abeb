//! What a chat's messages say: each one's text, the new message's
//! `file` parts, and the answers and decisions its tool parts give.

use super::UiMessage;
use crate::protocols::{approvals::ClientDecision, client_calls::ClientAnswer, error::ApiError};

impl UiMessage {
    /// The decisions on calls that waited for approval the message's tool
    /// parts hold.
    pub(super) fn decisions(&self) -> Result<Vec<ClientDecision>, ApiError> {
        self.parts
            .iter()
            .filter(|part| part.state.as_deref() == Some("approval-responded"))
            .filter_map(|part| {
                let call_id = part.tool_call_id.as_deref()?;
                let approval = part.approval.as_ref();
                Some(match approval.and_then(|a| a.approved) {
                    // The part's input is the person's: what was asked,
                    // or their edit of it (an approval's alone).
                    Some(approved) => ClientDecision::new(
                        call_id,
                        approved,
                        approval.and_then(|a| a.reason.clone()),
                        "approval.reason",
                    )
                    .and_then(|d| d.with_edit(part.input.clone().filter(|_| approved), "input")),
                    None => Err(ApiError::InvalidField {
                        field: "approval.approved".into(),
                        detail: "an `approval-responded` tool part's `approval.approved` \
                                 must be a boolean"
                            .into(),
                    }),
                })
            })
            .collect()
    }

    /// The results of tool calls the message's tool parts hold.
    pub(super) fn tool_results(&self) -> Vec<ClientAnswer> {
        self.parts
            .iter()
            .filter_map(|part| {
                let call_id = part.tool_call_id.as_deref()?;
                match part.state.as_deref()? {
                    "output-available" => Some(ClientAnswer::of(call_id, &part.output, false)),
                    "output-error" => Some(ClientAnswer::of(call_id, &part.error_text, true)),
                    _ => None,
                }
            })
            .collect()
    }

    /// Its text, an earlier message's files named in it.
    fn text(&self) -> String {
        self.parts
            .iter()
            .filter_map(|p| match p.kind.as_str() {
                "text" => p.text.as_deref(),
                "file" => Some("[the user attached a file here]"),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Its text and its `file` parts, in order (the new message's).
    fn joined(&self, field: &str) -> Result<crate::turn::Joined, ApiError> {
        let mut joined = crate::turn::Joined::default();
        for (i, part) in self.parts.iter().enumerate() {
            match part.kind.as_str() {
                "text" => joined.text(part.text.as_deref().unwrap_or_default()),
                "file" => {
                    let field = format!("{field}.parts[{i}]");
                    let Some(url) = part.url.clone() else {
                        return Err(ApiError::InvalidField {
                            field,
                            detail: "a `file` part needs its `url`".into(),
                        });
                    };
                    let media_type = part.media_type.as_deref();
                    let source = crate::protocols::parts::from_url(&field, url, media_type)?;
                    let kind = match &part.media_type {
                        Some(t) if t.starts_with("image/") => crate::turn::AskedKind::Image,
                        _ => crate::turn::AskedKind::File,
                    };
                    joined.attach(&field, kind, source, part.filename.clone(), None);
                }
                _ => {}
            }
        }
        Ok(joined)
    }
}

/// The conversation of a chat's messages (see [`crate::protocols::parts::Said`]).
pub(super) fn said(messages: &[UiMessage]) -> Result<crate::protocols::parts::Said<'_>, ApiError> {
    let last = messages.len().checked_sub(1);
    let mut texts = Vec::with_capacity(messages.len());
    let mut attachments = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        if Some(i) == last && message.role == "user" {
            let joined = message.joined(&format!("messages[{i}]"))?;
            attachments = joined.attachments;
            texts.push((message.role.as_str(), joined.text));
        } else {
            texts.push((message.role.as_str(), message.text()));
        }
    }
    Ok((texts, attachments))
}
