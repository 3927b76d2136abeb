//! The retention sweep: a session inactive for longer than its tenant's
//! retention (`HARNESS_RETENTION`, or the tenant's own) is erased whole,
//! as `DELETE /sessions/{id}` erases it, in bounded batches, by one
//! replica at a time (a lease in the store), never one whose turn runs or
//! waits.

use std::time::Duration;

use chrono::Utc;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::TurnRunner;
use crate::{
    ids::SessionKey,
    store::{
        Erased, StoreError,
        audit::{AuditEntry, kinds},
    },
};

/// The lease's name.
const LEASE: &str = "retention";

/// Sessions a batch reads.
const BATCH: u32 = 100;

/// Batches a scope (the service's retention, or one tenant's) takes in one
/// sweep, at most: the next sweep goes on.
const BATCHES: usize = 10;

/// Sweeps every `HARNESS_RETENTION_SWEEP_INTERVAL` until `stop`.
pub(super) async fn run(runner: TurnRunner, stop: CancellationToken) {
    let mut tick = tokio::time::interval(runner.inner.config.retention.every);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        match runner.sweep_retention().await {
            Ok(0) => {}
            Ok(erased) => tracing::info!(erased, "retention: sessions erased"),
            Err(e) => tracing::warn!(error = %e, "retention sweep failed"),
        }
    }
}

impl TurnRunner {
    /// One sweep, when this process holds the lease: the sessions it
    /// erased.
    pub async fn sweep_retention(&self) -> Result<u64, StoreError> {
        let inner = &self.inner;
        let retention = inner.config.retention;
        let now = Utc::now();
        // Held for two intervals: a holder that dies leaves the sweep to
        // another replica after that.
        let held = chrono::Duration::from_std(retention.every.saturating_mul(2))
            .unwrap_or_else(|_| chrono::Duration::days(1));
        let until = now.checked_add_signed(held).unwrap_or(now);
        if !inner
            .store
            .take_lease(LEASE, &inner.process_id, until, now)
            .await?
        {
            return Ok(0);
        }
        // Uploads that never finished (their process died) leave bytes
        // that no file names: gone an hour after they began.
        let swept = inner
            .store
            .sweep_unfinished_files(now - chrono::Duration::hours(1))
            .await?;
        if swept > 0 {
            tracing::info!(swept, "retention: unfinished uploads removed");
        }
        let mut scopes: Vec<(Option<String>, Duration)> = Vec::new();
        if let Some(kept) = retention.default {
            scopes.push((None, kept));
        }
        for (tenant, limits) in inner.store.list_tenants().await? {
            if let Some(seconds) = limits.retention_s {
                scopes.push((Some(tenant), Duration::from_secs(seconds)));
            }
        }
        let mut erased = 0;
        for (tenant, kept) in scopes {
            let kept = chrono::Duration::from_std(kept).unwrap_or(chrono::Duration::MAX);
            let Some(before) = now.checked_sub_signed(kept) else {
                continue;
            };
            for _ in 0..BATCHES {
                let inactive = inner
                    .store
                    .inactive_sessions(tenant.as_deref(), before, BATCH)
                    .await?;
                for id in &inactive {
                    // A turn that began since the read keeps its session.
                    let key = SessionKey::from_stored(id);
                    if inner.store.erase_session(&key).await? == Erased::Erased {
                        inner.config.running_jobs.stop_session(key.as_str());
                        erased += 1;
                        inner.metrics.retention_erased();
                        let entry = AuditEntry::new(key.tenant(), kinds::SESSION_ERASED)
                            .subject(key.id())
                            .outcome("retention");
                        inner
                            .store
                            .record(AuditEntry {
                                actor: "retention".to_owned(),
                                ..entry
                            })
                            .await;
                    }
                }
                if inactive.len() < BATCH as usize {
                    break;
                }
            }
        }
        if let Some(kept) = retention.audit {
            self.trim_audit(now, kept).await?;
        }
        if erased > 0 {
            let entry = AuditEntry::new("*", kinds::RETENTION_SWEPT).outcome(erased.to_string());
            inner
                .store
                .record(AuditEntry {
                    actor: "retention".to_owned(),
                    ..entry
                })
                .await;
        }
        Ok(erased)
    }

    /// Removes the audit rows older than `kept`, in bounded batches.
    async fn trim_audit(
        &self,
        now: chrono::DateTime<Utc>,
        kept: Duration,
    ) -> Result<(), StoreError> {
        let kept = chrono::Duration::from_std(kept).unwrap_or(chrono::Duration::MAX);
        let Some(before) = now.checked_sub_signed(kept) else {
            return Ok(());
        };
        for _ in 0..BATCHES {
            let trimmed = self.inner.store.trim_audit(before, BATCH * 10).await?;
            if trimmed < u64::from(BATCH * 10) {
                break;
            }
        }
        Ok(())
    }
}
