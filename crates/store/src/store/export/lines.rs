//! The stream of an export's lines: the header, the session, each part
//! a page of rows at a time, and the `end` line.

use chrono::{SubsecRound as _, Utc};
use serde_json::Value;

use super::{Cell, PARTS, Part, SESSION, header, line};
use uuid::Uuid;

use crate::{events::StoredEvent, ids::SessionKey, store::Result};

/// Rows a page of an export reads.
const PAGE: u32 = 500;

/// Where an export is.
enum At {
    Header,
    Part(usize, u64),
    /// A fork's: the events of the `n`th turn of its prefix, after a seq.
    Prefix(usize, i64),
    End,
    Done,
}

/// The lines of the export of the session `key`, a page of rows a chunk:
/// the header, the session, each part, and the `end` line that counts the
/// lines before it (an export cut short has none, and is refused at
/// import). An export fails when the session changed while it was read.
pub fn lines(
    store: std::sync::Arc<dyn crate::store::Store>,
    key: SessionKey,
    session: crate::store::SessionRecord,
) -> impl futures::Stream<Item = Result<String>> + Send {
    let forked = session.forked_at.is_some();
    let prefix: std::sync::Arc<std::sync::OnceLock<Vec<(SessionKey, Uuid)>>> =
        std::sync::Arc::default();
    futures::stream::unfold((At::Header, 0u64), move |(at, written)| {
        let (store, key, session) = (store.clone(), key.clone(), session.clone());
        let prefix = prefix.clone();
        async move {
            let (chunk, next) = match at {
                At::Done => return None,
                At::Header => {
                    let head = header(store.backend(), Utc::now());
                    let extra = [
                        ("id", Value::from(key.id())),
                        ("tenant", Value::from(key.tenant())),
                    ];
                    let cells = vec![
                        Cell::At(session.created_at.trunc_subsecs(6)),
                        Cell::At(session.updated_at.trunc_subsecs(6)),
                        Cell::Int(session.turn_count),
                        Cell::Int(session.last_seq),
                        session.cost_usd.map_or(Cell::Null, Cell::Real),
                    ];
                    let body = line(&SESSION, &cells, &extra);
                    ((format!("{head}\n{body}\n"), 2), At::Part(0, 0))
                }
                // A fork's events begin with its prefix's, turn by turn
                // (read as the source's log reads them).
                At::Part(index, 0)
                    if forked && PARTS[index].line == "event" && prefix.get().is_none() =>
                {
                    let turns = match store.prefix_turns(&key).await {
                        Ok(turns) => turns,
                        Err(e) => return Some((Err(e), (At::Done, written))),
                    };
                    let _ = prefix.set(turns);
                    ((String::new(), 0), At::Prefix(0, 0))
                }
                At::Prefix(n, after) => {
                    let turns = prefix.get().map_or(&[][..], Vec::as_slice);
                    match prefix_events(store.as_ref(), turns, n, after).await {
                        Ok(step) => step,
                        Err(e) => return Some((Err(e), (At::Done, written))),
                    }
                }
                At::Part(index, offset) => {
                    let part = &PARTS[index];
                    let page = match page(store.as_ref(), part, &key, forked, offset).await {
                        Ok(page) => page,
                        Err(e) => return Some((Err(e), (At::Done, written))),
                    };
                    let next = if page.len() == PAGE as usize {
                        At::Part(index, next_offset(part, &page, offset))
                    } else if index + 1 < PARTS.len() {
                        At::Part(index + 1, 0)
                    } else {
                        At::End
                    };
                    let count = page.len() as u64;
                    ((lines_of(part, page.into_iter()), count), next)
                }
                At::End => {
                    match store.get_session(&key).await {
                        Ok(Some(now)) if now.last_seq == session.last_seq => {}
                        Ok(_) => {
                            let changed = crate::store::StoreError::Unavailable(
                                "the session changed while it was exported".into(),
                            );
                            return Some((Err(changed), (At::Done, written)));
                        }
                        Err(e) => return Some((Err(e), (At::Done, written))),
                    }
                    let end = serde_json::json!({"type": "end", "lines": written});
                    ((format!("{end}\n"), 0), At::Done)
                }
            };
            let (text, count) = chunk;
            Some((Ok(text), (next, written + count)))
        }
    })
}

/// A page of `part`'s rows of the session `key` after `offset`. The events
/// are read as every reader reads them (a run of deltas is its events),
/// and `offset` is then the seq the page starts after; for the other
/// parts, the rows before the page.
async fn page(
    store: &dyn crate::store::Store,
    part: &Part,
    key: &SessionKey,
    forked: bool,
    offset: u64,
) -> Result<Vec<Vec<Cell>>> {
    if part.line == "event" {
        let after = i64::try_from(offset).unwrap_or(i64::MAX);
        let events = store.list_events(key, None, after, PAGE).await?;
        Ok(events.iter().map(event_cells).collect())
    } else {
        store.export_page(part, key, forked, PAGE, offset).await
    }
}

/// A page of the events of the `n`th turn of a fork's prefix after the
/// seq `after` (read as the source's log reads them), and what follows.
async fn prefix_events(
    store: &dyn crate::store::Store,
    turns: &[(SessionKey, Uuid)],
    n: usize,
    after: i64,
) -> Result<((String, u64), At)> {
    let events = PARTS.iter().position(|p| p.line == "event").unwrap_or(0);
    let Some((source, turn)) = turns.get(n) else {
        return Ok(((String::new(), 0), At::Part(events, 0)));
    };
    let page = store.list_events(source, Some(*turn), after, PAGE).await?;
    let next = match page.last() {
        Some(last) if page.len() == PAGE as usize => At::Prefix(n, last.seq),
        _ => At::Prefix(n + 1, 0),
    };
    let count = page.len() as u64;
    let chunk = lines_of(&PARTS[events], page.iter().map(event_cells));
    Ok(((chunk, count), next))
}

/// Rows of `part` as lines.
fn lines_of(part: &Part, rows: impl Iterator<Item = Vec<Cell>>) -> String {
    let mut chunk = String::new();
    for row in rows {
        chunk.push_str(&line(part, &row, &[]));
        chunk.push('\n');
    }
    chunk
}

/// Where the page after the full `page` of `part` starts (see [`page`]).
fn next_offset(part: &Part, page: &[Vec<Cell>], offset: u64) -> u64 {
    match page.last().and_then(|row| row.first()) {
        Some(Cell::Int(seq)) if part.line == "event" => u64::try_from(*seq).unwrap_or(u64::MAX),
        _ => offset + u64::from(PAGE),
    }
}

/// An event as the `event` part's columns hold it.
fn event_cells(event: &StoredEvent) -> Vec<Cell> {
    vec![
        Cell::Int(event.seq),
        Cell::Text(event.turn_id.to_string()),
        Cell::Text(event.event_type.clone()),
        Cell::Text(event.payload.clone()),
        Cell::At(event.created_at.trunc_subsecs(6)),
    ]
}
