//! A call's id is unique within its turn.
//!
//! Approvals, client-tool results, replay control, checkpoints and step
//! records are all keyed by a call's id. Providers do not all send one:
//! older Ollama sends none, some OpenAI-compatible servers number their
//! calls `call_0`, `call_1`… afresh at every step, and the adapters then
//! fill in such numbers themselves. Left as they came, step 2's `call_0`
//! would find step 1's approval (or client result) already given. So the
//! harness gives every call an id no earlier message of the conversation
//! holds, before any event names it. The assistant message and its tool
//! messages carry the id given here, so the provider gets back a
//! consistent pair.
//!
//! An id is kept when it is new and usable in a URL path segment; it is
//! replaced when it is empty, taken, longer than [`MAX_ID_LEN`] or holds
//! anything but ASCII letters, digits, `_`, `-`, `.` and `:`. (Rewriting
//! every id, the rejected alternative, would hide the provider's ids from
//! a person reading the log beside the provider's.)

use std::collections::HashSet;

use crate::providers::{ChatMessage, ToolCall};

/// The longest id kept as the provider sent it.
pub const MAX_ID_LEN: usize = 128;

fn usable(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'))
}

/// Gives each of `calls` (the model's calls at `step`) an id that none of
/// `messages` (the conversation so far), of `given` (the ids the turn
/// handed out before: a compaction may have taken their messages) nor
/// another of `calls` holds.
pub fn make_unique(
    calls: &mut [ToolCall],
    messages: &[ChatMessage],
    given: &HashSet<String>,
    step: u32,
) {
    let mut taken: HashSet<String> = messages
        .iter()
        .flat_map(|m| {
            m.tool_calls
                .iter()
                .map(|c| c.id.clone())
                .chain(m.tool_call_id.clone())
        })
        .chain(given.iter().cloned())
        .collect();
    for (index, call) in calls.iter_mut().enumerate() {
        if usable(&call.id) && !taken.contains(&call.id) {
            taken.insert(call.id.clone());
            continue;
        }
        let base = format!("call_s{step}_{index}");
        // At most `taken.len()` candidates can be taken, so this finds one.
        let fresh = (0..=taken.len())
            .map(|n| match n {
                0 => base.clone(),
                n => format!("{base}_{n}"),
            })
            .find(|candidate| !taken.contains(candidate))
            .unwrap_or_else(|| format!("call_{}", uuid::Uuid::now_v7().simple()));
        taken.insert(fresh.clone());
        call.id = fresh;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: "write_note".into(),
            arguments: "{}".into(),
        }
    }

    fn ids(calls: &[ToolCall]) -> Vec<&str> {
        calls.iter().map(|c| c.id.as_str()).collect()
    }

    #[test]
    fn new_usable_ids_are_kept() {
        let mut calls = vec![call("call_abc"), call("toolu_01:x.y-z")];
        make_unique(&mut calls, &[], &HashSet::new(), 1);
        assert_eq!(ids(&calls), ["call_abc", "toolu_01:x.y-z"]);
    }

    #[test]
    fn an_id_an_earlier_step_used_is_replaced_in_both_its_call_and_the_next() {
        let earlier = vec![
            ChatMessage::assistant("", vec![call("call_0")]),
            ChatMessage::tool("call_0", "done"),
        ];
        let mut calls = vec![call("call_0"), call("call_1")];
        make_unique(&mut calls, &earlier, &HashSet::new(), 2);
        assert_eq!(ids(&calls), ["call_s2_0", "call_1"]);
    }

    #[test]
    fn empty_repeated_or_unusable_ids_within_a_step_are_replaced() {
        let long = "x".repeat(MAX_ID_LEN + 1);
        let mut calls = vec![
            call(""),
            call("call_0"),
            call("call_0"),
            call("a/b"),
            call(&long),
        ];
        make_unique(&mut calls, &[], &HashSet::new(), 3);
        assert_eq!(
            ids(&calls),
            ["call_s3_0", "call_0", "call_s3_2", "call_s3_3", "call_s3_4"]
        );
    }

    #[test]
    fn a_replacement_that_is_itself_taken_gets_a_suffix() {
        let earlier = vec![ChatMessage::assistant(
            "",
            vec![call("call_0"), call("call_s1_0"), call("call_s1_0_1")],
        )];
        let mut calls = vec![call("call_0")];
        make_unique(&mut calls, &earlier, &HashSet::new(), 1);
        assert_eq!(ids(&calls), ["call_s1_0_2"]);
    }

    #[test]
    fn an_id_the_turn_handed_out_is_taken_though_no_message_holds_it() {
        let given: HashSet<String> = ["call_0".to_owned()].into();
        let mut calls = vec![call("call_0")];
        make_unique(&mut calls, &[], &given, 4);
        assert_eq!(ids(&calls), ["call_s4_0"]);
    }
}
