//! Probes and the OpenAPI document.

use axum::{
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::{app::AppState, store::Readiness};

/// Longest a readiness check waits for the database.
const READINESS_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(800);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics))
}

/// `/metrics` alone.
pub fn metrics_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(metrics))
}

/// Prometheus metrics.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    responses((status = 200, description = "OpenMetrics text exposition format", content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8", body = String))
)]
async fn metrics(State(app): State<AppState>) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            crate::metrics::CONTENT_TYPE,
        )],
        app.runner.metrics().render(),
    )
        .into_response()
}

/// Answer of the probes.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// `ok` or `unavailable`.
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub database: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub migrations: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draining: Option<bool>,
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "operations", responses((status = 200, description = "Success", body = Health)))]
async fn healthz() -> axum::Json<Health> {
    axum::Json(Health {
        status: "ok".into(),
        database: None,
        migrations: None,
        draining: None,
    })
}

/// The database answers, every migration is applied and the service is not
/// shutting down.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    responses((status = 200, description = "Success", body = Health), (status = 503, description = "Not ready", body = Health))
)]
async fn readyz(State(app): State<AppState>) -> Response {
    // A probe answers in time whatever the database does: one that waits
    // on a dead database looks to the orchestrator like a dead process.
    let readiness = tokio::time::timeout(READINESS_TIMEOUT, app.store.readiness())
        .await
        .unwrap_or(Readiness {
            reachable: false,
            migrations_applied: false,
        });
    let draining = app.runner.is_draining();
    let ready = readiness.reachable && readiness.migrations_applied && !draining;
    let body = Health {
        status: if ready { "ok" } else { "unavailable" }.into(),
        database: Some(
            if readiness.reachable {
                "reachable"
            } else {
                "unreachable"
            }
            .into(),
        ),
        migrations: Some(
            if readiness.migrations_applied {
                "applied"
            } else {
                "pending"
            }
            .into(),
        ),
        draining: Some(draining),
    };
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(body)).into_response()
}
