//! What a request may ask of the operator's account, checked at the
//! start of every turn.

use super::StartError;
use crate::{store::TenantLimits, turn::TurnRequest};

/// What a request may ask of the operator's account: checked at the start
/// of every turn, whichever route or protocol asked for it.
#[derive(Debug, Clone, Default)]
pub struct StartPolicy {
    /// The models a request may name ([`crate::config::Settings::allowed_models`]).
    pub allowed_models: Vec<String>,
    /// The most bytes a turn's client tools may hand the model (names,
    /// descriptions, schemas).
    pub client_tools_max_bytes: usize,
    /// Each tenant's limits where it has none of its own.
    pub tenant_defaults: TenantLimits,
    /// What a message's images and files may be.
    pub files: crate::files::FileLimits,
    /// Which addresses an image's URL may name
    /// (`HARNESS_OUTBOUND_ALLOW_PRIVATE`), and the roots its fetch trusts.
    pub outbound: crate::outbox::Trust,
    /// An image given by URL reaches an OpenAI-compatible provider by its
    /// URL (`HARNESS_FILE_URLS=pass`).
    pub pass_urls: bool,
}

impl StartPolicy {
    pub(super) fn admit(&self, spec: &TurnRequest) -> Result<(), StartError> {
        // A model the operator did not configure never reaches a provider.
        if let Some(model) = spec.runtime_model.as_deref()
            && !self.allowed_models.iter().any(|m| m == model)
        {
            return Err(StartError::ModelNotAllowed {
                model: model.to_owned(),
                allowed: self.allowed_models.clone(),
            });
        }
        if let Some(field) = spec.field_with_nul() {
            return Err(StartError::HoldsNul(field));
        }
        if let Some(schema) = spec.output.as_ref().and_then(|o| o.schema.as_ref())
            && let Err(e) = jsonschema::validator_for(schema)
        {
            return Err(StartError::InvalidOutputSchema(format!(
                "the output schema is not a JSON Schema: {e}"
            )));
        }
        let bytes = crate::turn::client_tools_bytes(&spec.client_tools);
        if bytes > self.client_tools_max_bytes {
            return Err(StartError::ClientToolsTooLarge {
                bytes,
                most: self.client_tools_max_bytes,
            });
        }
        Ok(())
    }
}
