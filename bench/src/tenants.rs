//! The tenants scenario: whether one tenant's flood slows another's turns.

use std::time::Duration;

use crate::{
    client::{self, Target},
    fake::Spec,
    procs::{self, Proc},
    scenarios::{ok, totals},
    stats::p50_p99,
};
/// A client whose every request carries `key`.
fn keyed_client(key: &str) -> Result<reqwest::Client, String> {
    let mut headers = reqwest::header::HeaderMap::new();
    let value = reqwest::header::HeaderValue::from_str(&format!("Bearer {key}"))
        .map_err(|e| format!("a key header: {e}"))?;
    headers.insert(reqwest::header::AUTHORIZATION, value);
    reqwest::Client::builder()
        .default_headers(headers)
        .pool_max_idle_per_host(10_000)
        .tcp_nodelay(true)
        .build()
        .map_err(|e| format!("a client: {e}"))
}

/// Makes a key of each (tenant, key) in the database at `url`.
async fn make_keys(url: &str, keys: &[(&str, &str)]) -> Result<(), String> {
    let settings = harness_core::config::Settings::load_from(["agent-harness"], |_| None)
        .map_err(|e| e.to_string())?;
    let store = harness_store::store::connect(url, settings.database.limits())
        .await
        .map_err(|e| e.to_string())?;
    for (tenant, key) in keys {
        let hash = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(key.as_bytes()));
        let id = format!("bench-{}-{tenant}", std::process::id());
        store
            .create_api_key(&id, tenant, &hash, false, chrono::Utc::now())
            .await
            .map_err(|e| format!("a key of {tenant}: {e}"))?;
    }
    Ok(())
}

/// What the flooding tenant got over one measurement.
#[derive(Debug, Default)]
struct Flood {
    served: usize,
    refused: usize,
}

/// `workers` loops of tenant A's turns, each sending its next request as
/// soon as the last is answered (a refusal too: a client that ignores
/// `Retry-After`), until `stop`.
fn flood(
    http: &reqwest::Client,
    base: &str,
    model: &str,
    workers: usize,
    stop: &tokio_util::sync::CancellationToken,
) -> tokio::task::JoinSet<Flood> {
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..workers {
        let (http, base, model, stop) = (
            http.clone(),
            base.to_owned(),
            model.to_owned(),
            stop.clone(),
        );
        set.spawn(async move {
            let mut flood = Flood::default();
            // Bounded: a measurement ends long before.
            for _ in 0..1_000_000 {
                let url = format!("{base}/sessions/a-{}/turns", uuid::Uuid::now_v7().simple());
                let sent = http
                    .post(url)
                    .header("accept", "text/event-stream")
                    .json(&serde_json::json!({"message": "Hi", "runtime_model": model}))
                    .send();
                let answered = tokio::select! {
                    answered = sent => answered,
                    () = stop.cancelled() => break,
                };
                if let Ok(response) = answered {
                    if response.status() == reqwest::StatusCode::TOO_MANY_REQUESTS {
                        flood.refused += 1;
                    } else if response.status().is_success() {
                        flood.served += 1;
                    }
                    tokio::select! {
                        _ = response.bytes() => {}
                        () = stop.cancelled() => break,
                    }
                }
            }
            flood
        });
    }
    set
}

/// Tenant B's turns, one at a time: alone, beside tenant A at its limits,
/// and beside A sending ten times its limits (issue 37: B's p99 should
/// stay within 20% of alone).
pub async fn run(fake: &Proc, url: &str, db: &str, scale: usize) -> Result<(), String> {
    const RUNNING: usize = 4;
    let env = [
        ("HARNESS_AUTH", "on".to_owned()),
        ("HARNESS_TENANT_MAX_RUNNING_TURNS", RUNNING.to_string()),
        ("HARNESS_TENANT_MAX_STREAMS", (2 * RUNNING).to_string()),
        // B sends more turns a minute than the default allows a key; A is
        // held by its running turns and streams alone.
        ("HARNESS_RATE_LIMIT_PER_MINUTE", "0".to_owned()),
    ];
    println!(
        "## tenants ({db}): tenant B's turns one at a time (one-step text turns, TTFT 0, 40 tokens); \
         HARNESS_TENANT_MAX_RUNNING_TURNS={RUNNING}, HARNESS_TENANT_MAX_STREAMS={}, HARNESS_RATE_LIMIT_PER_MINUTE=0\n",
        2 * RUNNING
    );
    let (harness, _) = procs::start_harness_with(url, &fake.url(), 120, &env).await?;
    let (key_a, key_b) = (
        format!("ah_bench_a_{}", std::process::id()),
        format!("ah_bench_b_{}", std::process::id()),
    );
    make_keys(url, &[("acme", &key_a), ("globex", &key_b)]).await?;
    let (acme, globex) = (keyed_client(&key_a)?, keyed_client(&key_b)?);
    let model = Spec::realistic().model();
    let target = Target::Harness {
        base: harness.url(),
    };
    let turns = 400 / scale;
    // Warm-up of both tenants' connections and caches.
    client::load(&globex, &target, &model, 1, 50 / scale).await;
    client::load(&acme, &target, &model, RUNNING, 50 / scale).await;
    println!(
        "| tenant A | B's turns | B p50 | B p99 | B p99 / alone | errors | A served/s | A refused/s | server CPU |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut alone_p99 = None;
    for (case, workers) in [
        ("idle", 0),
        ("at its limit (4 streams)", RUNNING),
        ("10x its limit (40 streams)", 10 * RUNNING),
    ] {
        let stop = tokio_util::sync::CancellationToken::new();
        let mut load = flood(&acme, &harness.url(), &model, workers, &stop);
        tokio::time::sleep(Duration::from_millis(if workers > 0 { 300 } else { 0 })).await;
        let cpu_before = harness.cpu();
        let (samples, wall) = client::load(&globex, &target, &model, 1, turns).await;
        let cpu = harness.cpu().saturating_sub(cpu_before);
        stop.cancel();
        let mut a = Flood::default();
        while let Some(done) = load.join_next().await {
            if let Ok(one) = done {
                a.served += one.served;
                a.refused += one.refused;
            }
        }
        let (good, errors) = ok(&samples);
        let (p50, p99) = p50_p99(&totals(&good));
        let alone = *alone_p99.get_or_insert(p99);
        let seconds = wall.as_secs_f64();
        println!(
            "| {case} | {} | {p50:.2} ms | {p99:.2} ms | {:.2} | {errors} | {:.0} | {:.0} | {:.0}% |",
            good.len(),
            p99 / alone.max(1e-9),
            a.served as f64 / seconds,
            a.refused as f64 / seconds,
            100.0 * cpu.as_secs_f64() / seconds,
        );
    }
    println!();
    Ok(())
}
