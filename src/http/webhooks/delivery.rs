//! The delivery of webhook messages: every replica claims the deliveries
//! that are due (a lease, so that a replica that dies mid-delivery leaves
//! them to another), POSTs each signed (Standard Webhooks: `webhook-id`,
//! `webhook-timestamp`, `webhook-signature`), and records the try: a 2xx
//! delivers it; anything else, or no answer in 10 s, tries again after
//! 1 s doubling up to 10 min, with jitter, until it has been tried for
//! 25 h, when it is given up (`failed`: the dead letters).

use std::{sync::Arc, time::Duration};

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::{
    app::AppState,
    events::TurnEvent,
    protocols::{
        a2a::push::{
            delivery::{Leased, backoff, run_outbox, since},
            outbound_client, unreachable,
        },
        typed,
    },
    store::{DeliveryOutcome, HeldDelivery, OPERATOR_WEBHOOK_ID, Webhook, pushes::Share},
    turn::StopReason,
};

/// How long a replica holds the deliveries it took.
const LEASE: Duration = Duration::from_secs(30);
/// A delivery's wait for its answer.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a failing delivery is tried before it is given up.
pub const GIVE_UP_AFTER: Duration = Duration::from_secs(25 * 3600);

/// Makes the operator's endpoint what the settings say (or removes it).
pub async fn put_operator(app: &AppState) -> Result<(), crate::store::StoreError> {
    let server = &app.settings.server;
    let hook = match (&server.webhook_url, &server.webhook_secret) {
        (Some(url), Some(secret)) => Some(Webhook {
            id: OPERATOR_WEBHOOK_ID.to_owned(),
            tenant: crate::store::webhooks::OPERATOR_TENANT.to_owned(),
            url: url.as_str().to_owned(),
            events: serde_json::to_string(&super::EVENT_TYPES).unwrap_or_default(),
            secret: secret.expose().to_owned(),
            created_at: Utc::now(),
        }),
        _ => None,
    };
    app.store.put_operator_webhook(hook.as_ref()).await
}

/// Delivers webhook messages until `stop`: this replica's part.
pub async fn deliver(app: AppState, stop: CancellationToken) {
    if let Err(e) = put_operator(&app).await {
        tracing::error!(error = %e, "webhooks: the operator's endpoint was not saved");
    }
    let Some(client) = http_client(&app) else {
        return;
    };
    let owner = format!("{}:{}", app.settings.server.instance_id, Uuid::now_v7());
    run_outbox(Arc::new(Sender { app, client }), owner, None, stop).await;
}

#[async_trait::async_trait]
impl Leased for Sender {
    type Item = HeldDelivery;

    fn tenant(item: &HeldDelivery) -> String {
        crate::store::webhooks::share_key(&item.delivery).to_owned()
    }

    async fn claim(
        &self,
        claim: &str,
        now: DateTime<Utc>,
        free: usize,
        share: &Share,
    ) -> Vec<HeldDelivery> {
        Sender::claim(self, claim, now, free, share).await
    }

    async fn put_back(&self, claim: &str, item: HeldDelivery, next_at: DateTime<Utc>) {
        self.record(claim, &item, &unchanged(&item, next_at)).await;
    }

    async fn deliver(&self, claim: &str, item: HeldDelivery) {
        let outcome = self.send(&item).await;
        self.record(claim, &item, &outcome).await;
    }

    async fn release(&self, owner: &str) {
        if let Err(e) = self.app.store.release_webhook_deliveries(owner).await {
            tracing::warn!(error = %e, "webhooks: leases not given back; they run out");
        }
    }
}

/// The client messages go out with (the pushes' own: no proxy, no
/// redirects, the outbound guard), and the service's name.
fn http_client(app: &AppState) -> Option<reqwest::Client> {
    let client = outbound_client(&app.protocols, SEND_TIMEOUT)
        .user_agent(concat!("agent-harness/", env!("CARGO_PKG_VERSION")));
    match client.build() {
        Ok(client) => Some(client),
        Err(e) => {
            tracing::error!(error = %e, "webhooks cannot be sent: no HTTP client");
            None
        }
    }
}

/// A delivery given back as it was, tried again at `next_at`.
fn unchanged(held: &HeldDelivery, next_at: DateTime<Utc>) -> DeliveryOutcome {
    let d = &held.delivery;
    DeliveryOutcome {
        status: "pending",
        attempts: d.attempts,
        next_at,
        last_status: d.last_status,
        last_error: d.last_error.clone(),
        delivered_at: None,
    }
}

/// A delivery after a try that did not deliver: tried again with backoff
/// and jitter, until it has been tried for [`GIVE_UP_AFTER`].
fn retried(held: &HeldDelivery, status: Option<i64>, error: String) -> DeliveryOutcome {
    let now = Utc::now();
    let attempts = held.delivery.attempts.saturating_add(1);
    let given_up = now - held.delivery.created_at >= since(GIVE_UP_AFTER);
    let wait = backoff(u32::try_from(attempts).unwrap_or(u32::MAX));
    // Up to a quarter more, so that the retries of many do not come
    // together.
    let jitter = wait.num_milliseconds() / 4 * i64::from(Uuid::new_v4().as_bytes()[0]) / 255;
    DeliveryOutcome {
        status: if given_up { "failed" } else { "pending" },
        attempts,
        next_at: now + wait + chrono::Duration::milliseconds(jitter),
        last_status: status,
        last_error: Some(error),
        delivered_at: None,
    }
}

struct Sender {
    app: AppState,
    client: reqwest::Client,
}

impl Sender {
    async fn claim(
        &self,
        claim: &str,
        now: DateTime<Utc>,
        free: usize,
        share: &Share,
    ) -> Vec<HeldDelivery> {
        match self.app.store.webhook_deliveries_due(now).await {
            Ok(true) => {}
            Ok(false) => return Vec::new(),
            Err(e) => {
                tracing::warn!(error = %e, "webhooks: the due ones cannot be read");
                return Vec::new();
            }
        }
        let limit = u32::try_from(free).unwrap_or(u32::MAX);
        let until = now + since(LEASE);
        match self
            .app
            .store
            .claim_webhook_deliveries(claim, now, until, limit, share)
            .await
        {
            Ok(held) => held,
            Err(e) => {
                tracing::warn!(error = %e, "webhooks: the due ones cannot be taken");
                Vec::new()
            }
        }
    }

    async fn record(&self, claim: &str, held: &HeldDelivery, outcome: &DeliveryOutcome) {
        let d = &held.delivery;
        let recorded = self
            .app
            .store
            .record_webhook_delivery(&d.webhook_id, &d.id, claim, outcome)
            .await;
        if let Err(e) = recorded {
            tracing::warn!(webhook = %d.webhook_id, message = %d.id, error = %e, "webhooks: a try was not recorded");
        }
    }

    /// One try of one delivery.
    async fn send(&self, held: &HeldDelivery) -> DeliveryOutcome {
        let d = &held.delivery;
        let message = match self.message(held).await {
            Ok(Some(message)) => message,
            // The event is gone (its session was deleted), or the
            // endpoint does not want what it turned out to be.
            Ok(None) => {
                return DeliveryOutcome {
                    status: "skipped",
                    ..unchanged(held, Utc::now())
                };
            }
            Err(e) => return retried(held, None, format!("the event cannot be read: {e}")),
        };
        let body = message.to_string();
        let timestamp = Utc::now().timestamp();
        let Some(signature) = crate::signing::sign(&held.secret, &d.id, timestamp, body.as_bytes())
        else {
            return retried(held, None, "the endpoint's secret cannot sign".into());
        };
        if let Err(why) =
            crate::protocols::a2a::push::checked_outbound(&self.app.protocols, &held.url)
        {
            return retried(held, None, format!("the URL is refused: {why}"));
        }
        let sent = self
            .client
            .post(&held.url)
            .header("content-type", "application/json")
            .header("webhook-id", &d.id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(body)
            .send()
            .await;
        match sent {
            Ok(response) if response.status().is_success() => DeliveryOutcome {
                status: "delivered",
                attempts: d.attempts.saturating_add(1),
                next_at: Utc::now(),
                last_status: Some(i64::from(response.status().as_u16())),
                last_error: None,
                delivered_at: Some(Utc::now()),
            },
            Ok(response) => {
                let status = response.status();
                retried(
                    held,
                    Some(i64::from(status.as_u16())),
                    format!("the endpoint answered {status}"),
                )
            }
            Err(e) => retried(
                held,
                None,
                format!("the endpoint could not be reached: {}", unreachable(e)),
            ),
        }
    }

    /// The message of a delivery: `None` when its event is gone, or the
    /// endpoint does not want the type it turned out to be.
    async fn message(
        &self,
        held: &HeldDelivery,
    ) -> Result<Option<Value>, crate::store::StoreError> {
        let d = &held.delivery;
        let session = d.session();
        let events = self
            .app
            .store
            .list_events(&session, None, d.seq - 1, 1)
            .await?;
        let Some(stored) = events.into_iter().find(|e| e.seq == d.seq) else {
            return Ok(None);
        };
        let Some(event) = typed(&stored) else {
            return Ok(None);
        };
        let Some((kind, data)) = event_data(&d.kind, session.id(), stored.turn_id, event) else {
            return Ok(None);
        };
        let wanted: Vec<String> = serde_json::from_str(&held.events).unwrap_or_default();
        if !wanted.iter().any(|w| w == kind) {
            return Ok(None);
        }
        Ok(Some(json!({
            "id": d.id,
            "object": "event",
            "created_at": stored.created_at.timestamp(),
            "type": kind,
            "data": data,
        })))
    }
}

/// A message's type and data, from its event: `kind` `turn` is the
/// turn's own event, `response` a background response's end (OpenAI's
/// shape: the response's id).
fn event_data(
    kind: &str,
    session: &str,
    turn_id: Uuid,
    event: &TurnEvent,
) -> Option<(&'static str, Value)> {
    let turn = turn_id.to_string();
    if kind == "response" {
        let kind = match event {
            TurnEvent::TurnCompleted { result } if result.stop_reason == StopReason::Answer => {
                "response.completed"
            }
            TurnEvent::TurnCompleted { .. } => "response.incomplete",
            TurnEvent::TurnFailed { .. } => "response.failed",
            TurnEvent::TurnCancelled { .. } => "response.cancelled",
            _ => return None,
        };
        return Some((kind, json!({"id": format!("resp_{}", turn_id.simple())})));
    }
    let answer = |route: &str, body: Value| json!({"method": "POST", "path": route, "body": body});
    Some(match event {
        TurnEvent::TurnCompleted { result } => (
            "turn.completed",
            json!({"session_id": session, "turn_id": turn, "status": "completed",
                   "text": result.text, "stop_reason": result.stop_reason}),
        ),
        TurnEvent::TurnFailed { code, message, .. } => (
            "turn.failed",
            json!({"session_id": session, "turn_id": turn, "status": "failed",
                   "code": code, "message": message}),
        ),
        TurnEvent::TurnCancelled { reason } => (
            "turn.cancelled",
            json!({"session_id": session, "turn_id": turn, "status": "cancelled", "reason": reason}),
        ),
        TurnEvent::ApprovalRequested {
            call_id,
            tool,
            arguments,
            expires_at,
            ..
        }
        | TurnEvent::ToolRequested {
            call_id,
            tool,
            arguments,
            expires_at,
            ..
        } => {
            let (waiting_for, route, body) = match event {
                TurnEvent::ApprovalRequested { .. } => {
                    ("approval", "approvals", json!({"approve": true}))
                }
                _ => ("client_tool", "tool-results", json!({"output": "…"})),
            };
            (
                "turn.waiting",
                json!({"session_id": session, "turn_id": turn, "waiting_for": waiting_for,
                       "call_id": call_id, "tool": tool, "arguments": arguments,
                       "expires_at": expires_at,
                       "answer": answer(
                           &format!("/sessions/{session}/turns/{turn}/{route}/{call_id}"),
                           body)}),
            )
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::WebhookDelivery;

    fn held(created_at: DateTime<Utc>, attempts: i64) -> HeldDelivery {
        HeldDelivery {
            delivery: WebhookDelivery {
                id: "msg_1".into(),
                webhook_id: "wh_1".into(),
                tenant: "acme".into(),
                session_id: "acme/s1".into(),
                seq: 3,
                kind: "turn".into(),
                created_at,
                status: "pending".into(),
                attempts,
                next_at: created_at,
                last_status: None,
                last_error: None,
                delivered_at: None,
            },
            url: "https://example.com/hook".into(),
            secret: crate::signing::new_secret(),
            events: "[\"turn.completed\"]".into(),
        }
    }

    #[test]
    fn a_failing_delivery_backs_off_with_jitter_and_is_given_up_after_a_day() {
        let now = Utc::now();
        let early = retried(&held(now, 3), Some(503), "503".into());
        assert_eq!((early.status, early.attempts), ("pending", 4));
        let wait = early.next_at - now;
        assert!(wait >= chrono::Duration::seconds(16), "{wait}");
        assert!(wait <= chrono::Duration::seconds(21), "{wait}");
        let late = retried(
            &held(now - chrono::Duration::hours(24), 30),
            None,
            "down".into(),
        );
        assert_eq!(late.status, "pending", "a day is not yet given up");
        assert!(late.next_at - Utc::now() <= chrono::Duration::seconds(751));
        let dead = retried(
            &held(now - chrono::Duration::hours(26), 40),
            None,
            "down".into(),
        );
        assert_eq!(dead.status, "failed");
    }

    #[test]
    fn a_wait_says_how_to_answer_it() {
        let turn = Uuid::now_v7();
        let (kind, data) = event_data(
            "turn",
            "s1",
            turn,
            &TurnEvent::ApprovalRequested {
                step: 1,
                call_id: "call_1".into(),
                tool: "write_note".into(),
                arguments: json!({"path": "a.md"}),
                expires_at: None,
            },
        )
        .unwrap();
        assert_eq!(kind, "turn.waiting");
        assert_eq!(
            data["answer"]["path"],
            format!("/sessions/s1/turns/{turn}/approvals/call_1")
        );
        let (kind, data) = event_data(
            "response",
            "s1",
            turn,
            &TurnEvent::TurnCancelled {
                reason: "user".into(),
            },
        )
        .unwrap();
        assert_eq!(kind, "response.cancelled");
        assert_eq!(data["id"], format!("resp_{}", turn.simple()));
    }
}
