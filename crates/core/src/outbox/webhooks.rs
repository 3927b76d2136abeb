//! Webhook messages: each delivery is POSTed signed as Standard Webhooks
//! say (`webhook-id`, `webhook-timestamp`, `webhook-signature`), and its
//! try recorded: a 2xx delivers it; anything else, or no answer in 10 s,
//! is tried again after the outbox's backoff, until it has been tried
//! for 25 h, when it is given up (`failed`: the dead letters).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{Deliveries, Outbound, retry_after, unreachable};
use crate::{
    events::TurnEvent,
    store::{DeliveryOutcome, HeldDelivery, Queue, Store, StoreError},
    turn::StopReason,
};

/// Delivers webhook messages until `stop`: this replica's part.
/// `trust`: which addresses deliveries may reach, which roots they trust.
pub async fn deliver(
    store: Arc<dyn Store>,
    instance: &str,
    trust: &crate::outbox::Trust,
    stop: CancellationToken,
) {
    let outbound = match Outbound::new(trust) {
        Ok(outbound) => outbound,
        Err(e) => {
            tracing::error!(error = %e, "webhooks cannot be sent: no HTTP client");
            return;
        }
    };
    let owner = format!("{instance}:{}", Uuid::now_v7());
    let sender = Arc::new(Sender {
        store: store.clone(),
        outbound,
    });
    super::run(store, sender, owner, None, stop).await;
}

struct Sender {
    store: Arc<dyn Store>,
    outbound: Outbound,
}

#[async_trait::async_trait]
impl Deliveries for Sender {
    type Item = HeldDelivery;
    const QUEUE: Queue = Queue::Webhooks;

    fn share_key(item: &HeldDelivery) -> &str {
        crate::store::webhooks::share_key(&item.delivery)
    }

    async fn held(&self, claim: &str) -> Result<Vec<HeldDelivery>, StoreError> {
        self.store.held_webhook_deliveries(claim).await
    }

    async fn put_back(&self, claim: &str, item: HeldDelivery, next_at: DateTime<Utc>) {
        self.record(claim, &item, &unchanged(&item, next_at)).await;
    }

    async fn deliver(&self, claim: &str, item: HeldDelivery) {
        let outcome = self.send(&item).await;
        self.record(claim, &item, &outcome).await;
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

/// A delivery after a try that did not deliver: tried again after the
/// outbox's backoff, until it has been tried for
/// [`super::GIVE_UP_AFTER`].
fn retried(held: &HeldDelivery, status: Option<i64>, error: String) -> DeliveryOutcome {
    let attempts = held.delivery.attempts.saturating_add(1);
    let (next_at, given_up) = retry_after(
        u32::try_from(attempts).unwrap_or(u32::MAX),
        held.delivery.created_at,
        Utc::now(),
    );
    DeliveryOutcome {
        status: if given_up { "failed" } else { "pending" },
        attempts,
        next_at,
        last_status: status,
        last_error: Some(error),
        delivered_at: None,
    }
}

impl Sender {
    async fn record(&self, claim: &str, held: &HeldDelivery, outcome: &DeliveryOutcome) {
        let d = &held.delivery;
        let recorded = self
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
        let url = match self.outbound.checked(&held.url) {
            Ok(url) => url,
            Err(why) => return retried(held, None, format!("the URL is refused: {why}")),
        };
        let sent = self
            .outbound
            .client
            .post(url)
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
    async fn message(&self, held: &HeldDelivery) -> Result<Option<Value>, StoreError> {
        let d = &held.delivery;
        let session = d.session();
        let events = self.store.list_events(&session, None, d.seq - 1, 1).await?;
        let Some(stored) = events.into_iter().find(|e| e.seq == d.seq) else {
            return Ok(None);
        };
        let Some(event) = stored.event() else {
            tracing::warn!(
                seq = stored.seq,
                "webhooks: an event this build cannot read is not sent"
            );
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
        // The fourth try failed: 8 s, jittered to between 4 and 8.
        let wait = early.next_at - now;
        assert!(wait >= chrono::Duration::seconds(4), "{wait}");
        assert!(wait <= chrono::Duration::seconds(9), "{wait}");
        let late = retried(
            &held(now - chrono::Duration::hours(24), 30),
            None,
            "down".into(),
        );
        assert_eq!(late.status, "pending", "a day is not yet given up");
        assert!(late.next_at - Utc::now() <= chrono::Duration::seconds(601));
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
