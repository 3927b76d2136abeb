//! The bounded loop of a turn: step gate and deadline, a streamed provider
//! call per step, text deltas out as events, tool calls answered, final
//! text or the seeds' fallback texts.

use futures::StreamExt;
use tokio::time::Instant;
use tracing::Instrument;

use super::{
    AgentHarness, EventSink, MAX_STEPS_TEXT, TIMEOUT_TEXT, TurnError, TurnRequest, TurnResult,
    prepare,
};
use crate::{
    events::TurnEvent,
    providers::{ChatMessage, ChatRequest, ProviderError, ProviderEvent, ToolCall, Usage},
};

/// What one provider call produced.
struct StepOutput {
    text: String,
    tool_calls: Vec<ToolCall>,
    usage: Usage,
}

pub(super) async fn run(
    harness: &AgentHarness,
    request: TurnRequest,
    sink: &dyn EventSink,
) -> Result<TurnResult, TurnError> {
    let deadline = Instant::now() + harness.config.timeout;
    let (provider_name, model) = harness.resolve_provider_model(
        request.runtime_provider.as_deref(),
        request.runtime_model.as_deref(),
    );
    let today = chrono::Utc::now().date_naive();
    let mut messages = prepare::messages(
        &harness.config.system_prompt,
        &request,
        &provider_name,
        &model,
        today,
    );
    let mut total = Usage::default();
    let mut final_text = None;

    for step in 1..=harness.config.max_steps {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            final_text = Some(TIMEOUT_TEXT.to_owned());
            break;
        }
        let call = ChatRequest {
            model: model.clone(),
            messages: messages.clone(),
            tools: Vec::new(),
            timeout: remaining,
        };
        let span = tracing::info_span!(
            "gen_ai.chat",
            otel.name = format!("chat {model}"),
            gen_ai.operation.name = "chat",
            gen_ai.provider.name = %provider_name,
            gen_ai.request.model = %model,
            gen_ai.usage.input_tokens = tracing::field::Empty,
            gen_ai.usage.output_tokens = tracing::field::Empty,
            gen_ai.response.finish_reasons = tracing::field::Empty,
            turn.step = step,
        );
        let output = match generate(harness, call, step, sink)
            .instrument(span.clone())
            .await
        {
            Ok(output) => output,
            Err(TurnError::Provider(ProviderError::Timeout(_))) if Instant::now() >= deadline => {
                final_text = Some(TIMEOUT_TEXT.to_owned());
                break;
            }
            Err(e) => return Err(e),
        };
        span.record("gen_ai.usage.input_tokens", output.usage.input_tokens);
        span.record("gen_ai.usage.output_tokens", output.usage.output_tokens);
        add_usage(&mut total, &output.usage);
        if output.tool_calls.is_empty() {
            final_text = Some(output.text);
            break;
        }
        // No tool is registered yet: every call gets a tool message saying so,
        // so the transcript stays valid and the model can answer without it.
        messages.push(ChatMessage::assistant(
            output.text,
            output.tool_calls.clone(),
        ));
        for call in &output.tool_calls {
            messages.push(ChatMessage::tool(
                &call.id,
                format!("Error: tool {:?} is not available in this turn.", call.name),
            ));
        }
    }

    Ok(TurnResult {
        text: final_text.unwrap_or_else(|| MAX_STEPS_TEXT.to_owned()),
        input_tokens: total.input_tokens,
        output_tokens: total.output_tokens,
        cache_read_tokens: total.cache_read_tokens,
        cache_creation_tokens: total.cache_creation_tokens,
        ..TurnResult::default()
    })
}

fn add_usage(total: &mut Usage, step: &Usage) {
    total.input_tokens += step.input_tokens;
    total.output_tokens += step.output_tokens;
    total.cache_read_tokens += step.cache_read_tokens;
    total.cache_creation_tokens += step.cache_creation_tokens;
}

/// One provider call, streamed: text deltas become `message.delta` events
/// as they arrive; usage becomes one `usage` event.
async fn generate(
    harness: &AgentHarness,
    call: ChatRequest,
    step: u32,
    sink: &dyn EventSink,
) -> Result<StepOutput, TurnError> {
    let mut stream = harness.provider.stream(call).await?;
    let mut output = StepOutput {
        text: String::new(),
        tool_calls: Vec::new(),
        usage: Usage::default(),
    };
    while let Some(event) = stream.next().await {
        match event? {
            ProviderEvent::TextDelta(text) => {
                output.text.push_str(&text);
                sink.emit(TurnEvent::MessageDelta { step, text }).await?;
            }
            ProviderEvent::ToolCall(call) => output.tool_calls.push(call),
            ProviderEvent::Usage(usage) => add_usage(&mut output.usage, &usage),
            ProviderEvent::Finished(reason) => {
                tracing::Span::current()
                    .record("gen_ai.response.finish_reasons", format!("{reason:?}"));
                break;
            }
        }
    }
    if !output.usage.is_zero() {
        sink.emit(TurnEvent::Usage {
            step,
            input_tokens: output.usage.input_tokens,
            output_tokens: output.usage.output_tokens,
            cache_read_tokens: output.usage.cache_read_tokens,
            cache_creation_tokens: output.usage.cache_creation_tokens,
        })
        .await?;
    }
    Ok(output)
}
