//! What a tenant may spend and what it spent: its own limits over the
//! service's defaults, and its turns' tokens and cost by UTC day.
//!
//! The reads are written once here; each backend's writes stand side by
//! side in `tenants/sqlite.rs` and `tenants/postgres.rs`.

mod postgres;
mod sqlite;

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use serde::Serialize;

use super::reader::{Reads, args};
use crate::store::Result;

/// A tenant's own limits; `None` keeps the service's default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct TenantLimits {
    /// Running turns at once, across replicas.
    pub max_running_turns: Option<u32>,
    /// Requests in flight at once (open event streams, queue waits and
    /// callers waiting for a turn's end), in one process.
    pub max_streams: Option<u32>,
    /// Input and output tokens per UTC day.
    pub tokens_per_day: Option<u64>,
    /// Seconds of inactivity after which a session is erased.
    pub retention_s: Option<u64>,
    /// Whether the model's reasoning reaches the tenant's clients
    /// (`HARNESS_REASONING` where unset).
    pub show_reasoning: Option<bool>,
}

impl TenantLimits {
    /// These limits, each unset one taken from `defaults`.
    pub fn over(self, defaults: Self) -> Self {
        Self {
            max_running_turns: self.max_running_turns.or(defaults.max_running_turns),
            max_streams: self.max_streams.or(defaults.max_streams),
            tokens_per_day: self.tokens_per_day.or(defaults.tokens_per_day),
            retention_s: self.retention_s.or(defaults.retention_s),
            show_reasoning: self.show_reasoning.or(defaults.show_reasoning),
        }
    }
}

/// Tokens and cost over some days.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, utoipa::ToSchema)]
pub struct UsageTotals {
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Output tokens spent on reasoning (among `output_tokens`).
    pub reasoning_tokens: u64,
    /// USD, when the models used are priced.
    pub cost_usd: Option<f64>,
}

impl UsageTotals {
    pub fn tokens(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }
}

/// A day as the usage table keys it.
pub fn day_key(day: NaiveDate) -> String {
    day.format("%Y-%m-%d").to_string()
}

/// A count as a column holds it (past `i64::MAX`: `i64::MAX`).
fn signed(value: Option<u64>) -> Option<i64> {
    value.map(|v| i64::try_from(v).unwrap_or(i64::MAX))
}

fn limit<T: TryFrom<i64>>(value: Option<i64>) -> Option<T> {
    value.and_then(|v| T::try_from(v).ok())
}

fn count(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

type LimitsRow = (
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<String>,
);

fn limits_of((running, streams, tokens, retention, reasoning): LimitsRow) -> TenantLimits {
    TenantLimits {
        max_running_turns: limit(running),
        max_streams: limit(streams),
        tokens_per_day: limit(tokens),
        retention_s: limit(retention),
        show_reasoning: reasoning.map(|r| r == REASONING_SHOWN),
    }
}

/// The `reasoning` column of a tenant whose clients see its reasoning
/// (else `hidden`).
const REASONING_SHOWN: &str = "show";

/// The `reasoning` column's value of a tenant's own choice.
fn reasoning_column(show: Option<bool>) -> Option<&'static str> {
    show.map(|show| if show { REASONING_SHOWN } else { "hidden" })
}

/// Tenants' limits and usage.
#[async_trait]
pub trait Tenants: Reads + Send + Sync + 'static {
    /// Sets a tenant's own limits (all of them: `None` clears one).
    async fn set_tenant_limits(
        &self,
        tenant: &str,
        limits: &TenantLimits,
        at: DateTime<Utc>,
    ) -> Result<()>;

    /// Adds a finished turn's tokens and cost to its tenant's `day`.
    async fn add_usage(&self, tenant: &str, day: NaiveDate, used: &UsageTotals) -> Result<()>;

    /// A tenant's own limits (all `None` when it has none).
    async fn tenant_limits(&self, tenant: &str) -> Result<TenantLimits> {
        let sql = "SELECT max_running_turns, max_streams, tokens_per_day, retention_s, \
                   reasoning FROM tenants WHERE tenant = $1";
        let row: Option<LimitsRow> = self.reader().row(sql, args![tenant]).await?;
        Ok(row.map(limits_of).unwrap_or_default())
    }

    /// Every tenant with limits of its own, by name.
    async fn list_tenants(&self) -> Result<Vec<(String, TenantLimits)>> {
        let sql = "SELECT tenant, max_running_turns, max_streams, tokens_per_day, retention_s, \
                   reasoning FROM tenants ORDER BY tenant";
        type Row = (
            String,
            Option<i64>,
            Option<i64>,
            Option<i64>,
            Option<i64>,
            Option<String>,
        );
        let rows: Vec<Row> = self.reader().rows(sql, args![]).await?;
        Ok(rows
            .into_iter()
            .map(|(tenant, running, streams, tokens, retention, reasoning)| {
                (
                    tenant,
                    limits_of((running, streams, tokens, retention, reasoning)),
                )
            })
            .collect())
    }

    /// Takes (or keeps) the lease `name` for `holder` until `until`,
    /// unless another holder's runs past `now`; whether `holder` has it.
    async fn take_lease(
        &self,
        name: &str,
        holder: &str,
        until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<bool>;

    /// Sessions whose last activity is before `before`, whose turns
    /// have all ended and that no fork reads through (a fork is erased
    /// first), oldest first, at most `limit`: those of `tenant` (`Some`),
    /// or (`None`) those of every tenant without a retention of its own.
    async fn inactive_sessions(
        &self,
        tenant: Option<&str>,
        before: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<String>> {
        let sql = "SELECT s.id FROM sessions s WHERE s.updated_at < $1 AND CASE WHEN $2 IS NULL \
                   THEN s.tenant NOT IN (SELECT tenant FROM tenants WHERE retention_s IS NOT NULL) \
                   ELSE s.tenant = $2 END \
                   AND NOT EXISTS (SELECT 1 FROM turns t WHERE t.session_id = s.id \
                   AND t.status = 'running') \
                   AND NOT EXISTS (SELECT 1 FROM sessions f WHERE f.forked_from = s.id) \
                   ORDER BY s.updated_at, s.id LIMIT $3";
        let rows: Vec<(String,)> = self
            .reader()
            .rows(sql, args![before, tenant, limit])
            .await?;
        Ok(rows.into_iter().map(|(id,)| id).collect())
    }

    /// A tenant's tokens and cost from `first` to `last` (UTC days, both
    /// included).
    async fn usage(&self, tenant: &str, first: NaiveDate, last: NaiveDate) -> Result<UsageTotals> {
        let sql = "SELECT CAST(COALESCE(SUM(input_tokens), 0) AS BIGINT), \
                   CAST(COALESCE(SUM(output_tokens), 0) AS BIGINT), \
                   CAST(COALESCE(SUM(reasoning_tokens), 0) AS BIGINT), SUM(cost_usd) \
                   FROM tenant_usage WHERE tenant = $1 AND day >= $2 AND day <= $3";
        let (first, last) = (day_key(first), day_key(last));
        let row: Option<(i64, i64, i64, Option<f64>)> = self
            .reader()
            .row(sql, args![tenant, first.as_str(), last.as_str()])
            .await?;
        let (input, output, reasoning, cost_usd) = row.unwrap_or((0, 0, 0, None));
        Ok(UsageTotals {
            input_tokens: count(input),
            output_tokens: count(output),
            reasoning_tokens: count(reasoning),
            cost_usd,
        })
    }
}
