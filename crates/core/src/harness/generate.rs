//! One provider call of a step (seeds 4c): its stream read into the
//! step's output, text and reasoning passed on as events as they come (a
//! turn that asks for JSON holds its text back until it is checked), and
//! its usage.

use futures::StreamExt;

use super::{AgentHarness, EventSink, SinkError, TurnError};
use crate::{
    events::TurnEvent,
    providers::{ChatRequest, FinishReason, ProviderEvent, ThinkingBlock, ToolCall, Usage},
};

/// What one provider call produced.
pub(super) struct StepOutput {
    pub(super) cost_usd: Option<f64>,
    /// Why the provider ended its answer, when it said.
    pub(super) finish: Option<FinishReason>,
    pub(super) text: String,
    pub(super) tool_calls: Vec<ToolCall>,
    pub(super) thinking: Vec<ThinkingBlock>,
    pub(super) usage: Usage,
    /// Why an answer that must be JSON does not fit.
    pub(super) unfit: Option<String>,
}

/// 4c: one provider call, streamed: text deltas become `message.delta`
/// events as they arrive; usage becomes one `usage` event. The text of a
/// turn that asks for JSON is held back and checked first: said whole
/// when it fits (or is the last try, or the step calls tools), never
/// when it is to be asked again (`repairs`: whether it may be).
pub(super) async fn generate(
    harness: &AgentHarness,
    call: ChatRequest,
    step: u32,
    sink: &dyn EventSink,
    cost: &(dyn Fn(&Usage) -> Option<f64> + Sync),
    repairs: bool,
    reasoning: super::Reasoning,
) -> Result<StepOutput, TurnError> {
    let format = call.output.clone();
    let stream_text = harness.options.stream && format.is_none();
    let mut stream = harness.provider.stream(call).await?;
    let mut output = StepOutput {
        cost_usd: None,
        finish: None,
        text: String::new(),
        tool_calls: Vec::new(),
        thinking: Vec::new(),
        usage: Usage::default(),
        unfit: None,
    };
    let mut streamed = false;
    // Bytes of reasoning the step streamed.
    let mut reasoned = 0usize;
    let shows_reasoning = reasoning == super::Reasoning::Show;
    // Bytes of reasoning in all (for its tokens, where the provider does
    // not count them apart).
    let mut reasoned_all = 0usize;
    while let Some(event) = stream.next().await {
        let event = event?.without_nul();
        // The reasoning ends where anything else comes.
        if !matches!(event, ProviderEvent::ReasoningDelta(_)) {
            reasoning_ends(sink, step, &mut reasoned, shows_reasoning).await?;
        }
        match event {
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
            ProviderEvent::ReasoningDelta(text) => {
                reasoned += text.len();
                reasoned_all += text.len();
                if shows_reasoning {
                    sink.emit(TurnEvent::ReasoningDelta { step, text }).await?;
                }
            }
            ProviderEvent::TextDelta(text) => {
                output.text.push_str(&text);
                // Without streaming the text arrives once, in the result.
                if stream_text {
                    harness.callbacks.on_stream_chunk(&text).await;
                    sink.emit(TurnEvent::MessageDelta { step, text }).await?;
                    streamed = true;
                }
            }
            ProviderEvent::ToolCall(call) => output.tool_calls.push(call),
            ProviderEvent::Usage(usage) => output.usage.add(&usage),
            ProviderEvent::Finished(reason) => {
                // An array of strings, as the conventions have it.
                use tracing_opentelemetry::OpenTelemetrySpanExt as _;
                tracing::Span::current().set_attribute(
                    "gen_ai.response.finish_reasons",
                    opentelemetry::Value::Array(opentelemetry::Array::String(vec![
                        reason.as_str().to_owned().into(),
                    ])),
                );
                output.finish = Some(reason);
                break;
            }
        }
    }
    reasoning_ends(sink, step, &mut reasoned, shows_reasoning).await?;
    if let Some(format) = &format {
        held_text(harness, sink, step, format, repairs, &mut output).await?;
    }
    if output.usage.reasoning_tokens == 0 && reasoned_all > 0 {
        // Not reported apart (Anthropic, Ollama): counted as the
        // reasoning's text, within the output it is part of.
        let counted = u64::try_from(reasoned_all.div_ceil(4)).unwrap_or(u64::MAX);
        output.usage.reasoning_tokens = counted.min(output.usage.output_tokens);
    }
    if !output.usage.is_zero() {
        output.cost_usd = cost(&output.usage);
        emit_usage(sink, step, &output.usage, output.cost_usd).await?;
    }
    Ok(output)
}

/// The end of a step's reasoning (`reasoned` bytes of it, if any):
/// `reasoning.completed`, with about as many tokens as a quarter of them.
async fn reasoning_ends(
    sink: &dyn EventSink,
    step: u32,
    reasoned: &mut usize,
    shown: bool,
) -> Result<(), SinkError> {
    if *reasoned > 0 && shown {
        let tokens = u64::try_from(reasoned.div_ceil(4)).unwrap_or(u64::MAX);
        sink.emit(TurnEvent::ReasoningCompleted { step, tokens })
            .await?;
    }
    *reasoned = 0;
    Ok(())
}

/// The held text of a turn that asks for JSON: checked when it is an
/// answer, and said whole unless it is to be asked again.
async fn held_text(
    harness: &AgentHarness,
    sink: &dyn EventSink,
    step: u32,
    format: &crate::turn::OutputFormat,
    repairs: bool,
    output: &mut StepOutput,
) -> Result<(), SinkError> {
    let answers = output.tool_calls.is_empty() && output.finish != Some(FinishReason::Length);
    if answers {
        output.unfit = fitted(format, &output.text).err();
    }
    let shown = !(output.unfit.is_some() && repairs);
    if shown && harness.options.stream && !output.text.is_empty() {
        harness.callbacks.on_stream_chunk(&output.text).await;
        let text = output.text.clone();
        sink.emit(TurnEvent::MessageDelta { step, text }).await?;
    }
    Ok(())
}

/// The `usage` event of one provider call.
pub(super) async fn emit_usage(
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
        reasoning_tokens: usage.reasoning_tokens,
        cost_usd,
    })
    .await
}

/// An answer's JSON: the whole text, or the one code block it is fenced
/// in (models often fence it).
pub fn parsed_json(text: &str) -> Option<serde_json::Value> {
    let trimmed = text.trim();
    let inner = trimmed
        .strip_prefix("```json")
        .or_else(|| trimmed.strip_prefix("```"))
        .and_then(|rest| rest.strip_suffix("```"))
        .unwrap_or(trimmed);
    serde_json::from_str(inner.trim()).ok()
}

/// Whether an answer is the JSON `format` asks for: any object, or an
/// instance of its schema; why not, in a line the model can act on.
pub(super) fn fitted(format: &crate::turn::OutputFormat, text: &str) -> Result<(), String> {
    let Some(value) = parsed_json(text) else {
        return Err("it is not JSON".into());
    };
    let Some(schema) = &format.schema else {
        return if value.is_object() {
            Ok(())
        } else {
            Err("it is not a JSON object".into())
        };
    };
    let validator = jsonschema::validator_for(schema).map_err(|e| e.to_string())?;
    let errors: Vec<String> = validator
        .iter_errors(&value)
        .take(5)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "it does not fit the schema `{}`: {}",
            format.name,
            errors.join("; ")
        ))
    }
}
