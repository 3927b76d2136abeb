//! The admin routes, for an admin key only (`agent-harness keys create
//! --admin`; with keys off, only with `HARNESS_ALLOW_LOCAL_ADMIN=true`):
//! `DELETE /tenants/{tenant}` erases a tenant's data and revokes its
//! keys, `GET /audit` reads the audit trail. Another key is refused 403
//! `admin_required`.

use axum::{
    Json,
    extract::{FromRequestParts, Path, State},
    http::{StatusCode, request::Parts},
    response::{IntoResponse, Response},
};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::ApiQuery;
use crate::protocols::error::ApiError;
use crate::{
    app::AppState,
    http::sessions::erase::{Erasing, Whose, erase_sessions},
    ids::{Caller, SessionId},
    protocols::error::BadRequest,
    store::{
        AuditFilter, AuditRow,
        audit::{AuditEntry, kinds},
    },
};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(erase_tenant))
        .routes(routes!(list_audit))
}

/// A request of an admin: any other is 403 `admin_required`.
pub struct Admin;

impl<S: Send + Sync> FromRequestParts<S> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        match parts.extensions.get::<Caller>() {
            Some(caller) if caller.admin => Ok(Self),
            _ => Err(ApiError::AdminRequired),
        }
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TenantPath {
    /// The tenant: 1-128 characters of `[A-Za-z0-9._:-]`.
    #[param(min_length = 1, max_length = 128, pattern = r"^[A-Za-z0-9._:-]+$")]
    tenant: String,
}

/// Erases a tenant: its keys are revoked first, then each of its sessions
/// is erased as `DELETE /sessions/{id}` erases one (a running turn
/// cancelled first), then its memories, webhook endpoints and their
/// deliveries, its own limits and usage, and its own vault (index and
/// folder). 204 when nothing of it is left; 202 when more sessions remain
/// than one request erases (send it again).
#[utoipa::path(
    delete,
    path = "/tenants/{tenant}",
    tag = "operations",
    params(TenantPath),
    responses(
        (status = 204, description = "Erased"),
        (status = 202, description = "Sessions remain: send the DELETE again", body = Erasing),
        BadRequest,
        (status = 403, description = "Not an admin key (`admin_required`)"),
        (status = 409, description = "A session's turn did not end in time (`turn_running`); what was erased before it stays erased"),
    )
)]
async fn erase_tenant(
    _: Admin,
    State(app): State<AppState>,
    Path(TenantPath { tenant }): Path<TenantPath>,
) -> Result<Response, ApiError> {
    let tenant = SessionId::parse(&tenant).map_err(ApiError::InvalidTenant)?;
    let tenant = tenant.as_str();
    // No key of the tenant begins anything while its data goes.
    for key in app.store.revoke_tenant_keys(tenant, Utc::now()).await? {
        app.key_streams.revoked(&key);
        let entry = AuditEntry::new(tenant, kinds::KEY_REVOKED).subject(key);
        app.store.record(entry).await;
    }
    let (erased, more) = erase_sessions(&app, Whose::Tenant(tenant)).await?;
    if more {
        let entry = AuditEntry::new(tenant, kinds::TENANT_ERASED)
            .outcome(format!("{erased} sessions, more remain"));
        app.store.record(entry).await;
        let body = Erasing {
            sessions_erased: erased,
            done: false,
        };
        return Ok((StatusCode::ACCEPTED, Json(body)).into_response());
    }
    app.store.erase_tenant_rest(tenant).await?;
    if let Some(folder) = app.vaults.forget_tenant(tenant) {
        match tokio::fs::remove_dir_all(&folder).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(ApiError::Internal(format!(
                    "cannot remove the tenant's vault folder: {e}"
                )));
            }
        }
    }
    tracing::info!(tenant, sessions = erased, "tenant erased");
    let entry = AuditEntry::new(tenant, kinds::TENANT_ERASED).outcome(format!("{erased} sessions"));
    app.store.record(entry).await;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Which audit rows to read.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// One tenant's rows.
    #[param(min_length = 1, max_length = 128)]
    tenant: Option<String>,
    /// One kind: key.created, key.revoked, approval.decided,
    /// session.erased, user.erased, tenant.erased, session.exported,
    /// session.imported, retention.swept, webhook.created,
    /// webhook.deleted, refused.other_tenant, auth.failed.
    kind: Option<String>,
    /// Rows at or after this time (RFC 3339).
    since: Option<DateTime<Utc>>,
    /// Rows before this time (RFC 3339).
    until: Option<DateTime<Utc>>,
    /// Rows after this id (the last page's `next_after`).
    #[param(minimum = 0)]
    after: Option<i64>,
    /// Rows at most (1-1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
}

/// A page of the audit trail.
pub type AuditPage = super::listing::Page<AuditRow, i64>;

/// The audit trail, oldest first: who did what to whose data, never what
/// was said.
#[utoipa::path(
    get,
    path = "/audit",
    tag = "operations",
    params(AuditQuery),
    responses(
        (status = 200, description = "A page of rows", body = AuditPage),
        BadRequest,
        (status = 403, description = "Not an admin key (`admin_required`)"),
    )
)]
async fn list_audit(
    _: Admin,
    State(app): State<AppState>,
    ApiQuery(query): ApiQuery<AuditQuery>,
) -> Result<Json<AuditPage>, ApiError> {
    let limit = super::listing::page_limit(query.limit)?;
    let after = query.after.unwrap_or(0);
    if after < 0 {
        return Err(ApiError::InvalidQuery(
            "`after` must not be negative".into(),
        ));
    }
    if let Some(kind) = &query.kind
        && !kinds::ALL.contains(&kind.as_str())
    {
        return Err(ApiError::InvalidQuery(format!(
            "`kind` must be one of {}",
            kinds::ALL.join(", ")
        )));
    }
    if let Some(tenant) = &query.tenant {
        SessionId::parse(tenant).map_err(ApiError::InvalidTenant)?;
    }
    let filter = AuditFilter {
        tenant: query.tenant,
        kind: query.kind,
        since: query.since,
        until: query.until,
        after,
        limit,
    };
    let audit = app.store.audit_rows(&filter).await?;
    Ok(Json(AuditPage::of(audit, limit, |row| row.id)))
}
