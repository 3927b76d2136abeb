//! What a run asks: AG-UI's `RunAgentInput`, the answers to interrupts
//! its `resume` brings, and the results of frontend tools its `tool`
//! messages bring.

use serde::Deserialize;
use utoipa::ToSchema;

use crate::protocols::{
    ToolDeclaration, approvals::ClientDecision, client_calls::ClientAnswer, error::ApiError,
    parts::Content,
};

/// AG-UI's `RunAgentInput` (the fields read; `state` and `context` are
/// accepted and ignored, and of `forwardedProps` only `multitask`).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunAgentInput {
    /// The thread: the service's session.
    #[schema(pattern = "^[A-Za-z0-9._:-]{1,128}$")]
    pub(super) thread_id: String,
    /// The client's id for this run (echoed in the run's events), kept
    /// with the turn the run begins.
    pub(super) run_id: Option<String>,
    /// An earlier run of the thread this one goes on from (its `runId`):
    /// the turn's history is that run's branch, as stored (the messages
    /// the client sends are not its history), and `RUN_STARTED` echoes it.
    pub(super) parent_run_id: Option<String>,
    #[schema(min_items = 1, max_items = 1000)]
    pub(super) messages: Vec<AguiMessage>,
    /// Frontend tools: tools the client runs itself (at most 32).
    #[serde(default)]
    pub(super) tools: Vec<ToolDeclaration>,
    /// Answers to the interrupts that ended the thread's previous run.
    #[serde(default)]
    #[schema(max_items = 100)]
    pub(super) resume: Vec<ResumeEntry>,
    /// What the host forwards; read: `multitask`.
    #[serde(default)]
    pub(super) forwarded_props: Option<ForwardedProps>,
}

/// The `forwardedProps` read (the others are accepted and ignored).
#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct ForwardedProps {
    /// What the run does while the thread's run is live, as on
    /// `POST /sessions/{session_id}/turns`: `reject` (the default),
    /// `enqueue`, `interrupt`, or `steer` (its message joins the live run,
    /// and this run's events are the rest of that one).
    pub(super) multitask: Option<crate::protocols::multitask::Multitask>,
}

/// An answer to one interrupt (a call that waits for approval).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResumeEntry {
    /// The interrupt's `id`: the call's `toolCallId`.
    pub(super) interrupt_id: String,
    pub(super) status: ResumeStatus,
    /// The decision: `{"approved": true|false, "reason"?: "…",
    /// "editedArgs"?: {…}}` (`editedArgs`: the arguments to run instead,
    /// with an approval).
    #[schema(value_type = Option<Value>)]
    pub(super) payload: Option<ResumePayload>,
}

/// A `resume` entry's payload: the decision, or (as some clients send it)
/// the bare approval.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum ResumePayload {
    #[serde(rename_all = "camelCase")]
    Decision {
        approved: Option<bool>,
        reason: Option<String>,
        edited_args: Option<serde_json::Value>,
    },
    Approved(bool),
    Other(serde::de::IgnoredAny),
}

/// Whether the interrupt was answered, or abandoned (a denial).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ResumeStatus {
    Resolved,
    Cancelled,
}

/// Interrupts one `resume` answers at most.
const RESUME_MAX: usize = 100;

/// The decisions `resume` brings.
pub(super) fn decisions(resume: &[ResumeEntry]) -> Result<Vec<ClientDecision>, ApiError> {
    if resume.len() > RESUME_MAX {
        return Err(ApiError::InvalidField {
            field: "resume".into(),
            detail: format!("`resume` answers at most {RESUME_MAX} interrupts"),
        });
    }
    resume
        .iter()
        .enumerate()
        .map(|(i, entry)| {
            let field = format!("resume[{i}].payload");
            let (approve, reason, edited) = match entry.status {
                ResumeStatus::Cancelled => (
                    false,
                    Some("the person cancelled the approval".to_owned()),
                    None,
                ),
                ResumeStatus::Resolved => {
                    let (approved, reason, edited) = match &entry.payload {
                        Some(ResumePayload::Decision {
                            approved,
                            reason,
                            edited_args,
                        }) => (*approved, reason.clone(), edited_args.clone()),
                        Some(ResumePayload::Approved(approved)) => (Some(*approved), None, None),
                        Some(ResumePayload::Other(_)) | None => (None, None, None),
                    };
                    let Some(approved) = approved else {
                        return Err(ApiError::InvalidField {
                            field: field.clone(),
                            detail: format!(
                                "`{field}` must be {{\"approved\": true|false, \"reason\"?: \"…\"}}"
                            ),
                        });
                    };
                    (approved, reason, edited)
                }
            };
            ClientDecision::new(&entry.interrupt_id, approve, reason, &field)?
                .with_edit(edited, &format!("{field}.editedArgs"))
        })
        .collect()
}

/// An AG-UI message: its text `content` is read, and of a `tool` message
/// the call it answers.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AguiMessage {
    #[schema(pattern = "^(developer|system|user|assistant|tool|activity)$")]
    pub(super) role: String,
    #[schema(schema_with = crate::protocols::schemas::text_or_parts)]
    pub(super) content: Option<Content>,
    pub(super) tool_call_id: Option<String>,
    /// A `tool` message's error: the call failed.
    pub(super) error: Option<String>,
}

impl AguiMessage {
    fn text(&self) -> String {
        crate::protocols::parts::content_text(self.content.as_ref())
    }
}

/// The results the `tool` messages at the end of `messages` give.
pub(super) fn tool_results(messages: &[AguiMessage]) -> Vec<ClientAnswer> {
    messages
        .iter()
        .rev()
        .take_while(|m| m.role == "tool")
        .filter_map(|m| {
            let call_id = m.tool_call_id.as_deref()?;
            Some(match &m.error {
                Some(error) => ClientAnswer::text(call_id, error.clone(), true),
                None => ClientAnswer::text(call_id, m.text(), false),
            })
        })
        .collect()
}
