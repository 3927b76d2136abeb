//! The native SSE encoding of a turn's events: `id:` is the seq, `event:` the
//! type, `data:` the envelope JSON. A stream whose log cannot be read any
//! more ends with a terminal `turn.failed` (`event_log_unavailable`) that has
//! no `id:`, so a client stops, and a later `Last-Event-ID` resumes from the
//! last event it really got.

use std::{fmt::Write as _, sync::Arc, time::Duration};

use axum::response::Response;
use bytes::Bytes;
use futures::Stream;
use uuid::Uuid;

use crate::protocols::{Encoded, WireFormat, stream_turn};
use crate::{events::StoredEvent, metrics::Metrics, service::StoreError};

/// The native format: every event, as it is in the log.
struct Native {
    turn: TurnRef,
}

impl WireFormat for Native {
    fn encode(&mut self, event: &StoredEvent) -> Encoded {
        Encoded {
            frames: vec![encode(event)],
            done: event.is_terminal(),
        }
    }

    fn unreadable(&mut self) -> Vec<Bytes> {
        tracing::warn!(turn.id = %self.turn.turn_id, "the native stream ends without its terminal event");
        vec![unreadable_log_frame(&self.turn)]
    }
}

/// Encodes `events` as an SSE response, with a keep-alive comment after
/// every `keepalive` without an event.
///
/// The frames are written here rather than through axum's `Sse`: each event
/// becomes one buffer of known size, with no per-field copying or newline
/// scanning (the envelope is compact JSON, which has no raw newlines).
pub fn response(
    turn: TurnRef,
    events: impl Stream<Item = Result<Arc<StoredEvent>, StoreError>> + Send + 'static,
    keepalive: Duration,
    metrics: Arc<Metrics>,
) -> Response {
    stream_turn(Native { turn }, events, keepalive, metrics)
}

/// One event in the native encoding: `id:`, `event:`, `data:`.
pub fn encode(event: &StoredEvent) -> Bytes {
    let mut frame = String::with_capacity(event.envelope_len_hint() + 48);
    frame.push_str("id: ");
    // Writing to a String cannot fail.
    let _ = write!(frame, "{}", event.seq);
    frame.push_str("\nevent: ");
    frame.push_str(&event.event_type);
    frame.push_str("\ndata: ");
    event.write_envelope(&mut frame);
    frame.push_str("\n\n");
    Bytes::from(frame)
}

/// The turn a stream follows.
#[derive(Debug, Clone)]
pub struct TurnRef {
    pub session_id: String,
    pub turn_id: Uuid,
}

/// The code of the terminal event of a stream whose log cannot be read.
pub const UNREADABLE_LOG_CODE: &str = "event_log_unavailable";

/// The end of a stream whose log cannot be read: a terminal `turn.failed`
/// without `id:` or `seq` (it is not in the log: the turn's stored outcome
/// may still differ, and a resume starts after the last real event).
fn unreadable_log_frame(turn: &TurnRef) -> Bytes {
    /// The frame's data: a `turn.failed` envelope of no seq.
    #[derive(serde::Serialize)]
    struct Unreadable<'a> {
        code: &'static str,
        created_at: String,
        message: &'static str,
        session_id: &'a str,
        turn_id: Uuid,
        #[serde(rename = "type")]
        kind: &'static str,
    }
    let data = Unreadable {
        code: UNREADABLE_LOG_CODE,
        created_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        message: "the event log cannot be read, so this stream ends here; the turn's stored \
                  status may differ: look it up, or resume with Last-Event-ID, once the \
                  service is ready",
        session_id: &turn.session_id,
        turn_id: turn.turn_id,
        kind: "turn.failed",
    };
    let mut frame = b"event: turn.failed\n".to_vec();
    frame.extend_from_slice(&super::super::data_frame(&data));
    Bytes::from(frame)
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use uuid::Uuid;

    use super::*;
    use crate::events::TurnEvent;

    #[test]
    fn an_event_is_one_frame_of_id_event_and_data() {
        let event = TurnEvent::MessageDelta {
            step: 1,
            text: "two\nlines".into(),
        };
        let stored = StoredEvent::new("s-1", Uuid::now_v7(), 12, &event, Utc::now()).unwrap();
        let frame = encode(&stored);
        let expected = format!(
            "id: 12\nevent: message.delta\ndata: {}\n\n",
            stored.envelope_json()
        );
        assert_eq!(frame, Bytes::from(expected));
        // One data line: a newline in the text stays escaped inside the JSON.
        assert_eq!(frame.iter().filter(|b| **b == b'\n').count(), 4);
    }

    #[test]
    fn an_unreadable_log_ends_the_stream_with_a_terminal_event_without_an_id() {
        let turn = TurnRef {
            session_id: "s-1".into(),
            turn_id: Uuid::now_v7(),
        };
        let frame = unreadable_log_frame(&turn);
        let text = std::str::from_utf8(&frame).unwrap();
        let prefix = "event: turn.failed\ndata: {";
        assert!(text.starts_with(prefix), "{text}");
        assert!(text.ends_with("}\n\n"), "{text}");
        let data: serde_json::Value =
            serde_json::from_str(&text[prefix.len() - 1..text.len() - 2]).unwrap();
        assert_eq!(data["type"], "turn.failed");
        assert_eq!(data["code"], "event_log_unavailable");
        assert_eq!(data["turn_id"], turn.turn_id.to_string());
        assert!(data.get("seq").is_none());
    }
}
/// One event of a `text/event-stream` body (the schema is of each event,
/// as OpenAPI 3.2's `itemSchema` says it and SSE clients read it). On the
/// native routes each event is an `id:` line (its `seq`), an `event:`
/// line (its `type`) and one `data:` line holding an `EventEnvelope` as
/// JSON, then a blank line; lines that start with `:` are keep-alive
/// comments. The stream ends after the turn's terminal event
/// (`turn.completed`, `turn.failed`, `turn.cancelled`,
/// `turn.interrupted`); a stream that cannot read the log ends with a
/// `turn.failed` (`event_log_unavailable`) without `id:`.
#[derive(utoipa::ToSchema)]
#[expect(dead_code, reason = "describes the stream; the SSE encoder writes it")]
pub struct EventStream {
    /// `event:`: the event's type, where the format names one.
    event: Option<String>,
    /// `data:`: the event, as JSON (`[DONE]` ends the AI SDK's stream).
    data: String,
    /// `id:`: the event's `seq`, where the format resumes.
    id: Option<String>,
    /// `retry:`, never sent.
    retry: Option<u64>,
}
