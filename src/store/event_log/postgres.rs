//! [`EventLog`] on Postgres: plain sqlx, each call bounded by the call
//! timeout (see [`PostgresStore::bounded`]).

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::Postgres;

use super::{Batch, EventLog};
use crate::store::Result;
use crate::{
    events::StoredEvent,
    store::{Lease, NewStep, StoreError, TurnFinish, postgres::PostgresStore},
};

/// The statement that ends a batch's turns ([`finish_statement`]).
const FINISH: &str = include_str!("finish.sql");

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
        self.bounded(async {
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
            // the sessions' locks, one statement for everything, COMMIT.
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
            let (ended, _): (Vec<String>, i64) = finish_statement(events, finishes, leases)
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

/// What [`insert_leased`]'s statements write, after the `leased` turns
/// each defines: the batch's events and records of those turns, the
/// statement failing whole when any is of another turn or a seq is taken.
macro_rules! insert_leased_rest {
    () => {
        "), e AS ( \
           SELECT * FROM unnest($1::text[], $2::int8[], $3::text[], $4::text[], $5::text[], \
           $6::timestamptz[]) AS e(session_id, seq, turn_id, type, payload, created_at) \
         ), logged AS ( \
           INSERT INTO events (session_id, seq, turn_id, type, payload, created_at) \
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
         + harness_event_conflicts((SELECT count(*) FROM e) \
           - (SELECT count(*) FROM logged) \
           - (SELECT count(*) FROM e JOIN events x ON x.session_id = e.session_id \
              AND x.seq = e.seq AND x.turn_id = e.turn_id AND x.type = e.type \
              AND x.payload = e.payload))"
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
    let columns = EventColumns::of(events.iter().map(|e| (&**e, false)));
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
    let _: i64 = sqlx::query_scalar(sql)
        .bind(columns.session_id)
        .bind(columns.seq)
        .bind(columns.turn_id)
        .bind(columns.event_type)
        .bind(columns.payload)
        .bind(columns.created_at)
        .bind(leases.turn_id)
        .bind(leases.attempt)
        .bind(step_turns)
        .bind(numbers)
        .bind(phases)
        .bind(records)
        .bind(at)
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
    let columns = EventColumns::of(events.map(|e| (e, false)));
    let _: i64 = sqlx::query_scalar(
        "WITH e AS ( \
           SELECT * FROM unnest($1::text[], $2::int8[], $3::text[], $4::text[], $5::text[], \
           $6::timestamptz[]) AS e(session_id, seq, turn_id, type, payload, created_at) \
         ), logged AS ( \
           INSERT INTO events (session_id, seq, turn_id, type, payload, created_at) \
           SELECT * FROM e ON CONFLICT (session_id, seq) DO NOTHING RETURNING 1 \
         ) \
         SELECT harness_event_conflicts((SELECT count(*) FROM e) \
           - (SELECT count(*) FROM logged) \
           - (SELECT count(*) FROM e JOIN events x ON x.session_id = e.session_id \
              AND x.seq = e.seq AND x.turn_id = e.turn_id AND x.type = e.type \
              AND x.payload = e.payload))",
    )
    .bind(columns.session_id)
    .bind(columns.seq)
    .bind(columns.turn_id)
    .bind(columns.event_type)
    .bind(columns.payload)
    .bind(columns.created_at)
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
}

impl<'a> EventColumns<'a> {
    fn of(events: impl Iterator<Item = (&'a StoredEvent, bool)>) -> Self {
        let mut columns = Self::default();
        for (e, terminal) in events {
            columns.session_id.push(&e.session_id);
            columns.seq.push(e.seq);
            columns.turn_id.push(e.turn_id.to_string());
            columns.event_type.push(&e.event_type);
            columns.payload.push(&e.payload);
            columns.created_at.push(e.created_at);
            columns.terminal.push(terminal);
        }
        columns
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

/// The one statement that ends a batch's turns: each turn still running
/// is ended and its messages, decision, observation, jobs, session totals
/// and terminal event written; the batch's other events are written
/// whatever happens. It returns the ids of the turns it ended (a turn
/// someone else ended meanwhile is left as it is, with nothing of its
/// finish written); an event that finds another at its seq fails it.
///
/// Idempotent, as [`insert_events`]: tried again after a commit whose
/// answer was lost, it finds its events stored, ends nothing twice, and
/// reports as ended the turns whose own terminal event is already there.
fn finish_statement<'q>(
    events: &'q [Arc<StoredEvent>],
    finishes: &'q [&'q TurnFinish],
    leases: &'q [Lease],
) -> sqlx::query::QueryAs<'q, Postgres, (Vec<String>, i64), sqlx::postgres::PgArguments> {
    let mut turn_id = Vec::with_capacity(finishes.len());
    let mut session_id = Vec::with_capacity(finishes.len());
    let mut status = Vec::with_capacity(finishes.len());
    let mut result = Vec::with_capacity(finishes.len());
    let mut error_code = Vec::with_capacity(finishes.len());
    let mut error_message = Vec::with_capacity(finishes.len());
    let mut finished_at = Vec::with_capacity(finishes.len());
    let mut cost_usd = Vec::with_capacity(finishes.len());
    let mut last_seq = Vec::with_capacity(finishes.len());
    let mut attempt = Vec::with_capacity(finishes.len());
    #[derive(Default)]
    struct Messages<'a> {
        id: Vec<String>,
        session_id: Vec<&'a str>,
        turn_id: Vec<String>,
        role: Vec<&'a str>,
        content: Vec<&'a str>,
        created_at: Vec<chrono::DateTime<chrono::Utc>>,
    }
    #[derive(Default)]
    struct Decisions<'a> {
        id: Vec<String>,
        session_id: Vec<&'a str>,
        turn_id: Vec<String>,
        key: Vec<&'a str>,
        strategy: Vec<&'a str>,
        record: Vec<&'a str>,
        created_at: Vec<chrono::DateTime<chrono::Utc>>,
    }
    #[derive(Default)]
    struct Observations<'a> {
        id: Vec<&'a str>,
        turn_id: Vec<String>,
        session_id: Vec<&'a str>,
        source_id: Vec<&'a str>,
        user_text: Vec<&'a str>,
        assistant_text: Vec<&'a str>,
        created_at: Vec<chrono::DateTime<chrono::Utc>>,
    }
    #[derive(Default)]
    struct Jobs<'a> {
        id: Vec<&'a str>,
        /// The finish's turn, whose end decides whether the job is kept.
        owner: Vec<String>,
        kind: Vec<&'a str>,
        session_id: Vec<&'a str>,
        turn_id: Vec<&'a str>,
        payload: Vec<&'a str>,
        at: Vec<chrono::DateTime<chrono::Utc>>,
    }
    let mut messages = Messages::default();
    let mut decisions = Decisions::default();
    let mut observations = Observations::default();
    let mut jobs = Jobs::default();
    for finish in finishes {
        let id = finish.turn_id.to_string();
        let at = finish.terminal.created_at;
        for message in &finish.messages {
            messages.id.push(message.id.to_string());
            messages.session_id.push(&finish.session_id);
            messages.turn_id.push(id.clone());
            messages.role.push(&message.role);
            messages.content.push(&message.content);
            messages.created_at.push(at);
        }
        if let Some(decision) = &finish.decision {
            decisions.id.push(decision.id.to_string());
            decisions.session_id.push(&finish.session_id);
            decisions.turn_id.push(id.clone());
            decisions.key.push(&decision.decision_key);
            decisions.strategy.push(&decision.strategy);
            decisions.record.push(&decision.record);
            decisions.created_at.push(at);
        }
        if let Some(o) = &finish.observation {
            observations.id.push(&o.id);
            observations.turn_id.push(id.clone());
            observations.session_id.push(&o.session_id);
            observations.source_id.push(&o.source_id);
            observations.user_text.push(&o.user_text);
            observations.assistant_text.push(&o.assistant_text);
            observations.created_at.push(o.created_at);
        }
        for job in &finish.jobs {
            jobs.id.push(&job.id);
            jobs.owner.push(id.clone());
            jobs.kind.push(&job.kind);
            jobs.session_id.push(&job.session_id);
            jobs.turn_id.push(&job.turn_id);
            jobs.payload.push(&job.payload);
            jobs.at.push(job.at);
        }
        turn_id.push(id);
        session_id.push(finish.session_id.as_str());
        status.push(finish.status.as_str());
        result.push(finish.result.as_deref());
        error_code.push(finish.error_code.as_deref());
        error_message.push(finish.error_message.as_deref());
        finished_at.push(at);
        cost_usd.push(finish.cost_usd);
        last_seq.push(finish.terminal.seq);
        attempt.push(i32::try_from(finish.attempt).unwrap_or(i32::MAX));
    }
    let leases = LeaseColumns::of(leases);
    let events = EventColumns::of(
        events
            .iter()
            .map(|e| (&**e, false))
            .chain(finishes.iter().map(|f| (&*f.terminal, true))),
    );
    // Bound in the order `finish.sql` names its binds (a test below
    // holds the two together).
    sqlx::query_as(FINISH)
        .bind(turn_id)
        .bind(session_id)
        .bind(status)
        .bind(result)
        .bind(error_code)
        .bind(error_message)
        .bind(finished_at)
        .bind(cost_usd)
        .bind(last_seq)
        .bind(messages.id)
        .bind(messages.session_id)
        .bind(messages.turn_id)
        .bind(messages.role)
        .bind(messages.content)
        .bind(messages.created_at)
        .bind(decisions.id)
        .bind(decisions.session_id)
        .bind(decisions.turn_id)
        .bind(decisions.key)
        .bind(decisions.strategy)
        .bind(decisions.record)
        .bind(decisions.created_at)
        .bind(events.session_id)
        .bind(events.seq)
        .bind(events.turn_id)
        .bind(events.event_type)
        .bind(events.payload)
        .bind(events.created_at)
        .bind(events.terminal)
        .bind(observations.id)
        .bind(observations.turn_id)
        .bind(observations.session_id)
        .bind(observations.source_id)
        .bind(observations.user_text)
        .bind(observations.assistant_text)
        .bind(observations.created_at)
        .bind(jobs.id)
        .bind(jobs.owner)
        .bind(jobs.kind)
        .bind(jobs.session_id)
        .bind(jobs.turn_id)
        .bind(jobs.payload)
        .bind(jobs.at)
        .bind(attempt)
        .bind(leases.turn_id)
        .bind(leases.attempt)
}

#[cfg(test)]
mod tests {
    use super::FINISH;

    /// What each of `finish.sql`'s binds is, in order: `alias.column` of the
    /// `unnest` it feeds (`f` the ending turns, `m` their messages, `d` their
    /// decisions, `e` the batch's events, `o` observations, `j` jobs).
    const FINISH_BINDS: [&str; 46] = [
        "f.turn_id",
        "f.session_id",
        "f.status",
        "f.result",
        "f.error_code",
        "f.error_message",
        "f.finished_at",
        "f.cost_usd",
        "f.last_seq",
        "m.message_id",
        "m.session_id",
        "m.turn_id",
        "m.role",
        "m.content",
        "m.created_at",
        "d.id",
        "d.session_id",
        "d.turn_id",
        "d.decision_key",
        "d.strategy",
        "d.record",
        "d.created_at",
        "e.session_id",
        "e.seq",
        "e.turn_id",
        "e.type",
        "e.payload",
        "e.created_at",
        "e.terminal",
        "o.id",
        "o.turn_id",
        "o.session_id",
        "o.source_id",
        "o.user_text",
        "o.assistant_text",
        "o.created_at",
        "j.id",
        "j.owner",
        "j.kind",
        "j.session_id",
        "j.turn_id",
        "j.payload",
        "j.at",
        "f.attempt",
        "l.turn_id",
        "l.attempt",
    ];

    /// The header of `finish.sql` as (bind number, name, type).
    fn header() -> Vec<(usize, String, String)> {
        FINISH
            .lines()
            .filter_map(|line| line.strip_prefix("--   $"))
            .map(|bind| {
                let mut parts = bind.split_whitespace();
                let n = parts.next().and_then(|n| n.parse().ok()).unwrap_or(0);
                let name = parts.next().unwrap_or_default().to_owned();
                let ty = parts.next().unwrap_or_default().to_owned();
                (n, name, ty)
            })
            .collect()
    }

    #[test]
    fn the_finish_statement_names_each_bind_and_feeds_it_to_its_column() {
        let header = header();
        let numbers: Vec<usize> = header.iter().map(|(n, _, _)| *n).collect();
        assert_eq!(numbers, (1..=FINISH_BINDS.len()).collect::<Vec<_>>());
        let names: Vec<&str> = header.iter().map(|(_, name, _)| name.as_str()).collect();
        assert_eq!(names, FINISH_BINDS);
        let statement: String = FINISH
            .lines()
            .filter(|line| !line.starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n");
        for (n, name, ty) in &header {
            // Each bind is used once, cast to the type the header names...
            let cast = format!("${n}::{ty}");
            assert_eq!(statement.matches(&cast).count(), 1, "{cast} ({name})");
            let bind = format!("${n}");
            let used = statement.match_indices(&bind).filter(|(at, _)| {
                !statement[at + bind.len()..].starts_with(|c: char| c.is_ascii_digit())
            });
            assert_eq!(used.count(), 1, "{bind} ({name}) is used once");
            // ...in the `unnest` whose alias and column it names.
            let (alias, column) = name.split_once('.').unwrap_or_default();
            let from = statement.find(&cast).unwrap_or_default();
            let rest = &statement[from..];
            let alias_at = rest.find(&format!("AS {alias}(")).unwrap_or(usize::MAX);
            assert!(
                alias_at != usize::MAX,
                "{name}: no `AS {alias}(` after {cast}"
            );
            let columns_end = rest[alias_at..].find(')').unwrap_or_default();
            let columns: Vec<&str> = rest[alias_at + alias.len() + 4..alias_at + columns_end]
                .split(',')
                .map(str::trim)
                .collect();
            let position = statement[..from]
                .rfind("unnest(")
                .map(|start| statement[start..from].matches("::").count())
                .unwrap_or_default();
            assert_eq!(
                columns.get(position),
                Some(&column),
                "{name} is column {position} of {alias}"
            );
        }
    }
}
