//! [`Webhooks`] on SQLite: each write is one job on the writer thread.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rusqlite::params;

use super::{DeliveryOutcome, HeldDelivery, OPERATOR_WEBHOOK_ID, Webhook, Webhooks};
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

    /// Round robin by tenant within each tenant's share (`Share`; the
    /// operator's endpoint a share of its own).
    async fn claim_webhook_deliveries(
        &self,
        owner: &str,
        now: DateTime<Utc>,
        lease_until: DateTime<Utc>,
        limit: u32,
        share: &crate::store::pushes::Share,
    ) -> Result<Vec<HeldDelivery>> {
        let owned = owner.to_owned();
        let (per_tenant, busy) = (share.per_tenant(), share.busy_json());
        let claimed = self
            .writes
            .run(move |connection| {
                let claimed = connection
                    .prepare_cached(
                        "UPDATE webhook_deliveries SET lease_owner = ?1, lease_until = ?2 \
                         WHERE rowid IN (SELECT rowid FROM ( \
                           SELECT rowid, next_at, ROW_NUMBER() OVER (PARTITION BY share \
                             ORDER BY next_at, rowid) + COALESCE((SELECT j.value \
                             FROM json_each(?6) j WHERE j.key = share), 0) AS place \
                           FROM (SELECT rowid, next_at, CASE WHEN webhook_id = 'wh_operator' \
                             THEN '*' ELSE tenant END AS share FROM webhook_deliveries \
                             WHERE status = 'pending' AND next_at <= ?3 \
                             AND (lease_until IS NULL OR lease_until < ?3))) \
                         WHERE place <= ?5 ORDER BY place, next_at LIMIT ?4)",
                    )?
                    .execute(params![
                        owned,
                        ts(lease_until),
                        ts(now),
                        limit,
                        per_tenant,
                        busy
                    ])?;
                Ok(claimed)
            })
            .await?;
        if claimed == 0 {
            return Ok(Vec::new());
        }
        self.held_webhook_deliveries(owner).await
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

    async fn release_webhook_deliveries(&self, owner: &str) -> Result<()> {
        let owner = owner.to_owned();
        self.writes
            .run(move |connection| {
                connection
                    .prepare_cached(
                        "UPDATE webhook_deliveries SET lease_owner = NULL, lease_until = NULL \
                         WHERE substr(lease_owner, 1, length(?1)) = ?1",
                    )?
                    .execute(params![owner])?;
                Ok(())
            })
            .await
    }
}
