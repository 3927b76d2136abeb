//! `GET /usage`: what the caller's tenant used today and this month, and
//! its limits.

use axum::{Extension, extract::State};
use chrono::{Datelike, Utc};
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::ids::Tenant;
use crate::protocols::error::ApiError;
use crate::{
    app::AppState,
    store::{TenantLimits, UsageTotals, tenants::day_key},
};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get_usage))
}

/// Tokens and cost over a span of UTC days.
#[derive(Debug, Serialize, ToSchema)]
pub struct UsageSpan {
    /// The first day (`YYYY-MM-DD`, UTC).
    pub from: String,
    /// The last day.
    pub to: String,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Output tokens spent on reasoning (among `output_tokens`, and
    /// priced as they are), shown to clients or hidden.
    pub reasoning_tokens: u64,
    /// Input and output together: what the daily quota counts.
    pub tokens: u64,
    /// USD, when the models used are priced.
    pub cost_usd: Option<f64>,
}

impl UsageSpan {
    fn of(from: chrono::NaiveDate, to: chrono::NaiveDate, used: UsageTotals) -> Self {
        Self {
            from: day_key(from),
            to: day_key(to),
            input_tokens: used.input_tokens,
            output_tokens: used.output_tokens,
            reasoning_tokens: used.reasoning_tokens,
            tokens: used.tokens(),
            cost_usd: used.cost_usd,
        }
    }
}

/// The caller's tenant: its usage and its limits.
#[derive(Debug, Serialize, ToSchema)]
pub struct UsageView {
    pub tenant: String,
    pub today: UsageSpan,
    pub month: UsageSpan,
    /// Its limits in force (its own over the service's defaults); a limit
    /// that is null does not apply.
    pub limits: TenantLimits,
    /// What its files take.
    pub files: FileUsage,
}

/// What a tenant's files take, the same bytes counted once.
#[derive(Debug, Serialize, ToSchema)]
pub struct FileUsage {
    pub bytes: u64,
    /// `HARNESS_TENANT_FILE_BYTES`.
    pub limit: u64,
}

/// What the caller's tenant used today and this month (UTC; counted as
/// each turn ends), and the limits it runs under.
#[utoipa::path(
    get,
    path = "/usage",
    tag = "operations",
    responses((status = 200, description = "The tenant's usage and limits", body = UsageView))
)]
async fn get_usage(
    State(app): State<AppState>,
    Extension(tenant): Extension<Tenant>,
) -> Result<axum::Json<UsageView>, ApiError> {
    let today = Utc::now().date_naive();
    let first = today.with_day(1).unwrap_or(today);
    let store = &app.store;
    Ok(axum::Json(UsageView {
        today: UsageSpan::of(today, today, store.usage(&tenant.0, today, today).await?),
        month: UsageSpan::of(first, today, store.usage(&tenant.0, first, today).await?),
        limits: app.runner.tenant_limits(&tenant.0).await?,
        files: FileUsage {
            bytes: store.stored_file_bytes(&tenant.0).await?,
            limit: app.settings.server.tenant_file_bytes,
        },
        tenant: tenant.0,
    }))
}
