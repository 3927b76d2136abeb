//! The two ends of a response at a call that waits: a call of the
//! client's tool, and one that waits for a person.

use serde_json::Value;

use super::{APPROVAL_PREFIX, ResponseFold, SERVER_LABEL};
use crate::protocols::responses::wire::{Numbered, OutputItem, StreamEvent};

impl ResponseFold {
    /// The stream events of a call of the client's tool: a
    /// `function_call` item, and the response ends (`completed`) to let
    /// the client run it.
    pub fn function_call(&mut self, call_id: &str, name: &str, arguments: &Value) -> Vec<Numbered> {
        let mut out = Vec::new();
        self.close_message("completed", &mut out);
        let id = format!("fc_{call_id}");
        let arguments = arguments.to_string();
        let item = |arguments: String, status| OutputItem::FunctionCall {
            id: id.clone(),
            call_id: call_id.to_owned(),
            name: name.to_owned(),
            arguments,
            status,
        };
        let index = self.add_item(item(String::new(), "in_progress"), &mut out);
        out.push(self.numbered(StreamEvent::ArgumentsDelta {
            item_id: id.clone(),
            output_index: index,
            delta: arguments.clone(),
        }));
        out.push(self.numbered(StreamEvent::ArgumentsDone {
            item_id: id.clone(),
            output_index: index,
            name: name.to_owned(),
            arguments: arguments.clone(),
        }));
        let done = item(arguments, "completed");
        if let Some(slot) = self.output.get_mut(index) {
            *slot = done.clone();
        }
        out.push(self.numbered(StreamEvent::ItemDone {
            output_index: index,
            item: done,
        }));
        self.end(
            "completed",
            |response| StreamEvent::Completed { response },
            &mut out,
        );
        out
    }

    /// A call that waits for a person: an `mcp_approval_request` item
    /// (`mcpr_<call id>`), and the response ends with it; the next
    /// request's `mcp_approval_response` decides.
    pub fn approval_request(
        &mut self,
        call_id: &str,
        tool: &str,
        arguments: &Value,
    ) -> Vec<Numbered> {
        let mut out = Vec::new();
        self.close_message("completed", &mut out);
        let (tool, _) = crate::protocols::client_calls::client_name(tool);
        let item = OutputItem::McpApprovalRequest {
            id: format!("{APPROVAL_PREFIX}{call_id}"),
            name: tool.to_owned(),
            arguments: arguments.to_string(),
            server_label: SERVER_LABEL,
        };
        let index = self.add_item(item.clone(), &mut out);
        out.push(self.numbered(StreamEvent::ItemDone {
            output_index: index,
            item,
        }));
        self.end(
            "completed",
            |response| StreamEvent::Completed { response },
            &mut out,
        );
        out
    }
}
