//! One step of a turn's loop (seeds 4a-4i): the step gate, the provider
//! call streamed as `message.delta` events, and when the model asks for
//! tools, their waves, a reflection and a compaction.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{
    AgentHarness, EventSink, MAX_STEPS_TEXT, SinkError, TIMEOUT_TEXT, TurnError, TurnInput,
    compaction::{self, ContextLevel},
    durable::{Prepared, PriorCalls, Recorded, StepPhase, StepRecord},
    gates::CallEnv,
    generate::{StepOutput, emit_usage, generate},
    replay::ReplayControl,
    scheduler,
    state::TurnRuntimeState,
    thinking::{self, SideCall},
    waves,
};
use crate::{
    events::TurnEvent,
    providers::{
        ChatMessage, ChatRequest, FinishReason, ProviderError, ToolCall, ToolDefinition, Usage,
    },
    turn::StopReason,
    when_woken::when_woken,
};

/// What every step of one turn shares.
pub(super) struct Turn<'a> {
    pub harness: &'a AgentHarness,
    pub request: &'a TurnInput,
    pub state: &'a Arc<TurnRuntimeState>,
    pub sink: &'a Arc<dyn EventSink>,
    pub turn_cancel: &'a CancellationToken,
    pub offered: Vec<Arc<ToolDefinition>>,
    pub replay: ReplayControl,
    pub provider_name: &'a str,
    pub model: &'a str,
    /// What the turn prepared, for its first record.
    pub prepared: &'a Prepared,
    /// The prepared prompt.
    pub prompt: &'a [ChatMessage],
}

/// The prompt as it grows over the steps, where the user's question is,
/// and how much of it the turn's records hold.
pub(super) struct Conversation {
    pub messages: Vec<ChatMessage>,
    pub question_at: usize,
    pub recorded: Recorded,
}

impl Turn<'_> {
    /// The cost of a provider call, when its model is priced.
    fn cost(&self, usage: &Usage) -> Option<f64> {
        self.harness.cost_tracker.as_ref().and_then(|c| {
            c.record(
                &self.request.session_id,
                self.provider_name,
                self.model,
                usage,
            )
        })
    }

    /// Reflection and compaction ask the turn's model on the turn's provider.
    fn side_call(&self) -> SideCall<'_> {
        SideCall {
            model: self.model,
            provider: self.request.asked.runtime_provider.as_deref(),
        }
    }

    /// One step (4a-4i): the step gate, a provider call, and, when it asks
    /// for tools, their waves, a reflection and a compaction. `Some`: the
    /// turn's final text (an answer, or the timeout or step-limit text) and
    /// why the loop stops.
    pub(super) async fn step(
        &self,
        conversation: &mut Conversation,
    ) -> Result<Option<(String, StopReason)>, TurnError> {
        let state = self.state;
        // A process handing its turns over stops here, between steps.
        if self.request.handover.is_cancelled() {
            return Err(TurnError::HandedOver);
        }
        // 4a: step gate and deadline.
        if state.budget.is_expired() {
            state.set_timed_out();
            return Ok(Some((TIMEOUT_TEXT.to_owned(), StopReason::Deadline)));
        }
        if !state.budget.claim_step() {
            return Ok(Some((MAX_STEPS_TEXT.to_owned(), StopReason::MaxSteps)));
        }
        let step = state.budget.steps_used();

        // Earlier images and PDFs that alone make the prompt too large
        // are left out before the call (text is compacted after a step).
        if compaction::has_earlier_attachments(&conversation.messages, conversation.question_at) {
            self.compact_if_critical(step, conversation, false).await?;
        }
        // Messages steered in since the last step, after its tool results.
        self.take_steers(step, conversation).await?;
        // 4c: generation, streamed.
        let Some(mut output) = self.call_model(step, &conversation.messages).await? else {
            state.set_timed_out();
            return Ok(Some((TIMEOUT_TEXT.to_owned(), StopReason::Deadline)));
        };
        state.add_tokens(&output.usage);
        state.add_cost(output.cost_usd);
        // Before any event names them: approvals and client results are
        // keyed by these ids.
        state.hand_out_call_ids(&mut output.tool_calls, &conversation.messages, step);

        // 4d: terminal check. An answer that must be JSON is checked, and
        // asked again (a bounded repair) when it does not fit.
        if output.tool_calls.is_empty() {
            let reason = match output.finish {
                Some(FinishReason::Length) => StopReason::Budget,
                _ => StopReason::Answer,
            };
            if reason == StopReason::Answer
                && let Some(why) = output.unfit
            {
                if state.repair_count(OUTPUT_REPAIRS) >= MAX_REPAIR_ATTEMPTS {
                    return Ok(Some((output.text, StopReason::OutputInvalid)));
                }
                state.count_repair(OUTPUT_REPAIRS);
                conversation
                    .messages
                    .push(ChatMessage::assistant(output.text, Vec::new()));
                conversation.messages.push(ChatMessage::user(format!(
                    "Your answer is not the JSON asked for ({why}). Answer again with the JSON \
                     alone: no prose, no code fence."
                )));
                return Ok(None);
            }
            return Ok(Some((output.text, reason)));
        }

        // 4e-4g: waves of tool calls through the gates.
        // The step's reasoning travels back with its calls: Anthropic
        // refuses a tool result whose call lost its signed thinking block.
        conversation.messages.push(ChatMessage {
            thinking: output.thinking,
            ..ChatMessage::assistant(output.text, output.tool_calls.clone())
        });
        // When one of its calls may change something, the model's answer
        // is recorded, and the calls run once that record is durable: a
        // process that dies then leaves the calls to its successor (which
        // runs each at most once), not a second answer. A step whose calls
        // only read (or name no tool) writes no such record: its `finished`
        // one carries the answer too, and a process that dies mid-wave
        // leaves the step to be asked again (reads are safe to redo), which
        // spares every read-only step a row.
        // A call of the client's own tool is recorded too, and one that
        // waits for a person's approval: the client (or the person)
        // answers that call (its id), so a successor, or the turn going on
        // after a park, waits on the same one.
        let approved = |effect| {
            self.harness.approvals.is_some()
                && self.harness.options.approval_effects.contains(&effect)
        };
        let changes = output.tool_calls.iter().any(|call| {
            self.request.asked.client_tool(&call.name).is_some()
                || self.harness.tools.get(&call.name).is_some_and(|tool| {
                    let effect = tool.spec().effect;
                    effect != crate::tools::EffectClass::ReadOnly || approved(effect)
                })
        });
        if changes {
            self.record(conversation, step, StepPhase::Answered, true)
                .await?;
        }
        self.run_tools(
            step,
            &output.tool_calls,
            conversation,
            &PriorCalls::default(),
        )
        .await?;
        Ok(None)
    }

    /// 4e-4i for the calls the model asked for at `step` (the last message
    /// of `conversation`): their waves, a reflection and a compaction, and
    /// the step's record. `prior`: what the log shows of these calls, when
    /// the turn goes on from a step a process that died began.
    pub(super) async fn run_tools(
        &self,
        step: u32,
        calls: &[ToolCall],
        conversation: &mut Conversation,
        prior: &PriorCalls,
    ) -> Result<(), TurnError> {
        let (harness, state) = (self.harness, self.state);
        let waves = scheduler::schedule(calls, &harness.tools, harness.options.parallel_enabled);
        let env = CallEnv {
            harness,
            request: self.request,
            state,
            replay: &self.replay,
            sink: self.sink,
            turn_cancel: self.turn_cancel,
            step,
            prior,
        };
        let (tool_messages, any_error) = match waves::run_waves(&env, calls, &waves).await? {
            waves::Waves::Ran(messages, any_error) => (messages, any_error),
            waves::Waves::Parked(parked) => return Err(TurnError::Parked(parked)),
        };
        // The calls people approved with other arguments are in the
        // model's history as they ran (the record then holds it whole).
        let edited = state.take_edited();
        if !edited.is_empty() {
            for message in conversation.messages.iter_mut().rev() {
                if message.tool_calls.is_empty() {
                    continue;
                }
                for call in &mut message.tool_calls {
                    if let Some(arguments) = edited.get(&call.id) {
                        call.arguments = crate::providers::Arguments::new(arguments.clone());
                    }
                }
                break;
            }
            conversation.recorded.messages = 0;
        }
        conversation.messages.extend(tool_messages);

        // 4h: reflection.
        if harness
            .thinking
            .should_reflect(self.request.turn_number, any_error)
        {
            self.reflect(step, &mut conversation.messages).await?;
        }
        // 4i: compaction at the critical level.
        self.compact_if_critical(step, conversation, true).await?;
        self.record(conversation, step, StepPhase::Finished, false)
            .await?;
        Ok(())
    }

    /// Writes the step's record: what the conversation and the tool
    /// results gained since the turn's previous one, and the state now.
    async fn record(
        &self,
        conversation: &mut Conversation,
        step: u32,
        phase: StepPhase,
        wait: bool,
    ) -> Result<(), SinkError> {
        let recorded = &conversation.recorded;
        // A conversation shorter than what was recorded was rewritten: it
        // is recorded whole.
        let after = if recorded.messages <= conversation.messages.len() {
            recorded.messages
        } else {
            0
        };
        let results = self.state.tool_results();
        let record = StepRecord {
            step,
            phase,
            after,
            messages: conversation.messages[after..].to_vec(),
            question_at: conversation.question_at,
            tool_results: results
                .get(recorded.tool_results..)
                .unwrap_or_default()
                .to_vec(),
            state: self.state.snapshot(&self.replay),
            prepared: (!recorded.any).then(|| Prepared {
                // Rewritten before this first record: the prompt is not
                // what its messages begin with.
                prompt: (!conversation.messages.starts_with(self.prompt))
                    .then(|| self.prompt.to_vec()),
                ..self.prepared.clone()
            }),
        };
        self.sink.step_done(record, wait).await?;
        conversation.recorded = Recorded {
            messages: conversation.messages.len(),
            tool_results: results.len(),
            any: true,
        };
        Ok(())
    }

    /// 4c: the provider call of `step`, in its span; `None` when the turn's
    /// deadline ran out during it.
    #[expect(
        clippy::too_many_lines,
        reason = "one provider call's stream in one loop: deltas, tool calls, restarts, the deadline"
    )]
    async fn call_model(
        &self,
        step: u32,
        messages: &[ChatMessage],
    ) -> Result<Option<StepOutput>, TurnError> {
        let harness = self.harness;
        let model = self.model;
        let asked = &self.request.asked;
        let catalogue = harness.models.as_ref().and_then(|m| m.max_output(model));
        let options = &harness.options;
        // The operator's ceilings hold whatever the model or the request.
        let max_output_tokens = [
            catalogue,
            asked.max_output_tokens,
            options.max_output_tokens,
        ]
        .into_iter()
        .flatten()
        .min();
        let call = ChatRequest {
            max_output_tokens,
            tools: self.offered.clone(),
            think_level: asked
                .think_level
                .unwrap_or(options.think_level)
                .min(options.max_think_level),
            provider: self.request.asked.runtime_provider.clone(),
            output: self.request.asked.output.clone(),
            ..ChatRequest::new(
                model,
                with_bytes(messages, &self.request.attachments, &self.request.earlier),
                self.state.budget.remaining(),
            )
        };
        let span = tracing::info_span!(
            "gen_ai.chat",
            otel.name = format!("chat {model}"),
            gen_ai.operation.name = "chat",
            gen_ai.provider.name = %self.provider_name,
            gen_ai.request.model = %model,
            gen_ai.usage.input_tokens = tracing::field::Empty,
            gen_ai.usage.output_tokens = tracing::field::Empty,
            gen_ai.input.messages = tracing::field::Empty,
            gen_ai.output.messages = tracing::field::Empty,
            turn.step = step,
            otel.kind = "client",
            error.type = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        // Prompt and answer text reach telemetry only when asked for.
        if harness.options.capture_content {
            let input = serde_json::to_string(&call.messages).unwrap_or_default();
            span.record("gen_ai.input.messages", input.as_str());
        }
        let cost = |usage: &Usage| self.cost(usage);
        let repairs = self.state.repair_count(OUTPUT_REPAIRS) < MAX_REPAIR_ATTEMPTS;
        let reasoning = self.request.reasoning.unwrap_or(harness.options.reasoning);
        let generated = generate(
            harness,
            call,
            step,
            self.sink.as_ref(),
            &cost,
            repairs,
            reasoning,
        )
        .instrument(span.clone());
        // A process handing its turns over does not wait for the model:
        // the next owner asks again (and retracts what streamed).
        let generated = tokio::select! {
            generated = generated => generated,
            () = when_woken(self.request.handover.cancelled()) => Err(TurnError::HandedOver),
        };
        let output = match generated {
            Err(TurnError::HandedOver) => return Err(TurnError::HandedOver),
            Ok(output) => output,
            Err(TurnError::Provider(ProviderError::Timeout(_)))
                if self.state.budget.is_expired() =>
            {
                // The seeds' timeout text ends the turn; the provider that
                // did not answer in time is still a provider timeout.
                span.record("error.type", "provider_timeout");
                harness
                    .callbacks
                    .on_provider_error("provider_timeout")
                    .await;
                return Ok(None);
            }
            Err(e) => {
                if let TurnError::Provider(failure) = &e {
                    harness.callbacks.on_provider_error(failure.code()).await;
                }
                span.record("error.type", e.code());
                span.record("otel.status_code", "ERROR");
                return Err(e);
            }
        };
        if harness.options.capture_content {
            span.record("gen_ai.output.messages", output.text.as_str());
        }
        // Signed, so that the span attribute is an integer (OpenTelemetry
        // has no unsigned type).
        let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        span.record(
            "gen_ai.usage.input_tokens",
            count(output.usage.input_tokens),
        );
        span.record(
            "gen_ai.usage.output_tokens",
            count(output.usage.output_tokens),
        );
        Ok(Some(output))
    }

    /// 4h: a reflection on the tool results; the model sees it unless it is
    /// a stub.
    async fn reflect(&self, step: u32, messages: &mut Vec<ChatMessage>) -> Result<(), TurnError> {
        let reflection = thinking::reflect(
            self.harness.provider.as_ref(),
            self.side_call(),
            messages,
            &self.state.tool_results(),
            &self.state.budget,
        )
        .await;
        let cost = |usage: &Usage| self.cost(usage);
        account(
            self.state,
            self.sink.as_ref(),
            step,
            &reflection.usage,
            &cost,
        )
        .await?;
        self.sink
            .emit(TurnEvent::Reflection {
                step,
                text: reflection.text.clone(),
                stub: reflection.stub,
                reason: reflection.reason.clone(),
            })
            .await?;
        if !reflection.stub {
            // The reflection restates tool results (and whatever pages
            // they echo): data for the next step, not instructions.
            messages.push(ChatMessage::system(super::prepare::untrusted_block(
                super::prepare::REFLECTION_INTRO,
                &reflection.text,
            )));
        }
        Ok(())
    }

    /// 4i: compaction when the prompt reaches the critical level: the
    /// images and PDFs of earlier messages first, oldest first, then (when
    /// `summarise`) the older messages' text.
    async fn compact_if_critical(
        &self,
        step: u32,
        conversation: &mut Conversation,
        summarise: bool,
    ) -> Result<(), TurnError> {
        let harness = self.harness;
        if !harness.options.auto_compact {
            return Ok(());
        }
        let Some(tracker) = &harness.context_tracker else {
            return Ok(());
        };
        let tokens = compaction::estimate_tokens(&conversation.messages);
        match tracker.level(self.model, tokens) {
            ContextLevel::Critical => {
                let fits = |tokens| tracker.level(self.model, tokens) < ContextLevel::Critical;
                let dropped = compaction::drop_oldest_attachments(
                    &mut conversation.messages,
                    conversation.question_at,
                    fits,
                );
                let mut done = compaction::Compaction {
                    removed_messages: 0,
                    removed_attachments: dropped,
                    tokens_before: tokens,
                    tokens_after: compaction::estimate_tokens(&conversation.messages),
                    question_at: conversation.question_at,
                    usage: Usage::default(),
                };
                if summarise
                    && !fits(done.tokens_after)
                    && let Some(summarised) = compaction::compact(
                        harness.provider.as_ref(),
                        self.side_call(),
                        &mut conversation.messages,
                        conversation.question_at,
                        &self.state.budget,
                    )
                    .await
                {
                    let cost = |usage: &Usage| self.cost(usage);
                    account(
                        self.state,
                        self.sink.as_ref(),
                        step,
                        &summarised.usage,
                        &cost,
                    )
                    .await?;
                    done = compaction::Compaction {
                        removed_attachments: dropped + summarised.removed_attachments,
                        tokens_before: tokens,
                        ..summarised
                    };
                }
                if done.removed_messages == 0 && done.removed_attachments == 0 {
                    return Ok(());
                }
                conversation.question_at = done.question_at;
                // Rewritten: the next record holds it whole.
                conversation.recorded.messages = 0;
                self.state.set_context_compacted();
                self.sink
                    .emit(TurnEvent::ContextCompacted {
                        step,
                        removed_messages: done.removed_messages,
                        removed_attachments: done.removed_attachments,
                        tokens_before: done.tokens_before,
                        tokens_after: done.tokens_after,
                    })
                    .await?;
            }
            ContextLevel::Warning if summarise => {
                tracing::info!(
                    tokens,
                    window = tracker.window(self.model),
                    "context window filling up"
                );
            }
            ContextLevel::Warning | ContextLevel::Ok => {}
        }
        Ok(())
    }
}

/// Counts a reflection's or a compaction's provider call in the turn's
/// usage and cost, with its own `usage` event (like every provider call).
async fn account(
    state: &TurnRuntimeState,
    sink: &dyn EventSink,
    step: u32,
    usage: &Usage,
    cost: &(dyn Fn(&Usage) -> Option<f64> + Sync),
) -> Result<(), SinkError> {
    if usage.is_zero() {
        return Ok(());
    }
    let cost_usd = cost(usage);
    state.add_tokens(usage);
    state.add_cost(cost_usd);
    emit_usage(sink, step, usage, cost_usd).await
}

/// The conversation a call sends: its messages, each attachment with its
/// bytes (a record of a message keeps its file alone: a turn taken over
/// has them from its request's files).
fn with_bytes(
    messages: &[ChatMessage],
    loaded: &[crate::providers::Attachment],
    earlier: &[crate::providers::Attachment],
) -> Vec<ChatMessage> {
    let mut messages = messages.to_vec();
    if loaded.is_empty() && earlier.is_empty() {
        return messages;
    }
    for attachment in messages.iter_mut().flat_map(|m| m.attachments.iter_mut()) {
        if attachment.data.is_none() {
            attachment.data = loaded
                .iter()
                .chain(earlier)
                .find(|l| l.file_id == attachment.file_id)
                .and_then(|l| l.data.clone());
        }
    }
    messages
}

/// The repair counter of a turn's answer (beside its calls' ids).
const OUTPUT_REPAIRS: &str = "#output";

use super::validation::MAX_REPAIR_ATTEMPTS;
