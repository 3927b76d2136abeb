//! The read half of both backends: the concerns' reads are written once,
//! against a [`Reader`], whichever database answers them.
//!
//! SQLite and Postgres accept the same read statements here (`$n`
//! parameters, `RETURNING`, partial indexes); what differs is the sqlx
//! type of the pool and of its arguments. A [`Reader`] takes the
//! statement, its arguments as [`Arg`]s and the row type (any type both
//! drivers decode, see [`Row`]), and runs it on its backend's pool; a
//! Postgres read is bounded by the call timeout (see
//! [`super::postgres`]). The writes are each backend's own, in the
//! concern's `sqlite.rs` and `postgres.rs`.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{
    Database, Encode, FromRow, Type,
    migrate::Migrator,
    postgres::{PgPool, PgRow},
    query::QueryAs,
    sqlite::{SqlitePool, SqliteRow},
};

use super::{Readiness, StoreError};
use crate::store::Result;

/// Columns of a turn, in [`super::records::rows::TurnRow`] order (a macro so
/// that `concat!` can splice it into a literal).
macro_rules! turn_columns {
    () => {
        "id, session_id, status, request, result, error_code, error_message, \
         owner_instance, attempt, first_seq, created_at, finished_at, traceparent, \
         parked_until, waited_ms, cancel_requested, parent_turn_id"
    };
}
pub(super) use turn_columns;

/// Columns of a [`super::MemoryRecord`], for `SELECT`s.
macro_rules! memory_columns {
    () => {
        "id, scope, kind, key, content, source_session_id, source_turn_id, created_at, updated_at"
    };
}
pub(super) use memory_columns;

/// Where a backend reads from. Only the store's concerns use it.
#[derive(Debug, Clone, Copy)]
pub enum Reader<'a> {
    Sqlite(&'a SqlitePool),
    /// Each read answers within `limit` or fails as transient.
    Postgres {
        pool: &'a PgPool,
        limit: Duration,
    },
}

/// A backend's read side: what the concern traits' shared reads run on.
pub trait Reads {
    fn reader(&self) -> Reader<'_>;
}

/// A row both drivers decode.
pub trait Row: for<'r> FromRow<'r, SqliteRow> + for<'r> FromRow<'r, PgRow> + Send + Unpin {}

impl<T> Row for T where T: for<'r> FromRow<'r, SqliteRow> + for<'r> FromRow<'r, PgRow> + Send + Unpin
{}

/// An argument of a statement.
#[derive(Debug, Clone)]
pub(crate) enum Arg<'a> {
    Text(&'a str),
    Owned(String),
    MaybeText(Option<&'a str>),
    Int(i64),
    MaybeInt(Option<i64>),
    MaybeReal(Option<f64>),
    Flag(bool),
    At(DateTime<Utc>),
    MaybeAt(Option<DateTime<Utc>>),
    MaybeBytes(Option<&'a [u8]>),
}

impl From<Option<i64>> for Arg<'_> {
    fn from(value: Option<i64>) -> Self {
        Self::MaybeInt(value)
    }
}

impl From<Option<f64>> for Arg<'_> {
    fn from(value: Option<f64>) -> Self {
        Self::MaybeReal(value)
    }
}

impl From<f64> for Arg<'_> {
    fn from(value: f64) -> Self {
        Self::MaybeReal(Some(value))
    }
}

impl From<Option<DateTime<Utc>>> for Arg<'_> {
    fn from(value: Option<DateTime<Utc>>) -> Self {
        Self::MaybeAt(value)
    }
}

impl From<bool> for Arg<'_> {
    fn from(value: bool) -> Self {
        Self::Flag(value)
    }
}

impl From<DateTime<Utc>> for Arg<'_> {
    fn from(value: DateTime<Utc>) -> Self {
        Self::At(value)
    }
}

impl<'a> From<Option<&'a [u8]>> for Arg<'a> {
    fn from(value: Option<&'a [u8]>) -> Self {
        Self::MaybeBytes(value)
    }
}

impl<'a> From<&'a Option<String>> for Arg<'a> {
    fn from(value: &'a Option<String>) -> Self {
        Self::MaybeText(value.as_deref())
    }
}

impl<'a> From<&'a str> for Arg<'a> {
    fn from(value: &'a str) -> Self {
        Self::Text(value)
    }
}

impl<'a> From<&'a String> for Arg<'a> {
    fn from(value: &'a String) -> Self {
        Self::Text(value)
    }
}

impl<'a> From<&'a crate::ids::SessionKey> for Arg<'a> {
    fn from(value: &'a crate::ids::SessionKey) -> Self {
        Self::Text(value.as_str())
    }
}

impl From<String> for Arg<'_> {
    fn from(value: String) -> Self {
        Self::Owned(value)
    }
}

impl From<uuid::Uuid> for Arg<'_> {
    fn from(value: uuid::Uuid) -> Self {
        Self::Owned(value.to_string())
    }
}

impl<'a> From<Option<&'a str>> for Arg<'a> {
    fn from(value: Option<&'a str>) -> Self {
        Self::MaybeText(value)
    }
}

impl From<i64> for Arg<'_> {
    fn from(value: i64) -> Self {
        Self::Int(value)
    }
}

impl From<u32> for Arg<'_> {
    fn from(value: u32) -> Self {
        Self::Int(i64::from(value))
    }
}

/// The argument list of a statement, for either backend.
pub(crate) trait Bind<'q, DB: Database>: Sized {
    fn bind_arg<T: 'q + Encode<'q, DB> + Type<DB>>(self, value: T) -> Self;
}

impl<'q, DB: Database, R> Bind<'q, DB> for QueryAs<'q, DB, R, <DB as Database>::Arguments> {
    fn bind_arg<T: 'q + Encode<'q, DB> + Type<DB>>(self, value: T) -> Self {
        self.bind(value)
    }
}

impl<'q, DB: Database> Bind<'q, DB> for sqlx::query::Query<'q, DB, <DB as Database>::Arguments> {
    fn bind_arg<T: 'q + Encode<'q, DB> + Type<DB>>(self, value: T) -> Self {
        self.bind(value)
    }
}

/// Binds `args` in order.
pub(crate) fn bind_all<'q, DB, Q>(mut query: Q, args: Vec<Arg<'q>>) -> Q
where
    DB: Database,
    Q: Bind<'q, DB>,
    &'q str: Encode<'q, DB> + Type<DB>,
    String: Encode<'q, DB> + Type<DB>,
    Option<&'q str>: Encode<'q, DB> + Type<DB>,
    i64: Encode<'q, DB> + Type<DB>,
    Option<i64>: Encode<'q, DB> + Type<DB>,
    Option<f64>: Encode<'q, DB> + Type<DB>,
    bool: Encode<'q, DB> + Type<DB>,
    DateTime<Utc>: Encode<'q, DB> + Type<DB>,
    Option<DateTime<Utc>>: Encode<'q, DB> + Type<DB>,
    Option<&'q [u8]>: Encode<'q, DB> + Type<DB>,
{
    for arg in args {
        query = match arg {
            Arg::Text(value) => query.bind_arg(value),
            Arg::Owned(value) => query.bind_arg(value),
            Arg::MaybeText(value) => query.bind_arg(value),
            Arg::Int(value) => query.bind_arg(value),
            Arg::MaybeInt(value) => query.bind_arg(value),
            Arg::MaybeReal(value) => query.bind_arg(value),
            Arg::Flag(value) => query.bind_arg(value),
            Arg::At(value) => query.bind_arg(value),
            Arg::MaybeAt(value) => query.bind_arg(value),
            Arg::MaybeBytes(value) => query.bind_arg(value),
        };
    }
    query
}

impl Reader<'_> {
    /// Every row `sql` selects.
    pub(crate) async fn rows<R: Row>(
        self,
        sql: impl sqlx::SqlSafeStr + Send,
        args: Vec<Arg<'_>>,
    ) -> Result<Vec<R>> {
        match self {
            Self::Sqlite(pool) => Ok(bind_all(sqlx::query_as(sql), args).fetch_all(pool).await?),
            Self::Postgres { pool, limit } => {
                let read = bind_all(sqlx::query_as(sql), args).fetch_all(pool);
                super::deadline::within(limit, read).await
            }
        }
    }

    /// The first row `sql` selects, if any.
    pub(crate) async fn row<R: Row>(
        self,
        sql: impl sqlx::SqlSafeStr + Send,
        args: Vec<Arg<'_>>,
    ) -> Result<Option<R>> {
        match self {
            Self::Sqlite(pool) => Ok(bind_all(sqlx::query_as(sql), args)
                .fetch_optional(pool)
                .await?),
            Self::Postgres { pool, limit } => {
                let read = bind_all(sqlx::query_as(sql), args).fetch_optional(pool);
                super::deadline::within(limit, read).await
            }
        }
    }

    /// The one value a one-row, one-column `sql` selects.
    pub(crate) async fn value<T>(self, sql: &'static str, args: Vec<Arg<'_>>) -> Result<T>
    where
        (T,): Row,
    {
        match self.row::<(T,)>(sql, args).await? {
            Some((value,)) => Ok(value),
            None => Err(sqlx::Error::RowNotFound.into()),
        }
    }

    /// For `GET /readyz`: whether the database answers and has each of
    /// `migrator`'s migrations applied.
    pub(crate) async fn readiness(self, migrator: &Migrator) -> Readiness {
        let applied: Result<Vec<(i64,)>> = self
            .rows(
                "SELECT version FROM _sqlx_migrations WHERE success = TRUE",
                Vec::new(),
            )
            .await;
        match applied {
            Ok(versions) => Readiness {
                reachable: true,
                migrations_applied: migrator
                    .iter()
                    .all(|m| versions.iter().any(|(v,)| *v == m.version)),
            },
            // The migrations table is missing on a fresh database; tell
            // that apart from a database that does not answer.
            Err(StoreError::Database(sqlx::Error::Database(_))) => Readiness {
                reachable: self.rows::<(i32,)>("SELECT 1", Vec::new()).await.is_ok(),
                migrations_applied: false,
            },
            Err(_) => Readiness {
                reachable: false,
                migrations_applied: false,
            },
        }
    }
}

/// The arguments of a read, each converted to an [`Arg`].
macro_rules! args {
    ($($arg:expr),* $(,)?) => {
        vec![$($crate::store::reader::Arg::from($arg)),*]
    };
}
pub(crate) use args;
