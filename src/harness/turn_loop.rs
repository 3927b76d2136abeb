//! `run_turn`, stage by stage (seeds: `003`).

use std::sync::Arc;

use futures::StreamExt;
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{
    AgentHarness, EventSink, MAX_STEPS_TEXT, SinkError, TIMEOUT_TEXT, TurnError, TurnOutput,
    TurnRequest,
    compaction::{self, ContextLevel},
    executor::{self, Executed},
    finalizer::{self, FinalizeInput},
    gates::{self, CallEnv},
    hooks::{MemoryContext, isolate},
    prepare::{PrepareInput, TurnPreparer},
    replay::ReplayControl,
    scheduler, selector,
    state::TurnRuntimeState,
    thinking::{self, SideCall},
};
use crate::{
    events::TurnEvent,
    providers::{
        ChatMessage, ChatRequest, ProviderError, ProviderEvent, ThinkingBlock, ToolCall,
        ToolDefinition, Usage,
    },
    tools::ToolContext,
};

pub(super) async fn run(
    harness: &AgentHarness,
    request: TurnRequest,
    sink: Arc<dyn EventSink>,
    state: Arc<TurnRuntimeState>,
) -> Result<TurnOutput, TurnError> {
    let started = Instant::now();
    // Cancels this turn's tool tasks however the turn ends, dropped included.
    let turn_cancel = CancellationToken::new();
    let _cancel_on_drop = turn_cancel.clone().drop_guard();
    // Stage 5's write gate closes however the turn ends: an error return
    // or a dropped future (cancel, shutdown) too, not only a completion.
    let _close_on_drop = CloseWrites(state.clone());

    // Stage 0: turn start.
    let _ = isolate(async {
        harness
            .callbacks
            .on_turn_start(&request.session_id, request.turn_number)
            .await;
        Ok(())
    })
    .await;

    // Stage 1: memory and context pack, concurrently.
    let (memory, mut context_pack) = tokio::join!(
        load_memory(harness, &request),
        load_context_pack(harness, &request, &state, &sink, &turn_cancel),
    );
    merge_preferences(&mut context_pack, &memory.preferences);

    // Stage 2 happened when `state` was made: budget and deadline.
    // Stage 3: message assembly.
    let system_prompt = harness
        .thinking
        .system_prompt(&harness.options.system_prompt);
    let prep = TurnPreparer.prepare(
        harness.provider.as_ref(),
        &PrepareInput {
            session_id: &request.session_id,
            history: &request.history,
            user_message: &request.user_message,
            context_pack: &context_pack,
            memory_context_text: &memory.text,
            runtime_provider: request.runtime_provider.as_deref(),
            runtime_model: request.runtime_model.as_deref(),
            skill_context: request.skill_context.as_deref(),
            system_prompt: &system_prompt,
            today: chrono::Utc::now().date_naive(),
        },
    );
    state.set_prompt_render_hash(&prep.prompt_render_hash);
    if let Some(prompt_id) = &harness.options.prompt_id {
        sink.emit(TurnEvent::PromptRendered {
            prompt_id: prompt_id.clone(),
            prompt_version: harness.options.prompt_version.clone(),
            render_hash: prep.prompt_render_hash.clone(),
            context_hash: prep.context_hash.clone(),
        })
        .await?;
    }
    let prompt_messages = prep.messages.clone();
    let mut messages = prep.messages.clone();
    // The turn's user message is the last of the prepared prompt; compaction
    // keeps it wherever it moves.
    let mut question_at = messages.len().saturating_sub(1);
    let model = prep.resolved_model.clone();
    // Reflection and compaction ask the turn's model on the turn's provider.
    let side_call = SideCall {
        model: &model,
        provider: request.runtime_provider.as_deref(),
    };

    // Stage 4b: the tools offered this turn.
    let offered = offered_tools(harness, &request);
    let replay = ReplayControl::default();

    let cost = |usage: &Usage| {
        harness
            .cost_tracker
            .as_ref()
            .and_then(|c| c.record(&request.session_id, &prep.resolved_provider, &model, usage))
    };

    // Stage 4: the bounded loop.
    let final_text = loop {
        // 4a: step gate and deadline.
        if state.budget.is_expired() {
            state.set_timed_out();
            break TIMEOUT_TEXT.to_owned();
        }
        if !state.budget.claim_step() {
            break MAX_STEPS_TEXT.to_owned();
        }
        let step = state.budget.steps_used();

        // 4c: generation, streamed.
        let call = ChatRequest {
            tools: offered.clone(),
            think_level: harness.options.think_level,
            provider: request.runtime_provider.clone(),
            ..ChatRequest::new(&model, messages.clone(), state.budget.remaining())
        };
        let span = tracing::info_span!(
            "gen_ai.chat",
            otel.name = format!("chat {model}"),
            gen_ai.operation.name = "chat",
            gen_ai.provider.name = %prep.resolved_provider,
            gen_ai.request.model = %model,
            gen_ai.usage.input_tokens = tracing::field::Empty,
            gen_ai.usage.output_tokens = tracing::field::Empty,
            gen_ai.response.finish_reasons = tracing::field::Empty,
            gen_ai.input.messages = tracing::field::Empty,
            gen_ai.output.messages = tracing::field::Empty,
            turn.step = step,
        );
        // Prompt and answer text reach telemetry only when asked for.
        if harness.options.capture_content {
            let input = serde_json::to_string(&call.messages).unwrap_or_default();
            span.record("gen_ai.input.messages", input.as_str());
        }
        let output = match generate(harness, call, step, sink.as_ref(), &cost)
            .instrument(span.clone())
            .await
        {
            Ok(output) => output,
            Err(TurnError::Provider(ProviderError::Timeout(_))) if state.budget.is_expired() => {
                state.set_timed_out();
                break TIMEOUT_TEXT.to_owned();
            }
            Err(e) => return Err(e),
        };
        if harness.options.capture_content {
            span.record("gen_ai.output.messages", output.text.as_str());
        }
        span.record("gen_ai.usage.input_tokens", output.usage.input_tokens);
        span.record("gen_ai.usage.output_tokens", output.usage.output_tokens);
        state.add_tokens(&output.usage);
        state.add_cost(output.cost_usd);

        // 4d: terminal check.
        if output.tool_calls.is_empty() {
            break output.text;
        }

        // 4e-4g: waves of tool calls through the gates.
        // The step's reasoning travels back with its calls: Anthropic
        // refuses a tool result whose call lost its signed thinking block.
        messages.push(ChatMessage {
            thinking: output.thinking,
            ..ChatMessage::assistant(output.text, output.tool_calls.clone())
        });
        let waves = scheduler::schedule(
            &output.tool_calls,
            &harness.tools,
            harness.options.parallel_enabled,
        );
        let env = CallEnv {
            harness,
            request: &request,
            state: &state,
            replay: &replay,
            sink: &sink,
            turn_cancel: &turn_cancel,
            step,
        };
        let (tool_messages, any_error) = gates::run_waves(&env, &output.tool_calls, &waves).await?;
        messages.extend(tool_messages);

        // 4h: reflection.
        if harness
            .thinking
            .should_reflect(request.turn_number, any_error)
        {
            let reflection = thinking::reflect(
                harness.provider.as_ref(),
                side_call,
                &messages,
                &state.tool_results(),
                &state.budget,
            )
            .await;
            account(&state, sink.as_ref(), step, &reflection.usage, &cost).await?;
            sink.emit(TurnEvent::Reflection {
                step,
                text: reflection.text.clone(),
                stub: reflection.stub,
                reason: reflection.reason.clone(),
            })
            .await?;
            if !reflection.stub {
                messages.push(ChatMessage::system(format!(
                    "Reflection: {}",
                    reflection.text
                )));
            }
        }

        // 4i: compaction at the critical level.
        if harness.options.auto_compact
            && let Some(tracker) = &harness.context_tracker
        {
            let tokens = compaction::estimate_tokens(&messages);
            match tracker.level(tokens) {
                ContextLevel::Critical => {
                    if let Some(done) = compaction::compact(
                        harness.provider.as_ref(),
                        side_call,
                        &mut messages,
                        question_at,
                        &state.budget,
                    )
                    .await
                    {
                        question_at = done.question_at;
                        account(&state, sink.as_ref(), step, &done.usage, &cost).await?;
                        state.set_context_compacted();
                        sink.emit(TurnEvent::ContextCompacted {
                            step,
                            removed_messages: done.removed_messages,
                            tokens_before: done.tokens_before,
                            tokens_after: done.tokens_after,
                        })
                        .await?;
                    }
                }
                ContextLevel::Warning => {
                    tracing::info!(
                        tokens,
                        window = tracker.window_tokens,
                        "context window filling up"
                    );
                }
                ContextLevel::Ok => {}
            }
        }
    };
    state.set_final_text(final_text.clone());

    // Stage 5: the write gate closes; late tool tasks write nothing from now on.
    state.close_writes();

    // Stage 6: finalization.
    let input = FinalizeInput {
        session_id: request.session_id.clone(),
        turn_id: request.turn_id,
        user_message: request.user_message.clone(),
        final_text,
        context_pack,
        context_hash: prep.context_hash.clone(),
        prompt_messages,
        prompt_render_hash: prep.prompt_render_hash.clone(),
        tool_results: state.tool_results(),
        usage: state.tokens(),
        cost_usd: state.cost_usd(),
        session_cost_before: request.session_cost_before,
        elapsed_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        show_citations: request.show_citations,
        citations: state.citations(),
        turn_number: request.turn_number,
        timed_out: state.timed_out(),
        context_was_compacted: state.context_was_compacted(),
    };
    Ok(finalizer::finalize(harness, input, sink.as_ref()).await?)
}

/// Closes a turn's write gate when dropped.
struct CloseWrites(Arc<TurnRuntimeState>);

impl Drop for CloseWrites {
    fn drop(&mut self) {
        self.0.close_writes();
    }
}

/// Stage 4b: the definitions of the tools offered this turn: those the
/// registry's mode and the request allow, trimmed to the most related when
/// semantic selection is on.
fn offered_tools(harness: &AgentHarness, request: &TurnRequest) -> Vec<Arc<ToolDefinition>> {
    let allowed: Vec<_> = harness
        .tools
        .offered()
        .into_iter()
        .filter(|t| harness.is_tool_allowed(&t.spec().name, request))
        .collect();
    let chosen = if harness.options.enable_semantic_selection {
        selector::select(
            allowed,
            &request.user_message,
            harness.options.max_tools_per_turn,
        )
    } else {
        allowed
    };
    chosen
        .iter()
        .filter_map(|t| harness.tools.definition(&t.spec().name))
        .collect()
}

/// Stage 1a: episodic memory; an empty bundle when absent or failing.
async fn load_memory(harness: &AgentHarness, request: &TurnRequest) -> MemoryContext {
    let Some(retriever) = &harness.memory_retriever else {
        return MemoryContext::default();
    };
    match isolate(retriever.retrieve_for_context(&request.session_id, &request.user_message)).await
    {
        Ok(memory) => memory,
        Err(e) => {
            tracing::warn!(error = %e, "memory retrieval failed; going on without");
            MemoryContext::default()
        }
    }
}

/// Stage 1b: the `get_context_pack` tool, run directly (not a model call).
async fn load_context_pack(
    harness: &AgentHarness,
    request: &TurnRequest,
    state: &Arc<TurnRuntimeState>,
    sink: &Arc<dyn EventSink>,
    turn_cancel: &CancellationToken,
) -> Value {
    let empty = json!({ "relevant_facts": [], "preferences": [] });
    let Some(tool) = harness.tools.get("get_context_pack").cloned() else {
        return empty;
    };
    if !harness.tools.permits("get_context_pack") {
        return empty;
    }
    let ctx = ToolContext {
        session_id: request.session_id.clone(),
        turn_id: request.turn_id,
        turn_number: request.turn_number,
        call_id: "stage1-context-pack".to_owned(),
        top_k: request.top_k,
        web_mode: request.web_mode,
        cancel: turn_cancel.child_token(),
    };
    let arguments = json!({ "query": request.user_message, "top_k": request.top_k });
    match executor::execute(
        &harness.tasks,
        tool,
        ctx,
        arguments,
        state.clone(),
        sink.clone(),
    )
    .await
    {
        Executed::Completed { output, .. } => {
            match serde_json::from_str::<Value>(&output.content) {
                Ok(pack @ Value::Object(_)) => {
                    // The pack's sources are the turn's sources too.
                    gates::add_citations(state, &output.citations);
                    pack
                }
                _ => empty,
            }
        }
        other => {
            tracing::warn!(outcome = ?other, "context pack failed; going on without");
            empty
        }
    }
}

/// Merges memory preferences into the pack's `preferences`, deduplicated,
/// order kept (seeds: `dict.fromkeys`).
pub(super) fn merge_preferences(pack: &mut Value, preferences: &[String]) {
    if preferences.is_empty() {
        return;
    }
    let Value::Object(map) = pack else { return };
    let mut merged: Vec<Value> = Vec::new();
    let existing = map
        .get("preferences")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for item in existing
        .into_iter()
        .chain(preferences.iter().map(|p| Value::String(p.clone())))
    {
        if !merged.contains(&item) {
            merged.push(item);
        }
    }
    map.insert("preferences".to_owned(), Value::Array(merged));
}

/// What one provider call produced.
struct StepOutput {
    cost_usd: Option<f64>,
    text: String,
    tool_calls: Vec<ToolCall>,
    thinking: Vec<ThinkingBlock>,
    usage: Usage,
}

/// 4c: one provider call, streamed: text deltas become `message.delta`
/// events as they arrive; usage becomes one `usage` event.
async fn generate(
    harness: &AgentHarness,
    call: ChatRequest,
    step: u32,
    sink: &dyn EventSink,
    cost: &(dyn Fn(&Usage) -> Option<f64> + Sync),
) -> Result<StepOutput, TurnError> {
    let mut stream = harness.provider.stream(call).await?;
    let mut output = StepOutput {
        cost_usd: None,
        text: String::new(),
        tool_calls: Vec::new(),
        thinking: Vec::new(),
        usage: Usage::default(),
    };
    let mut streamed = false;
    while let Some(event) = stream.next().await {
        match event? {
            ProviderEvent::Restart { reason } => {
                // Usage of the failed attempt stays counted: it was billed.
                output.text.clear();
                output.tool_calls.clear();
                output.thinking.clear();
                if streamed {
                    sink.emit(TurnEvent::MessageRetracted { step, reason })
                        .await?;
                    streamed = false;
                }
            }
            ProviderEvent::Thinking(block) => output.thinking.push(block),
            ProviderEvent::TextDelta(text) => {
                output.text.push_str(&text);
                // Without streaming the text arrives once, in the result.
                if harness.options.stream {
                    harness.callbacks.on_stream_chunk(&text).await;
                    sink.emit(TurnEvent::MessageDelta { step, text }).await?;
                    streamed = true;
                }
            }
            ProviderEvent::ToolCall(call) => output.tool_calls.push(call),
            ProviderEvent::Usage(usage) => output.usage.add(&usage),
            ProviderEvent::Finished(reason) => {
                tracing::Span::current()
                    .record("gen_ai.response.finish_reasons", format!("{reason:?}"));
                break;
            }
        }
    }
    if !output.usage.is_zero() {
        output.cost_usd = cost(&output.usage);
        emit_usage(sink, step, &output.usage, output.cost_usd).await?;
    }
    Ok(output)
}

/// The `usage` event of one provider call.
async fn emit_usage(
    sink: &dyn EventSink,
    step: u32,
    usage: &Usage,
    cost_usd: Option<f64>,
) -> Result<(), SinkError> {
    sink.emit(TurnEvent::Usage {
        step: Some(step),
        input_tokens: usage.input_tokens,
        output_tokens: usage.output_tokens,
        cache_read_tokens: usage.cache_read_tokens,
        cache_creation_tokens: usage.cache_creation_tokens,
        cost_usd,
    })
    .await
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preferences_merge_without_duplicates_in_order() {
        let mut pack = json!({"relevant_facts": [], "preferences": ["bullets", "metric"]});
        merge_preferences(
            &mut pack,
            &["metric".into(), "short answers".into(), "bullets".into()],
        );
        assert_eq!(
            pack["preferences"],
            json!(["bullets", "metric", "short answers"])
        );
    }
}
