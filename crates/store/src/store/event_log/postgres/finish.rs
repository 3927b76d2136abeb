//! The one statement that ends a batch's turns on Postgres, its SQL in
//! `finish.sql` beside it (one round trip, every bind named there).

use sqlx::Postgres;

use super::{EventColumns, LeaseColumns};
use crate::store::{Lease, TurnFinish, event_log::runs::Row, webhooks::Route};

/// The statement that ends a batch's turns ([`finish_statement`]).
const FINISH: &str = include_str!("finish.sql");

/// The one statement that ends a batch's turns: each turn still running
/// is ended and its messages, decision, observation, jobs, session totals
/// and terminal event written; the batch's other events are written
/// whatever happens. It returns the ids of the turns it ended (a turn
/// someone else ended meanwhile is left as it is, with nothing of its
/// finish written); an event that finds another at its seq fails it.
///
/// Idempotent, as [`super::insert_events`]: tried again after a commit whose
/// answer was lost, it finds its events stored, ends nothing twice, and
/// reports as ended the turns whose own terminal event is already there.
#[expect(
    clippy::too_many_lines,
    reason = "binds the statement's arrays in the order finish.sql names them"
)]
pub(super) fn finish_statement<'q>(
    rows: &'q [Row<'q>],
    finishes: &'q [&'q TurnFinish],
    leases: &'q [Lease],
    routes: &'q [Route<'q>],
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
        attachments: Vec<Option<&'a str>>,
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
            messages.attachments.push(message.attachments.as_deref());
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
    let mut events = EventColumns::of_rows(rows);
    for finish in finishes {
        events.push(&finish.terminal, true);
    }
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
        .bind(events.seq_end)
        .bind(
            routes
                .iter()
                .map(|r| r.message.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(routes.iter().map(|r| r.tenant).collect::<Vec<_>>())
        .bind(
            routes
                .iter()
                .map(|r| r.event.session_id.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(routes.iter().map(|r| r.event.seq).collect::<Vec<_>>())
        .bind(
            routes
                .iter()
                .map(|r| r.event.turn_id.to_string())
                .collect::<Vec<_>>(),
        )
        .bind(routes.iter().map(|r| r.kind).collect::<Vec<_>>())
        .bind(
            routes
                .iter()
                .map(|r| r.event.created_at)
                .collect::<Vec<_>>(),
        )
        .bind(routes.iter().map(|r| r.wanted).collect::<Vec<_>>())
        .bind(
            routes
                .iter()
                .map(|r| r.event.is_terminal())
                .collect::<Vec<_>>(),
        )
        .bind(messages.attachments)
}

#[cfg(test)]
mod tests {
    use super::FINISH;

    /// What each of `finish.sql`'s binds is, in order: `alias.column` of the
    /// `unnest` it feeds (`f` the ending turns, `m` their messages, `d` their
    /// decisions, `e` the batch's events, `o` observations, `j` jobs).
    const FINISH_BINDS: [&str; 57] = [
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
        "e.seq_end",
        "r.id",
        "r.tenant",
        "r.session_id",
        "r.seq",
        "r.turn_id",
        "r.kind",
        "r.created_at",
        "r.wanted",
        "r.terminal",
        "m.attachments",
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
