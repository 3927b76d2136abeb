//! [`Webhooks`] on Postgres: plain sqlx, each call bounded by the call
//! timeout; replicas claim without waiting on each other (`SKIP LOCKED`).

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{DeliveryOutcome, HeldDelivery, OPERATOR_WEBHOOK_ID, Webhook, Webhooks};
use crate::store::{Result, postgres::PostgresStore, reader::args};

#[async_trait]
impl Webhooks for PostgresStore {
    async fn create_webhook(&self, hook: &Webhook, most: u32) -> Result<bool> {
        // One statement: inserted only while the tenant holds fewer.
        let sql = "INSERT INTO webhooks (id, tenant, url, events, secret, created_at) \
                   SELECT $1, $2, $3, $4, $5, $6 \
                   WHERE (SELECT COUNT(*) FROM webhooks WHERE tenant = $2) < $7";
        let written = self
            .execute(
                sql,
                args![
                    hook.id.as_str(),
                    hook.tenant.as_str(),
                    hook.url.as_str(),
                    hook.events.as_str(),
                    hook.secret.as_str(),
                    hook.created_at,
                    i64::from(most)
                ],
            )
            .await?;
        Ok(written > 0)
    }

    async fn delete_webhook(&self, tenant: &str, id: &str) -> Result<bool> {
        // The deliveries go with it (ON DELETE CASCADE).
        let sql = "DELETE FROM webhooks WHERE tenant = $1 AND id = $2";
        Ok(self.execute(sql, args![tenant, id]).await? > 0)
    }

    async fn put_operator_webhook(&self, hook: Option<&Webhook>) -> Result<()> {
        match hook {
            Some(hook) => {
                let sql = "INSERT INTO webhooks (id, tenant, url, events, secret, created_at) \
                           VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (id) DO UPDATE SET \
                           url = excluded.url, events = excluded.events, secret = excluded.secret";
                self.execute(
                    sql,
                    args![
                        hook.id.as_str(),
                        hook.tenant.as_str(),
                        hook.url.as_str(),
                        hook.events.as_str(),
                        hook.secret.as_str(),
                        hook.created_at
                    ],
                )
                .await?;
            }
            None => {
                let sql = "DELETE FROM webhooks WHERE id = $1";
                self.execute(sql, args![OPERATOR_WEBHOOK_ID]).await?;
            }
        }
        Ok(())
    }

    /// Round robin by tenant within each tenant's share (`Share`; the
    /// operator's endpoint a share of its own); the lease is checked again
    /// on the row it updates.
    async fn claim_webhook_deliveries(
        &self,
        owner: &str,
        now: DateTime<Utc>,
        lease_until: DateTime<Utc>,
        limit: u32,
        share: &crate::store::pushes::Share,
    ) -> Result<Vec<HeldDelivery>> {
        let sql = "UPDATE webhook_deliveries SET lease_owner = $1, lease_until = $2 \
                   WHERE status = 'pending' AND (lease_until IS NULL OR lease_until < $3) \
                   AND (webhook_id, id) IN (SELECT webhook_id, id FROM ( \
                     SELECT webhook_id, id, next_at, ROW_NUMBER() OVER (PARTITION BY share \
                       ORDER BY next_at, webhook_id, id) \
                       + COALESCE(($6::jsonb ->> share)::int8, 0) AS place \
                     FROM (SELECT webhook_id, id, next_at, CASE WHEN webhook_id = 'wh_operator' \
                       THEN '*' ELSE tenant END AS share FROM webhook_deliveries \
                       WHERE status = 'pending' AND next_at <= $3 \
                       AND (lease_until IS NULL OR lease_until < $3)) due) placed \
                   WHERE place <= $5 ORDER BY place, next_at LIMIT $4)";
        let busy = share.busy_json();
        let claimed = self
            .execute(
                sql,
                args![
                    owner,
                    lease_until,
                    now,
                    limit,
                    share.per_tenant(),
                    busy.as_str()
                ],
            )
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
        let sql = "UPDATE webhook_deliveries SET status = $4, attempts = $5, next_at = $6, \
                   last_status = $7, last_error = $8, delivered_at = $9, \
                   lease_owner = NULL, lease_until = NULL \
                   WHERE webhook_id = $1 AND id = $2 AND lease_owner = $3";
        let updated = self
            .execute(
                sql,
                args![
                    webhook_id,
                    id,
                    owner,
                    outcome.status,
                    outcome.attempts,
                    outcome.next_at,
                    outcome.last_status,
                    outcome.last_error.as_deref(),
                    outcome.delivered_at
                ],
            )
            .await?;
        Ok(updated > 0)
    }

    async fn release_webhook_deliveries(&self, owner: &str) -> Result<()> {
        let sql = "UPDATE webhook_deliveries SET lease_owner = NULL, lease_until = NULL \
                   WHERE substr(lease_owner, 1, length($1)) = $1";
        self.execute(sql, args![owner]).await?;
        Ok(())
    }
}
