//! The heartbeat: keeps this process's running turns marked alive, picks up
//! cancellations requested through another replica, and interrupts turns
//! whose owner stopped beating. Cancel requests also arrive as they are
//! made, where the store can announce them ([`listen_for_announcements`]).

use std::time::Duration;

use futures::StreamExt;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::TurnRunner;
use crate::store::Announcement;

/// Sweeps per heartbeat interval (a beat every other sweep).
const SWEEPS_PER_BEAT: u32 = 4;

/// Beats every half heartbeat interval and sweeps orphans every quarter:
/// an orphan goes stale 1.5 intervals after its owner's last beat and is
/// taken over at the next sweep, within 1.75 intervals of its owner's
/// death; a live owner's beat may be a whole interval late (a busy
/// database) before its turns look stale.
pub(super) async fn run(runner: TurnRunner, stop: CancellationToken) {
    let mut tick = tokio::time::interval(runner.inner.config.heartbeat_interval / SWEEPS_PER_BEAT);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut ticks = 0u32;
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if ticks.is_multiple_of(2) {
            beat(&runner).await;
            runner.sweep_steers().await;
        }
        ticks = (ticks + 1) % SWEEPS_PER_BEAT;
        if let Err(e) = runner.sweep_orphans().await {
            tracing::warn!(error = %e, "orphan sweep failed");
        }
    }
}

/// Stops local turns whose cancellation another process asked for, and
/// takes over turns another process released, as the store announces
/// them; returns when the store has no such channel or on `stop`. A lost
/// connection is retried after a pause.
pub(super) async fn listen_for_announcements(runner: TurnRunner, stop: CancellationToken) {
    const PAUSE: Duration = Duration::from_secs(1);
    let inner = &runner.inner;
    loop {
        let requests = tokio::select! {
            () = stop.cancelled() => return,
            requests = inner.store.announcements() => requests,
        };
        let mut requests = match requests {
            Ok(Some(requests)) => requests,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for cancel requests; retrying");
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(PAUSE) => continue,
                }
            }
        };
        loop {
            let request = tokio::select! {
                () = stop.cancelled() => return,
                request = requests.next() => request,
            };
            match request {
                Some(Ok(Announcement::Cancel(turn_id))) => {
                    if let Some(live) = inner.live.get(turn_id) {
                        tracing::info!(turn.id = %turn_id, "cancellation requested by another process");
                        live.cancel.cancel();
                    }
                }
                Some(Ok(Announcement::Steered { turn, steer })) => {
                    // Said in its log, and made the next turn at its end
                    // if no step takes it.
                    if let Some(live) = inner.live.get(turn) {
                        live.steered
                            .store(true, std::sync::atomic::Ordering::SeqCst);
                        let runner = runner.clone();
                        inner.background.spawn(async move {
                            runner.accepted_here(&live, steer).await;
                        });
                    }
                }
                Some(Ok(Announcement::Released(turn_id))) => {
                    tracing::debug!(turn.id = %turn_id, "a turn was released; sweeping");
                    if let Err(e) = runner.sweep_orphans().await {
                        tracing::warn!(error = %e, "sweep after a release failed");
                    }
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "listening for cancel requests failed; reconnecting");
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(PAUSE) => {}
                    }
                }
                None => break,
            }
        }
    }
}

async fn beat(runner: &TurnRunner) {
    let inner = &runner.inner;
    let leases = inner.live.leases();
    let sent = std::time::Instant::now();
    match inner.store.heartbeat(&leases, chrono::Utc::now()).await {
        Ok(refreshed) => {
            // Fresh only when every lease held: a turn this process lost
            // keeps its writes fenced until it has ended here.
            if refreshed.len() == leases.len() {
                inner.lease_clock.beat(sent);
            }
            let cancelled = refreshed
                .into_iter()
                .filter_map(|(turn_id, cancel)| cancel.then_some(turn_id));
            for turn_id in cancelled {
                if let Some(live) = inner.live.get(turn_id) {
                    tracing::info!(turn.id = %turn_id, "cancellation requested through the store");
                    live.cancel.cancel();
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
    }
}
