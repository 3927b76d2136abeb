//! Prompt assembly: the message order of the seeds' `TurnPreparer`.

use chrono::{Days, NaiveDate};

use super::TurnRequest;
use crate::providers::{ChatMessage, LlmProvider};

/// The runtime metadata system message of the seeds.
pub fn runtime_metadata(session_id: &str, provider: &str, model: &str, today: NaiveDate) -> String {
    let tomorrow = today.checked_add_days(Days::new(1)).unwrap_or(today);
    format!(
        "Runtime metadata for this chat turn (authoritative):\n\
         - session_id: {session_id}\n\
         - provider: {provider}\n\
         - model: {model}\n\
         - today: {today}\n\
         - tomorrow: {tomorrow}\n\
         Never call tools to find today's date; use the value above."
    )
}

/// Provider and model names: the request's when both are given, otherwise
/// the provider's own, with `name:model` encodings split.
pub(super) fn resolve_provider_model(
    provider: &dyn LlmProvider,
    runtime_provider: Option<&str>,
    runtime_model: Option<&str>,
) -> (String, String) {
    let runtime_provider = runtime_provider.filter(|p| !p.is_empty());
    let runtime_model = runtime_model.filter(|m| !m.is_empty());
    if let (Some(p), Some(m)) = (runtime_provider, runtime_model) {
        return (p.to_owned(), m.to_owned());
    }
    let (name, model) = match provider.default_model().split_once(':') {
        Some((name, model)) if !name.is_empty() && !model.is_empty() => (name, model),
        _ => (provider.name(), provider.default_model()),
    };
    (
        runtime_provider.unwrap_or(name).to_owned(),
        runtime_model.unwrap_or(model).to_owned(),
    )
}

/// The initial messages of a turn: system prompt, runtime metadata,
/// history, skill context, user message.
pub(super) fn messages(
    system_prompt: &str,
    request: &TurnRequest,
    provider: &str,
    model: &str,
    today: NaiveDate,
) -> Vec<ChatMessage> {
    let mut messages = Vec::with_capacity(request.history.len() + 4);
    messages.push(ChatMessage::system(system_prompt));
    messages.push(ChatMessage::system(runtime_metadata(
        &request.session_id,
        provider,
        model,
        today,
    )));
    messages.extend(request.history.iter().cloned());
    if let Some(skill) = request.skill_context.as_deref().filter(|s| !s.is_empty()) {
        messages.push(ChatMessage::system(skill));
    }
    messages.push(ChatMessage::user(&request.user_message));
    messages
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_metadata_names_today_and_tomorrow() {
        let today = NaiveDate::from_ymd_opt(2026, 12, 31).unwrap();
        let text = runtime_metadata("sess_abc", "anthropic", "claude-sonnet-4-6", today);
        assert_eq!(
            text,
            "Runtime metadata for this chat turn (authoritative):\n\
             - session_id: sess_abc\n\
             - provider: anthropic\n\
             - model: claude-sonnet-4-6\n\
             - today: 2026-12-31\n\
             - tomorrow: 2027-01-01\n\
             Never call tools to find today's date; use the value above."
        );
    }
}
