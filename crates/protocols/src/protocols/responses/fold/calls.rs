//! The two ends of a response at a call that waits: a call of the
//! client's tool, and one that waits for a person.

use serde_json::{Value, json};

use super::{APPROVAL_PREFIX, ResponseFold, server_item};

impl ResponseFold {
    /// The stream events of a call of the client's tool: a
    /// `function_call` item, and the response ends (`completed`) to let
    /// the client run it.
    pub fn function_call(&mut self, call_id: &str, name: &str, arguments: &Value) -> Vec<Value> {
        let mut out = Vec::new();
        self.close_message("completed", &mut out);
        let id = format!("fc_{call_id}");
        let arguments = arguments.to_string();
        let mut item = json!({
            "type": "function_call",
            "id": id,
            "call_id": call_id,
            "name": name,
            "arguments": "",
            "status": "in_progress",
        });
        let index = self.add_item(item.clone(), &mut out);
        out.push(self.numbered(
            "response.function_call_arguments.delta",
            json!({"item_id": id, "output_index": index, "delta": arguments}),
        ));
        out.push(self.numbered(
            "response.function_call_arguments.done",
            json!({"item_id": id, "output_index": index, "name": name, "arguments": arguments}),
        ));
        item["arguments"] = arguments.into();
        item["status"] = "completed".into();
        if let Some(slot) = self.output.get_mut(index) {
            *slot = item.clone();
        }
        out.push(self.numbered(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
        self.end("completed", "response.completed", &mut out);
        out
    }

    /// A call that waits for a person: an `mcp_approval_request` item
    /// (`mcpr_<call id>`), and the response ends with it; the next
    /// request's `mcp_approval_response` decides.
    pub fn approval_request(&mut self, call_id: &str, tool: &str, arguments: &Value) -> Vec<Value> {
        let mut out = Vec::new();
        self.close_message("completed", &mut out);
        let id = format!("{APPROVAL_PREFIX}{call_id}");
        let (tool, _) = crate::protocols::client_calls::client_name(tool);
        let item = server_item("mcp_approval_request", id, tool, arguments);
        let index = self.add_item(item.clone(), &mut out);
        out.push(self.numbered(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
        self.end("completed", "response.completed", &mut out);
        out
    }
}
