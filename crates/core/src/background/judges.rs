//! LLM judges: declared in the settings, each with its criteria, the
//! prompt ids it judges and a pass threshold; scheduled by the finalizer
//! for turns whose prompt id they judge, run by the background worker.

use std::str::FromStr;

use async_trait::async_trait;
use chrono::Utc;
use serde::{Deserialize, Serialize};

use super::{JOB_JUDGE, new_job_id};
use crate::{
    hooks::{HookError, JudgeRequest, JudgeScheduler},
    store::NewJob,
};

/// One judge, as written in the settings.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JudgeConfig {
    /// `faithfulness`, `relevance`, …: letters, digits, `_`, `-`.
    pub name: String,
    /// What the judge scores the answer against.
    pub criteria: String,
    /// The prompt ids it judges; `*` for all (default).
    #[serde(default = "every_prompt")]
    pub prompt_ids: Vec<String>,
    /// The score (0 to 1) an answer needs to pass (default 0.7).
    #[serde(default = "default_threshold")]
    pub threshold: f64,
    /// The model that judges, `provider:model` (default: the one that
    /// answered the turn).
    #[serde(default)]
    pub model: Option<String>,
}

fn every_prompt() -> Vec<String> {
    vec!["*".to_owned()]
}

fn default_threshold() -> f64 {
    0.7
}

/// The declared judges: a JSON list of [`JudgeConfig`] (a
/// `[[judges.list]]` table each in the settings file).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JudgeList(pub Vec<JudgeConfig>);

impl FromStr for JudgeList {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let judges: Vec<JudgeConfig> =
            serde_json::from_str(s).map_err(|e| format!("expected a list of judges: {e}"))?;
        let mut seen = std::collections::HashSet::new();
        for judge in &judges {
            let name_ok = (1..=64).contains(&judge.name.len())
                && judge
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !name_ok {
                return Err(format!(
                    "judge {:?}: the name must be 1-64 letters, digits, `_` or `-`",
                    judge.name
                ));
            }
            if judge.criteria.trim().is_empty() {
                return Err(format!(
                    "judge {:?}: the criteria must not be empty",
                    judge.name
                ));
            }
            if !(0.0..=1.0).contains(&judge.threshold) {
                return Err(format!(
                    "judge {:?}: the threshold must be between 0 and 1",
                    judge.name
                ));
            }
            if judge
                .model
                .as_deref()
                .is_some_and(|m| !m.contains(':') || m.starts_with(':') || m.ends_with(':'))
            {
                return Err(format!(
                    "judge {:?}: the model must be provider:model",
                    judge.name
                ));
            }
            if !seen.insert(judge.name.as_str()) {
                return Err(format!("judge {:?} is declared twice", judge.name));
            }
        }
        Ok(Self(judges))
    }
}

/// What one judge's job needs: the judge, and what it evaluates (the
/// texts masked where the service masks them; `provider` and `model` the
/// judge's own).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JudgeJob {
    pub judge: String,
    #[serde(flatten)]
    pub request: JudgeRequest,
}

/// Schedules the declared judges of a prompt as background jobs.
pub struct JudgePanel {
    judges: Vec<JudgeConfig>,
    /// Mask personal data in the jobs' payloads (`HARNESS_REDACT_LOGS`):
    /// the judge reads the masked conversation.
    redact: bool,
}

impl JudgePanel {
    pub fn new(judges: Vec<JudgeConfig>, redact: bool) -> Self {
        Self { judges, redact }
    }

    fn judging(&self, prompt_id: &str) -> impl Iterator<Item = &JudgeConfig> {
        self.judges
            .iter()
            .filter(move |j| j.prompt_ids.iter().any(|p| p == "*" || p == prompt_id))
    }
}

#[async_trait]
impl JudgeScheduler for JudgePanel {
    fn judges_for(&self, prompt_id: &str) -> Vec<String> {
        self.judging(prompt_id).map(|j| j.name.clone()).collect()
    }

    async fn schedule(&self, request: JudgeRequest) -> Result<Vec<NewJob>, HookError> {
        let mut scheduled = Vec::new();
        // What every judge reads, masked once.
        let shown = |text: &str| crate::pii::redact_if(self.redact, text);
        let request = JudgeRequest {
            user_message: shown(&request.user_message),
            response: shown(&request.response),
            facts: request.facts.iter().map(|f| shown(f)).collect(),
            messages_text: shown(&request.messages_text),
            ..request
        };
        for judge in self.judging(&request.prompt_id) {
            let (provider, model) = match judge.model.as_deref().and_then(|m| m.split_once(':')) {
                Some((provider, model)) => (provider.to_owned(), model.to_owned()),
                None => (request.provider.clone(), request.model.clone()),
            };
            let job = JudgeJob {
                judge: judge.name.clone(),
                request: JudgeRequest {
                    provider,
                    model,
                    ..request.clone()
                },
            };
            scheduled.push(NewJob {
                id: new_job_id(),
                kind: JOB_JUDGE.into(),
                session_id: request.session_id.as_str().to_owned(),
                turn_id: request.turn_id.clone(),
                payload: serde_json::to_string(&job).map_err(HookError::new)?,
                at: Utc::now(),
            });
        }
        Ok(scheduled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_judge_job_is_one_flat_object_as_queued_jobs_hold_it() {
        let queued = r#"{"judge":"relevance","prompt_id":"p","prompt_version":"1",
            "session_id":"s","turn_id":"t","user_message":"q","response":"a",
            "facts":["f"],"messages_text":"[user] q","provider":"openai","model":"m"}"#;
        let job: JudgeJob = serde_json::from_str(queued).unwrap();
        assert_eq!(job.judge, "relevance");
        assert_eq!(job.request.facts, ["f"]);
        assert_eq!(job.request.model, "m");
        let again: serde_json::Value = serde_json::to_value(&job).unwrap();
        let before: serde_json::Value = serde_json::from_str(queued).unwrap();
        assert_eq!(again, before);
    }
}
