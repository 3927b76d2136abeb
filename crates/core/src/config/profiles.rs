//! The operator's agent profiles (`HARNESS_AGENT_PROFILES`): ready-made
//! asks with variables, which the MCP server offers as prompts
//! (`prompts/list`, `prompts/get`, and `completion/complete` of their
//! arguments from the values the operator lists).

use std::{collections::BTreeSet, str::FromStr};

use serde::Deserialize;

/// Profiles a service holds at most, and arguments a profile.
const PROFILES_MAX: usize = 50;
const ARGUMENTS_MAX: usize = 16;
/// Values an argument lists at most, for completion.
const VALUES_MAX: usize = 1000;
/// The longest text of a profile.
const TEXT_MAX: usize = 10_000;

/// One profile: a text whose `{{argument}}`s the caller fills in.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentProfile {
    /// 1-64 characters of `[A-Za-z0-9_-]`.
    pub name: String,
    pub title: Option<String>,
    pub description: Option<String>,
    #[serde(default)]
    pub arguments: Vec<ProfileArgument>,
    /// The ask, with `{{name}}` for each argument.
    pub text: String,
}

/// A variable of a profile.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileArgument {
    /// 1-64 characters of `[A-Za-z0-9_]`.
    pub name: String,
    pub description: Option<String>,
    #[serde(default)]
    pub required: bool,
    /// The values completion offers (any other value is taken too).
    #[serde(default)]
    pub values: Vec<String>,
}

/// The profiles, checked: names unique, each `{{…}}` of a text one of its
/// arguments, and within bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentProfiles(pub Vec<AgentProfile>);

impl Default for AgentProfiles {
    /// One profile, `research`: what the agent does best.
    fn default() -> Self {
        Self(vec![AgentProfile {
            name: "research".into(),
            title: Some("Research my notes".into()),
            description: Some(
                "Searches the caller's notes on a topic and answers what they say, citing \
                 each note it uses."
                    .into(),
            ),
            arguments: vec![ProfileArgument {
                name: "topic".into(),
                description: Some("What to look for".into()),
                required: true,
                values: Vec::new(),
            }],
            text: "Search my notes about {{topic}} and tell me what they say, citing each \
                   note you use."
                .into(),
        }])
    }
}

fn named(name: &str, extra: &[u8]) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || extra.contains(&b))
}

/// The `{{name}}`s of a text, in order.
pub fn variables(text: &str) -> Vec<&str> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else { break };
        found.push(after[..end].trim());
        rest = &after[end + 2..];
    }
    found
}

impl AgentProfile {
    fn check(&self) -> Result<(), String> {
        let name = &self.name;
        if !named(name, b"_-") {
            return Err(format!(
                "profile {name:?}: a name is 1-64 characters of [A-Za-z0-9_-]"
            ));
        }
        if self.text.trim().is_empty() || self.text.len() > TEXT_MAX || self.text.contains('\0') {
            return Err(format!(
                "profile {name}: `text` must be 1-{TEXT_MAX} bytes, without U+0000"
            ));
        }
        if self.arguments.len() > ARGUMENTS_MAX {
            return Err(format!("profile {name}: at most {ARGUMENTS_MAX} arguments"));
        }
        let mut arguments = BTreeSet::new();
        for argument in &self.arguments {
            if !named(&argument.name, b"_") || !arguments.insert(argument.name.as_str()) {
                return Err(format!(
                    "profile {name}: argument {:?} is not 1-64 characters of [A-Za-z0-9_], \
                     or is named twice",
                    argument.name
                ));
            }
            if argument.values.len() > VALUES_MAX {
                return Err(format!(
                    "profile {name}: at most {VALUES_MAX} values an argument"
                ));
            }
        }
        if let Some(unknown) = variables(&self.text)
            .into_iter()
            .find(|v| !arguments.contains(v))
        {
            return Err(format!(
                "profile {name}: `{{{{{unknown}}}}}` in its text is none of its arguments"
            ));
        }
        Ok(())
    }
}

impl FromStr for AgentProfiles {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let profiles: Vec<AgentProfile> = serde_json::from_str(s).map_err(|e| {
            format!("expected a JSON list of profiles ({{name, text, arguments?, …}}): {e}")
        })?;
        if profiles.len() > PROFILES_MAX {
            return Err(format!("at most {PROFILES_MAX} profiles"));
        }
        let mut names = BTreeSet::new();
        for profile in &profiles {
            profile.check()?;
            if !names.insert(profile.name.as_str()) {
                return Err(format!("profile {:?} is named twice", profile.name));
            }
        }
        Ok(Self(profiles))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_are_checked_when_read() {
        let good = r#"[{"name": "trip", "text": "Plan {{days}} days in {{city}}",
            "arguments": [{"name": "city", "required": true, "values": ["Paris", "Rome"]},
                          {"name": "days"}]}]"#;
        let profiles: AgentProfiles = good.parse().unwrap();
        assert_eq!(profiles.0[0].arguments[0].values, ["Paris", "Rome"]);
        for bad in [
            r#"[{"name": "trip", "text": "Plan {{city}}"}]"#,
            r#"[{"name": "a b", "text": "x"}]"#,
            r#"[{"name": "t", "text": " "}]"#,
            r#"[{"name": "t", "text": "x"}, {"name": "t", "text": "y"}]"#,
            r#"[{"name": "t", "text": "x", "arguments": [{"name": "a"}, {"name": "a"}]}]"#,
            r#"[{"name": "t", "text": "x", "model": "gpt"}]"#,
            "{}",
        ] {
            assert!(bad.parse::<AgentProfiles>().is_err(), "{bad}");
        }
        AgentProfiles::default().0[0].check().unwrap();
    }

    #[test]
    fn variables_are_read_in_order() {
        assert_eq!(variables("a {{x}} b {{ y }} {{x}} {{open"), ["x", "y", "x"]);
    }
}
