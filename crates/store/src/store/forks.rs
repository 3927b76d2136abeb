//! Forks (docs/conversation-trees.md): a session whose history begins with
//! another session's branch up to one of its turns. A fork is one row: it
//! names its source and the turn, and its first turn continues that turn,
//! so its history is read through the source's turns rather than copied.
//! A source is not erased while a fork reads through it.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rusqlite::{OptionalExtension, params};
use uuid::Uuid;

use crate::{
    ids::SessionKey,
    store::{
        Result,
        postgres::PostgresStore,
        reader::{Reads, args},
        sqlite::{SqliteStore, writer::ts},
    },
};

/// What a fork found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forked {
    /// The new session is made.
    Made,
    /// The source is not the tenant's (nothing was written).
    SourceNotFound,
    /// The turn is not the source's (nothing was written).
    TurnNotFound,
    /// The turn runs still (nothing was written).
    TurnRunning,
    /// The tenant has a session of the new id (nothing was written).
    Exists,
}

/// The session row a fork writes (`$1` its key, `$2` the time, `$3` the
/// source's last seq, `$4` the tenant, `$5` the source's key, `$6` the
/// turn). Its own events begin after the source's, so an export of the
/// fork (which carries the source's events of its branch) keeps one seq
/// order.
const INSERT: &str = "INSERT INTO sessions (id, created_at, updated_at, turn_count, last_seq, \
     tenant, branched, forked_from, forked_at) VALUES ($1, $2, $2, 0, $3, $4, TRUE, $5, $6) \
     ON CONFLICT (id) DO NOTHING";

/// A turn of the source (`$1` the source, `$2` the turn): its status.
const TURN_STATUS: &str = "SELECT status FROM turns WHERE session_id = $1 AND id = $2";

/// The forks of a session (`$1`), the first `$2` by key.
pub(crate) const FORKS_OF: &str =
    "SELECT id FROM sessions WHERE forked_from = $1 ORDER BY id LIMIT $2";

/// Forks of a session an erase's refusal names at most.
pub const FORKS_NAMED: u32 = 10;

/// Sessions forked from others.
#[async_trait]
pub trait Forks: Reads + Send + Sync {
    /// Makes the session `fork` (of the source's tenant) whose history is
    /// the source's branch up to `at_turn`, in one transaction that
    /// writes one row.
    async fn fork_session(
        &self,
        source: &SessionKey,
        at_turn: Uuid,
        fork: &SessionKey,
        now: DateTime<Utc>,
    ) -> Result<Forked>;

    /// The forks that read through `source`, at most `limit`.
    async fn forks_of(&self, source: &SessionKey, limit: u32) -> Result<Vec<SessionKey>> {
        let rows: Vec<(String,)> = self.reader().rows(FORKS_OF, args![source, limit]).await?;
        Ok(rows
            .into_iter()
            .map(|(key,)| SessionKey::stored(key))
            .collect())
    }
}

/// What the source's reads found, before the row is written.
fn checked(last_seq: Option<i64>, status: Option<&str>) -> std::result::Result<i64, Forked> {
    let last_seq = last_seq.ok_or(Forked::SourceNotFound)?;
    match status {
        None => Err(Forked::TurnNotFound),
        Some("running") => Err(Forked::TurnRunning),
        Some(_) => Ok(last_seq),
    }
}

#[async_trait]
impl Forks for SqliteStore {
    async fn fork_session(
        &self,
        source: &SessionKey,
        at_turn: Uuid,
        fork: &SessionKey,
        now: DateTime<Utc>,
    ) -> Result<Forked> {
        let (source, fork, turn) = (source.clone(), fork.clone(), at_turn.to_string());
        self.writes
            .run(move |tx| {
                // One writer: an erase of the source cannot come between
                // these reads and the row.
                let last_seq: Option<i64> = tx
                    .prepare_cached("SELECT last_seq FROM sessions WHERE id = ?1")?
                    .query_row(params![source.as_str()], |row| row.get(0))
                    .optional()?;
                let status: Option<String> = tx
                    .prepare_cached(TURN_STATUS)?
                    .query_row(params![source.as_str(), turn], |row| row.get(0))
                    .optional()?;
                let last_seq = match checked(last_seq, status.as_deref()) {
                    Ok(last_seq) => last_seq,
                    Err(found) => return Ok(found),
                };
                let made = tx.prepare_cached(INSERT)?.execute(params![
                    fork.as_str(),
                    ts(now),
                    last_seq,
                    fork.tenant(),
                    source.as_str(),
                    turn
                ])?;
                Ok(if made == 1 {
                    Forked::Made
                } else {
                    Forked::Exists
                })
            })
            .await
    }
}

#[async_trait]
impl Forks for PostgresStore {
    async fn fork_session(
        &self,
        source: &SessionKey,
        at_turn: Uuid,
        fork: &SessionKey,
        now: DateTime<Utc>,
    ) -> Result<Forked> {
        self.bounded(async {
            let mut tx = self.begin_write().await?;
            // Held to the commit: an erase of the source (which takes the
            // row `FOR UPDATE`) waits for the fork, then sees it; a fork
            // after the erase finds no source.
            let last_seq: Option<(i64,)> =
                sqlx::query_as("SELECT last_seq FROM sessions WHERE id = $1 FOR SHARE")
                    .bind(source.as_str())
                    .fetch_optional(&mut *tx)
                    .await?;
            let status: Option<(String,)> = sqlx::query_as(TURN_STATUS)
                .bind(source.as_str())
                .bind(at_turn.to_string())
                .fetch_optional(&mut *tx)
                .await?;
            let last_seq = match checked(
                last_seq.map(|(n,)| n),
                status.as_ref().map(|s| s.0.as_str()),
            ) {
                Ok(last_seq) => last_seq,
                Err(found) => return Ok(found),
            };
            let made = sqlx::query(INSERT)
                .bind(fork.as_str())
                .bind(now)
                .bind(last_seq)
                .bind(fork.tenant())
                .bind(source.as_str())
                .bind(at_turn.to_string())
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(if made.rows_affected() == 1 {
                Forked::Made
            } else {
                Forked::Exists
            })
        })
        .await
    }
}
