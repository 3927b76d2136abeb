//! `ThinkingManager` and `ReflectionEngine`.
//!
//! The think level adds thinking instructions to the system prompt; above
//! OFF it also enables reflection: after a tool wave with an error, or on
//! every `reflect_every`-th turn of a session, the model is asked to reflect
//! on the tool results so far. A reflection claims a budget slot and always
//! yields a result: a stub when the budget, the deadline or the provider
//! says no.

use std::time::Duration;

use super::{budget::TurnBudget, state::ToolResultRecord};
pub use crate::providers::ThinkLevel;
use crate::providers::{ChatMessage, ChatRequest, LlmProvider, Usage, collect_text};

/// Thinking instructions and the reflection schedule.
#[derive(Debug, Clone, Copy, Default)]
pub struct ThinkingManager {
    pub level: ThinkLevel,
    /// 0: never periodically; N: every N-th turn of a session.
    pub reflect_every: u32,
}

impl ThinkingManager {
    /// The system prompt with the level's thinking instructions.
    pub fn system_prompt(&self, base: &str) -> String {
        let instructions = match self.level {
            ThinkLevel::Off => return base.to_owned(),
            ThinkLevel::Low => "Think briefly before answering. Prefer a direct answer.",
            ThinkLevel::Medium => {
                "Think step by step before answering: restate the goal, note what you \
                 know and what you need, then answer."
            }
            ThinkLevel::High => {
                "Think carefully and step by step before answering: restate the goal, \
                 list what you know and what is missing, consider alternatives, check \
                 your reasoning against the tool results, then answer."
            }
        };
        format!("{base}\n\n## Thinking Instructions\n{instructions}")
    }

    /// Whether to reflect after a wave. `turn_number` is 1-based.
    pub fn should_reflect(&self, turn_number: u64, tool_error: bool) -> bool {
        if self.level == ThinkLevel::Off {
            return false;
        }
        let periodic =
            self.reflect_every > 0 && turn_number.is_multiple_of(u64::from(self.reflect_every));
        tool_error || periodic
    }
}

/// The outcome of a reflection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReflectionResult {
    pub text: String,
    /// True when no reflection ran (see `reason`).
    pub stub: bool,
    pub reason: Option<String>,
    /// What the reflection call used (counted in the turn's usage and cost).
    pub usage: Usage,
}

impl ReflectionResult {
    fn stub(reason: &str, usage: Usage) -> Self {
        Self {
            text: String::new(),
            stub: true,
            reason: Some(reason.to_owned()),
            usage,
        }
    }
}

/// Where the harness's own provider calls (reflection, compaction) go: the
/// turn's model on the turn's provider.
#[derive(Debug, Clone, Copy)]
pub struct SideCall<'a> {
    pub model: &'a str,
    /// The turn's `runtime_provider` (a chain picks it), if it named one.
    pub provider: Option<&'a str>,
}

impl SideCall<'_> {
    /// A request for this target.
    pub fn request(&self, messages: Vec<ChatMessage>, timeout: Duration) -> ChatRequest {
        ChatRequest {
            provider: self.provider.map(str::to_owned),
            ..ChatRequest::new(self.model, messages, timeout)
        }
    }
}

/// Longest a reflection call may take.
const REFLECTION_TIMEOUT: Duration = Duration::from_secs(20);

/// Asks the model to reflect on the tool results. Never fails.
pub async fn reflect(
    provider: &dyn LlmProvider,
    target: SideCall<'_>,
    messages: &[ChatMessage],
    tool_results: &[ToolResultRecord],
    budget: &TurnBudget,
) -> ReflectionResult {
    if budget.is_expired() {
        return ReflectionResult::stub("deadline", Usage::default());
    }
    if !budget.claim_reflection() {
        return ReflectionResult::stub("budget", Usage::default());
    }
    let summary: String = tool_results
        .iter()
        .map(|r| {
            let content: String = r.content.chars().take(500).collect();
            format!("- {} ({}): {}\n", r.tool, r.status, content)
        })
        .collect();
    let mut prompt = messages.to_vec();
    prompt.push(ChatMessage::user(format!(
        "Reflect briefly on the tool results so far: what worked, what failed and \
         what to do next. Do not answer the user yet.\n\nTool results:\n{summary}"
    )));
    let request = target.request(prompt, budget.clamp(REFLECTION_TIMEOUT));
    let collected = collect_text(provider, request).await;
    if let Some(e) = &collected.error {
        tracing::warn!(error = %e, "reflection failed");
        return ReflectionResult::stub("error", collected.usage);
    }
    if collected.text.trim().is_empty() {
        return ReflectionResult::stub("empty", collected.usage);
    }
    ReflectionResult {
        text: collected.text,
        stub: false,
        reason: None,
        usage: collected.usage,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_adds_nothing_and_never_reflects() {
        let off = ThinkingManager {
            level: ThinkLevel::Off,
            reflect_every: 1,
        };
        assert_eq!(off.system_prompt("base"), "base");
        assert!(!off.should_reflect(1, true));
    }

    #[test]
    fn levels_add_instructions_and_reflect_on_errors_or_every_n_turns() {
        let low = ThinkingManager {
            level: ThinkLevel::Low,
            reflect_every: 3,
        };
        assert!(
            low.system_prompt("base")
                .starts_with("base\n\n## Thinking Instructions\n")
        );
        assert!(low.should_reflect(1, true));
        assert!(!low.should_reflect(1, false));
        assert!(!low.should_reflect(2, false));
        assert!(low.should_reflect(3, false));
        assert!(low.should_reflect(6, false));
        let never_periodic = ThinkingManager {
            level: ThinkLevel::High,
            reflect_every: 0,
        };
        assert!(!never_periodic.should_reflect(4, false));
        assert_eq!("MEDIUM".parse::<ThinkLevel>(), Ok(ThinkLevel::Medium));
        assert!("loud".parse::<ThinkLevel>().is_err());
    }
}
