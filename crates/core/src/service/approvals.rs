//! What a person's approval binds (docs/client-tools-and-approvals.md):
//! the arguments the call runs with, edited or as asked, by their
//! SHA-256, so that a decision applies to those arguments alone.

use serde_json::Value;

use super::TurnService;
use crate::{
    events::TurnEvent,
    harness::validation,
    providers::Arguments,
    store::{Result, TurnRecord},
};

/// What an approval binds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApprovalTerms {
    /// The arguments to run instead of the asked ones (JSON), checked.
    pub edited_arguments: Option<String>,
    /// The SHA-256 of the arguments the decision is for.
    pub arguments_sha256: Option<String>,
}

impl TurnService {
    /// What an approval of the call `call_id` of `turn` binds: the
    /// arguments it asked with, or `edited` once it passes the tool's
    /// schema (with the harness's repairs) and the tool's own check. Err:
    /// why the edit cannot run (the validator's message); a call the log
    /// shows no request of binds nothing (the caller refused it already).
    pub async fn approval_terms(
        &self,
        turn: &TurnRecord,
        call_id: &str,
        edited: Option<&Value>,
    ) -> Result<std::result::Result<ApprovalTerms, String>> {
        let mut asked: Option<(String, Value)> = None;
        self.read_turn(turn, |stored| match stored.event() {
            Some(TurnEvent::ApprovalRequested {
                call_id: id,
                tool,
                arguments,
                ..
            }) if id == call_id => {
                asked = Some((tool.clone(), arguments.clone()));
                true
            }
            _ => false,
        })
        .await?;
        let Some((tool, arguments)) = asked else {
            return Ok(Ok(ApprovalTerms::default()));
        };
        // An "edit" that is what was asked (a client that sends the
        // call's input back with every decision) is none.
        let asked_sha256 = validation::arguments_sha256(&arguments);
        let Some(edited) = edited.filter(|e| validation::arguments_sha256(e) != asked_sha256)
        else {
            return Ok(Ok(ApprovalTerms {
                edited_arguments: None,
                arguments_sha256: Some(asked_sha256),
            }));
        };
        let spec = match self.tools().get(&tool) {
            Some(known) => Some((known.spec().clone(), Some(known.clone()))),
            None => turn
                .request
                .client_tool(&tool)
                .map(|declared| (crate::tools::client::ClientCall::spec_of(declared), None)),
        };
        let Some((spec, known)) = spec else {
            return Ok(Err(format!("the tool {tool:?} is not offered any more")));
        };
        let checked =
            validation::check(&spec, &Arguments::new(edited.to_string())).and_then(|valid| {
                match &known {
                    Some(tool) => tool.check(&valid).map(|()| valid),
                    None => Ok(valid),
                }
            });
        Ok(checked.map(|valid| ApprovalTerms {
            arguments_sha256: Some(validation::arguments_sha256(&valid)),
            edited_arguments: Some(valid.to_string()),
        }))
    }
}
