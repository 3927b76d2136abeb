//! `TurnFinalizer`: the seeds' post-loop steps, in order, each isolated so
//! that a failing step is logged and recorded but the result is still
//! returned.
//!
//! 1. citations appended (at most 8 local and 8 web)
//! 2. usage callback, only when a count is non-zero
//! 3. assistant message logged (its id is the learner's source event)
//! 4. memory extraction
//! 5. research learner observation
//! 6. judge scheduling
//! 7. decision record `support.chat.turn`
//! 8. turn end callback
//!
//! The messages and the decision are not written here: they are handed to
//! the runner, which commits them in one transaction with `turn.completed`.

use serde_json::{Value, json};
use uuid::Uuid;

use crate::turn::TurnResult;

use super::{
    AgentHarness, EventSink, TurnOutput,
    hooks::{Exchange, HookError, JudgeRequest, MemoryTurn, isolate},
    state::{CitationAccumulator, ToolResultRecord, WebCitation},
};
use crate::{
    events::TurnEvent,
    providers::{ChatMessage, Usage},
    store::{NewDecision, NewJob, NewMessage, ObservationRecord},
};

/// Items of each kind appended to the answer.
pub const MAX_CITATIONS: usize = 8;

/// The decision key of a turn.
pub const DECISION_KEY: &str = "support.chat.turn";

/// Appends the citation lists to `text` (seeds' `_append_citations`).
pub fn append_citations(text: &str, local: &[String], web: &[WebCitation]) -> String {
    let mut out = text.to_owned();
    if !local.is_empty() {
        out.push_str("\n\nLocal citations:");
        for anchor in local.iter().take(MAX_CITATIONS) {
            out.push_str("\n- ");
            out.push_str(anchor);
        }
    }
    if !web.is_empty() {
        out.push_str("\n\nWeb citations:");
        for citation in web.iter().take(MAX_CITATIONS) {
            if citation.title.is_empty() {
                out.push_str(&format!("\n- {}", citation.url));
            } else {
                out.push_str(&format!("\n- {}: {}", citation.title, citation.url));
            }
        }
    }
    out
}

/// Every strategy a decision record names (the seeds'), in
/// [`classify_strategy`]'s order of precedence (last: any other tool).
pub const STRATEGIES: [&str; 4] = [
    "direct_answer",
    "web_augmented",
    "retrieval_augmented",
    "tool_assisted",
];

/// The strategy of a turn from the tools it used successfully.
pub fn classify_strategy(tools_used: &[String]) -> &'static str {
    let used = |name: &str| tools_used.iter().any(|t| t == name);
    if tools_used.is_empty() {
        STRATEGIES[0]
    } else if used("web_search") || used("fetch_url") {
        STRATEGIES[1]
    } else if used("local_search") || used("get_context_pack") {
        STRATEGIES[2]
    } else {
        STRATEGIES[3]
    }
}

/// At most `max` characters of `text`.
fn preview(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

/// The prompt as flat text for judges (seeds' `_messages_to_text`).
pub fn messages_to_text(messages: &[ChatMessage]) -> String {
    messages
        .iter()
        .map(|m| format!("[{}] {}", m.role.as_str(), m.content))
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// What the finalizer gets from the loop.
pub(super) struct FinalizeInput {
    pub session_id: crate::ids::SessionKey,
    pub turn_id: Uuid,
    /// What the turn was asked.
    pub asked: std::sync::Arc<crate::turn::TurnRequest>,
    pub final_text: String,
    pub stop_reason: crate::turn::StopReason,
    pub context_pack: Value,
    pub context_hash: String,
    pub prompt_messages: Vec<ChatMessage>,
    pub prompt_render_hash: String,
    pub tool_results: Vec<ToolResultRecord>,
    pub usage: Usage,
    pub cost_usd: Option<f64>,
    pub session_cost_before: Option<f64>,
    pub elapsed_ms: u64,
    pub citations: CitationAccumulator,
    pub turn_number: u64,
    pub timed_out: bool,
    pub context_was_compacted: bool,
    pub memory_scope: String,
    /// The messages steered into the turn, in order: the history keeps
    /// them after its question.
    pub steered: Vec<String>,
    /// The provider and model that answered.
    pub provider: String,
    pub model: String,
}

/// A finalizer step that failed; the turn went on.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StepFailure {
    pub step: &'static str,
    pub error: String,
}

/// The failures of the finalizer's steps, in order; the turn goes on.
#[derive(Default)]
struct Failures(Vec<StepFailure>);

impl Failures {
    fn record(&mut self, step: &'static str, result: Result<(), HookError>) {
        if let Err(e) = result {
            tracing::warn!(step, error = %e, "finalizer step failed; the turn goes on");
            self.0.push(StepFailure {
                step,
                error: e.to_string(),
            });
        }
    }
}

pub(super) async fn finalize(
    harness: &AgentHarness,
    input: FinalizeInput,
    sink: &dyn EventSink,
) -> Result<TurnOutput, super::SinkError> {
    let mut failures = Failures::default();
    let text = cite(&input, sink).await?;
    report_usage(harness, &input, sink, &mut failures).await?;
    let assistant_message_id = Uuid::now_v7();
    let messages = history_messages(&input, &text, assistant_message_id);
    let extraction = extract_memory(harness, &input, &text, &mut failures).await;
    let observation =
        observe_for_learner(harness, &input, &text, assistant_message_id, &mut failures).await;
    let judgings = schedule_judges(harness, &input, &text, &mut failures).await;
    let judges_scheduled = judgings.len();
    let strategy = classify_strategy(&tools_used(&input.tool_results));
    let decision = record_decision(
        harness,
        &input,
        DecisionFacts {
            assistant_message_id,
            strategy,
            judges_scheduled,
            failures: &failures.0,
        },
        sink,
    )
    .await?;
    end_turn(harness, &input.session_id).await;

    let usage = input.usage;
    let output = output_of(&input);
    let citations = input.citations;
    Ok(TurnOutput {
        result: TurnResult {
            output,
            text,
            stop_reason: input.stop_reason,
            local_citations: citations.local,
            web_citations: citations.web,
            rendered_content_paths: citations.rendered_paths,
            context_pack_json: Some(input.context_pack),
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            cache_read_tokens: usage.cache_read_tokens,
            cache_creation_tokens: usage.cache_creation_tokens,
            reasoning_tokens: usage.reasoning_tokens,
            cost_usd: input.cost_usd,
            session_cost_usd: match (input.session_cost_before, input.cost_usd) {
                (None, None) => None,
                (before, now) => Some(before.unwrap_or(0.0) + now.unwrap_or(0.0)),
            },
        },
        assistant_message_id,
        messages,
        decision,
        observation,
        jobs: extraction.into_iter().chain(judgings).collect(),
        strategy: strategy.to_owned(),
        step_failures: failures.0,
    })
}

/// Step 1: the answer's text, with the citation lists when asked for; the
/// `citations` event when there are any.
async fn cite(input: &FinalizeInput, sink: &dyn EventSink) -> Result<String, super::SinkError> {
    let citations = &input.citations;
    // JSON asked for is the answer alone: citations would break it.
    let text = if input.asked.show_citations && input.asked.output.is_none() {
        append_citations(&input.final_text, &citations.local, &citations.web)
    } else {
        input.final_text.clone()
    };
    if !citations.local.is_empty() || !citations.web.is_empty() {
        sink.emit(TurnEvent::Citations {
            local: citations.local.clone(),
            web: citations.web.clone(),
        })
        .await?;
    }
    Ok(text)
}

/// The answer as JSON, when the turn asked for JSON and its answer fit
/// (the loop checked it: see `step::fitted`).
fn output_of(input: &FinalizeInput) -> Option<serde_json::Value> {
    let asked = input.asked.output.as_ref()?;
    if input.stop_reason != crate::turn::StopReason::Answer {
        return None;
    }
    let value = super::generate::parsed_json(&input.final_text)?;
    (asked.schema.is_none() && value.is_object() || asked.schema.is_some()).then_some(value)
}

/// Step 2: the usage callback and the turn's total `usage` event, only when
/// something was counted.
async fn report_usage(
    harness: &AgentHarness,
    input: &FinalizeInput,
    sink: &dyn EventSink,
    failures: &mut Failures,
) -> Result<(), super::SinkError> {
    let usage = input.usage;
    if usage.input_tokens == 0 && usage.output_tokens == 0 {
        return Ok(());
    }
    failures.record(
        "usage_callback",
        isolate(async {
            harness
                .callbacks
                .on_usage(usage.input_tokens, usage.output_tokens)
                .await;
            Ok(())
        })
        .await,
    );
    sink.emit(TurnEvent::Usage {
        step: None,
        input_tokens: usage.input_tokens,
        output_tokens: usage.output_tokens,
        cache_read_tokens: usage.cache_read_tokens,
        cache_creation_tokens: usage.cache_creation_tokens,
        reasoning_tokens: usage.reasoning_tokens,
        cost_usd: input.cost_usd,
    })
    .await
}

/// Step 3: the user message and the answer for the history (committed with the
/// turn's end), the answer under the id the turn refers to it by.
fn history_messages(
    input: &FinalizeInput,
    text: &str,
    assistant_message_id: Uuid,
) -> Vec<NewMessage> {
    let mut messages = Vec::with_capacity(2 + input.steered.len());
    messages.push(NewMessage {
        id: Uuid::now_v7(),
        role: "user".into(),
        content: input.asked.message.clone(),
        // Its images and files, as the turn's request names them (file
        // ids, never bytes): later turns send them again.
        attachments: (!input.asked.attachments.is_empty())
            .then(|| serde_json::to_string(&input.asked.attachments).ok())
            .flatten(),
    });
    // What was steered in, as the user sent it, before the answer that
    // heard it.
    messages.extend(input.steered.iter().map(|message| NewMessage {
        id: Uuid::now_v7(),
        role: "user".into(),
        content: message.clone(),
        attachments: None,
    }));
    messages.push(NewMessage {
        id: assistant_message_id,
        role: "assistant".into(),
        content: text.to_owned(),
        attachments: None,
    });
    messages
}

/// Step 4: memory extraction, when an extractor is configured.
async fn extract_memory(
    harness: &AgentHarness,
    input: &FinalizeInput,
    text: &str,
    failures: &mut Failures,
) -> Option<NewJob> {
    let extractor = harness.memory_extractor.as_ref()?;
    let turn = MemoryTurn {
        scope: input.memory_scope.clone(),
        session_id: input.session_id.clone(),
        turn_id: input.turn_id.to_string(),
        user_message: input.asked.message.clone(),
        assistant_message: text.to_owned(),
        tool_results: input.tool_results.clone(),
        provider: input.provider.clone(),
        model: input.model.clone(),
    };
    match isolate(extractor.extract_turn(&turn)).await {
        Ok(job) => job,
        Err(e) => {
            failures.record("memory_extraction", Err(e));
            None
        }
    }
}

/// Step 5: the research learner's observation, its source the stored
/// answer; kept with the turn's end.
async fn observe_for_learner(
    harness: &AgentHarness,
    input: &FinalizeInput,
    text: &str,
    assistant_message_id: Uuid,
    failures: &mut Failures,
) -> Option<ObservationRecord> {
    let learner = harness.research_learner.as_ref()?;
    let source_id = format!("chat_message:{assistant_message_id}");
    let exchange = Exchange {
        session_id: &input.session_id,
        user_text: &input.asked.message,
        assistant_text: text,
        source_id: &source_id,
    };
    match isolate(learner.observe_turn(exchange)).await {
        Ok(observation) => observation,
        Err(e) => {
            failures.record("research_learner", Err(e));
            None
        }
    }
}

/// Step 6: the judges of the prompt, when it has any: their jobs, kept
/// with the turn's end.
async fn schedule_judges(
    harness: &AgentHarness,
    input: &FinalizeInput,
    text: &str,
    failures: &mut Failures,
) -> Vec<NewJob> {
    let (Some(judges), Some(prompt_id)) = (&harness.judges, harness.options.prompt_id.as_deref())
    else {
        return Vec::new();
    };
    if judges.judges_for(prompt_id).is_empty() {
        return Vec::new();
    }
    let facts = input.context_pack["relevant_facts"]
        .as_array()
        .map(|facts| {
            facts
                .iter()
                .map(|f| {
                    f["text"]
                        .as_str()
                        .map_or_else(|| f.to_string(), str::to_owned)
                })
                .collect()
        })
        .unwrap_or_default();
    let request = JudgeRequest {
        prompt_id: prompt_id.to_owned(),
        prompt_version: harness.options.prompt_version.clone().unwrap_or_default(),
        session_id: input.session_id.clone(),
        turn_id: input.turn_id.to_string(),
        user_message: input.asked.message.clone(),
        response: text.to_owned(),
        facts,
        messages_text: messages_to_text(&input.prompt_messages),
        provider: input.provider.clone(),
        model: input.model.clone(),
    };
    match isolate(judges.schedule(request)).await {
        Ok(jobs) => jobs,
        Err(e) => {
            failures.record("judge_scheduling", Err(e));
            Vec::new()
        }
    }
}

/// The tools that completed at least once, in order of first use.
fn tools_used(results: &[ToolResultRecord]) -> Vec<String> {
    let mut used: Vec<String> = Vec::new();
    for result in results
        .iter()
        .filter(|r| r.status == crate::events::ToolStatus::Completed)
    {
        if !used.contains(&result.tool) {
            used.push(result.tool.clone());
        }
    }
    used
}

/// What the decision record takes from the earlier steps.
struct DecisionFacts<'a> {
    assistant_message_id: Uuid,
    strategy: &'static str,
    judges_scheduled: usize,
    failures: &'a [StepFailure],
}

/// Step 7: the `support.chat.turn` decision record and its event, unless
/// decisions are off.
async fn record_decision(
    harness: &AgentHarness,
    input: &FinalizeInput,
    facts: DecisionFacts<'_>,
    sink: &dyn EventSink,
) -> Result<Option<NewDecision>, super::SinkError> {
    if !harness.options.record_decisions {
        return Ok(None);
    }
    let usage = input.usage;
    let mut record = json!({
        "decision_key": DECISION_KEY,
        "session_id": crate::ids::client_session_id(&input.session_id),
        "turn_id": input.turn_id,
        "turn_number": input.turn_number,
        "assistant_message_id": facts.assistant_message_id,
        "strategy": facts.strategy,
        "tools_used": tools_used(&input.tool_results),
        "tool_calls": input.tool_results.len(),
        "context_hash": input.context_hash,
        "prompt_id": harness.options.prompt_id,
        "prompt_version": harness.options.prompt_version,
        "prompt_render_hash": input.prompt_render_hash,
        "prompt_tags": harness.options.prompt_tags,
        "prompt_engine": harness.options.prompt_engine,
        "prompt_variables": harness.options.prompt_variables,
        "run_context_metadata": harness.options.run_context_metadata,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cost_usd": input.cost_usd,
        "elapsed_ms": input.elapsed_ms,
        "timed_out": input.timed_out,
        "stop_reason": input.stop_reason,
        "context_was_compacted": input.context_was_compacted,
        "judges_scheduled": facts.judges_scheduled,
        "user_message": preview(&input.asked.message, 200),
        "finalizer_failures": facts.failures,
    });
    // The texts a record carries (the message, the failures' errors, the
    // operator's metadata) are masked; ids, hashes and counts are not text.
    if harness.options.redact_logs {
        for field in ["user_message", "finalizer_failures", "run_context_metadata"] {
            crate::pii::redact_json(&mut record[field]);
        }
    }
    sink.emit(TurnEvent::Decision {
        decision_key: DECISION_KEY.to_owned(),
        strategy: facts.strategy.to_owned(),
        record: record.clone(),
    })
    .await?;
    Ok(Some(NewDecision {
        id: Uuid::now_v7(),
        decision_key: DECISION_KEY.to_owned(),
        strategy: facts.strategy.to_owned(),
        record: record.to_string(),
    }))
}

/// Step 8: the turn-end callback; its failure changes nothing.
async fn end_turn(harness: &AgentHarness, session_id: &str) {
    let _ = isolate(async {
        harness.callbacks.on_turn_end(session_id).await;
        Ok(())
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn citations_use_the_seed_format_and_cap_at_eight_each() {
        let local: Vec<String> = (1..=10).map(|i| format!("notes/{i}.md")).collect();
        let web: Vec<WebCitation> = (1..=10)
            .map(|i| WebCitation {
                title: format!("Page {i}"),
                url: format!("https://example.com/{i}"),
            })
            .collect();
        let text = append_citations("Answer.", &local, &web);
        let expected_local: String = (1..=8).map(|i| format!("\n- notes/{i}.md")).collect();
        let expected_web: String = (1..=8)
            .map(|i| format!("\n- Page {i}: https://example.com/{i}"))
            .collect();
        assert_eq!(
            text,
            format!("Answer.\n\nLocal citations:{expected_local}\n\nWeb citations:{expected_web}")
        );
        assert_eq!(append_citations("Answer.", &[], &[]), "Answer.");
        assert_eq!(
            append_citations("A", &["notes/project.md".into()], &[]),
            "A\n\nLocal citations:\n- notes/project.md"
        );
    }

    #[test]
    fn strategy_follows_the_seed_table() {
        let names = |n: &[&str]| n.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(classify_strategy(&[]), "direct_answer");
        assert_eq!(classify_strategy(&names(&["web_search"])), "web_augmented");
        assert_eq!(
            classify_strategy(&names(&["local_search"])),
            "retrieval_augmented"
        );
        assert_eq!(
            classify_strategy(&names(&["get_context_pack"])),
            "retrieval_augmented"
        );
        assert_eq!(classify_strategy(&names(&["calculator"])), "tool_assisted");
        assert_eq!(
            classify_strategy(&names(&["local_search", "web_search"])),
            "web_augmented"
        );
        assert_eq!(
            classify_strategy(&names(&["calculator", "local_search"])),
            "retrieval_augmented"
        );
    }

    #[test]
    fn messages_flatten_to_role_blocks() {
        let text = messages_to_text(&[
            ChatMessage::system("You are SecondBrain..."),
            ChatMessage::user("What are my open loops?"),
        ]);
        assert_eq!(
            text,
            "[system] You are SecondBrain...\n\n[user] What are my open loops?"
        );
    }
}
