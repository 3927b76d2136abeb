//! Runs: a turn's text deltas committed together, kept as one row.
//!
//! A fast model streams hundreds of deltas a second, and each was a row of
//! its own: an insert, a key to compare, a page to rewrite and checksum in
//! the WAL. Both writers keep the deltas of one turn and step that a
//! commit holds, contiguous in seq, as one row: `seq` the first's,
//! `seq_end` the last's, and a payload that lists each event's time and
//! payload, in order. Every read expands a run back into its events, the
//! same ones (seq, type, payload, time) as rows of one event each, so a
//! client resuming after any seq inside a run gets exactly the rest.
//!
//! The payload of a run: `[["<time>",<payload>],…]`, each time as the
//! writer writes a row's, each payload the event's own JSON, unchanged.

use chrono::{DateTime, Utc};
use serde_json::value::RawValue;

use super::super::{Result, StoreError, records::rows::EventRow};
use crate::events::StoredEvent;

/// The most events in a run: a read's lower bound is the row at or before
/// its cursor, so a run's size bounds nothing there, but a row stays small.
pub const MAX_RUN: usize = 256;

/// The type of the events that make runs.
pub(super) const DELTA: &str = "message.delta";

/// One row to insert: an event alone, or a run of deltas.
#[derive(Debug, PartialEq, Eq)]
pub enum Row<'e> {
    One(&'e StoredEvent),
    Run {
        first: &'e StoredEvent,
        seq_end: i64,
        payload: String,
    },
}

impl<'e> Row<'e> {
    /// The event whose session, seq, turn, type and time the row has.
    pub fn first(&self) -> &'e StoredEvent {
        match self {
            Self::One(event) | Self::Run { first: event, .. } => event,
        }
    }

    pub fn seq_end(&self) -> Option<i64> {
        match self {
            Self::One(_) => None,
            Self::Run { seq_end, .. } => Some(*seq_end),
        }
    }

    pub fn payload(&self) -> &str {
        match self {
            Self::One(event) => &event.payload,
            Self::Run { payload, .. } => payload,
        }
    }
}

/// The step of a delta's payload, read without parsing it whole when the
/// event was made here (its typed event is at hand).
fn delta_step(event: &StoredEvent) -> Option<u32> {
    match event.event()? {
        crate::events::TurnEvent::MessageDelta { step, .. } => Some(*step),
        _ => None,
    }
}

/// Puts a batch's events in session and seq order, as rows are made from
/// them; two at one seq of one session are [`StoreError::Conflict`], as a
/// duplicate key is.
pub(super) fn in_session_order<E: std::ops::Deref<Target = StoredEvent>>(
    events: &mut [E],
) -> Result<()> {
    events.sort_by(|a, b| (&a.session_id, a.seq).cmp(&(&b.session_id, b.seq)));
    let twice = events
        .windows(2)
        .any(|w| w[0].seq == w[1].seq && w[0].session_id == w[1].session_id);
    if twice {
        return Err(StoreError::Conflict);
    }
    Ok(())
}

/// Whether `next` goes on the run that `last` ends.
pub(super) fn continues(last: &StoredEvent, next: &StoredEvent) -> bool {
    next.event_type == DELTA
        && last.event_type == DELTA
        && next.seq == last.seq + 1
        && next.turn_id == last.turn_id
        && next.session_id == last.session_id
        && delta_step(next).is_some_and(|step| delta_step(last) == Some(step))
}

/// `events` (in the order they are written) as rows: each stretch of two
/// or more deltas of one turn and step, contiguous in seq, is a run (of
/// at most [`MAX_RUN`]); every other event is a row of its own. `time`
/// writes an event's time as its row would hold it.
pub fn rows<'e>(
    events: impl IntoIterator<Item = &'e StoredEvent>,
    time: impl Fn(DateTime<Utc>) -> String,
) -> Vec<Row<'e>> {
    let mut rows = Vec::new();
    let mut stretch: Vec<&'e StoredEvent> = Vec::new();
    let flush = |stretch: &mut Vec<&'e StoredEvent>, rows: &mut Vec<Row<'e>>| {
        match stretch.as_slice() {
            [] => {}
            [one] => rows.push(Row::One(one)),
            [first, .., last] => {
                let mut payload = String::with_capacity(
                    stretch.iter().map(|e| e.payload.len() + 40).sum::<usize>() + 2,
                );
                payload.push('[');
                for (i, event) in stretch.iter().enumerate() {
                    if i > 0 {
                        payload.push(',');
                    }
                    // A time is digits, dashes, colons, a dot, a plus and
                    // letters: nothing to escape.
                    payload.push_str("[\"");
                    payload.push_str(&time(event.created_at));
                    payload.push_str("\",");
                    payload.push_str(&event.payload);
                    payload.push(']');
                }
                payload.push(']');
                rows.push(Row::Run {
                    first,
                    seq_end: last.seq,
                    payload,
                });
            }
        }
        stretch.clear();
    };
    for event in events {
        let goes_on = stretch
            .last()
            .is_some_and(|last| stretch.len() < MAX_RUN && continues(last, event));
        if !goes_on {
            flush(&mut stretch, &mut rows);
        }
        stretch.push(event);
    }
    flush(&mut stretch, &mut rows);
    rows
}

/// The events of a row read back: itself, or each event of its run.
/// `parse` reads a time as the writer wrote it.
pub fn expand(
    row: EventRow,
    parse: impl Fn(&str) -> Result<DateTime<Utc>>,
) -> Result<Vec<StoredEvent>> {
    let turn_id = crate::store::records::parse_uuid(&row.turn_id)?;
    let Some(seq_end) = row.seq_end else {
        return Ok(vec![StoredEvent::read(
            row.session_id,
            row.seq,
            turn_id,
            (row.event_type, row.payload),
            row.created_at,
        )]);
    };
    let corrupt = |why: &str| {
        StoreError::Corrupt(format!(
            "the run of events {}..={seq_end} of session {}: {why}",
            row.seq, row.session_id
        ))
    };
    let parts: Vec<(&str, &RawValue)> =
        serde_json::from_str(&row.payload).map_err(|e| corrupt(&e.to_string()))?;
    let count = usize::try_from(seq_end - row.seq + 1).unwrap_or(0);
    if parts.len() != count || count < 2 {
        return Err(corrupt(&format!("{} events listed", parts.len())));
    }
    parts
        .into_iter()
        .zip(row.seq..)
        .map(|((time, payload), seq)| {
            Ok(StoredEvent::read(
                row.session_id.clone(),
                seq,
                turn_id,
                (row.event_type.clone(), payload.get().to_owned()),
                parse(time)?,
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::TurnEvent;

    fn event(turn: uuid::Uuid, seq: i64, event: TurnEvent) -> StoredEvent {
        let at = DateTime::from_timestamp(1_700_000_000 + seq, 123_456_789).unwrap();
        StoredEvent::from_event("t/s", turn, seq, event, at).unwrap()
    }

    fn delta(turn: uuid::Uuid, seq: i64, step: u32, text: &str) -> StoredEvent {
        let text = text.to_owned();
        event(turn, seq, TurnEvent::MessageDelta { step, text })
    }

    fn time(at: DateTime<Utc>) -> String {
        at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, false)
    }

    fn parse(raw: &str) -> Result<DateTime<Utc>> {
        DateTime::parse_from_rfc3339(raw)
            .map(|at| at.with_timezone(&Utc))
            .map_err(|e| StoreError::Corrupt(e.to_string()))
    }

    fn row_of(row: &Row<'_>) -> EventRow {
        let first = row.first();
        EventRow {
            session_id: first.session_id.clone(),
            seq: first.seq,
            seq_end: row.seq_end(),
            turn_id: first.turn_id.to_string(),
            event_type: first.event_type.clone(),
            payload: row.payload().to_owned(),
            created_at: first.created_at,
        }
    }

    /// Deltas of one turn and step, contiguous, are one row; anything
    /// else (another type, step, turn, or a hole in the seqs) ends the
    /// run. Read back, the rows are the same events, in order.
    #[test]
    fn runs_of_deltas_are_one_row_and_read_back_as_the_same_events() {
        let (a, b) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
        let started = event(
            a,
            1,
            TurnEvent::MessageRetracted {
                step: 1,
                reason: "retry".into(),
            },
        );
        let events = vec![
            started,
            delta(a, 2, 1, "He"),
            delta(a, 3, 1, "l\"lo"),
            delta(a, 4, 1, " w"),
            delta(b, 9, 1, "other turn"),
            delta(a, 5, 2, "next step"),
            delta(a, 6, 2, "!"),
            delta(a, 8, 2, "after a hole"),
        ];
        let rows = rows(&events, time);
        let shape: Vec<(i64, Option<i64>)> =
            rows.iter().map(|r| (r.first().seq, r.seq_end())).collect();
        assert_eq!(
            shape,
            [(1, None), (2, Some(4)), (9, None), (5, Some(6)), (8, None)]
        );
        let back: Vec<StoredEvent> = rows
            .iter()
            .flat_map(|r| expand(row_of(r), parse).unwrap())
            .collect();
        assert_eq!(back, events);
        for (back, made) in back.iter().zip(&events) {
            assert_eq!(back.created_at, made.created_at, "seq {}", made.seq);
            assert_eq!(back.payload, made.payload);
        }
    }

    /// A run holds at most [`MAX_RUN`] events; a longer stretch is several.
    #[test]
    fn a_long_stretch_is_cut_into_runs_of_at_most_the_limit() {
        let turn = uuid::Uuid::now_v7();
        let events: Vec<StoredEvent> = (1..=600).map(|seq| delta(turn, seq, 1, "t")).collect();
        let rows = rows(&events, time);
        let shape: Vec<(i64, Option<i64>)> =
            rows.iter().map(|r| (r.first().seq, r.seq_end())).collect();
        assert_eq!(shape, [(1, Some(256)), (257, Some(512)), (513, Some(600))]);
    }

    /// A run whose listed events do not match its seqs is corrupt, not
    /// read as fewer or more events.
    #[test]
    fn a_run_that_lists_the_wrong_number_of_events_is_corrupt() {
        let turn = uuid::Uuid::now_v7();
        let events = [delta(turn, 1, 1, "a"), delta(turn, 2, 1, "b")];
        let rows = rows(&events, time);
        let mut row = row_of(&rows[0]);
        row.seq_end = Some(3);
        let error = expand(row, parse).unwrap_err();
        assert!(
            matches!(error, StoreError::Corrupt(ref why) if why.contains("2 events listed")),
            "{error:?}"
        );
    }
}
