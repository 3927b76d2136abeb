//! `run_turn`, stage by stage (seeds: `003`).

use std::sync::Arc;

use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{
    AgentHarness, EventSink, TurnError, TurnInput, TurnOutput,
    durable::{Prepared, PriorCalls, Recorded, Resume, StepPhase},
    executor::{self, Executed},
    finalizer::{self, FinalizeInput},
    hooks::{MemoryContext, isolate},
    prepare::{PrepareInput, TurnPreparer},
    replay::ReplayControl,
    selector,
    state::TurnRuntimeState,
    step::{Conversation, Turn},
    waves,
};
use crate::{
    events::TurnEvent,
    providers::{ChatMessage, ToolCall, ToolDefinition},
    tools::ToolContext,
};

pub(super) async fn run(
    harness: &AgentHarness,
    request: TurnInput,
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
    let prep = assemble(harness, &request, &context_pack, &memory.text);
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
    let messages = prep.messages;
    // The turn's user message is the last of the prepared prompt; compaction
    // keeps it wherever it moves.
    let question_at = messages.len().saturating_sub(1);
    let prepared = Prepared {
        provider: prep.resolved_provider,
        model: prep.resolved_model,
        context_pack,
        context_hash: prep.context_hash,
        prompt_render_hash: prep.prompt_render_hash,
        prompt_len: messages.len(),
        prompt: None,
    };
    let going = Going {
        sink,
        state,
        turn_cancel,
        prompt: messages.clone(),
        prepared,
        started,
        replay: ReplayControl::default(),
        answered: None,
    };
    let conversation = Conversation {
        messages,
        question_at,
        recorded: Recorded::default(),
    };
    go_on(harness, &request, going, conversation).await
}

/// Stage 3: the turn's prompt, from its history, the context pack and the
/// memories.
fn assemble(
    harness: &AgentHarness,
    request: &TurnInput,
    context_pack: &serde_json::Value,
    memory_text: &str,
) -> super::prepare::TurnPreparation {
    let system_prompt = harness
        .thinking
        .system_prompt(&harness.options.system_prompt);
    TurnPreparer.prepare(
        harness.provider.as_ref(),
        &PrepareInput {
            session_id: &request.session_id,
            history: &request.history,
            asked: &request.asked,
            attachments: &request.attachments,
            context_pack,
            memory_context_text: memory_text,
            system_prompt: &system_prompt,
            today: chrono::Utc::now().date_naive(),
        },
    )
}

/// A turn going on from its records in a process that did not begin it:
/// stages 0 to 3 are not run again (the records hold what they made), and
/// the loop starts where the last record left it.
pub(super) async fn resume(
    harness: &AgentHarness,
    request: TurnInput,
    sink: Arc<dyn EventSink>,
    resume: Resume,
) -> Result<TurnOutput, TurnError> {
    let Resume {
        from,
        prior,
        started,
        state,
    } = resume;
    let turn_cancel = CancellationToken::new();
    let _cancel_on_drop = turn_cancel.clone().drop_guard();
    let _close_on_drop = CloseWrites(state.clone());
    state.set_prompt_render_hash(&from.prepared.prompt_render_hash);
    let answered = match from.phase {
        // The step's calls are the answer's, the conversation's last message.
        StepPhase::Answered => from
            .messages
            .last()
            .map(|answer| (from.step, answer.tool_calls.clone(), prior)),
        StepPhase::Finished => None,
    };
    let going = Going {
        sink,
        state,
        turn_cancel,
        replay: from.replay(),
        prompt: from.prompt,
        prepared: from.prepared,
        started,
        answered,
    };
    let conversation = Conversation {
        recorded: Recorded {
            messages: from.messages.len(),
            tool_results: from.tool_results.len(),
            any: true,
        },
        messages: from.messages,
        question_at: from.question_at,
    };
    go_on(harness, &request, going, conversation).await
}

/// What the loop and the end need of the turn's start.
struct Going {
    sink: Arc<dyn EventSink>,
    state: Arc<TurnRuntimeState>,
    /// Cancels the turn's tool tasks (the caller keeps its drop guard).
    turn_cancel: CancellationToken,
    /// The prepared prompt.
    prompt: Vec<ChatMessage>,
    prepared: Prepared,
    started: Instant,
    replay: ReplayControl,
    /// A step whose model answer is recorded but whose calls did not
    /// all end: its number, calls, and what the log shows of them.
    answered: Option<(u32, Vec<ToolCall>, PriorCalls)>,
}

/// Stages 4 to 6: the loop from where `conversation` stands, and the end.
async fn go_on(
    harness: &AgentHarness,
    request: &TurnInput,
    going: Going,
    mut conversation: Conversation,
) -> Result<TurnOutput, TurnError> {
    let Going {
        sink,
        state,
        turn_cancel,
        prompt,
        prepared,
        started,
        replay,
        answered,
    } = going;
    // Stage 4: the bounded loop, a step at a time.
    let (sink, state, turn_cancel) = (&sink, &state, &turn_cancel);
    let turn = Turn {
        harness,
        request,
        state,
        sink,
        turn_cancel,
        // Stage 4b: the tools offered this turn.
        offered: offered_tools(harness, request).await,
        replay,
        provider_name: &prepared.provider,
        model: &prepared.model,
        prepared: &prepared,
        prompt: &prompt,
    };
    if let Some((step, calls, prior)) = answered {
        turn.run_tools(step, &calls, &mut conversation, &prior)
            .await?;
    }
    let (final_text, stop_reason) = loop {
        if let Some(end) = turn.step(&mut conversation).await? {
            break end;
        }
    };
    state.set_final_text(final_text.clone());

    // Stage 5: the write gate closes; late tool tasks write nothing from now on.
    state.close_writes();

    // Stage 6: finalization.
    let Prepared {
        provider,
        model,
        context_pack,
        context_hash,
        prompt_render_hash,
        ..
    } = prepared;
    let input = FinalizeInput {
        session_id: request.session_id.clone(),
        turn_id: request.turn_id,
        asked: request.asked.clone(),
        final_text,
        stop_reason,
        context_pack,
        context_hash,
        prompt_messages: prompt,
        prompt_render_hash,
        tool_results: state.tool_results(),
        usage: state.tokens(),
        cost_usd: state.cost_usd(),
        session_cost_before: request.session_cost_before,
        elapsed_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        citations: state.citations(),
        turn_number: request.turn_number,
        timed_out: state.timed_out(),
        context_was_compacted: state.context_was_compacted(),
        memory_scope: request.memory_scope.clone(),
        steered: state.steered(),
        provider,
        model,
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
async fn offered_tools(harness: &AgentHarness, request: &TurnInput) -> Vec<Arc<ToolDefinition>> {
    let allowed: Vec<_> = harness
        .tools
        .offered()
        .into_iter()
        .filter(|t| harness.is_tool_allowed(&t.spec().name, request))
        .collect();
    let chosen = if harness.options.enable_semantic_selection {
        selector::select(
            allowed,
            &request.asked.message,
            harness.options.max_tools_per_turn,
            harness.tool_embeddings.as_deref(),
        )
        .await
    } else {
        allowed
    };
    let mut offered: Vec<Arc<ToolDefinition>> = chosen
        .iter()
        .filter_map(|t| harness.tools.definition(&t.spec().name))
        .collect();
    // The client's own tools, when calls of them can get their results.
    if harness.client_results.is_some() {
        let mode = harness.tools.mode();
        let permitted = request.asked.client_tools.iter();
        offered.extend(permitted.filter(|t| mode.permits(t.effect)).map(|t| {
            Arc::new(ToolDefinition {
                name: t.offered_name(),
                description: format!("{}{}", crate::turn::CLIENT_TOOL_INTRO, t.description),
                parameters: t.parameters.clone(),
            })
        }));
    }
    offered
}

/// Stage 1a: episodic memory; an empty bundle when absent or failing.
async fn load_memory(harness: &AgentHarness, request: &TurnInput) -> MemoryContext {
    let Some(retriever) = &harness.memory_retriever else {
        return MemoryContext::default();
    };
    let (scope, message) = (&request.memory_scope, &request.asked.message);
    let retrieved = match request.memories.clone() {
        Some(read) => isolate(retriever.retrieve_with(scope, message, read)).await,
        None => isolate(retriever.retrieve_for_context(scope, message)).await,
    };
    match retrieved {
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
    request: &TurnInput,
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
        top_k: request.asked.top_k,
        web_mode: request.asked.web_mode,
        cancel: turn_cancel.child_token(),
    };
    let arguments = json!({ "query": request.asked.message, "top_k": request.asked.top_k });
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
                    waves::add_citations(state, &output.citations);
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
