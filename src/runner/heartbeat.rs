//! The heartbeat: keeps this process's running turns marked alive, picks up
//! cancellations requested through another replica, and interrupts turns
//! whose owner stopped beating.

use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::TurnRunner;

pub(super) async fn run(runner: TurnRunner, stop: CancellationToken) {
    let mut tick = tokio::time::interval(runner.inner.config.heartbeat_interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        beat(&runner).await;
    }
}

async fn beat(runner: &TurnRunner) {
    let inner = &runner.inner;
    let ids = inner.live.ids();
    match inner.store.heartbeat(&ids, chrono::Utc::now()).await {
        Ok(cancelled) => {
            for turn_id in cancelled {
                if let Some(live) = inner.live.get(turn_id) {
                    tracing::info!(turn.id = %turn_id, "cancellation requested through the store");
                    live.cancel.cancel();
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
    }
    if let Err(e) = runner.sweep_orphans().await {
        tracing::warn!(error = %e, "orphan sweep failed");
    }
}
