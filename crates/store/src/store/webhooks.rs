//! Webhook endpoints and their deliveries. The deliveries are an outbox:
//! the event log writes them in the transaction that logs the event they
//! say ([`routes`] says which messages an event makes; each backend's
//! commit matches them with the endpoints that want them), one for each
//! endpoint; each keeps its tries, when to try next, and which replica
//! holds it (a lease that runs out: a replica that dies mid-delivery
//! leaves it to another; see [`super::leases`]).
//!
//! The reads are written once here; each backend's writes stand side by
//! side in `webhooks/sqlite.rs` and `webhooks/postgres.rs`.

pub(super) mod postgres;
pub(super) mod sqlite;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::reader::args;
use crate::{
    events::StoredEvent,
    ids::{SessionKey, tenant_of},
    store::Result,
};

/// The operator's endpoint (`HARNESS_WEBHOOK_URL`): every tenant's events.
pub const OPERATOR_WEBHOOK_ID: &str = "wh_operator";
/// The tenant of the operator's endpoint.
pub const OPERATOR_TENANT: &str = "*";

/// The share key of a delivery (see [`super::pushes::Share`]): the
/// operator's endpoint its own (`*`), else the event's tenant, as the
/// claim statements say it.
pub fn share_key(delivery: &WebhookDelivery) -> &str {
    if delivery.webhook_id == OPERATOR_WEBHOOK_ID {
        OPERATOR_TENANT
    } else {
        &delivery.tenant
    }
}

/// A message an event makes, for every endpoint of its tenant (and the
/// operator's) whose `events` hold [`Route::wanted`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route<'a> {
    /// The message's `webhook-id`: the same on every try, and on a
    /// commit tried again (a delivery is written once).
    pub message: String,
    pub tenant: &'a str,
    pub event: &'a StoredEvent,
    /// `turn` (the event's own type) or `response` (a background
    /// response's end).
    pub kind: &'static str,
    /// What an endpoint's `events` (a JSON array) holds when it wants the
    /// message: its type, quoted, or the `"response.` that begins every
    /// response type.
    pub wanted: &'static str,
}

/// The messages `event` makes: its own, when its type is one an endpoint
/// may want (an approval's or a client tool's request is `turn.waiting`),
/// and at the end of a background turn (a response created with
/// `background`), the response's.
pub fn routes(event: &StoredEvent, background: bool) -> impl Iterator<Item = Route<'_>> {
    let (wanted, end) = match event.event_type.as_str() {
        "turn.completed" => ("\"turn.completed\"", true),
        "turn.failed" => ("\"turn.failed\"", true),
        "turn.cancelled" => ("\"turn.cancelled\"", true),
        "approval.requested" | "tool.requested" => ("\"turn.waiting\"", false),
        _ => ("", false),
    };
    // Most events make none: nothing is written for them.
    let message = || format!("msg_{}_{}", event.turn_id.simple(), event.seq);
    let route = |message: String, kind, wanted| Route {
        message,
        tenant: tenant_of(&event.session_id),
        event,
        kind,
        wanted,
    };
    let response = (end && background)
        .then(|| route(format!("{}_response", message()), "response", "\"response."));
    (!wanted.is_empty())
        .then(|| route(message(), "turn", wanted))
        .into_iter()
        .chain(response)
}

/// An endpoint, as it was registered.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Webhook {
    pub id: String,
    pub tenant: String,
    pub url: String,
    /// The event types wanted, a JSON array.
    pub events: String,
    /// `whsec_` and the key, base64.
    pub secret: String,
    pub created_at: DateTime<Utc>,
}

/// One message to one endpoint, and how its delivery stands.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct WebhookDelivery {
    /// The message's `webhook-id`.
    pub id: String,
    pub webhook_id: String,
    pub tenant: String,
    pub session_id: String,
    pub seq: i64,
    /// `turn` (the event's own type) or `response` (a background
    /// response's end).
    pub kind: String,
    pub created_at: DateTime<Utc>,
    /// `pending`, `delivered`, `failed` (given up) or `skipped`.
    pub status: String,
    pub attempts: i64,
    pub next_at: DateTime<Utc>,
    pub last_status: Option<i64>,
    pub last_error: Option<String>,
    pub delivered_at: Option<DateTime<Utc>>,
}

impl WebhookDelivery {
    pub fn session(&self) -> SessionKey {
        SessionKey::from_stored(&self.session_id)
    }
}

/// A delivery a replica holds, with its endpoint.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct HeldDelivery {
    #[sqlx(flatten)]
    pub delivery: WebhookDelivery,
    pub url: String,
    pub secret: String,
    pub events: String,
}

/// A delivery after a try.
#[derive(Debug, Clone)]
pub struct DeliveryOutcome {
    pub status: &'static str,
    pub attempts: i64,
    pub next_at: DateTime<Utc>,
    pub last_status: Option<i64>,
    pub last_error: Option<String>,
    pub delivered_at: Option<DateTime<Utc>>,
}

const DELIVERY_COLUMNS: &str = "d.id, d.webhook_id, d.tenant, d.session_id, d.seq, d.kind, \
     d.created_at, d.status, d.attempts, d.next_at, d.last_status, d.last_error, d.delivered_at";

/// Webhook endpoints and their deliveries.
#[async_trait]
pub trait Webhooks: super::Leases + Send + Sync + 'static {
    /// Registers an endpoint; false: its tenant has `most` already.
    async fn create_webhook(&self, hook: &Webhook, most: u32) -> Result<bool>;

    /// Deletes a tenant's endpoint and its deliveries; false when there
    /// was none.
    async fn delete_webhook(&self, tenant: &str, id: &str) -> Result<bool>;

    /// Makes the operator's endpoint `hook` (or removes it): its
    /// deliveries go on when only the URL or secret changed.
    async fn put_operator_webhook(&self, hook: Option<&Webhook>) -> Result<()>;

    /// Records a try, if `owner` still holds the delivery (its lease is
    /// given back). False: the lease was lost, or the endpoint is gone.
    async fn record_webhook_delivery(
        &self,
        webhook_id: &str,
        id: &str,
        owner: &str,
        outcome: &DeliveryOutcome,
    ) -> Result<bool>;

    /// A tenant's endpoints, oldest first.
    async fn webhooks(&self, tenant: &str) -> Result<Vec<Webhook>> {
        let sql = "SELECT id, tenant, url, events, secret, created_at FROM webhooks \
                   WHERE tenant = $1 ORDER BY created_at, id LIMIT 100";
        self.reader().rows(sql, args![tenant]).await
    }

    /// One of a tenant's endpoints.
    async fn webhook(&self, tenant: &str, id: &str) -> Result<Option<Webhook>> {
        let sql = "SELECT id, tenant, url, events, secret, created_at FROM webhooks \
                   WHERE tenant = $1 AND id = $2";
        self.reader().row(sql, args![tenant, id]).await
    }

    /// An endpoint's deliveries, newest first, at most `limit`, of one
    /// status when `status` is given.
    async fn webhook_deliveries(
        &self,
        webhook_id: &str,
        status: Option<&str>,
        limit: u32,
    ) -> Result<Vec<WebhookDelivery>> {
        let sql = format!(
            "SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries d WHERE d.webhook_id = $1 \
             AND ($2 IS NULL OR d.status = $2) ORDER BY d.created_at DESC, d.id DESC LIMIT $3"
        );
        self.reader()
            .rows(sqlx::AssertSqlSafe(sql), args![webhook_id, status, limit])
            .await
    }

    /// The deliveries `owner` holds (what a claim took), with their
    /// endpoints.
    async fn held_webhook_deliveries(&self, owner: &str) -> Result<Vec<HeldDelivery>> {
        let sql = format!(
            "SELECT {DELIVERY_COLUMNS}, w.url, w.secret, w.events FROM webhook_deliveries d \
             JOIN webhooks w ON w.id = d.webhook_id \
             WHERE d.lease_owner = $1 AND d.status = 'pending' ORDER BY d.created_at, d.seq"
        );
        self.reader()
            .rows(sqlx::AssertSqlSafe(sql), args![owner])
            .await
    }
}
