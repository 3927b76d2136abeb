//! [`Tenants`] on SQLite: each write is one job on the writer thread.

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use rusqlite::params;

use super::{TenantLimits, Tenants, UsageTotals, day_key};
use crate::store::{
    Result,
    sqlite::{SqliteStore, writer::ts},
};

#[async_trait]
impl Tenants for SqliteStore {
    async fn set_tenant_limits(
        &self,
        tenant: &str,
        limits: &TenantLimits,
        at: DateTime<Utc>,
    ) -> Result<()> {
        let (tenant, limits) = (tenant.to_owned(), *limits);
        self.writes
            .run(move |connection| {
                connection
                    .prepare_cached(
                        "INSERT INTO tenants (tenant, max_running_turns, max_streams, \
                         tokens_per_day, retention_s, updated_at, reasoning) \
                         VALUES (?1, ?2, ?3, ?4, ?6, ?5, ?7) \
                         ON CONFLICT (tenant) DO UPDATE SET \
                         reasoning = excluded.reasoning, \
                         max_running_turns = excluded.max_running_turns, \
                         max_streams = excluded.max_streams, \
                         tokens_per_day = excluded.tokens_per_day, \
                         retention_s = excluded.retention_s, \
                         updated_at = excluded.updated_at",
                    )?
                    .execute(params![
                        tenant,
                        limits.max_running_turns,
                        limits.max_streams,
                        super::signed(limits.tokens_per_day),
                        ts(at),
                        super::signed(limits.retention_s),
                        super::reasoning_column(limits.show_reasoning)
                    ])?;
                Ok(())
            })
            .await
    }

    async fn take_lease(
        &self,
        name: &str,
        holder: &str,
        until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        let (name, holder) = (name.to_owned(), holder.to_owned());
        self.writes
            .run(move |connection| {
                let taken = connection
                    .prepare_cached(
                        "INSERT INTO service_leases (name, holder, until) VALUES (?1, ?2, ?3) \
                         ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, \
                         until = excluded.until \
                         WHERE service_leases.holder = excluded.holder \
                         OR service_leases.until < ?4",
                    )?
                    .execute(params![name, holder, ts(until), ts(now)])?;
                Ok(taken == 1)
            })
            .await
    }

    async fn add_usage(&self, tenant: &str, day: NaiveDate, used: &UsageTotals) -> Result<()> {
        let (tenant, used) = (tenant.to_owned(), *used);
        self.writes
            .run(move |connection| {
                connection
                    .prepare_cached(
                        "INSERT INTO tenant_usage (tenant, day, input_tokens, output_tokens, \
                         cost_usd, reasoning_tokens) VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
                         ON CONFLICT (tenant, day) DO UPDATE SET \
                         input_tokens = tenant_usage.input_tokens + excluded.input_tokens, \
                         output_tokens = tenant_usage.output_tokens + excluded.output_tokens, \
                         reasoning_tokens = tenant_usage.reasoning_tokens + excluded.reasoning_tokens, \
                         cost_usd = COALESCE(tenant_usage.cost_usd + excluded.cost_usd, \
                         tenant_usage.cost_usd, excluded.cost_usd)",
                    )?
                    .execute(params![
                        tenant,
                        day_key(day),
                        super::signed(Some(used.input_tokens)),
                        super::signed(Some(used.output_tokens)),
                        used.cost_usd,
                        super::signed(Some(used.reasoning_tokens))
                    ])?;
                Ok(())
            })
            .await
    }
}
