//! `/webhooks`: a tenant's endpoints for the service's events (a turn's
//! end, a turn that waits for someone, a background response's end),
//! each delivered signed as Standard Webhooks say, at least once, from
//! the database's outbox ([`crate::outbox::webhooks`]).

use axum::{
    Extension,
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::ApiQuery;
use crate::ids::Tenant;
use crate::protocols::error::ApiError;
use crate::{
    app::AppState,
    protocols::error::BadRequest,
    protocols::json::ApiJson,
    store::{
        OPERATOR_WEBHOOK_ID, StoreError, Webhook, WebhookDelivery,
        audit::{AuditEntry, kinds},
        webhooks::OPERATOR_TENANT,
    },
};

/// Makes the operator's endpoint what the settings say (or removes it).
pub async fn put_operator(app: &AppState) -> Result<(), StoreError> {
    let server = &app.settings.server;
    let hook = match (&server.webhook_url, &server.webhook_secret) {
        (Some(url), Some(secret)) => Some(Webhook {
            id: OPERATOR_WEBHOOK_ID.to_owned(),
            tenant: OPERATOR_TENANT.to_owned(),
            url: url.as_str().to_owned(),
            events: serde_json::to_string(&EVENT_TYPES).unwrap_or_default(),
            secret: secret.expose().to_owned(),
            created_at: Utc::now(),
        }),
        _ => None,
    };
    app.store.put_operator_webhook(hook.as_ref()).await
}

/// The event types an endpoint may want, by name.
pub const EVENT_TYPES: [&str; 8] = {
    let mut names = [""; 8];
    let mut i = 0;
    while i < EventType::ALL.len() {
        names[i] = EventType::ALL[i].name();
        i += 1;
    }
    names
};

/// Endpoints a tenant has at most.
pub const WEBHOOKS_PER_TENANT: u32 = 10;
/// Bytes an endpoint's URL has at most.
const URL_MAX: usize = 2048;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_webhook, list_webhooks))
        .routes(routes!(get_webhook, delete_webhook))
        .routes(routes!(list_deliveries))
}

/// A new endpoint.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewWebhook {
    /// Where the events are POSTed: http(s), a public address (private
    /// ones only with `HARNESS_OUTBOUND_ALLOW_PRIVATE=true`).
    #[schema(
        min_length = 1,
        max_length = 2048,
        pattern = "^https?://[^/?#@\\s]+([/?#][^\\s]*)?$"
    )]
    url: String,
    /// The event types wanted (at least one): `turn.completed`,
    /// `turn.failed`, `turn.cancelled`, `turn.waiting`,
    /// `response.completed`, `response.failed`, `response.cancelled`,
    /// `response.incomplete`.
    #[schema(min_items = 1, max_items = 8, inline)]
    events: Vec<EventType>,
}

/// An event type an endpoint may want.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
pub enum EventType {
    #[serde(rename = "turn.completed")]
    TurnCompleted,
    #[serde(rename = "turn.failed")]
    TurnFailed,
    #[serde(rename = "turn.cancelled")]
    TurnCancelled,
    #[serde(rename = "turn.waiting")]
    TurnWaiting,
    #[serde(rename = "response.completed")]
    ResponseCompleted,
    #[serde(rename = "response.failed")]
    ResponseFailed,
    #[serde(rename = "response.cancelled")]
    ResponseCancelled,
    #[serde(rename = "response.incomplete")]
    ResponseIncomplete,
}

impl EventType {
    const ALL: [Self; 8] = [
        Self::TurnCompleted,
        Self::TurnFailed,
        Self::TurnCancelled,
        Self::TurnWaiting,
        Self::ResponseCompleted,
        Self::ResponseFailed,
        Self::ResponseCancelled,
        Self::ResponseIncomplete,
    ];

    /// Its name on the wire.
    const fn name(self) -> &'static str {
        match self {
            Self::TurnCompleted => "turn.completed",
            Self::TurnFailed => "turn.failed",
            Self::TurnCancelled => "turn.cancelled",
            Self::TurnWaiting => "turn.waiting",
            Self::ResponseCompleted => "response.completed",
            Self::ResponseFailed => "response.failed",
            Self::ResponseCancelled => "response.cancelled",
            Self::ResponseIncomplete => "response.incomplete",
        }
    }
}

/// An endpoint (its secret only in the answer that made it).
#[derive(Debug, Serialize, ToSchema)]
pub struct WebhookView {
    /// `wh_…`
    id: String,
    url: String,
    events: Vec<String>,
    created_at: DateTime<Utc>,
    /// The signing secret (`whsec_…`), shown once.
    #[serde(skip_serializing_if = "Option::is_none")]
    secret: Option<String>,
}

impl WebhookView {
    fn of(hook: Webhook, with_secret: bool) -> Self {
        Self {
            id: hook.id,
            url: hook.url,
            events: serde_json::from_str(&hook.events).unwrap_or_default(),
            created_at: hook.created_at,
            secret: with_secret.then_some(hook.secret),
        }
    }
}

/// The caller's endpoints.
pub type WebhookList = super::listing::Page<WebhookView>;

impl super::listing::Listed for WebhookView {
    const FIELD: &'static str = "webhooks";
    const PAGE: &'static str = "WebhookList";
    const ABOUT: &'static str = "The caller's endpoints.";
}

/// A route's `{webhook_id}`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct WebhookPath {
    /// `wh_…`
    #[param(max_length = 64)]
    webhook_id: String,
}

/// Registers an endpoint of the caller's tenant: its events are POSTed
/// to it, signed with the secret this answer holds (and no other).
#[utoipa::path(
    post,
    path = "/webhooks",
    tag = "webhooks",
    request_body = NewWebhook,
    responses(
        (status = 201, description = "Registered; `secret` is shown this once", body = WebhookView),
        BadRequest,
        (status = 409, description = "The tenant has 10 endpoints (`webhook_limit_reached`)"),
        (status = 422, description = "A URL that is not http(s) or not public (`invalid_field`), an unknown event type"),
    )
)]
async fn create_webhook(
    State(app): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    ApiJson(body): ApiJson<NewWebhook>,
) -> Result<Response, ApiError> {
    let invalid = |field: &str, detail: String| ApiError::InvalidField {
        field: field.to_owned(),
        detail,
    };
    if body.url.is_empty() || body.url.len() > URL_MAX {
        return Err(invalid(
            "url",
            format!("`url` must be 1 to {URL_MAX} bytes"),
        ));
    }
    let allow_private = app.settings.server.outbound_allow_private;
    let url = crate::outbox::checked_url(allow_private, &body.url)
        .map_err(|why| invalid("url", format!("`url` refused: {why}")))?;
    let mut events: Vec<&str> = Vec::new();
    for event in body.events {
        if !events.contains(&event.name()) {
            events.push(event.name());
        }
    }
    if events.is_empty() {
        return Err(invalid("events", "name at least one event type".into()));
    }
    let hook = Webhook {
        id: format!("wh_{}", uuid::Uuid::now_v7().simple()),
        tenant: tenant.0.clone(),
        url: url.to_string(),
        events: serde_json::to_string(&events).unwrap_or_default(),
        secret: crate::signing::new_secret(),
        created_at: Utc::now(),
    };
    if !app.store.create_webhook(&hook, WEBHOOKS_PER_TENANT).await? {
        return Err(ApiError::WebhookLimit(WEBHOOKS_PER_TENANT));
    }
    let entry = AuditEntry::new(&tenant.0, kinds::WEBHOOK_CREATED).subject(&hook.id);
    app.store.record(entry).await;
    Ok((StatusCode::CREATED, axum::Json(WebhookView::of(hook, true))).into_response())
}

/// The caller's endpoints, oldest first.
#[utoipa::path(
    get,
    path = "/webhooks",
    tag = "webhooks",
    responses((status = 200, description = "The endpoints (without their secrets)", body = WebhookList))
)]
async fn list_webhooks(
    State(app): State<AppState>,
    Extension(tenant): Extension<Tenant>,
) -> Result<axum::Json<WebhookList>, ApiError> {
    let webhooks = app.store.webhooks(&tenant.0).await?;
    Ok(axum::Json(WebhookList::whole(
        webhooks
            .into_iter()
            .map(|h| WebhookView::of(h, false))
            .collect(),
    )))
}

async fn own(app: &AppState, tenant: &Tenant, id: &str) -> Result<Webhook, ApiError> {
    app.store
        .webhook(&tenant.0, id)
        .await?
        .ok_or(ApiError::WebhookNotFound)
}

/// One of the caller's endpoints.
#[utoipa::path(
    get,
    path = "/webhooks/{webhook_id}",
    tag = "webhooks",
    params(WebhookPath),
    responses(
        (status = 200, description = "The endpoint (without its secret)", body = WebhookView),
        (status = 404, description = "No such endpoint of the caller's (`webhook_not_found`)"),
    )
)]
async fn get_webhook(
    State(app): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(WebhookPath { webhook_id }): Path<WebhookPath>,
) -> Result<axum::Json<WebhookView>, ApiError> {
    let hook = own(&app, &tenant, &webhook_id).await?;
    Ok(axum::Json(WebhookView::of(hook, false)))
}

/// Deletes one of the caller's endpoints, and its deliveries (those not
/// sent yet are not).
#[utoipa::path(
    delete,
    path = "/webhooks/{webhook_id}",
    tag = "webhooks",
    params(WebhookPath),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "No such endpoint of the caller's (`webhook_not_found`)"),
    )
)]
async fn delete_webhook(
    State(app): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(WebhookPath { webhook_id }): Path<WebhookPath>,
) -> Result<StatusCode, ApiError> {
    if app.store.delete_webhook(&tenant.0, &webhook_id).await? {
        let entry = AuditEntry::new(&tenant.0, kinds::WEBHOOK_DELETED).subject(&webhook_id);
        app.store.record(entry).await;
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::WebhookNotFound)
    }
}

/// Which deliveries.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct DeliveryQuery {
    /// Of one status: `pending`, `delivered`, `failed` (given up: the
    /// dead letters) or `skipped`.
    #[param(pattern = "^(pending|delivered|failed|skipped)$")]
    status: Option<String>,
    /// At most this many, 1-1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
}

/// One message to an endpoint, and how its delivery stands.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeliveryView {
    /// The message's `webhook-id` (the same on every try).
    id: String,
    /// `turn`: the turn's event (`turn.completed`, `turn.waiting`…);
    /// `response`: a background response's end.
    kind: String,
    /// The session the event is of.
    session_id: String,
    /// The event's seq in the session's log.
    seq: i64,
    /// `pending`, `delivered`, `failed` (given up after 24 h and more of
    /// tries) or `skipped` (the endpoint does not want this type).
    status: String,
    attempts: i64,
    /// The HTTP status of the last try, if it was answered.
    last_status: Option<i64>,
    last_error: Option<String>,
    created_at: DateTime<Utc>,
    /// When a pending one is tried next.
    next_attempt_at: Option<DateTime<Utc>>,
    delivered_at: Option<DateTime<Utc>>,
}

impl DeliveryView {
    fn of(delivery: WebhookDelivery) -> Self {
        let pending = delivery.status == "pending";
        let session_id = delivery.session().id().to_owned();
        Self {
            id: delivery.id,
            kind: delivery.kind,
            session_id,
            seq: delivery.seq,
            status: delivery.status,
            attempts: delivery.attempts,
            last_status: delivery.last_status,
            last_error: delivery.last_error,
            created_at: delivery.created_at,
            next_attempt_at: pending.then_some(delivery.next_at),
            delivered_at: delivery.delivered_at,
        }
    }
}

/// An endpoint's deliveries.
pub type DeliveryList = super::listing::Page<DeliveryView>;

impl super::listing::Listed for DeliveryView {
    const FIELD: &'static str = "deliveries";
    const PAGE: &'static str = "DeliveryList";
    const ABOUT: &'static str = "An endpoint's deliveries.";
}

/// An endpoint's deliveries, newest first: what was sent, what waits for
/// its next try, and what was given up (the dead letters).
#[utoipa::path(
    get,
    path = "/webhooks/{webhook_id}/deliveries",
    tag = "webhooks",
    params(WebhookPath, DeliveryQuery),
    responses(
        (status = 200, description = "The deliveries", body = DeliveryList),
        BadRequest,
        (status = 404, description = "No such endpoint of the caller's (`webhook_not_found`)"),
    )
)]
async fn list_deliveries(
    State(app): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(WebhookPath { webhook_id }): Path<WebhookPath>,
    ApiQuery(query): ApiQuery<DeliveryQuery>,
) -> Result<axum::Json<DeliveryList>, ApiError> {
    let limit = super::listing::page_limit(query.limit)?;
    let status = query.status.as_deref();
    if status.is_some_and(|s| !matches!(s, "pending" | "delivered" | "failed" | "skipped")) {
        return Err(ApiError::InvalidQuery(
            "`status` must be pending, delivered, failed or skipped".into(),
        ));
    }
    let hook = own(&app, &tenant, &webhook_id).await?;
    let deliveries = app
        .store
        .webhook_deliveries(&hook.id, status, limit)
        .await?;
    Ok(axum::Json(DeliveryList::whole(
        deliveries.into_iter().map(DeliveryView::of).collect(),
    )))
}

/// A message an endpoint is sent (OpenAI's webhook shape), signed with
/// the `webhook-id`, `webhook-timestamp` and `webhook-signature` headers.
#[derive(ToSchema)]
#[expect(dead_code, reason = "the OpenAPI document's schema of a message")]
struct WebhookMessage {
    /// The message's `webhook-id`: the same on every try.
    id: String,
    #[schema(pattern = "^event$")]
    object: String,
    /// The event's time, in seconds.
    created_at: i64,
    #[schema(inline)]
    r#type: EventType,
    data: WebhookData,
}

/// What a message says.
#[derive(ToSchema)]
#[expect(dead_code, reason = "the OpenAPI document's schema of a message")]
enum WebhookData {
    /// `turn.completed`, `turn.failed`, `turn.cancelled`.
    TurnEnded {
        session_id: String,
        turn_id: uuid::Uuid,
        status: String,
        /// `turn.completed`: the answer.
        text: Option<String>,
        stop_reason: Option<String>,
        /// `turn.failed`: its code and message.
        code: Option<String>,
        message: Option<String>,
        /// `turn.cancelled`: why.
        reason: Option<String>,
    },
    /// `turn.waiting`: a call waits for a person or the client.
    TurnWaiting {
        session_id: String,
        turn_id: uuid::Uuid,
        #[schema(pattern = "^(approval|client_tool)$")]
        waiting_for: String,
        call_id: String,
        tool: String,
        arguments: serde_json::Value,
        /// When the wait ends unanswered (`HARNESS_APPROVAL_TIMEOUT` after
        /// it began): the call then ends `timed_out`.
        expires_at: Option<chrono::DateTime<chrono::Utc>>,
        /// The native route that answers it: `method`, `path`, an example
        /// `body`.
        answer: serde_json::Value,
    },
    /// `response.*`: a background response ended.
    Response {
        /// `resp_…`
        id: String,
    },
}

/// The messages in the document's `webhooks`, one for each event type.
pub fn document(api: &mut utoipa::openapi::OpenApi) {
    use utoipa::{
        PartialSchema,
        openapi::{
            ContentBuilder, HttpMethod, PathItem, PathsBuilder, Ref, ResponseBuilder,
            path::{OperationBuilder, ParameterBuilder, ParameterIn},
            request_body::RequestBodyBuilder,
        },
    };
    let components = api.components.get_or_insert_with(Default::default);
    components
        .schemas
        .insert("WebhookMessage".into(), WebhookMessage::schema());
    components
        .schemas
        .insert("WebhookData".into(), WebhookData::schema());
    let header = |name: &str, description: &str| {
        ParameterBuilder::new()
            .name(name)
            .parameter_in(ParameterIn::Header)
            .required(utoipa::openapi::Required::True)
            .description(Some(description))
            .schema(Some(String::schema()))
            .build()
    };
    let mut paths = PathsBuilder::new();
    for event in EVENT_TYPES {
        let operation = OperationBuilder::new()
            .summary(Some(format!("`{event}`, POSTed to each endpoint that wants it")))
            .parameters(Some([
                header("webhook-id", "The message's id, the same on every try"),
                header("webhook-timestamp", "When this try was sent, in seconds"),
                header(
                    "webhook-signature",
                    "`v1,` and the base64 HMAC-SHA256 of `{id}.{timestamp}.{body}` (Standard Webhooks)",
                ),
            ]))
            .request_body(Some(
                RequestBodyBuilder::new()
                    .content(
                        "application/json",
                        ContentBuilder::new()
                            .schema(Some(Ref::from_schema_name("WebhookMessage")))
                            .build(),
                    )
                    .build(),
            ))
            .response(
                "2XX",
                ResponseBuilder::new()
                    .description("Taken; anything else is tried again")
                    .build(),
            )
            .build();
        paths = paths.path(event, PathItem::new(HttpMethod::Post, operation));
    }
    api.webhooks = Some(paths.build());
}
