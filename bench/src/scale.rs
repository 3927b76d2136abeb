//! The `scale` scenario: one process on 1, 2, 4 and 8 cores of its own.
//!
//! The machine's cores are split once: the service's (the first ones),
//! the fake provider's and the load client's (this process). Each is
//! pinned with `taskset`, so that neither the provider nor the client
//! takes a core from the service, and the service's runtime sizes itself
//! to the cores it is given (as it does in a container with a CPU
//! quota). Short turns are run on each count of the service's cores the
//! machine allows, then paced streams on the most of them.

use std::{ops::Range, process::Command, time::Duration};

use tokio::time::Instant;

use crate::{
    client::{self, Stop, Target},
    fake::Spec,
    procs::{self, Proc},
    scenarios::{ScratchDir, StreamRun, ok, one_tenants_room},
    stats::p50_p99,
};

/// The service's core counts, as many as the machine allows.
const SERVICE_CORES: [usize; 4] = [1, 2, 4, 8];

/// Concurrent short turns at each point.
const CONCURRENCY: [usize; 2] = [32, 256];

/// Which cores each process of the run gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The most cores the service gets: `0..service_max`.
    pub service_max: usize,
    pub fake: Range<usize>,
    pub client: Range<usize>,
}

impl Layout {
    /// Half of the machine (up to 8 cores) for the service, three eighths
    /// of the rest (at least one) for the fake provider, and what is left
    /// for the client (the provider's cores when nothing is left). `None`
    /// below 2 cores: nothing could be kept apart.
    fn of(cores: usize) -> Option<Self> {
        if cores < 2 {
            return None;
        }
        let service_max = SERVICE_CORES
            .into_iter()
            .rev()
            .find(|k| *k <= cores / 2)
            .unwrap_or(1);
        Self::around(cores, service_max)
    }

    /// The service on `0..service`, the provider and the client on the
    /// rest as [`Layout::of`] splits it; `None` when no core is left.
    pub fn around(cores: usize, service_max: usize) -> Option<Self> {
        if service_max == 0 || service_max >= cores {
            return None;
        }
        let rest = cores - service_max;
        let fake_cores = (rest * 3 / 8).max(1);
        let fake = service_max..service_max + fake_cores;
        let client = if fake.end < cores {
            fake.end..cores
        } else {
            fake.clone()
        };
        Some(Self {
            service_max,
            fake,
            client,
        })
    }
}

/// A range of cores as `taskset` takes it.
pub fn cpu_list(cores: &Range<usize>) -> String {
    format!(
        "{}-{}",
        cores.start,
        cores.end.saturating_sub(1).max(cores.start)
    )
}

/// Pins every thread of this process to `cores`.
pub fn pin_self(cores: &Range<usize>) -> Result<(), String> {
    let status = Command::new("taskset")
        .args(["-a", "-p", "-c", &cpu_list(cores)])
        .arg(std::process::id().to_string())
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("the scale scenario needs taskset: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("taskset could not pin the client to {cores:?}"))
    }
}

pub async fn run(quick: bool, streams: Option<usize>) -> Result<(), String> {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let Some(layout) = Layout::of(cores) else {
        return Err(format!(
            "the scale scenario needs 2 cores or more; this machine has {cores}"
        ));
    };
    let counts: Vec<usize> = SERVICE_CORES
        .into_iter()
        .filter(|k| *k <= layout.service_max)
        .collect();
    println!(
        "## scale: the service on {counts:?} cores of its own (of {cores}); the fake provider on cores {}, the client on {}\n",
        cpu_list(&layout.fake),
        cpu_list(&layout.client)
    );
    if layout.client == layout.fake {
        println!(
            "(too few cores to keep the client apart: it shares the provider's; the figures are this machine's, not the targets')\n"
        );
    }
    pin_self(&layout.client)?;
    let result = measure(&layout, &counts, quick, streams).await;
    // The scenarios after this one get the whole machine back.
    pin_self(&(0..cores))?;
    result
}

async fn measure(
    layout: &Layout,
    counts: &[usize],
    quick: bool,
    streams: Option<usize>,
) -> Result<(), String> {
    let dir = ScratchDir::new("scale")?;
    let fake = procs::start_fake_on(Some(&cpu_list(&layout.fake))).await?;
    let seconds = if quick { 3 } else { 10 };
    let model = Spec::parse("bench/n=40").model();
    println!("### short turns: 40 tokens, TTFT 0, ITL 0, {seconds} s per point\n");
    let room = one_tenants_room(CONCURRENCY[CONCURRENCY.len() - 1]);
    println!(
        "| service cores | concurrency | turns/s | × 1 core | p50 | p99 | errors | service CPU | CPU per turn | sqlite-writer |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut one_core = [0.0; CONCURRENCY.len()];
    for &k in counts {
        let db = format!("sqlite://{}/scale-{k}.db", dir.0.display());
        let service = cpu_list(&(0..k));
        let (harness, _) = procs::start_harness_on(&service, &db, &fake.url(), 120, &room).await?;
        let http = client::http_client();
        let target = Target::Harness {
            base: harness.url(),
        };
        client::load(&http, &target, &model, 32, 640).await;
        for (i, concurrency) in CONCURRENCY.into_iter().enumerate() {
            let cpu_before = harness.cpu();
            let writer_before = harness.thread_cpu("sqlite-writer");
            let stop = Stop::At(Instant::now() + Duration::from_secs(seconds));
            let (samples, wall) =
                client::load_until(&http, &target, &model, concurrency, Duration::ZERO, stop).await;
            let cpu = harness.cpu().saturating_sub(cpu_before);
            let writer = harness
                .thread_cpu("sqlite-writer")
                .saturating_sub(writer_before);
            let (good, errors) = ok(&samples);
            let (p50, p99) = p50_p99(&crate::scenarios::totals(&good));
            let rate = good.len() as f64 / wall.as_secs_f64();
            if k == 1 {
                one_core[i] = rate;
            }
            let wall = wall.as_secs_f64();
            println!(
                "| {k} | {concurrency} | {rate:.0} | {:.2} | {p50:.2} ms | {p99:.2} ms | {errors} | {:.2} cores | {:.3} ms | {:.0}% of a core |",
                rate / one_core[i].max(1e-9),
                cpu.as_secs_f64() / wall,
                cpu.as_secs_f64() * 1000.0 / good.len().max(1) as f64,
                100.0 * writer.as_secs_f64() / wall,
            );
        }
    }
    println!();
    let count = streams.unwrap_or(if quick { 1000 } else { 10_000 });
    let k = layout.service_max;
    let db = format!("sqlite://{}/scale-streams.db", dir.0.display());
    let room = one_tenants_room(count);
    let (harness, _) =
        procs::start_harness_on(&cpu_list(&(0..k)), &db, &fake.url(), 120, &room).await?;
    paced(&fake, &harness, k, count).await;
    Ok(())
}

/// `count` streams at 20 tokens/s (a token every 50 ms, 200 tokens),
/// their starts spread over 50 ms, straight from the provider and through
/// the service on `k` cores.
async fn paced(fake: &Proc, harness: &Proc, k: usize, count: usize) {
    let spec = Spec::parse("bench/itl=50/n=200");
    let model = spec.model();
    let warm = Spec::parse("bench/n=1").model();
    println!(
        "### paced streams on {k} cores: {count} concurrent turns, ITL 50 ms, 200 tokens, staggered\n"
    );
    println!(
        "| path | gap p50 | gap p99 | gap max | TTFT p99 | errors | service CPU | CPU per token |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut figures = Vec::new();
    let targets = [
        ("direct", Target::Direct { base: fake.url() }),
        (
            "agent-harness",
            Target::Harness {
                base: harness.url(),
            },
        ),
    ];
    for (name, target) in targets {
        // A client per path: its idle connections to the other are closed.
        let http = client::http_client();
        let spread = Duration::from_millis(spec.itl_ms);
        let load = (warm.as_str(), model.as_str(), count, spread);
        let (run, cpu, wall) = StreamRun::measure(&http, &target, load, harness).await;
        let cores = if name == "direct" {
            String::new()
        } else {
            format!("{:.2} cores", cpu.as_secs_f64() / wall.as_secs_f64())
        };
        let per_token = run.cpu_per_token(name, cpu);
        println!("| {name} | {} | {cores} | {per_token} |", run.cells());
        figures.push((run.g50, run.g99));
    }
    println!(
        "\nadded inter-chunk delay on {k} cores, {count} streams: p50 {:.2} ms, p99 {:.2} ms\n",
        figures[1].0 - figures[0].0,
        figures[1].1 - figures[0].1
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_process_gets_cores_of_its_own_where_the_machine_has_them() {
        assert_eq!(Layout::of(1), None);
        assert_eq!(
            Layout::of(2),
            Some(Layout {
                service_max: 1,
                fake: 1..2,
                client: 1..2
            }),
            "two cores: the provider and the client share the second"
        );
        assert_eq!(
            Layout::of(16),
            Some(Layout {
                service_max: 8,
                fake: 8..11,
                client: 11..16
            })
        );
        assert_eq!(
            Layout::of(4),
            Some(Layout {
                service_max: 2,
                fake: 2..3,
                client: 3..4
            })
        );
        assert_eq!(Layout::around(16, 16), None, "nothing left");
        assert_eq!(
            Layout::around(16, 12),
            Some(Layout {
                service_max: 12,
                fake: 12..13,
                client: 13..16
            })
        );
        assert_eq!(cpu_list(&(0..1)), "0-0");
        assert_eq!(cpu_list(&(8..11)), "8-10");
    }
}
