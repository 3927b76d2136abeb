//! [`EventLog`] on Postgres: plain sqlx, each call bounded by the call
//! timeout (see [`PostgresStore::bounded`]).

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::Postgres;

mod finish;

use super::{
    Batch, EventLog,
    runs::{self, Row},
};
use crate::store::{Result, sqlite::writer::ts};
use crate::{
    events::StoredEvent,
    store::{
        Lease, NewStep, StoreError,
        postgres::PostgresStore,
        webhooks::{Route, postgres::insert_deliveries, routes},
    },
};
use finish::finish_statement;

#[async_trait]
impl EventLog for PostgresStore {
    async fn commit(&self, batch: Batch<'_>) -> Result<Vec<bool>> {
        let Batch {
            events,
            steps,
            finishes,
            leases,
            fence,
        } = batch;
        // The webhook messages of the batch's events, written with them.
        let waits = events.iter().flat_map(|event| routes(event, false));
        let ends = finishes
            .iter()
            .flat_map(|finish| routes(&finish.terminal, finish.background));
        let routes: Vec<Route<'_>> = waits.chain(ends).collect();
        self.bounded(async {
            if finishes.is_empty() && !routes.is_empty() {
                // A wait for a person or a client: its messages in its
                // events' transaction.
                let mut tx = self.begin_write().await?;
                insert_leased(&mut *tx, events, steps, leases, fence).await?;
                insert_deliveries(&mut *tx, &routes).await?;
                tx.commit().await?;
                return Ok(Vec::new());
            }
            if finishes.is_empty() {
                // One statement is its own transaction: no BEGIN and COMMIT
                // round trips for the common batch of deltas, nor for a
                // step's end (its events and its record together).
                if steps.is_empty() && !fence {
                    // The common batch (deltas of turns whose leases hold):
                    // the plain insert.
                    if !events.is_empty() {
                        insert_events(self.writer(), events.iter().map(|e| &**e)).await?;
                    }
                } else {
                    insert_leased(self.writer(), events, steps, leases, fence).await?;
                }
                return Ok(Vec::new());
            }
            // However many turns end in the batch, four round trips: BEGIN,
            // the sessions' locks, one statement for everything (webhook
            // messages included), COMMIT.
            let mut tx = self.begin_write().await?;
            // Rows are locked in one order everywhere: a session before its
            // turns, sessions by id (see `lock_session`). In a statement of
            // its own, so that the locks are held before any turn is touched.
            let mut sessions: Vec<&str> = finishes.iter().map(|f| f.session_id.as_str()).collect();
            sessions.sort_unstable();
            sessions.dedup();
            sqlx::query("SELECT 1 FROM sessions WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE")
                .bind(&sessions)
                .execute(&mut *tx)
                .await?;
            if !steps.is_empty() {
                insert_leased(&mut *tx, &[], steps, leases, fence).await?;
            }
            // The batch's events as rows (runs among them), as a batch
            // with no end writes them.
            let rows = as_rows(events.iter().map(|e| &**e))?;
            // The webhook messages in the same statement: no round trip
            // of their own.
            let (ended, _): (Vec<String>, i64) = finish_statement(&rows, finishes, leases, &routes)
                .fetch_one(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(finishes
                .iter()
                .map(|finish| ended.contains(&finish.turn_id.to_string()))
                .collect())
        })
        .await
    }

    /// The session row is locked first (as a turn's begin and end lock
    /// it), then no running turn is checked in a statement of its own, so
    /// that a turn that began meanwhile is seen.
    async fn append_session_event(&self, event: &StoredEvent) -> Result<bool> {
        self.bounded(async {
            let mut tx = self.begin_write().await?;
            let locked: Option<i64> =
                sqlx::query_scalar("SELECT last_seq FROM sessions WHERE id = $1 FOR NO KEY UPDATE")
                    .bind(&event.session_id)
                    .fetch_optional(&mut *tx)
                    .await?;
            if locked.is_none() {
                return Err(StoreError::Corrupt(format!(
                    "no session {}",
                    event.session_id
                )));
            }
            let running: Option<String> = sqlx::query_scalar(
                "SELECT id FROM turns WHERE session_id = $1 AND status = 'running'",
            )
            .bind(&event.session_id)
            .fetch_optional(&mut *tx)
            .await?;
            if running.is_some() {
                return Ok(false);
            }
            let seq: i64 = sqlx::query_scalar(
                "UPDATE sessions SET last_seq = last_seq + 1 WHERE id = $1 RETURNING last_seq",
            )
            .bind(&event.session_id)
            .fetch_one(&mut *tx)
            .await?;
            sqlx::query(
                "INSERT INTO events (session_id, seq, turn_id, type, payload, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(&event.session_id)
            .bind(seq)
            .bind(event.turn_id.to_string())
            .bind(event.event_type.as_str())
            .bind(&event.payload)
            .bind(event.created_at)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(true)
        })
        .await
    }
}

/// The end of a statement that inserted the rows `e` as `logged` (ON
/// CONFLICT DO NOTHING): 0, or the statement fails (migration 0015) when
/// a row neither went in nor is stored as it is, or when a session's
/// first row of the batch is at or before what the session holds and not
/// stored as it is (the key sees only a run's first seq: as on SQLite, a
/// session's events come after everything it holds; [`as_rows`] checks
/// the batch's own). A `CASE` evaluates the subqueries of the branch it
/// takes only: the comparison of every row with what is stored, an index
/// probe each, runs only when a row did not go in (a batch tried again).
macro_rules! event_conflicts {
    () => {
        "CASE WHEN (SELECT count(*) FROM logged) = (SELECT count(*) FROM e) THEN 0::int8 \
         ELSE harness_event_conflicts((SELECT count(*) FROM e) \
           - (SELECT count(*) FROM logged) \
           - (SELECT count(*) FROM e JOIN events x ON x.session_id = e.session_id \
              AND x.seq = e.seq AND x.turn_id = e.turn_id AND x.type = e.type \
              AND x.payload = e.payload AND x.seq_end IS NOT DISTINCT FROM e.seq_end)) END \
         + harness_event_conflicts((SELECT count(*) FROM \
             (SELECT DISTINCT ON (session_id) * FROM e ORDER BY session_id, seq) AS f \
           WHERE (SELECT COALESCE(x.seq_end, x.seq) FROM events x \
                  WHERE x.session_id = f.session_id ORDER BY x.seq DESC LIMIT 1) >= f.seq \
           AND NOT EXISTS (SELECT 1 FROM events x WHERE x.session_id = f.session_id \
              AND x.seq = f.seq AND x.turn_id = f.turn_id AND x.type = f.type \
              AND x.payload = f.payload AND x.seq_end IS NOT DISTINCT FROM f.seq_end)))"
    };
}

/// What [`insert_leased`]'s statements write, after the `leased` turns
/// each defines: the batch's events and records of those turns, the
/// statement failing whole when any is of another turn or a seq is taken.
macro_rules! insert_leased_rest {
    () => {
        concat!(
            "), e AS ( \
           SELECT * FROM unnest($1::text[], $2::int8[], $3::text[], $4::text[], $5::text[], \
           $6::timestamptz[], $14::int8[]) \
           AS e(session_id, seq, turn_id, type, payload, created_at, seq_end) \
         ), logged AS ( \
           INSERT INTO events (session_id, seq, turn_id, type, payload, created_at, seq_end) \
           SELECT * FROM e WHERE e.turn_id IN (SELECT id FROM leased) \
           ON CONFLICT (session_id, seq) DO NOTHING RETURNING 1 \
         ), s AS ( \
           SELECT * FROM unnest($9::text[], $10::int4[], $11::text[], $12::text[], \
           $13::timestamptz[]) AS s(turn_id, step, phase, record, created_at) \
         ), kept AS ( \
           INSERT INTO turn_steps (turn_id, step, phase, record, created_at) \
           SELECT * FROM s WHERE s.turn_id IN (SELECT id FROM leased) \
           ON CONFLICT DO NOTHING RETURNING 1 \
         ) \
         SELECT harness_lease_lost( \
           (SELECT count(*) FROM e WHERE e.turn_id NOT IN (SELECT id FROM leased)) \
           + (SELECT count(*) FROM s WHERE s.turn_id NOT IN (SELECT id FROM leased))) \
         + ",
            event_conflicts!()
        )
    };
}

/// [`insert_leased`]'s statement: each turn's row share-locked and its
/// attempt checked.
const INSERT_FENCED: &str = concat!(
    "WITH leased AS ( \
       SELECT t.id FROM turns t JOIN unnest($7::text[], $8::int4[]) AS l(turn_id, attempt) \
       ON t.id = l.turn_id AND t.attempt = l.attempt FOR KEY SHARE OF t ",
    insert_leased_rest!()
);

/// [`insert_leased`]'s statement when no lease can have been lost: the
/// leases taken as held (no turn row is read).
const INSERT_UNFENCED: &str = concat!(
    "WITH leased AS ( \
       SELECT l.turn_id AS id FROM unnest($7::text[], $8::int4[]) AS l(turn_id, attempt) ",
    insert_leased_rest!()
);

/// A batch's events and step records, for the turns that hold `leases`,
/// in one statement whatever their number. Each turn's row is share-locked
/// while they go in, so a take-over (which locks the row for update)
/// either waits for them, and numbers its own events after, or comes first
/// and fails the statement whole. Idempotent as [`insert_events`]: a
/// record already kept is kept as it was.
async fn insert_leased<'c, E>(
    executor: E,
    events: &[Arc<StoredEvent>],
    steps: &[&NewStep],
    leases: &[Lease],
    fence: bool,
) -> Result<()>
where
    E: sqlx::Executor<'c, Database = Postgres>,
{
    let rows = as_rows(events.iter().map(|e| &**e))?;
    let mut columns = EventColumns::of_rows(&rows);
    let seq_end = std::mem::take(&mut columns.seq_end);
    // Unfenced, the leases are taken as held (no turn row is read).
    let sql = if fence {
        INSERT_FENCED
    } else {
        INSERT_UNFENCED
    };
    let leases = LeaseColumns::of(leases);
    let step_turns: Vec<String> = steps.iter().map(|s| s.turn_id.to_string()).collect();
    let numbers: Vec<i32> = steps
        .iter()
        .map(|s| i32::try_from(s.step).unwrap_or(i32::MAX))
        .collect();
    let phases: Vec<&str> = steps.iter().map(|s| s.phase).collect();
    let records: Vec<&str> = steps.iter().map(|s| s.record.as_str()).collect();
    let at: Vec<_> = steps.iter().map(|s| s.created_at).collect();
    let _: i64 = columns
        .bound(sqlx::query_scalar(sql))
        .bind(leases.turn_id)
        .bind(leases.attempt)
        .bind(step_turns)
        .bind(numbers)
        .bind(phases)
        .bind(records)
        .bind(at)
        .bind(seq_end)
        .fetch_one(executor)
        .await?;
    Ok(())
}

/// Inserts events in one statement, whatever their number: each column is
/// one array parameter, so the statement's text (and its prepared plan) is
/// the same for every batch.
///
/// Idempotent: a batch tried again after a commit whose answer was lost
/// (the connection cut just after COMMIT was sent) finds its rows there,
/// and goes on. Only a row that holds another event at one of the batch's
/// seqs (or one the statement could not see) is a conflict: the statement
/// fails whole (see migration 0015), as a unique index would fail it.
pub(in crate::store) async fn insert_events<'e, 'c, E>(
    executor: E,
    events: impl Iterator<Item = &'e StoredEvent>,
) -> Result<()>
where
    E: sqlx::Executor<'c, Database = Postgres>,
{
    let rows = as_rows(events)?;
    let mut columns = EventColumns::of_rows(&rows);
    let seq_end = std::mem::take(&mut columns.seq_end);
    let _: i64 = columns
        .bound(sqlx::query_scalar(concat!(
            "WITH e AS ( \
           SELECT * FROM unnest($1::text[], $2::int8[], $3::text[], $4::text[], $5::text[], \
           $6::timestamptz[], $7::int8[]) \
           AS e(session_id, seq, turn_id, type, payload, created_at, seq_end) \
         ), logged AS ( \
           INSERT INTO events (session_id, seq, turn_id, type, payload, created_at, seq_end) \
           SELECT * FROM e ON CONFLICT (session_id, seq) DO NOTHING RETURNING 1 \
         ) \
         SELECT ",
            event_conflicts!()
        )))
        .bind(seq_end)
        .fetch_one(executor)
        .await?;
    Ok(())
}

/// Events as columns, for `unnest`.
#[derive(Default)]
struct EventColumns<'a> {
    session_id: Vec<&'a str>,
    seq: Vec<i64>,
    turn_id: Vec<String>,
    event_type: Vec<&'a str>,
    payload: Vec<&'a str>,
    created_at: Vec<chrono::DateTime<chrono::Utc>>,
    /// Written only if its turn's finish applies.
    terminal: Vec<bool>,
    /// A run's last seq ([`Self::of_rows`]; not bound by [`Self::bound`]).
    seq_end: Vec<Option<i64>>,
}

/// `events` as the rows to insert: each session's events together, in
/// seq order, its text deltas that follow each other in runs (see
/// `runs`), as SQLite keeps them. A batch of a fast answer's deltas is a
/// row per session instead of a row per delta.
///
/// Runs keep what the primary key (session, seq) fences. A process that
/// takes a turn over numbers its events after the last stored seq, and a
/// run is stored whole or not at all, so the first row either process
/// writes after what the other saw starts at the same seq: the two collide
/// on that key, as two rows of one event did. Rows are made the same way
/// from the same events, so a batch tried again finds them stored as they
/// are.
///
/// Two events of the batch at one seq are [`StoreError::Conflict`], as a
/// duplicate key is.
fn as_rows<'e>(events: impl Iterator<Item = &'e StoredEvent>) -> Result<Vec<Row<'e>>> {
    let mut events: Vec<&StoredEvent> = events.collect();
    runs::in_session_order(&mut events)?;
    Ok(runs::rows(events, ts))
}

impl<'a> EventColumns<'a> {
    /// Adds `e` as a row of its own.
    fn push(&mut self, e: &'a StoredEvent, terminal: bool) {
        self.session_id.push(&e.session_id);
        self.seq.push(e.seq);
        self.turn_id.push(e.turn_id.to_string());
        self.event_type.push(&e.event_type);
        self.payload.push(&e.payload);
        self.created_at.push(e.created_at);
        self.terminal.push(terminal);
        self.seq_end.push(None);
    }

    /// Rows (runs among them) as columns.
    fn of_rows(rows: &'a [Row<'a>]) -> Self {
        let mut columns = Self::default();
        for row in rows {
            let e = row.first();
            columns.session_id.push(&e.session_id);
            columns.seq.push(e.seq);
            columns.turn_id.push(e.turn_id.to_string());
            columns.event_type.push(&e.event_type);
            columns.payload.push(row.payload());
            columns.created_at.push(e.created_at);
            columns.terminal.push(false);
            columns.seq_end.push(row.seq_end());
        }
        columns
    }

    /// `query` with the six event columns bound as its first parameters
    /// (`$1`-`$6`: session ids, seqs, turn ids, types, payloads, times).
    fn bound<'q>(
        self,
        query: sqlx::query::QueryScalar<'q, Postgres, i64, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::QueryScalar<'q, Postgres, i64, sqlx::postgres::PgArguments>
    where
        'a: 'q,
    {
        query
            .bind(self.session_id)
            .bind(self.seq)
            .bind(self.turn_id)
            .bind(self.event_type)
            .bind(self.payload)
            .bind(self.created_at)
    }
}

/// Leases as columns, for `unnest`.
struct LeaseColumns {
    turn_id: Vec<String>,
    attempt: Vec<i32>,
}

impl LeaseColumns {
    fn of(leases: &[Lease]) -> Self {
        Self {
            turn_id: leases.iter().map(|l| l.turn_id.to_string()).collect(),
            attempt: leases
                .iter()
                .map(|l| i32::try_from(l.attempt).unwrap_or(i32::MAX))
                .collect(),
        }
    }
}
