//! Messages steered into a running turn (issue 66, part 5; the store's
//! half): kept before the steer is answered, then applied once at one of
//! the turn's step boundaries, or, when the turn ends first, claimed once
//! to become the session's next turn. Erased with their session.
//!
//! Applying is a claim for a step: `applied_step` is set to it. A turn
//! that goes on from the record of step `S` (a take-over) claims again
//! what was claimed for a step after `S`, whose record never landed, so a
//! message is in the model's conversation once, whoever asks.

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
        records::parse_uuid,
        sqlite::{SqliteStore, writer::ts},
    },
};

/// Steers one turn keeps waiting at most: past them a steer is refused.
pub const STEERS_WAITING_MAX: i64 = 1_000;

/// A steer to keep.
#[derive(Debug, Clone)]
pub struct NewSteer {
    pub id: Uuid,
    pub session_id: SessionKey,
    pub turn_id: Uuid,
    pub message: String,
    pub at: DateTime<Utc>,
}

/// A kept steer: its id and its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Steer {
    pub id: Uuid,
    pub message: String,
}

/// What keeping a steer found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SteerAdded {
    Added,
    /// The turn is the session's but no longer runs (nothing written).
    NotRunning,
    /// No such turn of the session (nothing written).
    TurnNotFound,
    /// The turn keeps [`STEERS_WAITING_MAX`] steers waiting already.
    Full,
}

/// A turn's status (`$1` its session, `$2` the turn).
const TURN_STATUS: &str = "SELECT status FROM turns WHERE session_id = $1 AND id = $2";

/// [`TURN_STATUS`], the turn's row held to the commit (Postgres).
const TURN_STATUS_LOCKED: &str =
    "SELECT status FROM turns WHERE session_id = $1 AND id = $2 FOR UPDATE";

/// Steers of a turn (`$1`) that wait.
const WAITING: &str = "SELECT count(*) FROM steers \
     WHERE turn_id = $1 AND applied_step IS NULL AND deferred_to IS NULL";

const INSERT: &str = "INSERT INTO steers (id, session_id, turn_id, message, created_at) \
     VALUES ($1, $2, $3, $4, $5)";

/// Claims for step `$1` the steers of the turn `$2` not applied before
/// it, at most `$3`, oldest first. The outer conditions are checked again
/// on a row another claim changed meanwhile (Postgres), so a steer that
/// became a turn is never applied.
const APPLY: &str = "UPDATE steers SET applied_step = $1 WHERE id IN ( \
       SELECT id FROM steers WHERE turn_id = $2 AND deferred_to IS NULL \
       AND (applied_step IS NULL OR applied_step >= $1) ORDER BY id LIMIT $3) \
     AND deferred_to IS NULL AND (applied_step IS NULL OR applied_step >= $1) \
     RETURNING id, message";

/// Claims (`$1`, the claim's token) the steers of the turn `$2` never
/// applied, at most `$3`, oldest first: they become the next turn.
const DEFER: &str = "UPDATE steers SET deferred_to = $1 WHERE id IN ( \
       SELECT id FROM steers WHERE turn_id = $2 AND deferred_to IS NULL \
       AND applied_step IS NULL ORDER BY id LIMIT $3) \
     AND deferred_to IS NULL AND applied_step IS NULL RETURNING id, message";

/// The steers of the turn `$1` a claim for step `$2` would take, at most
/// `$3`: read before claiming, so that a step with none writes nothing.
const PENDING: &str = "SELECT id, message FROM steers WHERE turn_id = $1 \
     AND deferred_to IS NULL AND (applied_step IS NULL OR applied_step >= $2) \
     ORDER BY id LIMIT $3";

/// Gives back the steers claimed under the token `$1` (their next turn
/// could not start): a later sweep claims them again.
const RELEASE: &str = "UPDATE steers SET deferred_to = NULL WHERE deferred_to = $1";

/// Turns that ended with steers no step took and no turn answers, at
/// most `$1`: their owner died or shut down before it made them the
/// session's next turn (a parked turn runs: its steers wait for it).
const LEFT: &str = "SELECT DISTINCT s.session_id, s.turn_id FROM steers s \
     JOIN turns t ON t.id = s.turn_id \
     WHERE s.applied_step IS NULL AND s.deferred_to IS NULL AND t.status <> 'running' \
     LIMIT $1";

/// Steers kept and claimed.
#[async_trait]
pub trait Steers: Reads + Send + Sync {
    /// Keeps `steer` for its turn, if the turn is the session's and runs.
    async fn add_steer(&self, steer: &NewSteer) -> Result<SteerAdded>;

    /// Claims for `step` the turn's steers not applied before it, at most
    /// `limit`, oldest first.
    async fn apply_steers(&self, turn_id: Uuid, step: u32, limit: u32) -> Result<Vec<Steer>>;

    /// Claims the turn's steers never applied, at most `limit`, oldest
    /// first, under `token` (the claim's, so that one claimer alone has
    /// them).
    async fn defer_steers(&self, turn_id: Uuid, token: Uuid, limit: u32) -> Result<Vec<Steer>>;

    /// Whether a claim for `step` would take any steer of the turn (a
    /// read: the common case, none, writes nothing).
    async fn steers_pending(&self, turn_id: Uuid, step: u32) -> Result<bool> {
        let rows: Vec<(String, String)> = self
            .reader()
            .rows(PENDING, args![turn_id, i64::from(step), 1i64])
            .await?;
        Ok(!rows.is_empty())
    }

    /// Gives back what [`Steers::defer_steers`] claimed under `token`.
    async fn release_steers(&self, token: Uuid) -> Result<()>;

    /// Sessions and turns that ended with steers waiting, at most `limit`
    /// (for a sweep: see [`LEFT`]).
    async fn steers_left(&self, limit: u32) -> Result<Vec<(SessionKey, Uuid)>> {
        let rows: Vec<(String, String)> = self.reader().rows(LEFT, args![i64::from(limit)]).await?;
        rows.into_iter()
            .map(|(session, turn)| Ok((SessionKey::stored(session), parse_uuid(&turn)?)))
            .collect()
    }
}

/// Claimed rows as steers, oldest first.
fn claimed(rows: Vec<(String, String)>) -> Result<Vec<Steer>> {
    let mut steers = rows
        .into_iter()
        .map(|(id, message)| {
            Ok(Steer {
                id: parse_uuid(&id)?,
                message,
            })
        })
        .collect::<Result<Vec<Steer>>>()?;
    steers.sort_by_key(|s| s.id);
    Ok(steers)
}

/// What a turn's status and its waiting steers say of a new steer.
fn admitted(status: Option<&str>, waiting: i64) -> Option<SteerAdded> {
    match status {
        None => Some(SteerAdded::TurnNotFound),
        Some("running") if waiting >= STEERS_WAITING_MAX => Some(SteerAdded::Full),
        Some("running") => None,
        Some(_) => Some(SteerAdded::NotRunning),
    }
}

#[async_trait]
impl Steers for SqliteStore {
    async fn add_steer(&self, steer: &NewSteer) -> Result<SteerAdded> {
        let steer = steer.clone();
        self.writes
            .run(move |tx| {
                let (session, turn) = (steer.session_id.as_str(), steer.turn_id.to_string());
                let status: Option<String> = tx
                    .prepare_cached(TURN_STATUS)?
                    .query_row(params![session, turn], |row| row.get(0))
                    .optional()?;
                let waiting: i64 = tx
                    .prepare_cached(WAITING)?
                    .query_row(params![turn], |row| row.get(0))?;
                if let Some(refused) = admitted(status.as_deref(), waiting) {
                    return Ok(refused);
                }
                tx.prepare_cached(INSERT)?.execute(params![
                    steer.id.to_string(),
                    session,
                    turn,
                    steer.message,
                    ts(steer.at)
                ])?;
                Ok(SteerAdded::Added)
            })
            .await
    }

    async fn apply_steers(&self, turn_id: Uuid, step: u32, limit: u32) -> Result<Vec<Steer>> {
        let rows = self
            .writes
            .run(move |tx| {
                let rows = tx
                    .prepare_cached(APPLY)?
                    .query_map(params![step, turn_id.to_string(), limit], |row| {
                        Ok((row.get(0)?, row.get(1)?))
                    })?
                    .collect::<rusqlite::Result<Vec<(String, String)>>>()?;
                Ok(rows)
            })
            .await?;
        claimed(rows)
    }

    async fn defer_steers(&self, turn_id: Uuid, token: Uuid, limit: u32) -> Result<Vec<Steer>> {
        let rows = self
            .writes
            .run(move |tx| {
                let rows = tx
                    .prepare_cached(DEFER)?
                    .query_map(
                        params![token.to_string(), turn_id.to_string(), limit],
                        |row| Ok((row.get(0)?, row.get(1)?)),
                    )?
                    .collect::<rusqlite::Result<Vec<(String, String)>>>()?;
                Ok(rows)
            })
            .await?;
        claimed(rows)
    }

    async fn release_steers(&self, token: Uuid) -> Result<()> {
        self.writes
            .run(move |tx| {
                tx.prepare_cached(RELEASE)?
                    .execute(params![token.to_string()])?;
                Ok(())
            })
            .await
    }
}

#[async_trait]
impl Steers for PostgresStore {
    async fn add_steer(&self, steer: &NewSteer) -> Result<SteerAdded> {
        self.bounded(async {
            let mut tx = self.begin_write().await?;
            let turn = steer.turn_id.to_string();
            // The turn's row, held to the commit: its end waits for the
            // steer, or the steer sees the end.
            let status: Option<(String,)> = sqlx::query_as(TURN_STATUS_LOCKED)
                .bind(steer.session_id.as_str())
                .bind(&turn)
                .fetch_optional(&mut *tx)
                .await?;
            let (waiting,): (i64,) = sqlx::query_as(WAITING)
                .bind(&turn)
                .fetch_one(&mut *tx)
                .await?;
            if let Some(refused) = admitted(status.as_ref().map(|s| s.0.as_str()), waiting) {
                return Ok(refused);
            }
            sqlx::query(INSERT)
                .bind(steer.id.to_string())
                .bind(steer.session_id.as_str())
                .bind(&turn)
                .bind(&steer.message)
                .bind(steer.at)
                .execute(&mut *tx)
                .await?;
            // Heard on commit by the replica that runs the turn, which
            // says so in its log at once.
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(crate::store::CANCEL_CHANNEL)
                .bind(format!(
                    "{}{turn}:{}",
                    crate::store::STEERED_PREFIX,
                    steer.id
                ))
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(SteerAdded::Added)
        })
        .await
    }

    async fn apply_steers(&self, turn_id: Uuid, step: u32, limit: u32) -> Result<Vec<Steer>> {
        let rows: Vec<(String, String)> = self
            .bounded(async {
                Ok(sqlx::query_as(APPLY)
                    .bind(i64::from(step))
                    .bind(turn_id.to_string())
                    .bind(i64::from(limit))
                    .fetch_all(self.writer())
                    .await?)
            })
            .await?;
        claimed(rows)
    }

    async fn defer_steers(&self, turn_id: Uuid, token: Uuid, limit: u32) -> Result<Vec<Steer>> {
        let rows: Vec<(String, String)> = self
            .bounded(async {
                Ok(sqlx::query_as(DEFER)
                    .bind(token.to_string())
                    .bind(turn_id.to_string())
                    .bind(i64::from(limit))
                    .fetch_all(self.writer())
                    .await?)
            })
            .await?;
        claimed(rows)
    }

    async fn release_steers(&self, token: Uuid) -> Result<()> {
        self.bounded(async {
            sqlx::query(RELEASE)
                .bind(token.to_string())
                .execute(self.writer())
                .await?;
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_steer_is_kept_only_for_a_running_turn_with_room() {
        assert_eq!(admitted(None, 0), Some(SteerAdded::TurnNotFound));
        assert_eq!(admitted(Some("completed"), 0), Some(SteerAdded::NotRunning));
        assert_eq!(admitted(Some("running"), STEERS_WAITING_MAX - 1), None);
        assert_eq!(
            admitted(Some("running"), STEERS_WAITING_MAX),
            Some(SteerAdded::Full)
        );
    }
}
