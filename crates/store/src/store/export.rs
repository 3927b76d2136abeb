//! A session as JSON Lines, and back: what `GET
//! /sessions/{id}/export` streams and `POST /sessions/import` (or
//! `agent-harness import`) makes again, in this deployment or another,
//! on either backend.
//!
//! The first line names the format and its version, and which fields are
//! local (they differ between an export and the export of its import: the
//! time, the backend, the tenant). Then the session, then each of its
//! parts ([`PARTS`]) in a fixed order: turns, events, messages, decisions,
//! approvals, client tools' results, artifacts, checkpoints (with the
//! note's saved bytes, base64), judgements, observations, the files its
//! messages carried and their bytes (a chunk a line, base64). A line is one
//! row: its `type`, then its columns by name. Times are RFC 3339 in UTC
//! to the microsecond (what both backends keep), so an export of an
//! import is the same bytes, but its local fields.
//!
//! Not exported: what belongs to the deployment rather than the session
//! (webhook deliveries, A2A push configurations, background jobs, queue
//! tickets, steers, a running turn's step records; the ids messages are
//! numbered by), and the memories (they are the user's, across sessions: `GET
//! /memories`).

mod import;
mod lines;
mod postgres;
mod sqlite;
mod tree;

pub use lines::lines;

use async_trait::async_trait;
use base64::Engine as _;
use chrono::{DateTime, SecondsFormat, SubsecRound as _, Utc};
use serde_json::{Map, Value};
use sqlx::{ColumnIndex, Decode, Type};

pub use import::{ImportError, Parsed, parse};

use super::reader::{Arg, Reader, Reads, args, bind_all};
use super::records::parse_uuid;
use crate::{ids::SessionKey, store::Result};

/// The format's name, on the first line.
pub const FORMAT: &str = "agent-harness/session";

/// The format's version: an import reads this one only.
pub const VERSION: u64 = 1;

/// The fields that differ between an export and the export of its
/// import: `header.` (the first line's) and `session.` (the session's).
pub const LOCAL: [&str; 3] = ["header.exported_at", "header.backend", "session.tenant"];

/// How a column is kept, and written in a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Text,
    Int,
    Real,
    Flag,
    /// A time: RFC 3339, UTC, microseconds.
    At,
    /// Bytes: base64.
    Bytes,
}

/// A column of a part.
#[derive(Debug, Clone, Copy)]
pub struct Column {
    pub name: &'static str,
    /// Its field in a line (its name, but where that is `type`).
    pub field: &'static str,
    pub kind: Kind,
    /// Whether it may be `null`.
    pub null: bool,
}

const fn col(name: &'static str, kind: Kind) -> Column {
    Column {
        name,
        field: name,
        kind,
        null: false,
    }
}

const fn opt(name: &'static str, kind: Kind) -> Column {
    Column {
        name,
        field: name,
        kind,
        null: true,
    }
}

/// A kind of row of a session: its line's `type`, its table, the columns
/// exported (the session's key is implied), and their order.
#[derive(Debug)]
pub struct Part {
    pub line: &'static str,
    pub table: &'static str,
    pub columns: &'static [Column],
    pub order: &'static str,
}

/// The session's own row.
pub const SESSION: Part = Part {
    line: "session",
    table: "sessions",
    columns: &[
        col("created_at", Kind::At),
        col("updated_at", Kind::At),
        col("turn_count", Kind::Int),
        col("last_seq", Kind::Int),
        opt("cost_usd", Kind::Real),
    ],
    order: "id",
};

/// The parts of a session, in the order they are written.
pub const PARTS: &[Part] = &[
    Part {
        line: "turn",
        table: "turns",
        columns: &[
            col("id", Kind::Text),
            col("status", Kind::Text),
            col("request", Kind::Text),
            opt("idempotency_key", Kind::Text),
            opt("result", Kind::Text),
            opt("error_code", Kind::Text),
            opt("error_message", Kind::Text),
            col("first_seq", Kind::Int),
            col("created_at", Kind::At),
            opt("finished_at", Kind::At),
            opt("cost_usd", Kind::Real),
            col("attempt", Kind::Int),
            opt("traceparent", Kind::Text),
            opt("hidden_at", Kind::At),
            col("waited_ms", Kind::Int),
            col("resumes", Kind::Int),
            opt("parent_turn_id", Kind::Text),
            opt("run_id", Kind::Text),
        ],
        order: "first_seq, id",
    },
    Part {
        line: "event",
        table: "events",
        columns: &[
            col("seq", Kind::Int),
            col("turn_id", Kind::Text),
            Column {
                name: "type",
                field: "event",
                kind: Kind::Text,
                null: false,
            },
            col("payload", Kind::Text),
            col("created_at", Kind::At),
        ],
        order: "seq",
    },
    Part {
        line: "message",
        table: "messages",
        columns: &[
            col("turn_id", Kind::Text),
            col("role", Kind::Text),
            col("content", Kind::Text),
            col("created_at", Kind::At),
            opt("message_id", Kind::Text),
            opt("attachments", Kind::Text),
        ],
        order: "id",
    },
    Part {
        line: "decision",
        table: "decisions",
        columns: &[
            col("id", Kind::Text),
            col("turn_id", Kind::Text),
            col("decision_key", Kind::Text),
            col("strategy", Kind::Text),
            col("record", Kind::Text),
            col("created_at", Kind::At),
        ],
        order: "created_at, id",
    },
    Part {
        line: "approval",
        table: "approvals",
        columns: &[
            col("turn_id", Kind::Text),
            col("call_id", Kind::Text),
            col("approved", Kind::Flag),
            opt("reason", Kind::Text),
            col("decided_at", Kind::At),
            opt("edited_arguments", Kind::Text),
            opt("arguments_sha256", Kind::Text),
        ],
        order: "decided_at, turn_id, call_id",
    },
    Part {
        line: "tool_result",
        table: "client_tool_results",
        columns: &[
            col("turn_id", Kind::Text),
            col("call_id", Kind::Text),
            col("output", Kind::Text),
            col("is_error", Kind::Flag),
            col("posted_at", Kind::At),
        ],
        order: "posted_at, turn_id, call_id",
    },
    Part {
        line: "artifact",
        table: "artifacts",
        columns: &[
            col("id", Kind::Text),
            col("turn_id", Kind::Text),
            col("call_id", Kind::Text),
            col("tool", Kind::Text),
            col("content", Kind::Text),
            col("created_at", Kind::At),
        ],
        order: "created_at, id",
    },
    Part {
        line: "checkpoint",
        table: "checkpoints",
        columns: &[
            col("id", Kind::Text),
            col("turn_id", Kind::Text),
            col("call_id", Kind::Text),
            col("tool", Kind::Text),
            col("path", Kind::Text),
            col("existed", Kind::Flag),
            opt("content", Kind::Bytes),
            opt("bytes", Kind::Int),
            col("created_at", Kind::At),
            opt("restored_at", Kind::At),
        ],
        order: "created_at, id",
    },
    Part {
        line: "judgement",
        table: "judgements",
        columns: &[
            col("id", Kind::Text),
            col("turn_id", Kind::Text),
            col("judge", Kind::Text),
            col("prompt_id", Kind::Text),
            col("prompt_version", Kind::Text),
            col("score", Kind::Real),
            col("passed", Kind::Flag),
            col("rationale", Kind::Text),
            col("provider", Kind::Text),
            col("model", Kind::Text),
            col("created_at", Kind::At),
        ],
        order: "created_at, id",
    },
    Part {
        line: "observation",
        table: "research_observations",
        columns: &[
            col("id", Kind::Text),
            col("source_id", Kind::Text),
            col("user_text", Kind::Text),
            col("assistant_text", Kind::Text),
            col("created_at", Kind::At),
        ],
        order: "created_at, id",
    },
    // The files its messages carried, then their bytes a chunk a line.
    Part {
        line: "file",
        table: "files",
        columns: &[
            col("id", Kind::Text),
            col("sha256", Kind::Text),
            col("bytes", Kind::Int),
            col("media_type", Kind::Text),
            col("filename", Kind::Text),
            col("purpose", Kind::Text),
            opt("user_id", Kind::Text),
            col("created_at", Kind::At),
        ],
        order: "created_at, id",
    },
    Part {
        line: "file_chunk",
        table: FILE_CHUNKS,
        columns: &[
            col("file_id", Kind::Text),
            col("idx", Kind::Int),
            col("data", Kind::Bytes),
        ],
        order: "file_id, idx",
    },
];

/// A session's files' chunks, as a table of the session's rows.
pub(super) const FILE_CHUNKS: &str = "(SELECT f.session_id, f.id AS file_id, c.idx, c.data FROM files f \
     JOIN file_chunks c ON c.tenant = f.tenant AND c.sha256 = f.sha256) fc";

/// A value of a column.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Null,
    Text(String),
    Int(i64),
    Real(f64),
    Flag(bool),
    At(DateTime<Utc>),
    Bytes(Vec<u8>),
}

impl Cell {
    /// As a line writes it.
    fn json(&self) -> Value {
        match self {
            Self::Null => Value::Null,
            Self::Text(text) => Value::String(text.clone()),
            Self::Int(n) => Value::from(*n),
            Self::Real(x) => serde_json::Number::from_f64(*x).map_or(Value::Null, Value::Number),
            Self::Flag(flag) => Value::Bool(*flag),
            Self::At(at) => Value::String(time(*at)),
            Self::Bytes(bytes) => {
                Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
            }
        }
    }

    /// As a statement binds it into a column of `kind` (a null is typed
    /// as its column).
    pub(super) fn arg(&self, kind: Kind) -> Arg<'_> {
        match self {
            Self::Null => match kind {
                Kind::Int => Arg::MaybeInt(None),
                Kind::Real => Arg::MaybeReal(None),
                Kind::At => Arg::MaybeAt(None),
                Kind::Bytes => Arg::MaybeBytes(None),
                Kind::Text | Kind::Flag => Arg::MaybeText(None),
            },
            Self::Text(text) => Arg::Text(text),
            Self::Int(n) => Arg::Int(*n),
            Self::Real(x) => Arg::MaybeReal(Some(*x)),
            Self::Flag(flag) => Arg::Flag(*flag),
            Self::At(at) => Arg::At(*at),
            Self::Bytes(bytes) => Arg::MaybeBytes(Some(bytes)),
        }
    }
}

/// A time as a line writes it.
pub fn time(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// The first line of an export.
pub fn header(backend: &str, at: DateTime<Utc>) -> String {
    let mut line = Map::new();
    line.insert("format".into(), FORMAT.into());
    line.insert("version".into(), VERSION.into());
    line.insert("exported_at".into(), time(at).into());
    line.insert("backend".into(), backend.into());
    line.insert("local".into(), LOCAL.to_vec().into());
    Value::Object(line).to_string()
}

/// A row as its line: its `type`, then its columns.
pub fn line(part: &Part, cells: &[Cell], extra: &[(&str, Value)]) -> String {
    let mut line = Map::new();
    line.insert("type".into(), part.line.into());
    for (name, value) in extra {
        line.insert((*name).into(), value.clone());
    }
    for (column, cell) in part.columns.iter().zip(cells) {
        line.insert(column.field.into(), cell.json());
    }
    Value::Object(line).to_string()
}

/// Reads the columns of `kinds` from rows of either driver.
fn decode<R>(kinds: &[Kind], rows: &[R]) -> std::result::Result<Vec<Vec<Cell>>, sqlx::Error>
where
    R: sqlx::Row,
    usize: ColumnIndex<R>,
    for<'r> Option<String>: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Option<i64>: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Option<f64>: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Option<bool>: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Option<DateTime<Utc>>: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Option<Vec<u8>>: Decode<'r, R::Database> + Type<R::Database>,
{
    let one = |row: &R, index: usize, kind: Kind| -> std::result::Result<Cell, sqlx::Error> {
        let cell = match kind {
            Kind::Text => row.try_get::<Option<String>, _>(index)?.map(Cell::Text),
            Kind::Int => row.try_get::<Option<i64>, _>(index)?.map(Cell::Int),
            Kind::Real => row.try_get::<Option<f64>, _>(index)?.map(Cell::Real),
            Kind::Flag => row.try_get::<Option<bool>, _>(index)?.map(Cell::Flag),
            // Microseconds: what both backends keep.
            Kind::At => row
                .try_get::<Option<DateTime<Utc>>, _>(index)?
                .map(|at| Cell::At(at.trunc_subsecs(6))),
            Kind::Bytes => row.try_get::<Option<Vec<u8>>, _>(index)?.map(Cell::Bytes),
        };
        Ok(cell.unwrap_or(Cell::Null))
    };
    rows.iter()
        .map(|row| {
            kinds
                .iter()
                .enumerate()
                .map(|(index, kind)| one(row, index, *kind))
                .collect()
        })
        .collect()
}

/// The select of a part's rows of a session, a page at a time (`$1` the
/// session's key, `$2` the page's size, `$3` the rows before it); of a
/// fork (`forked`), its own rows and its prefix's. An integer is read as
/// a `BIGINT` (Postgres keeps some as `INTEGER`).
fn select(part: &Part, forked: bool) -> String {
    let columns: Vec<String> = part
        .columns
        .iter()
        .map(|c| match c.kind {
            Kind::Int => format!("CAST({} AS BIGINT)", c.name),
            _ => c.name.to_owned(),
        })
        .collect();
    let key = if part.table == "sessions" {
        "id"
    } else {
        "session_id"
    };
    let (with, prefix) = match tree::of_prefix(part).filter(|_| forked) {
        Some(rows) => (tree::PREFIX, format!(" OR {rows}")),
        None => ("", String::new()),
    };
    format!(
        "{with}SELECT {} FROM {} WHERE {key} = $1{prefix} ORDER BY {} LIMIT $2 OFFSET $3",
        columns.join(", "),
        part.table,
        part.order
    )
}

impl Reader<'_> {
    /// A page of `part`'s rows of the session `key` (a fork: `forked`).
    async fn cells(
        self,
        part: &Part,
        key: &str,
        forked: bool,
        (limit, offset): (u32, u64),
    ) -> Result<Vec<Vec<Cell>>> {
        let sql = select(part, forked);
        let offset = i64::try_from(offset).unwrap_or(i64::MAX);
        let args = vec![Arg::Text(key), Arg::Int(i64::from(limit)), Arg::Int(offset)];
        let kinds: Vec<Kind> = part.columns.iter().map(|c| c.kind).collect();
        match self {
            Self::Sqlite(pool) => {
                let rows = bind_all(sqlx::query(sqlx::AssertSqlSafe(sql)), args)
                    .fetch_all(pool)
                    .await?;
                Ok(decode(&kinds, &rows)?)
            }
            Self::Postgres { pool, limit } => {
                let read = bind_all(sqlx::query(sqlx::AssertSqlSafe(sql)), args).fetch_all(pool);
                let rows = super::deadline::within(limit, read).await?;
                Ok(decode(&kinds, &rows)?)
            }
        }
    }
}

/// What an import did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Imported {
    /// The session and all its rows are in.
    Done,
    /// The tenant has a session of that id already (nothing was written).
    Exists,
    /// A row's id is taken in this deployment, in `table` (nothing was
    /// written): a turn, a message, a decision, an artifact... of another
    /// session (the same export imported before, for another tenant).
    Taken(&'static str),
}

/// Sessions exported and imported.
#[async_trait]
pub trait Export: Reads + Send + Sync {
    /// A page of `part`'s rows of the session `key`, in its order; of a
    /// fork (`forked`), its prefix's rows too.
    async fn export_page(
        &self,
        part: &Part,
        key: &SessionKey,
        forked: bool,
        limit: u32,
        offset: u64,
    ) -> Result<Vec<Vec<Cell>>> {
        self.reader()
            .cells(part, key.as_str(), forked, (limit, offset))
            .await
    }

    /// The turns a fork reads through, root first: each one's session
    /// and id (none for a session that is not a fork).
    async fn prefix_turns(&self, key: &SessionKey) -> Result<Vec<(SessionKey, uuid::Uuid)>> {
        let rows: Vec<(String, String)> =
            self.reader().rows(tree::PREFIX_TURNS, args![key]).await?;
        let turn = |(session, turn): (String, String)| {
            Ok((SessionKey::stored(session), parse_uuid(&turn)?))
        };
        rows.into_iter().map(turn).collect()
    }

    /// Makes the session `key` of `parsed`, in one transaction.
    async fn import_session(&self, key: &SessionKey, parsed: &Parsed) -> Result<Imported>;
}

/// The insert of a row of `part` (`$1` the session's key, then its
/// columns). A turn is given what a turn that ended has: no owner, its
/// heartbeat at its start, no cancel asked; and its session's tenant.
fn insert(part: &Part) -> String {
    if part.table == FILE_CHUNKS {
        // A chunk of a file of the session, kept once for its tenant.
        // (The parameters appear in order: SQLite numbers `$n` by where
        // each first appears.)
        return "INSERT INTO file_chunks (tenant, sha256, idx, data) \
                SELECT f.tenant, f.sha256, x.idx, x.data FROM files f, \
                (SELECT $1 AS session_id, $2 AS file_id, $3 AS idx, $4 AS data) x \
                WHERE f.session_id = x.session_id AND f.id = x.file_id ON CONFLICT DO NOTHING"
            .to_owned();
    }
    let key = if part.table == "sessions" {
        "id, tenant"
    } else {
        "session_id"
    };
    let first = if part.table == "sessions" { 3 } else { 2 };
    let mut columns: Vec<String> = vec![key.to_owned()];
    let mut values: Vec<String> = if part.table == "sessions" {
        vec!["$1".into(), "$2".into()]
    } else {
        vec!["$1".into()]
    };
    for (i, column) in part.columns.iter().enumerate() {
        columns.push(column.name.to_owned());
        values.push(format!("${}", i + first));
    }
    if part.table == "files" {
        columns.push("tenant".into());
        values.push("(SELECT tenant FROM sessions WHERE id = $1)".into());
    }
    if part.table == "turns"
        && let Some(at) = part.columns.iter().position(|c| c.name == "created_at")
    {
        columns.extend(
            [
                "owner_instance",
                "owner_process",
                "heartbeat_at",
                "cancel_requested",
                "tenant",
            ]
            .map(Into::into),
        );
        values.extend([
            "''".into(),
            "''".into(),
            format!("${}", at + first),
            "FALSE".into(),
            "(SELECT tenant FROM sessions WHERE id = $1)".into(),
        ]);
    }
    format!(
        "INSERT INTO {} ({}) VALUES ({})",
        part.table,
        columns.join(", "),
        values.join(", ")
    )
}

/// The blobs of the session's files, once its chunks are in (a tenant
/// that holds the same bytes keeps its own) (`$1` the session's key).
const BLOBS: &str = "INSERT INTO file_blobs (tenant, sha256, bytes, created_at) \
     SELECT tenant, sha256, MAX(bytes), MIN(created_at) FROM files WHERE session_id = $1 \
     GROUP BY tenant, sha256 ON CONFLICT DO NOTHING";

/// What an import undoes before it commits: the webhook deliveries its
/// events made (the outbox's trigger announces each event written), as an
/// import is not new activity (`$1` the session's key).
const UNANNOUNCE: &str = "DELETE FROM webhook_deliveries WHERE session_id = $1";
