//! MCP prompts: the operator's agent profiles (`HARNESS_AGENT_PROFILES`,
//! by default one `research` profile), each a ready-made ask whose
//! `{{argument}}`s the caller fills in; `completion/complete` of an
//! argument offers the values the operator lists for it. Both versions
//! of `/mcp` serve them from here.

use rmcp::model::{GetPromptResult, JsonObject, Prompt, PromptArgument, PromptMessage, Role};
use serde_json::Value;

use crate::{
    config::{AgentProfile, AgentProfiles},
    protocols::Shared,
};

/// The longest value of an argument.
const VALUE_MAX: usize = 10_000;

fn profiles(app: &Shared) -> AgentProfiles {
    app.settings
        .server
        .agent_profiles
        .clone()
        .unwrap_or_default()
}

fn find<'a>(profiles: &'a AgentProfiles, name: &str) -> Option<&'a AgentProfile> {
    profiles.0.iter().find(|p| p.name == name)
}

/// `prompts/list`: every profile, with its arguments.
pub(super) fn list(app: &Shared) -> Vec<Prompt> {
    profiles(app)
        .0
        .iter()
        .map(|profile| {
            let arguments = profile
                .arguments
                .iter()
                .map(|a| {
                    let argument = PromptArgument::new(&a.name).with_required(a.required);
                    match &a.description {
                        Some(description) => argument.with_description(description),
                        None => argument,
                    }
                })
                .collect();
            let prompt = Prompt::new(&profile.name, profile.description.as_ref(), Some(arguments));
            match &profile.title {
                Some(title) => prompt.with_title(title),
                None => prompt,
            }
        })
        .collect()
}

pub(super) fn get(
    app: &Shared,
    name: &str,
    given: Option<&JsonObject>,
) -> Result<GetPromptResult, String> {
    let profiles = profiles(app);
    let profile = find(&profiles, name).ok_or_else(|| format!("no prompt {name:?}"))?;
    let empty = JsonObject::new();
    let given = given.unwrap_or(&empty);
    if let Some(unknown) = given
        .keys()
        .find(|k| !profile.arguments.iter().any(|a| &a.name == *k))
    {
        return Err(format!("prompt {name} has no argument {unknown:?}"));
    }
    let mut values = Vec::new();
    for argument in &profile.arguments {
        let value = match given.get(&argument.name) {
            Some(Value::String(v)) if v.len() <= VALUE_MAX && !v.contains('\0') => v.trim(),
            Some(_) => {
                return Err(format!(
                    "argument {:?}: text of at most {VALUE_MAX} bytes, without U+0000",
                    argument.name
                ));
            }
            None => "",
        };
        if argument.required && value.is_empty() {
            return Err(format!("argument {:?} is required", argument.name));
        }
        values.push((argument.name.as_str(), value));
    }
    let text = render(&profile.text, &values);
    let mut result = GetPromptResult::new(vec![PromptMessage::new_text(Role::User, text)]);
    // Each protocol version says its result's type itself.
    result.result_type = None;
    result.description.clone_from(&profile.description);
    Ok(result)
}

fn render(text: &str, values: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else { break };
        out.push_str(&rest[..start]);
        let name = after[..end].trim();
        let value = values
            .iter()
            .find(|(n, _)| *n == name)
            .map_or("", |(_, v)| *v);
        out.push_str(value);
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    out
}

/// The values of a profile's argument that start with what is typed
/// (case aside), and how many there are. `Err`: no such profile.
pub(super) fn complete(
    app: &Shared,
    name: &str,
    argument: &str,
    typed: &str,
) -> Result<Vec<String>, String> {
    let profiles = profiles(app);
    let profile = find(&profiles, name).ok_or_else(|| format!("no prompt {name:?}"))?;
    let typed = typed.to_lowercase();
    Ok(profile
        .arguments
        .iter()
        .filter(|a| a.name == argument)
        .flat_map(|a| a.values.iter())
        .filter(|v| v.to_lowercase().starts_with(&typed))
        .cloned()
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_is_rendered_with_its_values() {
        let values = [("city", "Paris"), ("days", "")];
        assert_eq!(
            render("Plan {{days}} days in {{ city }}: {{city}}.", &values),
            "Plan  days in Paris: Paris."
        );
        assert_eq!(render("no {{end", &values), "no {{end");
    }
}
