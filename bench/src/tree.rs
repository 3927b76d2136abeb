//! The `tree` scenario: what a turn of a branched session (its history
//! read along its parent links) costs beside a turn of a session that
//! never branched (its last messages read as before), both with a full
//! history (`HARNESS_HISTORY_MAX_MESSAGES`, 50) to read, in the same
//! process and run, turns of the two sessions taken in turn.
//!
//! The `fork` scenario: forking a session of 5,000 turns, at its newest,
//! middle and first turn: how long a fork takes, and how many rows it
//! writes (every table counted before and after).

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::{client, fake::Spec, procs::Proc, stats::p50_p99};

/// Turns each session has before the measured ones: more than the history
/// holds, so every measured turn reads a full one.
const BEFORE: usize = 40;

/// Posts a JSON turn to `session` (with `extra` fields): its id.
async fn turn(
    http: &reqwest::Client,
    base: &str,
    session: &str,
    model: &str,
    extra: Value,
) -> Result<String, String> {
    let mut body = json!({"message": "Tell me more.", "runtime_model": model});
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    post(http, &format!("{base}/sessions/{session}/turns"), &body).await
}

async fn post(http: &reqwest::Client, url: &str, body: &Value) -> Result<String, String> {
    let response = http
        .post(url)
        .json(body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let text = response.text().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("{url}: {status}: {text}"));
    }
    let answer: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    answer["turn_id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("{url}: no turn_id in {text}"))
}

pub(crate) async fn run(harness: &Proc, db: &str, scale: usize) -> Result<(), String> {
    let spec = Spec::realistic();
    let model = spec.model();
    let http = client::http_client();
    let base = harness.url();
    let run = uuid::Uuid::now_v7().simple().to_string();
    let (linear, branched) = (format!("tree-l-{run}"), format!("tree-b-{run}"));
    let mut ids = Vec::new();
    for _ in 0..BEFORE {
        turn(&http, &base, &linear, &model, json!({})).await?;
        ids.push(turn(&http, &base, &branched, &model, json!({})).await?);
    }
    // A new answer to the tenth turn, then on from it: the session is
    // branched, and its newest turn's branch is 11 turns long before the
    // measured ones add theirs.
    post(
        &http,
        &format!("{base}/sessions/{branched}/turns/{}/regenerate", ids[9]),
        &json!({"runtime_model": model}),
    )
    .await?;
    println!(
        "## tree ({db}): a turn of a branched session beside one of a session that never \
         branched, each with {BEFORE} turns before and a full history of 50 messages to read, \
         c=1, turns of the two taken in turn\n"
    );
    println!("| session | turns | p50 | p99 | server CPU/turn |");
    println!("|---|---|---|---|---|");
    let total = 200 / scale;
    let mut times: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    let mut cpu = [Duration::ZERO; 2];
    for _ in 0..total {
        for (n, session) in [&linear, &branched].into_iter().enumerate() {
            let cpu_before = harness.cpu();
            let started = Instant::now();
            turn(&http, &base, session, &model, json!({})).await?;
            times[n].push(started.elapsed());
            cpu[n] += harness.cpu().saturating_sub(cpu_before);
        }
    }
    for (n, name) in ["never branched", "branched"].iter().enumerate() {
        let (p50, p99) = p50_p99(&times[n]);
        println!(
            "| {name} | {} | {p50:.2} ms | {p99:.2} ms | {:.3} ms |",
            times[n].len(),
            cpu[n].as_secs_f64() * 1000.0 / times[n].len().max(1) as f64,
        );
    }
    println!();
    Ok(())
}

/// Turns of the session the `fork` scenario forks.
const LONG: usize = 5_000;

/// Forks the `fork` scenario times.
const FORKS: usize = 30;

/// Rows in every table of the database at `url` (the service's own
/// migrations' bookkeeping aside).
async fn rows(url: &str) -> Result<i64, String> {
    use sqlx::Row as _;
    // The tables, then the sum of their counts, on a pool of either kind.
    macro_rules! count_all {
        ($pool:expr, $tables:expr) => {{
            let pool = $pool.map_err(|e| e.to_string())?;
            let tables = sqlx::query($tables)
                .fetch_all(&pool)
                .await
                .map_err(|e| e.to_string())?;
            let mut total = 0i64;
            for table in &tables {
                let name: String = table.get(0);
                let sql = format!("SELECT count(*) FROM \"{name}\"");
                let row = sqlx::query(sqlx::AssertSqlSafe(sql))
                    .fetch_one(&pool)
                    .await
                    .map_err(|e| e.to_string())?;
                total += row.get::<i64, _>(0);
            }
            Ok(total)
        }};
    }
    if url.starts_with("sqlite:") {
        count_all!(
            sqlx::SqlitePool::connect(url).await,
            "SELECT name FROM sqlite_master WHERE type = 'table' \
             AND name NOT LIKE 'sqlite_%' AND name NOT LIKE '_sqlx%'"
        )
    } else {
        count_all!(
            sqlx::PgPool::connect(url).await,
            "SELECT table_name::text FROM information_schema.tables \
             WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' \
             AND table_name NOT LIKE '_sqlx%'"
        )
    }
}

pub(crate) async fn fork(harness: &Proc, url: &str, db: &str) -> Result<(), String> {
    let model = Spec::realistic().model();
    let http = client::http_client();
    let base = harness.url();
    let source = format!("fork-src-{}", uuid::Uuid::now_v7().simple());
    let made = Instant::now();
    let mut ids = Vec::with_capacity(LONG);
    for _ in 0..LONG {
        ids.push(turn(&http, &base, &source, &model, json!({})).await?);
    }
    let made = made.elapsed();
    let at = [
        ("newest", ids[LONG - 1].clone()),
        ("middle", ids[LONG / 2].clone()),
        ("first", ids[0].clone()),
    ];
    println!(
        "## fork ({db}): `POST /sessions/{{id}}/fork` of a session of {LONG} turns (made in \
         {:.0} s), {FORKS} forks at each turn, c=1; rows: every table counted before and after\n",
        made.as_secs_f64()
    );
    println!(
        "| at the source's | forks | p50 | p99 | rows written a fork | first turn of a fork, p50 |"
    );
    println!("|---|---|---|---|---|---|");
    for (name, turn_id) in &at {
        let before = rows(url).await?;
        let mut times = Vec::with_capacity(FORKS);
        let mut forks = Vec::with_capacity(FORKS);
        for _ in 0..FORKS {
            let url = format!("{base}/sessions/{source}/fork");
            let started = Instant::now();
            let response = http
                .post(&url)
                .json(&json!({"at_turn": turn_id}))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            times.push(started.elapsed());
            let status = response.status();
            let answer: Value = response.json().await.map_err(|e| e.to_string())?;
            if status != reqwest::StatusCode::CREATED {
                return Err(format!("{url}: {status}: {answer}"));
            }
            if let Some(id) = answer["session_id"].as_str() {
                forks.push(id.to_owned());
            }
        }
        let written = rows(url).await? - before;
        // The fork's first turn reads its history through the source.
        let mut firsts = Vec::with_capacity(forks.len());
        for fork in &forks {
            let started = Instant::now();
            turn(&http, &base, fork, &model, json!({})).await?;
            firsts.push(started.elapsed());
        }
        let (p50, p99) = p50_p99(&times);
        let (first, _) = p50_p99(&firsts);
        println!(
            "| {name} | {FORKS} | {p50:.2} ms | {p99:.2} ms | {:.1} | {first:.2} ms |",
            written as f64 / FORKS as f64
        );
    }
    println!();
    Ok(())
}
