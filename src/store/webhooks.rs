//! Webhook endpoints and their deliveries. The deliveries are the
//! outbox: the database writes them (a trigger on `events`) in the
//! transaction that logs the event they say, one for each endpoint that
//! wants it; each keeps its tries, when to try next, and which replica
//! holds it (a lease that runs out: a replica that dies mid-delivery
//! leaves it to another).
//!
//! The reads are written once here; each backend's writes stand side by
//! side in `webhooks/sqlite.rs` and `webhooks/postgres.rs`.

mod postgres;
mod sqlite;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::reader::{Reads, args};
use crate::{ids::SessionKey, store::Result};

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
pub trait Webhooks: Reads + Send + Sync + 'static {
    /// Registers an endpoint; false: its tenant has `most` already.
    async fn create_webhook(&self, hook: &Webhook, most: u32) -> Result<bool>;

    /// Deletes a tenant's endpoint and its deliveries; false when there
    /// was none.
    async fn delete_webhook(&self, tenant: &str, id: &str) -> Result<bool>;

    /// Makes the operator's endpoint `hook` (or removes it): its
    /// deliveries go on when only the URL or secret changed.
    async fn put_operator_webhook(&self, hook: Option<&Webhook>) -> Result<()>;

    /// Takes up to `limit` deliveries that are due and held by no live
    /// lease, for `owner` until `lease_until`.
    async fn claim_webhook_deliveries(
        &self,
        owner: &str,
        now: DateTime<Utc>,
        lease_until: DateTime<Utc>,
        limit: u32,
        share: &super::pushes::Share,
    ) -> Result<Vec<HeldDelivery>>;

    /// Records a try, if `owner` still holds the delivery (its lease is
    /// given back). False: the lease was lost, or the endpoint is gone.
    async fn record_webhook_delivery(
        &self,
        webhook_id: &str,
        id: &str,
        owner: &str,
        outcome: &DeliveryOutcome,
    ) -> Result<bool>;

    /// Gives up every lease held by `owner` or an owner it begins.
    async fn release_webhook_deliveries(&self, owner: &str) -> Result<()>;

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

    /// Whether any delivery is due and free: a read, so that an idle
    /// replica's look costs no write.
    async fn webhook_deliveries_due(&self, now: DateTime<Utc>) -> Result<bool> {
        let sql = "SELECT COUNT(*) FROM (SELECT 1 FROM webhook_deliveries \
                   WHERE status = 'pending' AND next_at <= $1 \
                   AND (lease_until IS NULL OR lease_until < $1) LIMIT 1) due";
        let (due,): (i64,) = self.reader().row(sql, args![now]).await?.unwrap_or((0,));
        Ok(due > 0)
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
