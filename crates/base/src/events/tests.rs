//! The envelope and the event vocabulary.

use super::*;

/// An event made here keeps its typed form (no parse back from JSON);
/// one read from the log is parsed once; one this build does not know
/// has none. Neither form takes part in equality.
#[test]
fn a_stored_event_carries_its_typed_event() {
    let event = TurnEvent::MessageDelta {
        step: 1,
        text: "hi".into(),
    };
    let at = Utc::now();
    let made = StoredEvent::from_event("s", Uuid::now_v7(), 2, event.clone(), at).unwrap();
    assert!(made.parsed.0.get().is_some(), "kept, not parsed");
    assert_eq!(made.event(), Some(&event));
    let read = StoredEvent {
        parsed: Parsed::default(),
        ..made.clone()
    };
    assert!(read.parsed.0.get().is_none());
    assert_eq!(read.event(), Some(&event));
    assert_eq!(read, made);
    let unknown = StoredEvent {
        event_type: "from.the.future".into(),
        payload: r#"{"type":"from.the.future"}"#.into(),
        parsed: Parsed::default(),
        ..made
    };
    assert_eq!(unknown.event(), None);
}

#[test]
fn envelope_json_is_one_object_with_the_event_fields() {
    let turn_id = Uuid::now_v7();
    let event = TurnEvent::MessageDelta {
        step: 1,
        text: "hi \"there\"".into(),
    };
    let stored = StoredEvent::new("s-1", turn_id, 7, &event, Utc::now()).unwrap();
    let parsed: EventEnvelope = serde_json::from_str(&stored.envelope_json()).unwrap();
    assert_eq!(parsed.seq, 7);
    assert_eq!(parsed.session_id, "s-1");
    assert_eq!(parsed.turn_id, turn_id);
    assert_eq!(parsed.event, event);
}

#[test]
fn the_envelope_is_the_documented_shape_whatever_the_session_id_holds() {
    let turn_id = Uuid::now_v7();
    let event = TurnEvent::MessageDelta {
        step: 2,
        text: "line\none".into(),
    };
    let at = Utc::now();
    for session in ["s-1", "quote\"back\\slash", "tab\tnl\nctl\u{1}", "é✓"] {
        let stored = StoredEvent::new(session, turn_id, 9, &event, at).unwrap();
        let json = stored.envelope_json();
        // The same as serializing the documented envelope, field for field.
        let expected = serde_json::to_value(EventEnvelope {
            seq: 9,
            session_id: session.to_owned(),
            turn_id,
            created_at: stored.created_at,
            event: event.clone(),
        })
        .unwrap();
        let actual: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(actual, expected, "{json}");
        assert!(!json.contains('\n'), "compact, one line: {json}");
        let mut appended = String::from("[");
        stored.write_envelope(&mut appended);
        assert_eq!(appended, format!("[{json}"));
    }
}

#[test]
fn only_the_four_end_states_are_terminal() {
    let terminal: Vec<_> = [
        "turn.started",
        "message.delta",
        "usage",
        "turn.completed",
        "turn.failed",
        "turn.cancelled",
        "turn.interrupted",
    ]
    .into_iter()
    .filter(|t| is_terminal_type(t))
    .collect();
    assert_eq!(
        terminal,
        [
            "turn.completed",
            "turn.failed",
            "turn.cancelled",
            "turn.interrupted"
        ]
    );
}
