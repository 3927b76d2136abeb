//! An export read back: every line checked against the format before
//! anything is written (its version, each line's type and columns, their
//! kinds, the order of the parts, turns that ended, rows of the session's
//! own turns, the closing line's count).

use std::collections::HashSet;

use base64::Engine as _;
use chrono::{DateTime, Utc};
use serde_json::{Map, Value};

use super::{Cell, Column, FORMAT, Kind, PARTS, Part, SESSION, VERSION};
use crate::{
    events::{SESSION_TURN, is_session_type},
    ids::SessionId,
};

/// An export, checked.
#[derive(Debug)]
pub struct Parsed {
    /// The session's id, as clients name it.
    pub id: SessionId,
    /// The session's columns ([`SESSION`]).
    pub session: Vec<Cell>,
    /// Each row, in the order of the lines.
    pub rows: Vec<(&'static Part, Vec<Cell>)>,
}

/// Why an export cannot be imported: the line (from 1) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ImportError {
    pub line: usize,
    pub message: String,
}

fn invalid(line: usize, message: impl Into<String>) -> ImportError {
    ImportError {
        line,
        message: message.into(),
    }
}

/// The statuses of a turn that ended: an export holds no other.
const ENDED: [&str; 4] = ["completed", "failed", "cancelled", "interrupted"];

/// Reads an export (see [`super`]).
pub fn parse(text: &str) -> Result<Parsed, ImportError> {
    let mut lines = text.lines().enumerate().map(|(i, line)| (i + 1, line));
    let (n, first) = lines
        .next()
        .ok_or_else(|| invalid(1, "the export is empty"))?;
    check_header(n, first)?;
    let (n, second) = lines
        .next()
        .ok_or_else(|| invalid(2, "the session's line is missing"))?;
    let (id, session) = session_line(n, second)?;
    let mut seqs = Seqs::of(n, &session)?;
    check_meaning(n, &SESSION, &session, &mut seqs)?;
    let mut rows = Vec::new();
    let mut turns = HashSet::new();
    let mut at_part = 0;
    let mut ended = false;
    for (n, text) in lines {
        if ended {
            return Err(invalid(n, "nothing may follow the `end` line"));
        }
        let line = object(n, text)?;
        let kind = line.get("type").and_then(Value::as_str).unwrap_or_default();
        if kind == "end" {
            let count = line.get("lines").and_then(Value::as_u64);
            if line.len() != 2 || count != Some(n as u64 - 1) {
                return Err(invalid(
                    n,
                    format!("the `end` line must count the {} lines before it", n - 1),
                ));
            }
            ended = true;
            continue;
        }
        let Some(index) = PARTS.iter().position(|p| p.line == kind) else {
            return Err(invalid(n, format!("no line type `{kind}`")));
        };
        if index < at_part {
            return Err(invalid(
                n,
                format!("a `{kind}` line after the `{}` lines", PARTS[at_part].line),
            ));
        }
        at_part = index;
        let part = &PARTS[index];
        let mut row = cells(n, part, line)?;
        if part.line == "event" {
            session_event(n, part, &mut row, &turns)?;
        }
        check_turn(n, part, &row, &mut turns)?;
        check_meaning(n, part, &row, &mut seqs)?;
        rows.push((part, row));
    }
    if !ended {
        return Err(invalid(
            text.lines().count() + 1,
            "the export ends without its `end` line (it was cut short)",
        ));
    }
    check_files(&rows)?;
    Ok(Parsed { id, session, rows })
}

/// Each file's chunks are its bytes: numbered from 0 in order, as many
/// bytes as it says, whose SHA-256 is its `sha256` (an import may not
/// pass other bytes off as a tenant's stored ones); a chunk names a file
/// of the export.
fn check_files(rows: &[(&'static Part, Vec<Cell>)]) -> Result<(), ImportError> {
    use sha2::Digest as _;
    let text = |cell: &Cell| match cell {
        Cell::Text(text) => text.clone(),
        _ => String::new(),
    };
    let int = |cell: &Cell| match cell {
        Cell::Int(n) => *n,
        _ => -1,
    };
    // (id, sha256, bytes) of each file, and its bytes so far.
    let mut files: Vec<(String, String, i64, sha2::Sha256, i64, i64)> = Vec::new();
    for (line, (part, row)) in rows.iter().enumerate() {
        match part.line {
            "file" => files.push((
                text(&row[0]),
                text(&row[1]),
                int(&row[2]),
                sha2::Sha256::new(),
                0,
                0,
            )),
            "file_chunk" => {
                let (id, index) = (text(&row[0]), int(&row[1]));
                let Some(file) = files.iter_mut().find(|f| f.0 == id) else {
                    return Err(invalid(
                        line + 3,
                        format!("a chunk of no file of the export: {id}"),
                    ));
                };
                if index != file.5 {
                    return Err(invalid(
                        line + 3,
                        format!("{id}'s chunk {} is missing", file.5),
                    ));
                }
                if let Cell::Bytes(data) = &row[2] {
                    file.3.update(data);
                    file.4 += data.len() as i64;
                }
                file.5 += 1;
            }
            _ => {}
        }
    }
    for (id, sha256, bytes, hasher, read, _) in files {
        if read != bytes || hex::encode(hasher.finalize()) != sha256 {
            return Err(invalid(
                rows.len() + 2,
                format!("the chunks of {id} are not its {bytes} bytes of SHA-256 {sha256}"),
            ));
        }
    }
    Ok(())
}

/// The columns of a line that hold a JSON object as text.
const JSON_COLUMNS: [(&str, &str); 4] = [
    ("turn", "request"),
    ("turn", "result"),
    ("event", "payload"),
    ("decision", "record"),
];

/// The roles the service writes in a session's history: an import that
/// gave a line another (`system`) would make its text the operator's in
/// every later prompt.
const ROLES: [&str; 2] = ["user", "assistant"];

/// The earliest time a row may have: older ones are not this service's.
const EARLIEST: &str = "2000-01-01T00:00:00Z";

/// How far past the importer's clock a row's time may be (clocks differ).
const LATEST_AHEAD: chrono::Duration = chrono::Duration::days(1);

/// Where the session's seqs are: its `last_seq`, and the last event's.
struct Seqs {
    last_seq: i64,
    event: i64,
    turn: i64,
}

impl Seqs {
    /// From the session's line: its `last_seq`, 0 or more.
    fn of(n: usize, session: &[Cell]) -> Result<Self, ImportError> {
        let at = SESSION.columns.iter().position(|c| c.name == "last_seq");
        match at.and_then(|i| session.get(i)) {
            Some(Cell::Int(last_seq)) if *last_seq >= 0 => Ok(Self {
                last_seq: *last_seq,
                event: 0,
                turn: 0,
            }),
            _ => Err(invalid(n, "`last_seq` must be 0 or more")),
        }
    }
}

/// What a row means, checked as the service itself would have written it:
/// no U+0000 in any text (Postgres text cannot hold it), JSON columns JSON
/// objects without `\u0000`, history roles the service writes, seqs in
/// order within the session's `last_seq`, and times within reason.
fn check_meaning(n: usize, part: &Part, row: &[Cell], seqs: &mut Seqs) -> Result<(), ImportError> {
    let earliest = DateTime::parse_from_rfc3339(EARLIEST)
        .map(|at| at.with_timezone(&Utc))
        .unwrap_or_default();
    let latest = Utc::now() + LATEST_AHEAD;
    for (column, cell) in part.columns.iter().zip(row) {
        let wrong = |what: &str| invalid(n, format!("`{}` {what}", column.field));
        match cell {
            Cell::Text(text) if text.contains('\0') => return Err(wrong("contains U+0000")),
            Cell::Text(text) if JSON_COLUMNS.contains(&(part.line, column.name)) => {
                if !matches!(serde_json::from_str::<Value>(text), Ok(Value::Object(_))) {
                    return Err(wrong("must be a JSON object, as text"));
                }
                if crate::turn::json_has_nul(text) {
                    return Err(wrong("contains U+0000"));
                }
            }
            Cell::Text(role)
                if part.line == "message"
                    && column.name == "role"
                    && !ROLES.contains(&role.as_str()) =>
            {
                return Err(wrong("must be `user` or `assistant`"));
            }
            Cell::At(at) if *at < earliest || *at > latest => {
                return Err(wrong("is not a time of this service (2000 to tomorrow)"));
            }
            Cell::Int(seq) if column.name == "seq" || column.name == "first_seq" => {
                let after = if column.name == "seq" {
                    &mut seqs.event
                } else {
                    &mut seqs.turn
                };
                if *seq <= 0 || *seq > seqs.last_seq {
                    return Err(wrong(&format!(
                        "must be from 1 to the session's `last_seq` ({})",
                        seqs.last_seq
                    )));
                }
                // Events are in seq order, each once; turns in the order
                // of their first events.
                let strict = column.name == "seq";
                if *seq < *after || (strict && *seq == *after) {
                    return Err(wrong("is out of order"));
                }
                *after = *seq;
            }
            Cell::Int(count) if *count < 0 => return Err(wrong("must be 0 or more")),
            _ => {}
        }
    }
    Ok(())
}

/// The first line: this format, this version.
fn check_header(n: usize, text: &str) -> Result<(), ImportError> {
    let header = object(n, text)?;
    if header.get("format").and_then(Value::as_str) != Some(FORMAT) {
        return Err(invalid(
            n,
            format!("the first line names no format `{FORMAT}`"),
        ));
    }
    match header.get("version").and_then(Value::as_u64) {
        Some(VERSION) => Ok(()),
        other => Err(invalid(
            n,
            format!("version {other:?} is not read here (only {VERSION})"),
        )),
    }
}

/// The session's line: its id and its columns (its tenant is local: the
/// importer's is the session's).
fn session_line(n: usize, text: &str) -> Result<(SessionId, Vec<Cell>), ImportError> {
    let mut line = object(n, text)?;
    expect_type(n, &line, SESSION.line)?;
    let id = match line.remove("id") {
        Some(Value::String(id)) => {
            SessionId::parse(&id).map_err(|e| invalid(n, format!("`id`: {e}")))?
        }
        _ => return Err(invalid(n, "`id` must be the session's id")),
    };
    line.remove("tenant");
    Ok((id, cells(n, &SESSION, line)?))
}

/// A turn is a UUID that ended; a row of a turn names one of the
/// session's turns (given before it).
fn check_turn(
    n: usize,
    part: &Part,
    row: &[Cell],
    turns: &mut HashSet<String>,
) -> Result<(), ImportError> {
    let turn_id = part
        .columns
        .iter()
        .position(|c| c.name == "turn_id" || (part.line == "turn" && c.name == "id"));
    if let Some(Cell::Text(turn)) = turn_id.map(|i| &row[i]) {
        if part.line == "turn" {
            uuid::Uuid::parse_str(turn).map_err(|_| invalid(n, "`id`: a turn's id is a UUID"))?;
            // A turn continues one of the session's that began before it
            // (a line before it): never another session's.
            let parent = part.columns.iter().position(|c| c.name == "parent_turn_id");
            if let Some(Cell::Text(parent)) = parent.map(|i| &row[i])
                && !turns.contains(parent)
            {
                return Err(invalid(
                    n,
                    format!("`parent_turn_id` {parent} is no earlier turn of the session"),
                ));
            }
            turns.insert(turn.clone());
        } else {
            let sessions = part.line == "event" && *turn == SESSION_TURN.to_string();
            if !turns.contains(turn) && !sessions {
                return Err(invalid(
                    n,
                    format!("`turn_id` {turn} is no turn of the session"),
                ));
            }
        }
    }
    if part.line == "turn"
        && let Some(Cell::Text(status)) = status_of(row)
        && !ENDED.contains(&status.as_str())
    {
        return Err(invalid(n, format!("a turn that ended, not `{status}`")));
    }
    Ok(())
}

/// An event the session owns (a judgement) is under [`SESSION_TURN`],
/// which is no turn. Earlier versions wrote a judgement's
/// event under a fresh UUID that named no turn: such an event is read as
/// the session's (its `turn_id` becomes [`SESSION_TURN`]). A turn's own
/// event may not take the session's id.
fn session_event(
    n: usize,
    part: &Part,
    row: &mut [Cell],
    turns: &HashSet<String>,
) -> Result<(), ImportError> {
    let at = |name: &str| part.columns.iter().position(|c| c.name == name);
    let (Some(turn_at), Some(type_at)) = (at("turn_id"), at("type")) else {
        return Ok(());
    };
    let Cell::Text(event_type) = &row[type_at] else {
        return Ok(());
    };
    let event_type = event_type.clone();
    let owned = is_session_type(&event_type);
    let session = SESSION_TURN.to_string();
    if let Cell::Text(turn) = &mut row[turn_at] {
        if *turn == session && !owned {
            return Err(invalid(
                n,
                format!("a `{event_type}` event belongs to a turn, not to the session"),
            ));
        }
        if owned && !turns.contains(turn.as_str()) {
            *turn = session;
        }
    }
    Ok(())
}

fn status_of(row: &[Cell]) -> Option<&Cell> {
    let index = PARTS[0].columns.iter().position(|c| c.name == "status")?;
    row.get(index)
}

fn object(n: usize, text: &str) -> Result<Map<String, Value>, ImportError> {
    match serde_json::from_str(text) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(_) => Err(invalid(n, "a line is one JSON object")),
        Err(e) => Err(invalid(n, format!("not JSON: {e}"))),
    }
}

fn expect_type(n: usize, line: &Map<String, Value>, kind: &str) -> Result<(), ImportError> {
    if line.get("type").and_then(Value::as_str) == Some(kind) {
        Ok(())
    } else {
        Err(invalid(n, format!("a `{kind}` line is expected here")))
    }
}

/// A line's columns, in `part`'s order, each of its kind; no other field.
fn cells(n: usize, part: &Part, mut line: Map<String, Value>) -> Result<Vec<Cell>, ImportError> {
    line.remove("type");
    let mut row = Vec::with_capacity(part.columns.len());
    for column in part.columns {
        let value = line.remove(column.field).unwrap_or(Value::Null);
        row.push(cell(n, column, value)?);
    }
    if let Some(name) = line.keys().next() {
        return Err(invalid(
            n,
            format!("no field `{name}` in a `{}` line", part.line),
        ));
    }
    Ok(row)
}

fn cell(n: usize, column: &Column, value: Value) -> Result<Cell, ImportError> {
    let wrong = |what: &str| invalid(n, format!("`{}` must be {what}", column.field));
    let cell = match (column.kind, value) {
        (_, Value::Null) if column.null => Cell::Null,
        (_, Value::Null) => return Err(wrong("given")),
        (Kind::Text, Value::String(text)) => Cell::Text(text),
        (Kind::Text, _) => return Err(wrong("a string")),
        (Kind::Int, Value::Number(number)) => {
            Cell::Int(number.as_i64().ok_or_else(|| wrong("an integer"))?)
        }
        (Kind::Int, _) => return Err(wrong("an integer")),
        (Kind::Real, Value::Number(number)) => {
            Cell::Real(number.as_f64().ok_or_else(|| wrong("a number"))?)
        }
        (Kind::Real, _) => return Err(wrong("a number")),
        (Kind::Flag, Value::Bool(flag)) => Cell::Flag(flag),
        (Kind::Flag, _) => return Err(wrong("true or false")),
        (Kind::At, Value::String(text)) => Cell::At(
            DateTime::parse_from_rfc3339(&text)
                .map_err(|_| wrong("an RFC 3339 time"))?
                .with_timezone(&Utc),
        ),
        (Kind::At, _) => return Err(wrong("an RFC 3339 time")),
        (Kind::Bytes, Value::String(text)) => Cell::Bytes(
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .map_err(|_| wrong("base64"))?,
        ),
        (Kind::Bytes, _) => return Err(wrong("base64")),
    };
    Ok(cell)
}
