//! Models remembered as refusing a request option (OpenAI's
//! `reasoning_effort`, Ollama's `think`): an adapter asks once more
//! without the option and does not send it to that model again.

use std::{collections::HashSet, sync::Mutex};

/// Past this many models the set starts over (a request may name any
/// model, so the set must not grow without end).
const MAX_REMEMBERED_MODELS: usize = 256;

/// The models that refused one option.
#[derive(Debug, Default)]
pub(super) struct RefusingModels(Mutex<HashSet<String>>);

impl RefusingModels {
    /// Whether `model` refused the option before.
    pub(super) fn contains(&self, model: &str) -> bool {
        self.0
            .lock()
            .map(|set| set.contains(model))
            .unwrap_or(false)
    }

    pub(super) fn remember(&self, model: &str) {
        if let Ok(mut set) = self.0.lock() {
            if set.len() >= MAX_REMEMBERED_MODELS {
                set.clear();
            }
            set.insert(model.to_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_is_remembered_and_the_set_stays_bounded() {
        let models = RefusingModels::default();
        assert!(!models.contains("llama3.2"));
        models.remember("llama3.2");
        assert!(models.contains("llama3.2"));
        for i in 0..MAX_REMEMBERED_MODELS {
            models.remember(&format!("m{i}"));
        }
        let held = models.0.lock().unwrap().len();
        assert!(held <= MAX_REMEMBERED_MODELS, "{held}");
    }
}
