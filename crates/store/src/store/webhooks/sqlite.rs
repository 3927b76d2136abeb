//! [`Webhooks`] on SQLite: each write is one job on the writer thread.

use async_trait::async_trait;
use rusqlite::{Connection, params};

use super::{DeliveryOutcome, OPERATOR_WEBHOOK_ID, Route, Webhook, Webhooks};
use crate::store::{
    Result,
    sqlite::{SqliteStore, writer::ts},
};

#[async_trait]
impl Webhooks for SqliteStore {
    async fn create_webhook(&self, hook: &Webhook, most: u32) -> Result<bool> {
        let hook = hook.clone();
        self.writes
            .run(move |connection| {
                let held: i64 = connection
                    .prepare_cached("SELECT COUNT(*) FROM webhooks WHERE tenant = ?1")?
                    .query_row(params![hook.tenant], |row| row.get(0))?;
                if held >= i64::from(most) {
                    return Ok(false);
                }
                connection
                    .prepare_cached(
                        "INSERT INTO webhooks (id, tenant, url, events, secret, created_at) \
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    )?
                    .execute(params![
                        hook.id,
                        hook.tenant,
                        hook.url,
                        hook.events,
                        hook.secret,
                        ts(hook.created_at)
                    ])?;
                Ok(true)
            })
            .await
    }

    async fn delete_webhook(&self, tenant: &str, id: &str) -> Result<bool> {
        let (tenant, id) = (tenant.to_owned(), id.to_owned());
        self.writes
            .run(move |connection| {
                connection
                    .prepare_cached(
                        "DELETE FROM webhook_deliveries WHERE webhook_id = ?2 \
                         AND EXISTS (SELECT 1 FROM webhooks WHERE id = ?2 AND tenant = ?1)",
                    )?
                    .execute(params![tenant, id])?;
                let deleted = connection
                    .prepare_cached("DELETE FROM webhooks WHERE tenant = ?1 AND id = ?2")?
                    .execute(params![tenant, id])?;
                Ok(deleted > 0)
            })
            .await
    }

    async fn put_operator_webhook(&self, hook: Option<&Webhook>) -> Result<()> {
        let hook = hook.cloned();
        self.writes
            .run(move |connection| {
                match &hook {
                    Some(hook) => {
                        connection
                            .prepare_cached(
                                "INSERT INTO webhooks (id, tenant, url, events, secret, created_at) \
                                 VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (id) DO UPDATE SET \
                                 url = excluded.url, events = excluded.events, \
                                 secret = excluded.secret",
                            )?
                            .execute(params![
                                hook.id,
                                hook.tenant,
                                hook.url,
                                hook.events,
                                hook.secret,
                                ts(hook.created_at)
                            ])?;
                    }
                    None => {
                        connection
                            .prepare_cached("DELETE FROM webhook_deliveries WHERE webhook_id = ?1")?
                            .execute(params![OPERATOR_WEBHOOK_ID])?;
                        connection
                            .prepare_cached("DELETE FROM webhooks WHERE id = ?1")?
                            .execute(params![OPERATOR_WEBHOOK_ID])?;
                    }
                }
                Ok(())
            })
            .await
    }

    async fn record_webhook_delivery(
        &self,
        webhook_id: &str,
        id: &str,
        owner: &str,
        outcome: &DeliveryOutcome,
    ) -> Result<bool> {
        let (webhook_id, id, owner, outcome) = (
            webhook_id.to_owned(),
            id.to_owned(),
            owner.to_owned(),
            outcome.clone(),
        );
        self.writes
            .run(move |connection| {
                let updated = connection
                    .prepare_cached(
                        "UPDATE webhook_deliveries SET status = ?4, attempts = ?5, next_at = ?6, \
                         last_status = ?7, last_error = ?8, delivered_at = ?9, \
                         lease_owner = NULL, lease_until = NULL \
                         WHERE webhook_id = ?1 AND id = ?2 AND lease_owner = ?3",
                    )?
                    .execute(params![
                        webhook_id,
                        id,
                        owner,
                        outcome.status,
                        outcome.attempts,
                        ts(outcome.next_at),
                        outcome.last_status,
                        outcome.last_error,
                        outcome.delivered_at.map(ts)
                    ])?;
                Ok(updated > 0)
            })
            .await
    }
}

/// Writes the deliveries of `routes` in the writer's transaction (that
/// of their events): one for each endpoint that wants each.
pub(in crate::store) fn insert_deliveries<'a>(
    tx: &Connection,
    routes: impl Iterator<Item = Route<'a>>,
) -> Result<()> {
    for route in routes {
        tx.prepare_cached(
            "INSERT OR IGNORE INTO webhook_deliveries (id, webhook_id, tenant, session_id, seq, \
             kind, created_at, next_at, share_key) \
             SELECT ?1, w.id, ?2, ?3, ?4, ?5, ?6, ?6, CASE WHEN w.tenant = '*' THEN '*' ELSE ?2 END \
             FROM webhooks w WHERE (w.tenant = '*' OR w.tenant = ?2) AND instr(w.events, ?7) > 0",
        )?
        .execute(params![
            route.message,
            route.tenant,
            route.event.session_id,
            route.event.seq,
            route.kind,
            ts(route.event.created_at),
            route.wanted
        ])?;
    }
    Ok(())
}
