//! `POST /v1/agui`: the AG-UI protocol's events from the same turn, for
//! AG-UI clients (CopilotKit and others). The request is AG-UI's
//! `RunAgentInput` (`threadId` is the session, `runId` the client's name for
//! the run, `messages` with the new user message last); the answer streams
//! `RUN_STARTED`, `STEP_STARTED`/`STEP_FINISHED`, `TEXT_MESSAGE_*`,
//! `TOOL_CALL_*`, and `RUN_FINISHED` or `RUN_ERROR`.
//!
//! The input's `tools` are the client's (frontend tools): a call of one is
//! `TOOL_CALL_START`/`ARGS`/`END` and the run finishes while the turn
//! waits; the next run's `messages` end with its `tool` message (the
//! result), and that run is the same turn after the call.
//!
//! A call that waits for a person's approval ends the run with AG-UI's
//! interrupt outcome (`RUN_FINISHED` `outcome: {type: "interrupt",
//! interrupts: [{id, reason: "tool_approval", toolCallId, …}]}`); the next
//! run's `resume` answers it (`payload: {approved, reason?}`, or
//! `status: "cancelled"`, a denial), and that run is the same turn after
//! the decision.

mod events;
mod input;

use axum::{Extension, extract::State, response::Response};
use events::{Custom, Event, Interrupt, InterruptTool, Outcome, RESPONSE_SCHEMA, RunResult};
pub use input::{AguiMessage, ResumeEntry, ResumePayload, ResumeStatus};
use input::{RunAgentInput, decisions, tool_results};
use serde_json::Value;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::{
    ConversationTurn,
    client_calls::{EndsAtClientCall, Replies, SegmentEncoder, SegmentStream, client_name},
    endpoint::Placement,
    retraction::{Say, StepText, ends_text},
    stream_for,
};
use crate::{
    events::TurnEvent,
    ids::Tenant,
    protocols::Shared,
    protocols::{
        error::{ApiError, BadRequest, InvalidBody, TurnAlreadyRunning},
        json::ApiJson,
    },
};

pub fn router<S>() -> OpenApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
    crate::protocols::Shared: axum::extract::FromRef<S>,
{
    OpenApiRouter::new().routes(routes!(agui_run))
}

/// Turns the turn's events into AG-UI events.
///
/// A message cannot be taken back: a step the turn retracts and says
/// again is held back while it repeats what was sent ([`StepText`]); one
/// said otherwise ends its text message and is named void by a `CUSTOM`
/// event `message.retracted` (`messageId`, `step`, `reason`) before its
/// new text starts a new message. `turn.resumed` is a `CUSTOM` event too.
struct Encoder {
    thread_id: String,
    run_id: String,
    /// The run the request branched from, echoed by `RUN_STARTED`.
    parent_run_id: Option<String>,
    /// The open text message, if any.
    message: Option<String>,
    /// The newest text message.
    last_message: Option<String>,
    messages: u32,
    step: Option<u32>,
    said: StepText,
    /// The open reasoning message, if any.
    reasoning: Option<String>,
    /// What this run's provider calls used (their `usage` events).
    used: events::TokenUsage,
}

impl Encoder {
    fn close_message(&mut self, out: &mut Vec<Event>) {
        self.close_reasoning(out);
        if let Some(message_id) = self.message.take() {
            out.push(Event::TextMessageEnd { message_id });
        }
    }

    /// A piece of reasoning: in the open reasoning message, or a new one
    /// (its span opened first).
    fn reason(&mut self, delta: &str, out: &mut Vec<Event>) {
        let message_id = match &self.reasoning {
            Some(id) => id.clone(),
            None => {
                self.messages += 1;
                let id = format!("{}-r{}", self.run_id, self.messages);
                out.push(Event::ReasoningStart {
                    message_id: id.clone(),
                });
                out.push(Event::ReasoningMessageStart {
                    message_id: id.clone(),
                    role: "reasoning",
                });
                self.reasoning = Some(id.clone());
                id
            }
        };
        out.push(Event::ReasoningMessageContent {
            message_id,
            delta: delta.to_owned(),
        });
    }

    fn close_reasoning(&mut self, out: &mut Vec<Event>) {
        if let Some(message_id) = self.reasoning.take() {
            out.push(Event::ReasoningMessageEnd {
                message_id: message_id.clone(),
            });
            out.push(Event::ReasoningEnd { message_id });
        }
    }

    fn enter_step(&mut self, step: u32, out: &mut Vec<Event>) {
        if self.step == Some(step) {
            return;
        }
        self.close_message(out);
        if let Some(previous) = self.step {
            out.push(Event::StepFinished {
                step_name: format!("step-{previous}"),
            });
        }
        out.push(Event::StepStarted {
            step_name: format!("step-{step}"),
        });
        self.step = Some(step);
    }

    fn leave_step(&mut self, out: &mut Vec<Event>) {
        self.close_message(out);
        if let Some(step) = self.step.take() {
            out.push(Event::StepFinished {
                step_name: format!("step-{step}"),
            });
        }
    }

    fn say(&mut self, said: Vec<Say>, out: &mut Vec<Event>) {
        for say in said {
            match say {
                Say::Text(text) if text.is_empty() => {}
                Say::Text(delta) => {
                    let message_id = match &self.message {
                        Some(id) => id.clone(),
                        None => {
                            self.messages += 1;
                            let id = format!("{}-m{}", self.run_id, self.messages);
                            out.push(Event::TextMessageStart {
                                message_id: id.clone(),
                                role: "assistant",
                            });
                            self.message = Some(id.clone());
                            self.last_message = Some(id.clone());
                            id
                        }
                    };
                    out.push(Event::TextMessageContent { message_id, delta });
                }
                Say::Retract { step, reason } => {
                    self.close_message(out);
                    out.push(Event::Custom {
                        name: "message.retracted",
                        value: Custom::Retracted {
                            message_id: self.last_message.clone(),
                            step,
                            reason,
                        },
                    });
                }
            }
        }
    }

    /// A tool call's `TOOL_CALL_START`, `_ARGS` and `_END`.
    fn tool_call(call_id: &str, tool: &str, arguments: &Value, out: &mut Vec<Event>) {
        out.extend([
            Event::ToolCallStart {
                tool_call_id: call_id.to_owned(),
                tool_call_name: tool.to_owned(),
            },
            Event::ToolCallArgs {
                tool_call_id: call_id.to_owned(),
                delta: arguments.to_string(),
            },
            Event::ToolCallEnd {
                tool_call_id: call_id.to_owned(),
            },
        ]);
    }

    /// `RUN_FINISHED`, with the turn's answer or the interrupt it waits on,
    /// and what the run's provider calls used.
    fn finished(&self, result: Option<RunResult>, outcome: Option<Outcome>) -> Event {
        let used = self.used;
        Event::RunFinished {
            thread_id: self.thread_id.clone(),
            run_id: self.run_id.clone(),
            result,
            outcome,
            usage: if used == events::TokenUsage::default() {
                Vec::new()
            } else {
                vec![events::TokenUsage {
                    total_tokens: used.input_tokens.saturating_add(used.output_tokens),
                    ..used
                }]
            },
        }
    }

    /// Adds a provider call's `usage` to the run's.
    fn count(&mut self, event: &TurnEvent) {
        if let TurnEvent::Usage {
            step: Some(_),
            input_tokens,
            output_tokens,
            cache_read_tokens,
            cache_creation_tokens,
            reasoning_tokens,
            ..
        } = event
        {
            let used = &mut self.used;
            used.input_tokens = used.input_tokens.saturating_add(*input_tokens);
            used.output_tokens = used.output_tokens.saturating_add(*output_tokens);
            used.cached_input_tokens = used.cached_input_tokens.saturating_add(*cache_read_tokens);
            used.cache_write_input_tokens = used
                .cache_write_input_tokens
                .saturating_add(*cache_creation_tokens);
            used.reasoning_tokens = used.reasoning_tokens.saturating_add(*reasoning_tokens);
        }
    }
}

impl SegmentEncoder for Encoder {
    fn start(&mut self, _: uuid::Uuid) -> Vec<Event> {
        vec![Event::RunStarted {
            thread_id: self.thread_id.clone(),
            run_id: self.run_id.clone(),
            parent_run_id: self.parent_run_id.clone(),
        }]
    }

    fn unreadable(&mut self) -> Event {
        Event::RunError {
            message: "the event log cannot be read".to_owned(),
            code: "event_log_unavailable".to_owned(),
        }
    }
}

impl EndsAtClientCall for Encoder {
    type Chunk = Event;

    /// A call of the client's tool: the run ends with it.
    fn client_call(&mut self, call_id: &str, tool: &str, arguments: &Value) -> Vec<Event> {
        let mut out = Vec::new();
        let said = self.said.other();
        self.say(said, &mut out);
        self.close_message(&mut out);
        Self::tool_call(call_id, tool, arguments, &mut out);
        self.leave_step(&mut out);
        let outcome = Outcome::Success {
            pending_tool_call_ids: vec![call_id.to_owned()],
        };
        out.push(self.finished(None, Some(outcome)));
        out
    }

    /// A call that waits for approval: the run ends with an interrupt.
    fn approval(&mut self, call_id: &str, tool: &str, arguments: &Value) -> Vec<Event> {
        let (tool, _) = client_name(tool);
        let mut out = Vec::new();
        let said = self.said.other();
        self.say(said, &mut out);
        self.leave_step(&mut out);
        let interrupt = Interrupt {
            id: call_id.to_owned(),
            reason: "tool_approval",
            message: format!("{tool} waits for your approval"),
            tool_call_id: call_id.to_owned(),
            response_schema: RESPONSE_SCHEMA,
            metadata: InterruptTool {
                tool: tool.to_owned(),
                arguments: arguments.clone(),
            },
        };
        let outcome = Outcome::Interrupt {
            interrupts: vec![interrupt],
        };
        out.push(self.finished(None, Some(outcome)));
        out
    }

    /// The events of `event`; the second value is true when the run ends.
    fn event(&mut self, event: &TurnEvent) -> (Vec<Event>, bool) {
        let mut out = Vec::new();
        if ends_text(event) {
            let said = self.said.other();
            self.say(said, &mut out);
        }
        self.count(event);
        match event {
            TurnEvent::ReasoningDelta { step, text } => {
                self.enter_step(*step, &mut out);
                self.reason(text, &mut out);
            }
            TurnEvent::ReasoningCompleted { .. } => self.close_reasoning(&mut out),
            TurnEvent::MessageDelta { step, text } => {
                self.enter_step(*step, &mut out);
                self.close_reasoning(&mut out);
                let said = self.said.delta(*step, text);
                self.say(said, &mut out);
            }
            TurnEvent::MessageRetracted { step, reason } => self.said.retracted(*step, reason),
            TurnEvent::TurnResumed {
                owner,
                attempt,
                from_step,
            } => out.push(Event::Custom {
                name: "turn.resumed",
                value: Custom::Resumed {
                    owner: owner.clone(),
                    attempt: *attempt,
                    from_step: *from_step,
                },
            }),
            // A call a person's approval edited starts again: the client sent
            // the edit, and its first start stands.
            TurnEvent::ToolStarted { edited: true, .. } => {}
            TurnEvent::ToolStarted {
                step,
                call_id,
                tool,
                arguments,
                ..
            } => {
                self.enter_step(*step, &mut out);
                self.close_message(&mut out);
                Self::tool_call(call_id, tool, arguments, &mut out);
            }
            TurnEvent::ToolFinished { .. } => out.extend(self.tool_result(event)),
            TurnEvent::TurnCompleted { result } => {
                self.leave_step(&mut out);
                let result = RunResult {
                    text: result.text.clone(),
                    local_citations: result.local_citations.clone(),
                    web_citations: result.web_citations.clone(),
                };
                out.push(self.finished(Some(result), None));
                return (out, true);
            }
            TurnEvent::TurnFailed { code, message, .. } => {
                self.leave_step(&mut out);
                out.push(Event::RunError {
                    message: message.clone(),
                    code: code.clone(),
                });
                return (out, true);
            }
            // Stopped, not failed: AG-UI 1.0's cancelled outcome.
            TurnEvent::TurnCancelled { .. } | TurnEvent::TurnInterrupted { .. } => {
                self.leave_step(&mut out);
                out.push(self.finished(None, Some(Outcome::Cancelled)));
                return (out, true);
            }
            _ => {}
        }
        (out, false)
    }
}

impl Encoder {
    /// The `TOOL_CALL_RESULT` of a `tool.finished`.
    fn tool_result(&mut self, event: &TurnEvent) -> Option<Event> {
        let (call_id, shown) = super::finished_call(event)?;
        let content = match shown {
            Ok(output) => output,
            Err((status, Some(why))) => format!("{}: {why}", status.as_str()),
            Err((status, None)) => status.as_str().to_owned(),
        };
        self.messages += 1;
        Some(Event::ToolCallResult {
            message_id: format!("{}-m{}", self.run_id, self.messages),
            tool_call_id: call_id.to_owned(),
            content,
            role: "tool",
        })
    }
}

/// A turn as an AG-UI run.
#[utoipa::path(
    post,
    path = "/v1/agui",
    tag = "turns",
    request_body = RunAgentInput,
    responses(
        (status = 200, description = "AG-UI events (`data: {…}` lines)", content_type = "text/event-stream", body = crate::protocols::native::stream::EventStream),
        BadRequest,
        (status = 404, description = "A `tool` message answers a call the thread's turn did not ask for (`call_not_found`)"),
        TurnAlreadyRunning,
        InvalidBody,
    )
)]
async fn agui_run(
    State(app): State<Shared>,
    Extension(tenant): Extension<Tenant>,
    ApiJson(body): ApiJson<RunAgentInput>,
) -> Result<Response, ApiError> {
    let named = |id: &Option<String>| {
        id.clone()
            .filter(|r| !r.trim().is_empty() && r.len() <= 128 && !r.chars().any(char::is_control))
    };
    let run_id = named(&body.run_id);
    let parent_run_id = named(&body.parent_run_id);
    let branch_from = match &parent_run_id {
        Some(parent) => {
            let session = crate::protocols::paths::parse_session_id(&body.thread_id, &tenant)?;
            match app.turns.turn_of_run(&session, parent).await? {
                Some(turn) => Some(turn),
                None => return Err(ApiError::TurnNotFound),
            }
        }
        None => None,
    };
    let ConversationTurn {
        session_id,
        turn_id,
        after,
        events,
        ..
    } = ConversationTurn::open(
        &app,
        &tenant,
        &body.thread_id,
        crate::protocols::parts::said(
            body.messages
                .iter()
                .map(|m| (m.role.as_str(), m.content.as_ref())),
            "messages",
        )?,
        Replies {
            answers: tool_results(&body.messages),
            decisions: decisions(&body.resume)?,
        },
        ("tools", body.tools),
        Placement {
            branch_from,
            run_id: run_id.clone(),
            multitask: body
                .forwarded_props
                .as_ref()
                .and_then(|props| props.multitask)
                .unwrap_or_default(),
            ..Placement::default()
        },
    )
    .await?;
    // A run that answered an interrupt goes on with its turn: it branched
    // from nothing.
    let parent_run_id = parent_run_id.filter(|_| after == 0);
    let session = session_id.id().to_owned();
    let run_id = run_id.unwrap_or_else(|| turn_id.to_string());
    let encoder = Encoder {
        thread_id: session,
        run_id,
        parent_run_id,
        message: None,
        last_message: None,
        messages: 0,
        step: None,
        said: StepText::default(),
        reasoning: None,
        used: events::TokenUsage::default(),
    };
    let format = SegmentStream::new(turn_id, after, encoder);
    Ok(stream_for(&app, format, events))
}
