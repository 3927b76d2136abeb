//! `bench compare BIN BIN…`: agent-harness binaries (for example the
//! release binary of an older commit and the new one) run alternately in
//! one run, on the same fake provider and load client, so that a change's
//! cost shows beside what it replaced and not as a figure alone.
//!
//! Each binary runs as a user runs it: the service's own defaults,
//! configured through the environment only (its address, a fresh database,
//! the provider). Each round starts every binary afresh, and runs each
//! workload on every binary before the next workload, in the order
//! first-to-last on even rounds and last-to-first on odd ones, so that a
//! drift of the host's speed during the run does not favour one side. The
//! last column compares each round's run with the first binary's run of
//! the same round and workload (the two ran one after the other), and
//! gives the median of those ratios.

use std::{path::PathBuf, time::Duration};

use tokio::time::Instant;

use crate::{
    client::{self, Sample, Stop, Target},
    fake::Spec,
    procs::{self, PostgresServer, Proc},
    scale::{Layout, cpu_list},
    stats::p50_p99,
};

/// What `bench compare` was asked.
#[derive(Debug)]
pub struct Options {
    pub binaries: Vec<PathBuf>,
    pub rounds: usize,
    pub seconds: u64,
    pub postgres: Option<String>,
    /// Workloads by key; empty: all.
    pub only: Vec<String>,
    /// Each binary on this many cores of its own (the provider and the
    /// client on others), as the `scale` scenario places them.
    pub service_cores: Option<usize>,
    /// Also run `bench relay` ([`crate::relay`]), as the last binary.
    pub floor: bool,
}

/// One workload of the comparison.
struct Workload {
    /// What `--only` names it by.
    key: &'static str,
    name: &'static str,
    spec: Spec,
    concurrency: usize,
    /// Spread of the workers' starts (one turn's length for the staggered
    /// TTFT workload, as independent users arrive).
    spread: Duration,
    /// Whose answers: the fake's, or llm-katan's (`spec` then unused).
    provider: Provider,
}

/// The provider of a workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Provider {
    Fake,
    /// llm-katan's echo backend ([`procs::start_katan`]): run only when
    /// `--only` names it, as it needs `pip install llm-katan`.
    Katan,
}

fn workloads() -> Vec<Workload> {
    let realistic = Spec::realistic();
    let slow = Spec {
        ttft_ms: 200,
        itl_ms: 20,
        ..realistic
    };
    vec![
        Workload {
            key: "c=1",
            name: "c=1",
            spec: realistic,
            concurrency: 1,
            spread: Duration::ZERO,
            provider: Provider::Fake,
        },
        Workload {
            key: "c=32",
            name: "c=32",
            spec: realistic,
            concurrency: 32,
            spread: Duration::ZERO,
            provider: Provider::Fake,
        },
        Workload {
            key: "ttft",
            name: "ttft c=32",
            spec: slow,
            concurrency: 32,
            spread: Duration::from_millis(slow.ttft_ms + slow.tokens * slow.itl_ms),
            provider: Provider::Fake,
        },
        // A tool step before the answer: what each step's durable
        // record (and, on Postgres, the lease on every write) costs.
        Workload {
            key: "tools",
            name: "tools c=32",
            spec: Spec {
                tools: 1,
                tool_ms: 0,
                ..realistic
            },
            concurrency: 32,
            spread: Duration::ZERO,
            provider: Provider::Fake,
        },
        // All 32 start together and, being of equal length, end and start
        // again together: the worst case for the first token's wait.
        Workload {
            key: "ttft-in-step",
            name: "ttft c=32 in step",
            spec: slow,
            concurrency: 32,
            spread: Duration::ZERO,
            provider: Provider::Fake,
        },
        // The `scale` scenario's short turns at its higher concurrency: 40
        // tokens at once, no busy work in the provider, 256 at a time.
        Workload {
            key: "c=256",
            name: "c=256 short",
            spec: Spec::parse("bench/n=40"),
            concurrency: 256,
            spread: Duration::ZERO,
            provider: Provider::Fake,
        },
        // The `eventlog` scenario's load: fast answers of 2,000 tokens (a
        // turn's turns/s × 2,005 is its persisted events/s).
        Workload {
            key: "eventlog",
            name: "eventlog c=32",
            spec: Spec::parse("bench/n=2000"),
            concurrency: 32,
            spread: Duration::ZERO,
            provider: Provider::Fake,
        },
        // The `streams` scenario's load: 1,000 turns at once, a token every
        // 50 ms (20,000 relayed tokens a second), their starts spread over
        // one interval. What a paced token costs.
        Workload {
            key: "paced",
            name: "paced c=1000",
            spec: Spec::parse("bench/itl=50/n=200"),
            concurrency: PACED,
            spread: Duration::from_millis(50),
            provider: Provider::Fake,
        },
        // An outside provider, in Python, as a deployment may sit beside:
        // what the service spends per turn against what the provider does
        // (issue 42's third target). Its echo answers in chunks of four
        // characters, about 30 to a turn.
        Workload {
            key: "katan",
            name: "llm-katan c=32",
            spec: realistic,
            concurrency: 32,
            spread: Duration::ZERO,
            provider: Provider::Katan,
        },
    ]
}

/// Concurrent turns of the `paced` workload.
const PACED: usize = 1000;

/// One binary's figures on one workload in one round.
#[derive(Debug, Clone, Default)]
struct Point {
    turns_per_s: f64,
    /// Its turns/s over the provider's own, measured just before.
    share: f64,
    cpu_per_turn_ms: f64,
    /// The database server's CPU per turn (Postgres on this machine).
    db_cpu_per_turn_ms: Option<f64>,
    provider_cpu_per_stream_ms: f64,
    added_p50_ms: f64,
    added_ttft_p50_ms: f64,
    added_ttft_p99_ms: f64,
    /// The service's CPU per text token relayed.
    cpu_per_token_us: f64,
    added_gap_p99_ms: f64,
    errors: usize,
    /// Events the service committed over its commits (`/metrics`; none
    /// for the floor, which has no log).
    events_per_commit: Option<f64>,
    /// What failed, by kind (`HTTP 429 ×3, direct: connect ×1`), or empty.
    failures: String,
}

/// [`crate::fake::offered_models`] as `HARNESS_MODELS` says them.
fn offered_models_json() -> String {
    let entries: serde_json::Map<String, serde_json::Value> = crate::fake::offered_models()
        .into_iter()
        .map(|model| (model, serde_json::json!({})))
        .collect();
    serde_json::Value::Object(entries).to_string()
}

/// The settings every binary gets, by name, for the report and the
/// process. Old binaries ignore the names they do not know.
fn environment(database_url: &str, provider: &str) -> Vec<(&'static str, String)> {
    vec![
        ("DATABASE_URL", database_url.to_owned()),
        ("OPENAI_BASE_URL", format!("{provider}/v1")),
        ("ANTHROPIC_BASE_URL", provider.to_owned()),
        ("HARNESS_PROVIDERS", "openai:bench".to_owned()),
        ("HARNESS_PROVIDER_MAX_ATTEMPTS", "1".to_owned()),
        // The bench's models, which binaries since 2026-11-27 require the
        // operator to list.
        ("HARNESS_MODELS", offered_models_json()),
        // The default of binaries before 2026-11-24 was on; the issue's
        // A/B ran with it off, and so does this one.
        ("HARNESS_MEMORY_EXTRACTION", "false".to_owned()),
        // Every turn is the default tenant's: room for the `paced`
        // workload's 1,000 (binaries before 2026-11-27 ignore these).
        ("HARNESS_TENANT_MAX_RUNNING_TURNS", (PACED + 64).to_string()),
        ("HARNESS_TENANT_MAX_STREAMS", (PACED + 64).to_string()),
    ]
}

/// [`environment`] against llm-katan at `provider`: its one model, and a
/// key (it checks that one is given).
fn katan_environment(database_url: &str, provider: &str) -> Vec<(&'static str, String)> {
    let mut env = environment(database_url, provider);
    for (name, value) in &mut env {
        match *name {
            "HARNESS_PROVIDERS" => *value = format!("openai:{}", procs::KATAN_MODEL),
            "HARNESS_MODELS" => {
                *value = serde_json::json!({ procs::KATAN_MODEL: {} }).to_string();
            }
            _ => {}
        }
    }
    env.push(("OPENAI_API_KEY", "sk-bench".to_owned()));
    env
}

pub async fn run(options: Options) -> Result<(), String> {
    enough(&options)?;
    for binary in &options.binaries {
        if !binary.is_file() {
            return Err(format!("{} is not a file", binary.display()));
        }
    }
    // Each binary runs in a folder of its own: a path relative to here
    // would name nothing there.
    let mut binaries = options
        .binaries
        .iter()
        .map(|b| std::path::absolute(b).map_err(|e| format!("{}: {e}", b.display())))
        .collect::<Result<Vec<_>, _>>()?;
    if options.floor {
        binaries.push(std::env::current_exe().map_err(|e| format!("this binary: {e}"))?);
    }
    let options = Options {
        binaries,
        ..options
    };
    let scratch = std::env::temp_dir().join(format!(
        "agent-harness-bench-{}-compare",
        std::process::id()
    ));
    std::fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    let result = compare(&options, &scratch).await;
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

async fn compare(options: &Options, scratch: &std::path::Path) -> Result<(), String> {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let layout = match options.service_cores {
        Some(k) => Some(Layout::around(cores, k).ok_or_else(|| {
            format!("--service-cores {k} leaves no core of {cores} to the provider and the client")
        })?),
        None => None,
    };
    if let Some(layout) = &layout {
        crate::scale::pin_self(&layout.client)?;
    }
    let fake = procs::start_fake_on(layout.as_ref().map(|l| cpu_list(&l.fake)).as_deref()).await?;
    let service_cpus = layout.as_ref().map(|l| cpu_list(&(0..l.service_max)));
    let database = if options.postgres.is_some() {
        "postgres"
    } else {
        "sqlite"
    };
    println!(
        "# agent-harness bench compare ({} cores, {database}, {} rounds of {} s per point)\n",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        options.rounds,
        options.seconds
    );
    let names = names(options);
    for (i, binary) in options.binaries.iter().enumerate() {
        if options.floor && i + 1 == options.binaries.len() {
            println!(
                "- [{i}] the floor: `{} relay`, the provider's stream relayed and nothing else",
                binary.display()
            );
        } else {
            println!("- [{i}] {}", binary.display());
        }
    }
    if let Some(layout) = &layout {
        println!(
            "\nEach binary on cores {}, the fake provider on {}, the client on {}.",
            cpu_list(&(0..layout.service_max)),
            cpu_list(&layout.fake),
            cpu_list(&layout.client)
        );
    }
    let shown: Vec<String> = environment("(a fresh database per binary and round)", "(the fake)")
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    // Inherited by every binary: shown, as they change what is measured.
    let inherited: Vec<String> = std::env::vars()
        .filter(|(name, _)| name.starts_with("HARNESS_"))
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    println!(
        "\nEach binary runs with its own defaults and only: HARNESS_LISTEN, {}{}.",
        shown.join(", "),
        if inherited.is_empty() {
            String::new()
        } else {
            format!(", and from the environment: {}", inherited.join(", "))
        }
    );
    println!(
        "The provider: the fake, {} text chunks of one token, a finish chunk and a usage \
         chunk, {} µs of busy work per chunk; the `ttft` workloads add TTFT 200 ms and ITL 20 ms \
         (staggered: the 32 workers start spread over one turn's length; in step: together).\n",
        Spec::realistic().tokens,
        Spec::realistic().cost_us
    );
    let postgres_server = match &options.postgres {
        Some(url) => PostgresServer::find(url).await,
        None => None,
    };
    let named = |w: &Workload| options.only.iter().any(|o| o == w.key);
    // The fake's workloads first: each binary's llm-katan workloads run on
    // a service of their own, started after the first has stopped.
    let (mut workloads, outside): (Vec<Workload>, Vec<Workload>) = workloads()
        .into_iter()
        .filter(|w| named(w) || (options.only.is_empty() && w.provider == Provider::Fake))
        .partition(|w| w.provider == Provider::Fake);
    let fake_workloads = workloads.len();
    workloads.extend(outside);
    if workloads.is_empty() {
        return Err(format!("no workload is named {:?}", options.only));
    }
    let katan = if workloads.len() > fake_workloads {
        Some(procs::start_katan(layout.as_ref().map(|l| cpu_list(&l.fake)).as_deref()).await?)
    } else {
        None
    };
    // points[binary][workload] = one Point per round.
    let mut points = vec![vec![Vec::new(); workloads.len()]; options.binaries.len()];
    let http = client::http_client();
    for round in 0..options.rounds {
        let mut order: Vec<usize> = (0..options.binaries.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        // Each binary's service of the workloads run so far, and its
        // provider. Every binary's service lives through the round, and
        // the binaries take turns workload by workload: the runs a figure
        // compares are next to each other in time, so a drift of the
        // host's speed (up to a fifth within minutes on a shared VM) falls
        // on both sides of a comparison, not between them.
        let mut running: Vec<Option<(Proc, Provider)>> =
            options.binaries.iter().map(|_| None).collect();
        for (w, workload) in workloads.iter().enumerate() {
            let provider = match (workload.provider, &katan) {
                (Provider::Fake, _) => &fake,
                (Provider::Katan, Some(katan)) => katan,
                (Provider::Katan, None) => return Err("llm-katan is not running".into()),
            };
            for &b in &order {
                let folder = scratch.join(format!("r{round}-b{b}"));
                let service = match running[b].take() {
                    Some((service, of)) if of == workload.provider => service,
                    before => {
                        if let Some((service, _)) = before {
                            print_rss(round, b, &service);
                        }
                        let side = Side {
                            binary: &options.binaries[b],
                            args: if options.floor && b + 1 == options.binaries.len() {
                                &["relay"]
                            } else {
                                &[]
                            },
                            postgres: options.postgres.as_deref(),
                            folder: &folder,
                            cpus: service_cpus.as_deref(),
                        };
                        side.start(&http, round, b, workload.provider, &provider.url())
                            .await
                            .map_err(|e| format!("[{b}] {e}"))?
                    }
                };
                let point = measure(
                    &http,
                    provider,
                    &service,
                    postgres_server.as_ref(),
                    workload,
                    options.seconds,
                )
                .await;
                running[b] = Some((service, workload.provider));
                println!(
                    "round {round} [{b}] {:<10} {:>7.0} turns/s ({:.2}× the provider's), \
                     {:.3} ms CPU/turn{}, provider {:.3} ms CPU/stream, added p50 {:.2} ms, \
                     added TTFT p50 {:.2} ms p99 {:.2} ms, {:.1} µs CPU/token, added gap p99 {:.2} ms, \
                     {} errors{}{}",
                    workload.name,
                    point.turns_per_s,
                    point.share,
                    point.cpu_per_turn_ms,
                    point
                        .db_cpu_per_turn_ms
                        .map(|ms| format!(" + database {ms:.3} ms"))
                        .unwrap_or_default(),
                    point.provider_cpu_per_stream_ms,
                    point.added_p50_ms,
                    point.added_ttft_p50_ms,
                    point.added_ttft_p99_ms,
                    point.cpu_per_token_us,
                    point.added_gap_p99_ms,
                    point.errors,
                    if point.failures.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", point.failures)
                    },
                    point
                        .events_per_commit
                        .map(|n| format!(", {n:.1} events a commit"))
                        .unwrap_or_default(),
                );
                points[b][w].push(point);
            }
        }
        for &b in &order {
            if let Some((service, _)) = running[b].take() {
                print_rss(round, b, &service);
            }
        }
    }
    println!();
    let floor = options.floor.then(|| options.binaries.len() - 1);
    report(&names, floor, &workloads, &points);
    Ok(())
}

fn print_rss(round: usize, b: usize, service: &Proc) {
    println!(
        "round {round} [{b}] RSS after the run {:.1} MiB, of which not of mapped files {:.1} MiB",
        service.rss_kib() as f64 / 1024.0,
        service.rss_anon_kib() as f64 / 1024.0
    );
}

/// Whether `options` name something to compare: two binaries, or one and
/// the floor.
fn enough(options: &Options) -> Result<(), String> {
    if options.binaries.len() + usize::from(options.floor) < 2 {
        return Err("compare needs at least two binaries, or one and --floor".into());
    }
    Ok(())
}

/// What the report calls each binary: its file's name, and the floor
/// `floor`.
fn names(options: &Options) -> Vec<String> {
    let mut names: Vec<String> = options
        .binaries
        .iter()
        .map(|binary| {
            binary.file_name().map_or_else(
                || binary.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            )
        })
        .collect();
    if options.floor
        && let Some(last) = names.last_mut()
    {
        "floor".clone_into(last);
    }
    names
}

/// Where one binary runs in a round.
struct Side<'a> {
    binary: &'a std::path::Path,
    /// Its arguments (the floor's `relay`).
    args: &'a [&'a str],
    postgres: Option<&'a str>,
    folder: &'a std::path::Path,
    cpus: Option<&'a str>,
}

impl Side<'_> {
    /// The binary on a fresh database (and, against llm-katan, in a folder
    /// of its own), warmed up: connections, caches, the first pages.
    async fn start(
        &self,
        http: &reqwest::Client,
        round: usize,
        b: usize,
        provider: Provider,
        provider_url: &str,
    ) -> Result<Proc, String> {
        let (folder, tag) = match provider {
            Provider::Fake => (self.folder.to_path_buf(), ""),
            Provider::Katan => (self.folder.join("katan"), "_katan"),
        };
        std::fs::create_dir_all(&folder).map_err(|e| format!("{}: {e}", folder.display()))?;
        let database_url = match self.postgres {
            Some(url) => fresh_postgres(url, &format!("r{round}_b{b}{tag}")).await?,
            None => format!("sqlite://{}/bench.db", folder.display()),
        };
        let (env, warm) = match provider {
            Provider::Fake => (
                environment(&database_url, provider_url),
                Spec::realistic().model(),
            ),
            Provider::Katan => (
                katan_environment(&database_url, provider_url),
                procs::KATAN_MODEL.to_owned(),
            ),
        };
        let (service, _) = procs::start_binary(
            self.binary,
            self.args,
            &env,
            &folder,
            &folder.join("stderr.log"),
            self.cpus,
        )
        .await?;
        let through = Target::Harness {
            base: service.url(),
        };
        client::load(http, &through, &warm, 32, 320).await;
        Ok(service)
    }
}

/// A new, empty database on the server of `url` for one binary's round
/// (`name` says which).
async fn fresh_postgres(url: &str, name: &str) -> Result<String, String> {
    use sqlx::Connection as _;
    let mut parsed = url::Url::parse(url).map_err(|e| format!("{url}: {e}"))?;
    let name = format!("agent_harness_compare_{name}");
    let mut admin = sqlx::PgConnection::connect(url)
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    for statement in [
        format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        format!("CREATE DATABASE {name}"),
    ] {
        // `name` is made here of a fixed prefix and two numbers.
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement.clone()))
            .execute(&mut admin)
            .await
            .map_err(|e| format!("{statement}: {e}"))?;
    }
    let _ = admin.close().await;
    parsed.set_path(&name);
    Ok(parsed.to_string())
}

async fn measure(
    http: &reqwest::Client,
    provider: &Proc,
    service: &Proc,
    postgres: Option<&PostgresServer>,
    workload: &Workload,
    seconds: u64,
) -> Point {
    let (model, direct) = match workload.provider {
        Provider::Fake => (
            workload.spec.model(),
            Target::Direct {
                base: provider.url(),
            },
        ),
        Provider::Katan => (
            procs::KATAN_MODEL.to_owned(),
            Target::Katan {
                base: provider.url(),
            },
        ),
    };
    let period = Duration::from_secs(seconds);
    let through = Target::Harness {
        base: service.url(),
    };
    if workload.concurrency > 32 {
        // The connections of that many turns (client to service, service to
        // provider), so that the figures are not the handshakes'.
        let warm = Spec::parse("bench/n=1").model();
        for target in [&direct, &through] {
            let n = workload.concurrency;
            client::load(http, target, &warm, n, n).await;
        }
    }
    let provider_before = provider.cpu();
    let (d, d_wall) = client::load_until(
        http,
        &direct,
        &model,
        workload.concurrency,
        workload.spread,
        Stop::At(Instant::now() + period),
    )
    .await;
    let provider_cpu = provider.cpu().saturating_sub(provider_before);
    let commits_before = commits(http, service).await;
    let cpu_before = service.cpu();
    let db_before = postgres.map(PostgresServer::cpu);
    let (h, h_wall) = client::load_until(
        http,
        &through,
        &model,
        workload.concurrency,
        workload.spread,
        Stop::At(Instant::now() + period),
    )
    .await;
    let cpu = service.cpu().saturating_sub(cpu_before);
    let events_per_commit = commits_before
        .zip(commits(http, service).await)
        .map(|((e0, c0), (e1, c1))| (e1 - e0) / (c1 - c0).max(1.0));
    let db_cpu = postgres
        .zip(db_before)
        .map(|(server, before)| server.cpu().saturating_sub(before));
    let good =
        |samples: &[Sample]| -> Vec<Sample> { samples.iter().filter(|s| s.ok).cloned().collect() };
    let (d_ok, h_ok) = (good(&d), good(&h));
    let rate = |n: usize, wall: Duration| n as f64 / wall.as_secs_f64().max(1e-9);
    let (d_rate, h_rate) = (rate(d_ok.len(), d_wall), rate(h_ok.len(), h_wall));
    let totals = |s: &[Sample]| s.iter().map(|s| s.total).collect::<Vec<_>>();
    let ttfts = |s: &[Sample]| s.iter().map(|s| s.ttft).collect::<Vec<_>>();
    let (d50, _) = p50_p99(&totals(&d_ok));
    let (h50, _) = p50_p99(&totals(&h_ok));
    let (dt50, dt99) = p50_p99(&ttfts(&d_ok));
    let (ht50, ht99) = p50_p99(&ttfts(&h_ok));
    let per = |cpu: Duration, n: usize| cpu.as_secs_f64() * 1000.0 / n.max(1) as f64;
    let gaps = |s: &[Sample]| s.iter().flat_map(|s| s.gaps.clone()).collect::<Vec<_>>();
    let (h_gaps, d_gaps) = (gaps(&h_ok), gaps(&d_ok));
    // Each relayed token: its gap, and the first of each stream.
    let tokens = h_gaps.len() + h_ok.len();
    let (_, dg99) = p50_p99(&d_gaps);
    let (_, hg99) = p50_p99(&h_gaps);
    Point {
        turns_per_s: h_rate,
        share: h_rate / d_rate.max(1e-9),
        cpu_per_turn_ms: per(cpu, h_ok.len()),
        db_cpu_per_turn_ms: db_cpu.map(|cpu| per(cpu, h_ok.len())),
        provider_cpu_per_stream_ms: per(provider_cpu, d_ok.len()),
        added_p50_ms: h50 - d50,
        added_ttft_p50_ms: ht50 - dt50,
        added_ttft_p99_ms: ht99 - dt99,
        cpu_per_token_us: per(cpu, tokens) * 1000.0,
        added_gap_p99_ms: hg99 - dg99,
        errors: (d.len() - d_ok.len()) + (h.len() - h_ok.len()),
        events_per_commit,
        failures: failures(&h, &d),
    }
}

/// The service's events committed and its commits so far (`/metrics`),
/// or none (the floor has no metrics).
async fn commits(http: &reqwest::Client, service: &Proc) -> Option<(f64, f64)> {
    committed(&service.metrics(http).await?)
}

/// The events committed and the commits in a `/metrics` text.
fn committed(text: &str) -> Option<(f64, f64)> {
    let counter = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    Some((
        counter("agent_harness_events_persisted_total")?,
        counter("agent_harness_event_batches_total")?,
    ))
}

/// The failures of the service's samples and of the provider's own, each
/// kind with its count.
fn failures(through: &[Sample], direct: &[Sample]) -> String {
    let count = |samples: &[Sample]| {
        let mut kinds = std::collections::BTreeMap::<&str, usize>::new();
        for why in samples.iter().filter(|s| !s.ok) {
            *kinds
                .entry(why.failure.as_deref().unwrap_or("?"))
                .or_default() += 1;
        }
        kinds
            .into_iter()
            .map(|(kind, n)| format!("{kind} ×{n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match (count(through), count(direct)) {
        (h, d) if d.is_empty() => h,
        (h, d) if h.is_empty() => format!("direct: {d}"),
        (h, d) => format!("{h}; direct: {d}"),
    }
}

/// `min-max` of a figure over the rounds.
fn range(points: &[Point], figure: impl Fn(&Point) -> f64, decimals: usize) -> String {
    let values: Vec<f64> = points.iter().map(figure).collect();
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if values.is_empty() {
        String::new()
    } else if format!("{min:.decimals$}") == format!("{max:.decimals$}") {
        format!("{min:.decimals$}")
    } else {
        format!("{min:.decimals$} to {max:.decimals$}")
    }
}

/// The median over the rounds of `figure` of `points` ÷ `figure` of
/// `base` in the same round: the ratio of runs next to each other in time.
fn paired(points: &[Point], base: &[Point], figure: impl Fn(&Point) -> f64) -> f64 {
    let mut ratios: Vec<f64> = points
        .iter()
        .zip(base)
        .map(|(p, b)| figure(p) / figure(b).max(1e-9))
        .collect();
    ratios.sort_by(f64::total_cmp);
    match ratios.len() {
        0 => 0.0,
        n if n % 2 == 1 => ratios[n / 2],
        n => (ratios[n / 2 - 1] + ratios[n / 2]) / 2.0,
    }
}

/// The tables, a workload each; with a floor (`floor`, its index), a
/// last column of each binary's CPU per turn over the floor's, paired by
/// round as the one over the first binary's.
fn report(
    names: &[String],
    floor: Option<usize>,
    workloads: &[Workload],
    points: &[Vec<Vec<Point>>],
) {
    for (w, workload) in workloads.iter().enumerate() {
        println!("## {}\n", workload.name);
        let with_db = points
            .iter()
            .any(|p| p[w].iter().any(|p| p.db_cpu_per_turn_ms.is_some()));
        println!(
            "| binary | turns/s | share of the provider's turns/s | service CPU/turn{} | provider CPU/stream | service ÷ provider CPU | added p50 | added TTFT p50 | added TTFT p99 | service CPU/token | added gap p99 | errors | events a commit | CPU/turn vs [0] (median of the rounds' ratios) |{}",
            if with_db { " | database CPU/turn" } else { "" },
            if floor.is_some() {
                " CPU/turn vs the floor (the same) |"
            } else {
                ""
            }
        );
        println!(
            "|---|---|---|---|{}---|---|---|---|---|---|---|---|---|---|{}",
            if with_db { "---|" } else { "" },
            if floor.is_some() { "---|" } else { "" }
        );
        for (b, name) in names.iter().enumerate() {
            let p = &points[b][w];
            println!(
                "| [{b}] {name} | {} | {} | {} ms{} | {} ms | {} | {} ms | {} ms | {} ms | {} µs | {} ms | {} | {} | {:.2}× |{}",
                range(p, |p| p.turns_per_s, 0),
                range(p, |p| p.share, 2),
                range(p, |p| p.cpu_per_turn_ms, 3),
                if with_db {
                    format!(
                        " | {} ms",
                        range(p, |p| p.db_cpu_per_turn_ms.unwrap_or(0.0), 3)
                    )
                } else {
                    String::new()
                },
                range(p, |p| p.provider_cpu_per_stream_ms, 3),
                range(
                    p,
                    |p| p.cpu_per_turn_ms / p.provider_cpu_per_stream_ms.max(1e-9),
                    2
                ),
                range(p, |p| p.added_p50_ms, 2),
                range(p, |p| p.added_ttft_p50_ms, 2),
                range(p, |p| p.added_ttft_p99_ms, 2),
                range(p, |p| p.cpu_per_token_us, 1),
                range(p, |p| p.added_gap_p99_ms, 2),
                p.iter().map(|p| p.errors).sum::<usize>(),
                if p.iter().all(|p| p.events_per_commit.is_some()) {
                    range(p, |p| p.events_per_commit.unwrap_or(0.0), 1)
                } else {
                    "-".to_owned()
                },
                paired(p, &points[0][w], |p| p.cpu_per_turn_ms),
                floor.map_or_else(String::new, |f| format!(
                    " {:.2}× |",
                    paired(p, &points[f][w], |p| p.cpu_per_turn_ms)
                )),
            );
        }
        println!();
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::{Options, Point, committed, enough, names, paired};

    fn options(binaries: &[&str], floor: bool) -> Options {
        Options {
            binaries: binaries.iter().map(PathBuf::from).collect(),
            rounds: 1,
            seconds: 1,
            postgres: None,
            only: Vec::new(),
            service_cores: None,
            floor,
        }
    }

    /// One binary and the floor make a comparison; one binary alone does
    /// not. The floor (the last binary, this one) is called so in the
    /// tables, the others by their file's name.
    #[test]
    fn the_floor_counts_as_a_binary_and_is_named_so() {
        assert!(enough(&options(&["/old/agent-harness"], false)).is_err());
        assert!(enough(&options(&["/old/agent-harness"], true)).is_ok());
        assert!(enough(&options(&["/old/a", "/new/b"], false)).is_ok());
        let with_floor = options(&["/old/agent-harness", "/x/bench"], true);
        assert_eq!(names(&with_floor), ["agent-harness", "floor"]);
        let without = options(&["/old/agent-harness", "/x/bench"], false);
        assert_eq!(names(&without), ["agent-harness", "bench"]);
    }

    fn cpu(values: &[f64]) -> Vec<Point> {
        values
            .iter()
            .map(|&ms| Point {
                cpu_per_turn_ms: ms,
                ..Point::default()
            })
            .collect()
    }

    /// Each round's run against the first binary's run of that round:
    /// a host that ran a third slower in one round moves both, not the
    /// ratio (the ratio of the medians would call this 1.12×).
    #[test]
    fn the_ratio_pairs_each_round_with_the_first_binarys() {
        let base = cpu(&[1.0, 1.3, 1.0]);
        let new = cpu(&[1.12, 1.3 * 0.95, 0.95]);
        let ratio = paired(&new, &base, |p| p.cpu_per_turn_ms);
        assert!((ratio - 0.95).abs() < 1e-9, "{ratio}");
        // An even count: the mean of the middle two.
        let ratio = paired(&cpu(&[2.0, 3.0]), &cpu(&[1.0, 1.0]), |p| p.cpu_per_turn_ms);
        assert!((ratio - 2.5).abs() < 1e-9, "{ratio}");
        assert_eq!(paired(&[], &[], |p| p.cpu_per_turn_ms), 0.0);
    }

    /// The events committed and the commits, read from the service's
    /// metrics; none where either is missing.
    #[test]
    fn the_commits_are_read_from_the_metrics() {
        let text = "# HELP agent_harness_events_persisted Events committed\n\
                    agent_harness_events_persisted_total 1200\n\
                    agent_harness_event_batches_total 30\n\
                    agent_harness_event_batch_failures_total 1\n";
        assert_eq!(committed(text), Some((1200.0, 30.0)));
        assert_eq!(committed("agent_harness_event_batches_total 30\n"), None);
    }
}
