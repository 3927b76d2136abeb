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
                         tokens_per_day, updated_at) VALUES (?1, ?2, ?3, ?4, ?5) \
                         ON CONFLICT (tenant) DO UPDATE SET \
                         max_running_turns = excluded.max_running_turns, \
                         max_streams = excluded.max_streams, \
                         tokens_per_day = excluded.tokens_per_day, \
                         updated_at = excluded.updated_at",
                    )?
                    .execute(params![
                        tenant,
                        limits.max_running_turns,
                        limits.max_streams,
                        super::signed(limits.tokens_per_day),
                        ts(at)
                    ])?;
                Ok(())
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
                         cost_usd) VALUES (?1, ?2, ?3, ?4, ?5) \
                         ON CONFLICT (tenant, day) DO UPDATE SET \
                         input_tokens = tenant_usage.input_tokens + excluded.input_tokens, \
                         output_tokens = tenant_usage.output_tokens + excluded.output_tokens, \
                         cost_usd = COALESCE(tenant_usage.cost_usd + excluded.cost_usd, \
                         tenant_usage.cost_usd, excluded.cost_usd)",
                    )?
                    .execute(params![
                        tenant,
                        day_key(day),
                        super::signed(Some(used.input_tokens)),
                        super::signed(Some(used.output_tokens)),
                        used.cost_usd
                    ])?;
                Ok(())
            })
            .await
    }
}
