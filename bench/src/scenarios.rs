//! The scenarios of docs/benchmarks.md, one function each in the order that
//! document gives them. One file over 600 lines on purpose: each scenario
//! is read beside the others it is compared with, as docs/benchmarks.md does.

use std::time::Duration;

use tokio::time::Instant;

use crate::{
    client::{self, Sample, Target},
    fake::Spec,
    procs::{self, Proc},
    stats::{p50_p99, percentile},
};

/// A folder for the run's databases, removed at the end.
pub(crate) struct ScratchDir(pub(crate) std::path::PathBuf);

impl ScratchDir {
    pub(crate) fn new(name: &str) -> Result<Self, String> {
        let path =
            std::env::temp_dir().join(format!("agent-harness-bench-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Self(path))
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const ALL: [&str; 14] = [
    "startup", "overhead", "ttft", "tools", "images", "tree", "fork", "streams", "held",
    "eventlog", "replicas", "takeover", "tenants", "scale",
];

pub async fn run(
    scenarios: Vec<String>,
    postgres: Option<String>,
    quick: bool,
    streams_count: Option<usize>,
) -> Result<(), String> {
    let wanted = |name: &str| scenarios.is_empty() || scenarios.iter().any(|s| s == name);
    for name in &scenarios {
        if !ALL.contains(&name.as_str()) {
            return Err(format!(
                "unknown scenario {name:?}; known: {}",
                ALL.join(", ")
            ));
        }
    }
    let dir = ScratchDir::new("run")?;
    let sqlite = format!("sqlite://{}/bench.db", dir.0.display());
    let fake = procs::start_fake().await?;
    let scale = if quick { 10 } else { 1 };
    println!(
        "# agent-harness bench ({} cores)\n",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    // What a reader compares against a deployment: every setting that is
    // not the service's default.
    let from_env: Vec<String> = std::env::vars()
        .filter(|(name, _)| name.starts_with("HARNESS_"))
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    println!(
        "Settings: the service's defaults, except the listen address, the instance id, \
         the database URL, the provider URLs and chain (`openai:bench,anthropic:bench`, \
         the fake provider) and the fake's models (`[providers.models]`), one provider attempt, the turn timeout{}.\n",
        if from_env.is_empty() {
            String::new()
        } else {
            format!(", and from the environment: {}", from_env.join(", "))
        }
    );

    if wanted("startup") {
        startup(&fake, &sqlite, postgres.as_deref()).await?;
    }
    if wanted("overhead") || wanted("ttft") || wanted("tools") || wanted("images") {
        let (harness, _) = procs::start_harness(&sqlite, &fake.url(), 120).await?;
        if wanted("overhead") {
            overhead(&fake, &harness, "sqlite", scale).await;
            if let Some(url) = &postgres {
                let (pg, _) = procs::start_harness(url, &fake.url(), 120).await?;
                overhead(&fake, &pg, "postgres", scale).await;
            }
        }
        if wanted("ttft") {
            ttft(&fake, &harness, scale).await;
        }
        if wanted("tools") {
            tools(&harness, scale).await;
        }
        if wanted("images") {
            crate::images::run(&harness, scale).await?;
        }
    }
    if wanted("tree") {
        let (harness, _) = procs::start_harness(&sqlite, &fake.url(), 120).await?;
        crate::tree::run(&harness, "sqlite", scale).await?;
        if let Some(url) = &postgres {
            let (pg, _) = procs::start_harness(url, &fake.url(), 120).await?;
            crate::tree::run(&pg, "postgres", scale).await?;
        }
    }
    if wanted("fork") {
        let (harness, _) = procs::start_harness(&sqlite, &fake.url(), 120).await?;
        crate::tree::fork(&harness, &sqlite, "sqlite").await?;
        if let Some(url) = &postgres {
            let (pg, _) = procs::start_harness(url, &fake.url(), 120).await?;
            crate::tree::fork(&pg, url, "postgres").await?;
        }
    }
    if wanted("streams") {
        // A fresh process, so that its RSS is not the sum of earlier runs.
        let count = streams_count.unwrap_or(if quick { 100 } else { 1000 });
        let room = one_tenants_room(count);
        let (fresh, _) = procs::start_harness_with(&sqlite, &fake.url(), 120, &room).await?;
        streams(&fake, &fresh, count).await;
    }
    if wanted("held") {
        let room = one_tenants_room(if quick { 500 } else { 5000 });
        let (fresh, _) = procs::start_harness_with(&sqlite, &fake.url(), 120, &room).await?;
        held(&fresh, quick).await;
    }
    if wanted("replicas") {
        match &postgres {
            Some(url) => replicas(&fake, &sqlite, url, scale).await?,
            None if !scenarios.is_empty() => {
                return Err("the replicas scenario needs --postgres".into());
            }
            None => {}
        }
    }
    if wanted("takeover") {
        match &postgres {
            Some(url) => takeover(&fake, url, quick).await?,
            None if !scenarios.is_empty() => {
                return Err("the takeover scenario needs --postgres".into());
            }
            None => {}
        }
    }
    if wanted("tenants") {
        crate::tenants::run(&fake, &sqlite, "sqlite", scale).await?;
        if let Some(url) = &postgres {
            crate::tenants::run(&fake, url, "postgres", scale).await?;
        }
    }
    // Only when named: it pins this process and its children to cores.
    if scenarios.iter().any(|s| s == "scale") {
        crate::scale::run(quick, streams_count).await?;
    }
    if wanted("eventlog") {
        let (sq, _) = procs::start_harness(&sqlite, &fake.url(), 120).await?;
        eventlog(&sq, "sqlite", scale).await;
        drop(sq);
        if let Some(url) = &postgres {
            let (pg, _) = procs::start_harness(url, &fake.url(), 120).await?;
            eventlog(&pg, "postgres", scale).await;
        }
    }
    Ok(())
}

/// The two paths every side-by-side scenario measures, named as printed.
fn paths(fake: &Proc, harness: &Proc) -> [(&'static str, Target); 2] {
    [
        ("direct", Target::Direct { base: fake.url() }),
        (
            "agent-harness",
            Target::Harness {
                base: harness.url(),
            },
        ),
    ]
}

pub(crate) fn ok(samples: &[Sample]) -> (Vec<&Sample>, usize) {
    let good: Vec<&Sample> = samples.iter().filter(|s| s.ok).collect();
    let errors = samples.len() - good.len();
    (good, errors)
}

pub(crate) fn totals(samples: &[&Sample]) -> Vec<Duration> {
    samples.iter().map(|s| s.total).collect()
}

pub(crate) fn ttfts(samples: &[&Sample]) -> Vec<Duration> {
    samples.iter().map(|s| s.ttft).collect()
}

pub(crate) fn gaps(samples: &[&Sample]) -> Vec<Duration> {
    samples
        .iter()
        .flat_map(|s| s.gaps.iter().copied())
        .collect()
}

async fn startup(fake: &Proc, sqlite: &str, postgres: Option<&str>) -> Result<(), String> {
    println!("## startup\n");
    println!("| database | start to ready (migrations applied) | idle RSS |");
    println!("|---|---|---|");
    let dir = ScratchDir::new("startup")?;
    let fresh = format!("sqlite://{}/fresh.db", dir.0.display());
    let mut cases = vec![
        ("sqlite, new file", fresh),
        ("sqlite, existing file", sqlite.to_owned()),
    ];
    if let Some(url) = postgres {
        cases.push(("postgres", url.to_owned()));
    }
    for (name, url) in cases {
        let (harness, ready) = procs::start_harness(&url, &fake.url(), 60).await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        println!(
            "| {name} | {:.1} ms | {:.1} MiB |",
            ready.as_secs_f64() * 1000.0,
            harness.rss_kib() as f64 / 1024.0
        );
    }
    println!();
    Ok(())
}

async fn overhead(fake: &Proc, harness: &Proc, db: &str, scale: usize) {
    let spec = Spec::realistic();
    println!(
        "## overhead ({db}): one-step text turn, TTFT 0, ITL 0, {} tokens, {} µs of provider work per chunk\n",
        spec.tokens, spec.cost_us
    );
    println!(
        "| concurrency | path | turns/s | p50 | p99 | errors | added p50 | added p99 | share of direct turns/s | server CPU | CPU/turn | provider CPU/stream |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let http = client::http_client();
    let model = spec.model();
    let direct = Target::Direct { base: fake.url() };
    let through = Target::Harness {
        base: harness.url(),
    };
    // Warm-up: connections, caches, the first SQLite pages.
    client::load(&http, &through, &model, 8, 200 / scale).await;
    for concurrency in [1, 8, 32] {
        let total = if concurrency == 1 { 1000 } else { 4000 } / scale;
        let fake_before = fake.cpu();
        let (d, d_wall) = client::load(&http, &direct, &model, concurrency, total).await;
        let fake_cpu = fake.cpu().saturating_sub(fake_before);
        let cpu_before = harness.cpu();
        let (h, h_wall) = client::load(&http, &through, &model, concurrency, total).await;
        let cpu = harness.cpu().saturating_sub(cpu_before);
        let (d_ok, d_err) = ok(&d);
        let (h_ok, h_err) = ok(&h);
        let (d50, d99) = p50_p99(&totals(&d_ok));
        let (h50, h99) = p50_p99(&totals(&h_ok));
        let d_rate = d_ok.len() as f64 / d_wall.as_secs_f64();
        let h_rate = h_ok.len() as f64 / h_wall.as_secs_f64();
        println!(
            "| {concurrency} | direct | {d_rate:.0} | {d50:.2} ms | {d99:.2} ms | {d_err} | | | | | | {:.3} ms |",
            fake_cpu.as_secs_f64() * 1000.0 / d_ok.len().max(1) as f64
        );
        println!(
            "| {concurrency} | agent-harness | {h_rate:.0} | {h50:.2} ms | {h99:.2} ms | {h_err} | {:.2} ms | {:.2} ms | {:.2} | {:.0}% | {:.3} ms | |",
            h50 - d50,
            h99 - d99,
            h_rate / d_rate.max(1e-9),
            100.0 * cpu.as_secs_f64() / h_wall.as_secs_f64(),
            cpu.as_secs_f64() * 1000.0 / h_ok.len().max(1) as f64
        );
    }
    println!();
}

async fn ttft(fake: &Proc, harness: &Proc, scale: usize) {
    let spec = Spec {
        ttft_ms: 200,
        itl_ms: 20,
        ..Spec::realistic()
    };
    println!(
        "## ttft: TTFT 200 ms, ITL 20 ms, {} tokens, {} µs of provider work per chunk, 32 concurrent\n",
        spec.tokens, spec.cost_us
    );
    let http = client::http_client();
    let model = spec.model();
    // 512 turns: a p99 that is not just the largest few samples.
    let total = 512 / scale.min(8);
    // Warm-up, as in `overhead`: the connections 32 concurrent turns use
    // (client to service, service to provider) and the first SQLite pages,
    // so that p99 is the steady state and not the first burst's set-up.
    let warm = Spec::parse("bench/n=20").model();
    for (_, target) in paths(fake, harness) {
        client::load(&http, &target, &warm, 32, 320).await;
    }
    // In step: the 32 turns start together and, being of equal length, end
    // and start again together (32 turn starts at once, every round).
    // Staggered: their starts spread over one turn's length, as turns of
    // independent users arrive.
    let turn = Duration::from_millis(spec.ttft_ms + spec.tokens * spec.itl_ms);
    let mut added = Vec::new();
    for (arrivals, spread) in [("in step", Duration::ZERO), ("staggered", turn)] {
        println!("### arrivals {arrivals}\n");
        println!("| path | TTFT p50 | TTFT p99 | gap p50 | gap p99 | total p50 | errors |");
        println!("|---|---|---|---|---|---|---|");
        let mut figures = Vec::new();
        for (name, target) in paths(fake, harness) {
            let (samples, _) =
                client::load_staggered(&http, &target, &model, 32, total, spread).await;
            let (good, errors) = ok(&samples);
            let (t50, t99) = p50_p99(&ttfts(&good));
            let (g50, g99) = p50_p99(&gaps(&good));
            let (total50, _) = p50_p99(&totals(&good));
            println!(
                "| {name} | {t50:.2} ms | {t99:.2} ms | {g50:.2} ms | {g99:.2} ms | {total50:.1} ms | {errors} |"
            );
            figures.push((t50, t99, g50, g99));
        }
        let (d, h) = (figures[0], figures[1]);
        println!();
        added.push((arrivals, h.0 - d.0, h.1 - d.1, h.2 - d.2, h.3 - d.3));
    }
    for (arrivals, t50, t99, g50, g99) in added {
        println!(
            "added, arrivals {arrivals}: TTFT p50 {t50:.2} ms, p99 {t99:.2} ms; inter-chunk p50 {g50:.2} ms, p99 {g99:.2} ms"
        );
    }
    println!();
}

async fn tools(harness: &Proc, scale: usize) {
    println!("## tools: a two-step turn with a wave of 6 read-only tools of 100 ms each\n");
    let http = client::http_client();
    let model = Spec::parse("bench/tools=6/toolms=100/n=10").model();
    let through = Target::Harness {
        base: harness.url(),
    };
    let (samples, _) = client::load(&http, &through, &model, 1, 50 / scale.min(5)).await;
    let (good, errors) = ok(&samples);
    let (p50, p99) = p50_p99(&totals(&good));
    println!("| turn p50 | turn p99 | errors | one tool | six in sequence would be |");
    println!("|---|---|---|---|---|");
    println!("| {p50:.1} ms | {p99:.1} ms | {errors} | 100 ms | 600 ms |\n");
}

async fn streams(fake: &Proc, harness: &Proc, streams: usize) {
    let http = client::http_client();
    println!("## streams: {streams} concurrent turns, ITL 50 ms, 200 tokens\n");
    let spec = Spec::parse("bench/itl=50/n=200");
    let model = spec.model();
    let warm = Spec::parse("bench/n=1").model();
    // In step: every stream starts at once, so all of them receive a token
    // within the same few milliseconds, every 50 ms. Staggered: starts
    // spread over one inter-token interval, so tokens arrive evenly, as
    // streams of independent users do.
    let mut added = Vec::new();
    for (arrivals, spread) in [
        ("in step", Duration::ZERO),
        ("staggered", Duration::from_millis(spec.itl_ms)),
    ] {
        println!("### arrivals {arrivals}\n");
        println!(
            "| path | gap p50 | gap p99 | gap max | TTFT p99 | errors | server RSS | server CPU | CPU per token |"
        );
        println!("|---|---|---|---|---|---|---|---|---|");
        let mut figures = Vec::new();
        for (name, target) in paths(fake, harness) {
            // Warm-up: the connections of 1,000 concurrent turns (client to
            // service, service to provider), so the figures are the steady
            // state and not 1,000 TCP handshakes at once.
            let load = (warm.as_str(), model.as_str(), streams, spread);
            let (run, cpu, wall) = StreamRun::measure(&http, &target, load, harness).await;
            let per_token = run.cpu_per_token(name, cpu);
            let (rss, cpu) = if name == "direct" {
                (String::new(), String::new())
            } else {
                (
                    format!("{:.1} MiB", harness.rss_kib() as f64 / 1024.0),
                    format!("{:.0}%", 100.0 * cpu.as_secs_f64() / wall.as_secs_f64()),
                )
            };
            println!("| {name} | {} | {rss} | {cpu} | {per_token} |", run.cells());
            figures.push((run.g50, run.g99));
        }
        println!();
        added.push((
            arrivals,
            figures[1].0 - figures[0].0,
            figures[1].1 - figures[0].1,
        ));
    }
    for (arrivals, g50, g99) in added {
        println!("added inter-chunk delay, arrivals {arrivals}: p50 {g50:.2} ms, p99 {g99:.2} ms");
    }
    println!();
}

/// What the samples of a run of streams say, as its table row shows it.
pub(crate) struct StreamRun {
    /// Gaps between tokens: p50, p99 and the largest, ms.
    pub g50: f64,
    pub g99: f64,
    pub max: f64,
    pub t99: f64,
    pub errors: usize,
    /// Tokens relayed: each gap, and the first of each stream.
    pub tokens: usize,
}

impl StreamRun {
    /// `count` streams of `model` to `target` (after as many of `warm`, to
    /// open their connections), their starts spread over `spread`: what
    /// they say, the service's CPU meanwhile, and the wall time.
    pub(crate) async fn measure(
        http: &reqwest::Client,
        target: &Target,
        (warm, model, count, spread): (&str, &str, usize, Duration),
        harness: &Proc,
    ) -> (Self, Duration, Duration) {
        client::load(http, target, warm, count, count).await;
        let cpu_before = harness.cpu();
        let (samples, wall) =
            client::load_staggered(http, target, model, count, count, spread).await;
        let cpu = harness.cpu().saturating_sub(cpu_before);
        (Self::of(&samples), cpu, wall)
    }

    /// Its gaps' p50, p99 and largest, its TTFT p99 and its errors, as
    /// cells of a table's row.
    pub(crate) fn cells(&self) -> String {
        format!(
            "{:.2} ms | {:.2} ms | {:.1} ms | {:.2} ms | {}",
            self.g50, self.g99, self.max, self.t99, self.errors
        )
    }

    /// The service's `cpu` per token relayed, as a cell (empty for the
    /// path straight to the provider).
    pub(crate) fn cpu_per_token(&self, path: &str, cpu: Duration) -> String {
        if path == "direct" {
            return String::new();
        }
        format!(
            "{:.1} µs",
            cpu.as_secs_f64() * 1e6 / self.tokens.max(1) as f64
        )
    }

    pub(crate) fn of(samples: &[Sample]) -> Self {
        let (good, errors) = ok(samples);
        let all_gaps = gaps(&good);
        let (g50, g99) = p50_p99(&all_gaps);
        let (_, t99) = p50_p99(&ttfts(&good));
        Self {
            g50,
            g99,
            max: percentile(&all_gaps, 100.0),
            t99,
            errors,
            tokens: all_gaps.len() + good.len(),
        }
    }
}

/// The settings that let one tenant hold `count` turns at once (the
/// `streams` and `held` scenarios' turns are all the default tenant's,
/// past its default limits of 64 running turns and 256 open streams),
/// printed as the settings the scenario changes.
pub(crate) fn one_tenants_room(count: usize) -> Vec<(&'static str, String)> {
    let room = (count + 64).to_string();
    println!(
        "(this scenario's {count} turns are one tenant's: it sets \
         HARNESS_TENANT_MAX_RUNNING_TURNS={room} and HARNESS_TENANT_MAX_STREAMS={room})\n"
    );
    vec![
        ("HARNESS_TENANT_MAX_RUNNING_TURNS", room.clone()),
        ("HARNESS_TENANT_MAX_STREAMS", room),
    ]
}

/// Turns held open by a provider that has not answered yet: memory per turn.
async fn held(harness: &Proc, quick: bool) {
    let http = client::http_client();
    let held = if quick { 500 } else { 5000 };
    println!("## held: {held} turns held open (the provider waits 60 s before its first token)\n");
    // Warm up first (pools, caches, thread stacks), so that the difference
    // is what the open turns hold and not what any first turn sets up.
    let warm = Spec::parse("bench/n=20").model();
    let target = Target::Harness {
        base: harness.url(),
    };
    client::load(&http, &target, &warm, 32, 1000).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = harness.rss_kib();
    let model = Spec::parse("bench/ttft=60000/n=1").model();
    let mut open = tokio::task::JoinSet::new();
    let started = Instant::now();
    for _ in 0..held {
        let (http, target, model) = (http.clone(), target.clone(), model.clone());
        open.spawn(async move { client::request(&http, &target, &model).await });
    }
    // Wait until every turn has begun (the server counts them).
    let mut running = 0;
    while started.elapsed() < Duration::from_secs(50) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        running = count_running(&http, harness).await.unwrap_or(running);
        if running >= held {
            break;
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let loaded = harness.rss_kib();
    println!("| open turns | RSS before (warm) | RSS with them open | per open stream |");
    println!("|---|---|---|---|");
    println!(
        "| {running} | {:.1} MiB | {:.1} MiB | {:.1} KiB |\n",
        idle as f64 / 1024.0,
        loaded as f64 / 1024.0,
        (loaded.saturating_sub(idle)) as f64 / running.max(1) as f64
    );
    open.abort_all();
}

/// Turns the server says are running (`/metrics`).
async fn count_running(http: &reqwest::Client, harness: &Proc) -> Option<usize> {
    let text = harness.metrics(http).await?;
    text.lines()
        .find_map(|l| l.strip_prefix("agent_harness_turns_running "))
        .and_then(|v| v.trim().parse().ok())
}

async fn eventlog(harness: &Proc, db: &str, scale: usize) {
    println!("## eventlog ({db}): turns of 2000 tokens, ITL 0, 32 concurrent\n");
    let http = client::http_client();
    let model = Spec::parse("bench/n=2000").model();
    let through = Target::Harness {
        base: harness.url(),
    };
    let turns = 320 / scale;
    let (samples, wall) = client::load(&http, &through, &model, 32, turns).await;
    let (good, errors) = ok(&samples);
    // Every turn persists its deltas plus turn.started, usage (step and
    // total), decision and turn.completed.
    let events = good.len() * (2000 + 5);
    println!("| turns | events | seconds | persisted events/s | errors |");
    println!("|---|---|---|---|---|");
    println!(
        "| {} | {events} | {:.2} | {:.0} | {errors} |\n",
        good.len(),
        wall.as_secs_f64(),
        events as f64 / wall.as_secs_f64()
    );
}

/// Postgres deadlocks so far in the database of `url`.
async fn deadlocks(url: &str) -> Result<i64, String> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    let count = sqlx::query_scalar::<_, i64>(
        "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(&pool)
    .await
    .map_err(|e| e.to_string());
    pool.close().await;
    count
}

/// Replicas on one Postgres behind a gateway that spreads turns over them,
/// beside the provider alone, one SQLite process and one Postgres process,
/// with a provider as fast as a good hosted one (first token after 25 ms);
/// then a replica killed mid-turn and the time until another frees its
/// session.
async fn replicas(fake: &Proc, sqlite: &str, postgres: &str, scale: usize) -> Result<(), String> {
    const REPLICAS: usize = 3;
    const CONCURRENCY: usize = 32;
    println!(
        "## replicas: TTFT 25 ms, ITL 0, 20 tokens, {CONCURRENCY} concurrent; {REPLICAS} replicas on one Postgres\n"
    );
    let http = client::http_client();
    let model = Spec::parse("bench/ttft=25/n=20").model();
    let total = 4000 / scale;
    let deadlocks_before = deadlocks(postgres).await?;
    // The database server's CPU, when it runs on this machine.
    let server = procs::PostgresServer::find(postgres).await;
    let (sqlite_one, _) = procs::start_harness(sqlite, &fake.url(), 120).await?;
    let (postgres_one, _) = procs::start_harness(postgres, &fake.url(), 120).await?;
    let mut replicas = Vec::new();
    for _ in 0..REPLICAS {
        replicas.push(procs::start_harness(postgres, &fake.url(), 120).await?.0);
    }
    let gateway = Target::gateway(replicas.iter().map(Proc::url).collect());
    let cases: [(&str, Target, Vec<&Proc>, bool); 4] = [
        (
            "provider alone",
            Target::Direct { base: fake.url() },
            vec![],
            false,
        ),
        (
            "1 process, SQLite",
            Target::Harness {
                base: sqlite_one.url(),
            },
            vec![&sqlite_one],
            false,
        ),
        (
            "1 process, Postgres",
            Target::Harness {
                base: postgres_one.url(),
            },
            vec![&postgres_one],
            true,
        ),
        (
            "3 replicas, Postgres",
            gateway,
            replicas.iter().collect(),
            true,
        ),
    ];
    println!(
        "| path | turns/s | × provider alone | p50 | p99 | added p50 | added p99 | errors | service CPU per turn | Postgres CPU per turn |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut direct = (0.0, 0.0, 0.0);
    let per_turn = |cpu: Duration, turns: usize| cpu.as_secs_f64() * 1000.0 / turns.max(1) as f64;
    for (name, target, procs, on_postgres) in cases {
        // Warm-up: the connections and the first pages.
        client::load(&http, &target, &model, CONCURRENCY, 400 / scale).await;
        let cpu_before: Duration = procs.iter().map(|p| p.cpu()).sum();
        let server_before = server.as_ref().map(procs::PostgresServer::cpu);
        let (samples, wall) = client::load(&http, &target, &model, CONCURRENCY, total).await;
        let cpu = procs
            .iter()
            .map(|p| p.cpu())
            .sum::<Duration>()
            .saturating_sub(cpu_before);
        let server_cpu = server
            .as_ref()
            .zip(server_before)
            .map(|(s, before)| s.cpu().saturating_sub(before));
        let (good, errors) = ok(&samples);
        let rate = good.len() as f64 / wall.as_secs_f64();
        let (p50, p99) = p50_p99(&totals(&good));
        let database = match server_cpu {
            Some(cpu) if on_postgres => format!("{:.2} ms", per_turn(cpu, good.len())),
            _ => String::new(),
        };
        if procs.is_empty() {
            direct = (rate, p50, p99);
            println!(
                "| {name} | {rate:.0} | 1.00 | {p50:.2} ms | {p99:.2} ms | | | {errors} | | |"
            );
        } else {
            println!(
                "| {name} | {rate:.0} | {:.2} | {p50:.2} ms | {p99:.2} ms | {:.2} ms | {:.2} ms | {errors} | {:.2} ms | {database} |",
                rate / direct.0,
                p50 - direct.1,
                p99 - direct.2,
                per_turn(cpu, good.len())
            );
        }
    }
    println!();
    drop((sqlite_one, postgres_one));

    // A replica killed in the middle of a turn: how long until another
    // replica has taken the turn over.
    let (started, session, turn) = slow_turn(&http, &replicas[0]).await?;
    // The turn runs (its provider call is under way) before the kill.
    tokio::time::sleep(Duration::from_millis(500)).await;
    replicas[0].kill();
    let taken = resumed_within(&http, &replicas[1], &session, Duration::from_secs(60)).await;
    drop(started);
    let _ = http
        .post(format!(
            "{}/sessions/{session}/turns/{turn}/cancel",
            replicas[1].url()
        ))
        .send()
        .await;
    let heartbeat = std::env::var("HARNESS_HEARTBEAT_INTERVAL_S").unwrap_or_else(|_| "5".into());
    match taken {
        Some(after) => println!(
            "kill -9 of a replica mid-turn: its turn taken over by another replica after {:.2} s (heartbeat {heartbeat} s)",
            after.as_secs_f64()
        ),
        None => println!("kill -9 of a replica mid-turn: the turn was NOT taken over within 60 s"),
    }
    let deadlocks_during = deadlocks(postgres).await? - deadlocks_before;
    println!("Postgres deadlocks during the scenario: {deadlocks_during}\n");
    Ok(())
}

/// A turn on a new session of `harness` whose model takes a minute to
/// answer (it is mid-call for as long as a scenario needs; cancel it
/// after): its stream, session and turn id.
async fn slow_turn(
    http: &reqwest::Client,
    harness: &Proc,
) -> Result<(reqwest::Response, String, String), String> {
    let slow = Spec::parse("bench/ttft=60000/n=1").model();
    let session = format!("bench-slow-{}", uuid::Uuid::now_v7().simple());
    let started = http
        .post(format!("{}/sessions/{session}/turns", harness.url()))
        .header("accept", "text/event-stream")
        .json(&serde_json::json!({"message": "Hi", "runtime_model": slow}))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let turn = started
        .headers()
        .get("x-turn-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    Ok((started, session, turn))
}

/// How long until `session` shows `turn.resumed` on `replica` (polled every
/// 5 ms), or `None` within `limit`.
async fn resumed_within(
    http: &reqwest::Client,
    replica: &Proc,
    session: &str,
    limit: Duration,
) -> Option<Duration> {
    let from = Instant::now();
    while from.elapsed() < limit {
        let log: serde_json::Value = match http
            .get(format!(
                "{}/sessions/{session}/events?limit=1000",
                replica.url()
            ))
            .send()
            .await
        {
            Ok(response) => response.json().await.unwrap_or_default(),
            Err(_) => serde_json::Value::Null,
        };
        let resumed = log["events"]
            .as_array()
            .is_some_and(|events| events.iter().any(|e| e["type"] == "turn.resumed"));
        if resumed {
            return Some(from.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

/// Turns taken over: the owner of a running turn (its model call under
/// way) killed with SIGKILL, or stopped with SIGTERM (a deploy), and the
/// time until another replica has taken the turn over (`turn.resumed` in
/// its log), N times each; the heartbeat is the service's default unless
/// `HARNESS_HEARTBEAT_INTERVAL_S` says otherwise.
async fn takeover(fake: &Proc, postgres: &str, quick: bool) -> Result<(), String> {
    let rounds = if quick { 3 } else { 20 };
    let heartbeat = std::env::var("HARNESS_HEARTBEAT_INTERVAL_S").unwrap_or_else(|_| "5".into());
    println!(
        "## takeover: the owner of a running turn killed (SIGKILL) or stopped (SIGTERM), {rounds} times each; heartbeat {heartbeat} s; 2 replicas on Postgres\n"
    );
    let http = client::http_client();
    let mut survivor = procs::start_harness(postgres, &fake.url(), 120).await?.0;
    println!("| how | p50 | p99 | max | taken over |");
    println!("|---|---|---|---|---|");
    for how in ["SIGKILL", "SIGTERM"] {
        let mut after = Vec::new();
        for _ in 0..rounds {
            let mut owner = procs::start_harness(postgres, &fake.url(), 120).await?.0;
            let (started, session, turn) = slow_turn(&http, &owner).await?;
            tokio::time::sleep(Duration::from_millis(300)).await;
            if how == "SIGKILL" {
                owner.kill();
            } else {
                owner.terminate();
            }
            // From the signal (sent just now) to the first poll that sees it.
            let limit = Duration::from_secs(60);
            if let Some(taken) = resumed_within(&http, &survivor, &session, limit).await {
                after.push(taken);
            }
            drop(started);
            let _ = http
                .post(format!(
                    "{}/sessions/{session}/turns/{turn}/cancel",
                    survivor.url()
                ))
                .send()
                .await;
            drop(owner);
        }
        let (p50, p99) = p50_p99(&after);
        let max = after.iter().max().copied().unwrap_or_default();
        println!(
            "| {how} | {p50:.0} ms | {p99:.0} ms | {:.0} ms | {}/{rounds} |",
            max.as_secs_f64() * 1000.0,
            after.len()
        );
    }
    println!();
    survivor.kill();
    Ok(())
}
