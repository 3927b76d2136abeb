//! The model's reasoning in a response: a `reasoning` item per step, its
//! text one `reasoning_text` part, streamed as
//! `response.reasoning_text.delta` and `.done`.

use super::ResponseFold;
use crate::protocols::responses::wire::{Numbered, OutputItem, ReasoningText, StreamEvent};

impl ResponseFold {
    /// A piece of reasoning: in the open `reasoning` item, or a new one.
    pub(super) fn reason(&mut self, text: &str, out: &mut Vec<Numbered>) {
        let index = match &self.reasoning {
            Some((index, _)) => *index,
            None => {
                self.close_message("completed", out);
                let id = format!(
                    "rs_{}_{}",
                    self.head.id.trim_start_matches("resp_"),
                    self.output.len()
                );
                let item = OutputItem::Reasoning {
                    id,
                    summary: Vec::new(),
                    content: Vec::new(),
                    status: "in_progress",
                };
                let index = self.add_item(item, out);
                self.reasoning = Some((index, String::new()));
                index
            }
        };
        if let Some((_, said)) = self.reasoning.as_mut() {
            said.push_str(text);
        }
        let item_id = self.item_id(index);
        out.push(self.numbered(StreamEvent::ReasoningTextDelta {
            item_id,
            output_index: index,
            content_index: 0,
            delta: text.to_owned(),
        }));
    }

    /// Ends the open `reasoning` item, whole.
    pub(super) fn close_reasoning(&mut self, out: &mut Vec<Numbered>) {
        let Some((index, text)) = self.reasoning.take() else {
            return;
        };
        let id = self.item_id(index);
        out.push(self.numbered(StreamEvent::ReasoningTextDone {
            item_id: id.clone(),
            output_index: index,
            content_index: 0,
            text: text.clone(),
        }));
        let item = OutputItem::Reasoning {
            id,
            summary: Vec::new(),
            content: vec![ReasoningText {
                kind: "reasoning_text",
                text,
            }],
            status: "completed",
        };
        if let Some(slot) = self.output.get_mut(index) {
            *slot = item.clone();
        }
        out.push(self.numbered(StreamEvent::ItemDone {
            output_index: index,
            item,
        }));
    }
}
