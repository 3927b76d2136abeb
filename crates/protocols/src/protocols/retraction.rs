//! A step's text that the turn retracted (`message.retracted`: a provider
//! retry, a take-over) and says again, for the formats whose clients
//! cannot be told to forget text they were sent.
//!
//! What was sent of the retracted step is kept; the step's new text is
//! held back while it says the same again, and flows on from where the
//! client already is once it says more. Only a step done again
//! differently (or shorter) is retracted on the wire, in whatever way the
//! format has ([`Say::Retract`]), and its new text sent whole. A model
//! asked again the same question often answers the same way, so the
//! client of a retried step usually sees nothing of the retry.

/// What a format says for the text of a turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Say {
    /// Text to send, after what was sent.
    Text(String),
    /// The text sent for the step `step` is void (`reason`: why the turn
    /// retracted it); the new text follows.
    Retract { step: u32, reason: String },
}

/// Whether `event` ends the text of its step (what follows is no more of
/// it): the step's usage, its tool calls, a reflection, a compaction, the
/// turn's end.
pub fn ends_text(event: &crate::events::TurnEvent) -> bool {
    use crate::events::TurnEvent as E;
    matches!(
        event,
        E::Usage { .. }
            | E::ToolStarted { .. }
            | E::Reflection { .. }
            | E::ContextCompacted { .. }
            | E::TurnCompleted { .. }
            | E::TurnFailed { .. }
            | E::TurnCancelled { .. }
            | E::TurnInterrupted { .. }
    )
}

/// The text sent of the current step, and of a retracted step while it
/// is said again.
#[derive(Debug, Default)]
pub struct StepText {
    step: u32,
    sent: String,
    redo: Option<Redo>,
}

/// A retracted step said again: what the client has of it (`sent`) and
/// what the step has said since (`said`), held back while it repeats.
#[derive(Debug)]
struct Redo {
    step: u32,
    reason: String,
    sent: String,
    said: String,
}

impl StepText {
    /// What to say for a `message.delta` of `step`.
    pub fn delta(&mut self, step: u32, text: &str) -> Vec<Say> {
        let mut out = Vec::new();
        if self.redo.as_ref().is_some_and(|redo| redo.step != step) {
            out.extend(self.give_up());
        }
        let Some(redo) = self.redo.as_mut() else {
            if self.step != step {
                self.step = step;
                self.sent.clear();
            }
            self.sent.push_str(text);
            out.push(Say::Text(text.to_owned()));
            return out;
        };
        redo.said.push_str(text);
        if redo.sent.starts_with(redo.said.as_str()) {
            // Said again so far; the client has it.
            if redo.said.len() == redo.sent.len() {
                self.sent = std::mem::take(&mut redo.said);
                self.redo = None;
            }
        } else if let Some(rest) = redo.said.strip_prefix(redo.sent.as_str()) {
            // Past what the client has: the rest flows on.
            out.push(Say::Text(rest.to_owned()));
            self.sent = std::mem::take(&mut redo.said);
            self.redo = None;
        } else {
            out.extend(self.give_up());
        }
        out
    }

    /// The text of `step` sent so far is void (`reason`: why).
    pub fn retracted(&mut self, step: u32, reason: &str) {
        if let Some(redo) = self.redo.as_mut().filter(|redo| redo.step == step) {
            // Retracted again while said again: the client still has
            // what it was sent first.
            redo.said.clear();
            return;
        }
        if self.step == step && !self.sent.is_empty() {
            self.redo = Some(Redo {
                step,
                reason: reason.to_owned(),
                sent: std::mem::take(&mut self.sent),
                said: String::new(),
            });
        }
    }

    /// What to say before any event that is not text: a step said again
    /// that ends (or gives way) before it has said all the client has is
    /// no repeat of it.
    pub fn other(&mut self) -> Vec<Say> {
        if self.redo.is_some() {
            self.give_up()
        } else {
            Vec::new()
        }
    }

    /// The step said again differs from what was sent: retract that, and
    /// send what it has said.
    fn give_up(&mut self) -> Vec<Say> {
        let Some(redo) = self.redo.take() else {
            return Vec::new();
        };
        let mut out = vec![Say::Retract {
            step: redo.step,
            reason: redo.reason,
        }];
        self.step = redo.step;
        self.sent = redo.said;
        if !self.sent.is_empty() {
            out.push(Say::Text(self.sent.clone()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Say {
        Say::Text(s.to_owned())
    }

    fn retract(step: u32) -> Say {
        Say::Retract {
            step,
            reason: "takeover".into(),
        }
    }

    #[test]
    fn a_step_said_again_alike_is_held_back_then_flows_on() {
        let mut t = StepText::default();
        assert_eq!(t.delta(1, "Hel"), [text("Hel")]);
        assert_eq!(t.delta(1, "lo"), [text("lo")]);
        t.retracted(1, "takeover");
        assert_eq!(t.delta(1, "He"), []);
        assert_eq!(t.delta(1, "llo wor"), [text(" wor")]);
        assert_eq!(t.delta(1, "ld"), [text("ld")]);
        assert!(t.other().is_empty());
    }

    #[test]
    fn a_step_said_again_exactly_then_done_says_nothing_more() {
        let mut t = StepText::default();
        t.delta(2, "Hi.");
        t.retracted(2, "takeover");
        assert_eq!(t.delta(2, "Hi."), []);
        assert!(t.other().is_empty());
        assert_eq!(t.delta(3, "Next"), [text("Next")]);
    }

    #[test]
    fn a_step_said_again_otherwise_is_retracted_and_sent_whole() {
        let mut t = StepText::default();
        t.delta(1, "Hello");
        t.retracted(1, "takeover");
        assert_eq!(t.delta(1, "Hel"), []);
        assert_eq!(t.delta(1, "p!"), [retract(1), text("Help!")]);
        assert_eq!(t.delta(1, " Now"), [text(" Now")]);
    }

    #[test]
    fn a_step_said_again_shorter_is_retracted_at_its_next_event() {
        let mut t = StepText::default();
        t.delta(1, "Hello there");
        t.retracted(1, "takeover");
        assert_eq!(t.delta(1, "Hello"), []);
        assert_eq!(t.other(), [retract(1), text("Hello")]);
        assert!(t.other().is_empty());
        // Said nothing again at all before another step's text.
        t.delta(2, "abc");
        t.retracted(2, "provider_retry");
        assert_eq!(
            t.delta(3, "x"),
            [
                Say::Retract {
                    step: 2,
                    reason: "provider_retry".into()
                },
                text("x")
            ]
        );
    }

    #[test]
    fn a_step_retracted_twice_is_compared_with_what_the_client_has() {
        let mut t = StepText::default();
        t.delta(1, "Hello");
        t.retracted(1, "takeover");
        assert_eq!(t.delta(1, "Hel"), []);
        t.retracted(1, "provider_retry");
        assert_eq!(t.delta(1, "Hello!"), [text("!")]);
        // A step with no text sent has nothing to retract.
        t.retracted(4, "takeover");
        assert_eq!(t.delta(4, "new"), [text("new")]);
    }
}
