//! A tenant's limits and its quota of the day, as the runner admits its
//! turns by them.

use chrono::Utc;

use super::{LIMITS_CACHED, LIMITS_TTL, StartError, TurnRunner};
use crate::{
    events::TurnEvent,
    store::{StoreError, TenantLimits},
};

impl TurnRunner {
    /// A tenant's limits: its own over the defaults, read at most every
    /// [`LIMITS_TTL`] (`agent-harness tenants set` takes effect within it).
    pub async fn tenant_limits(&self, tenant: &str) -> Result<TenantLimits, StoreError> {
        let inner = &self.inner;
        let cached = || {
            inner
                .tenant_limits
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get(tenant)
                .filter(|(at, _)| at.elapsed() < LIMITS_TTL)
                .map(|(_, limits)| *limits)
        };
        let own = match cached() {
            Some(own) => own,
            None => {
                let _one_read = inner.reading_limits.lock().await;
                // Another request may have read them meanwhile.
                if let Some(own) = cached() {
                    return Ok(own.over(inner.config.policy.tenant_defaults));
                }
                let now = std::time::Instant::now();
                let own = inner.store.tenant_limits(tenant).await?;
                let mut cache = inner
                    .tenant_limits
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                // Bounded: past so many tenants, start again.
                if cache.len() >= LIMITS_CACHED {
                    cache.clear();
                }
                cache.insert(tenant.to_owned(), (now, own));
                own
            }
        };
        Ok(own.over(inner.config.policy.tenant_defaults))
    }

    /// Whether a tenant's clients see the model's reasoning, when it chose
    /// (else as the harness's options say).
    pub(super) async fn reasoning_of(
        &self,
        tenant: &str,
    ) -> Result<Option<crate::harness::Reasoning>, StoreError> {
        use crate::harness::Reasoning;
        let limits = self.tenant_limits(tenant).await?;
        Ok(limits.show_reasoning.map(|show| {
            if show {
                Reasoning::Show
            } else {
                Reasoning::Hidden
            }
        }))
    }

    /// The tenant's quota of the day: refused when used up, a warning past
    /// 80%.
    pub(super) async fn quota(
        &self,
        tenant: &str,
        limits: &TenantLimits,
    ) -> Result<Option<TurnEvent>, StartError> {
        let Some(limit) = limits.tokens_per_day else {
            return Ok(None);
        };
        let now = Utc::now();
        let today = now.date_naive();
        let used = self.inner.store.usage(tenant, today, today).await?.tokens();
        if used >= limit {
            let midnight = today
                .succ_opt()
                .and_then(|d| d.and_hms_opt(0, 0, 0))
                .map_or(now, |m| m.and_utc());
            let retry_after = u64::try_from((midnight - now).num_seconds())
                .unwrap_or(0)
                .max(1);
            return Err(StartError::QuotaExceeded {
                used,
                limit,
                retry_after,
            });
        }
        Ok(
            (used.saturating_mul(5) >= limit.saturating_mul(4)).then_some(
                TurnEvent::QuotaWarning {
                    tokens_today: used,
                    tokens_per_day: limit,
                },
            ),
        )
    }
}
