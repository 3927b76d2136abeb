//! [`Webhooks`] on Postgres: plain sqlx, each call bounded by the call
//! timeout.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{DeliveryOutcome, OPERATOR_WEBHOOK_ID, Route, Webhook, Webhooks};
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
}

/// Writes the deliveries of `routes` in the transaction that logs their
/// events (one statement): one for each endpoint that wants each, for an
/// event the log holds now (a batch's event of a turn whose lease was
/// lost, or whose finish did not apply, is not written, and makes none).
pub(in crate::store) async fn insert_deliveries<'c, E>(
    executor: E,
    routes: &[Route<'_>],
) -> Result<()>
where
    E: sqlx::Executor<'c, Database = sqlx::Postgres>,
{
    let message: Vec<&str> = routes.iter().map(|r| r.message.as_str()).collect();
    let tenant: Vec<&str> = routes.iter().map(|r| r.tenant).collect();
    let session: Vec<&str> = routes.iter().map(|r| r.event.session_id.as_str()).collect();
    let seq: Vec<i64> = routes.iter().map(|r| r.event.seq).collect();
    let turn: Vec<String> = routes.iter().map(|r| r.event.turn_id.to_string()).collect();
    let kind: Vec<&str> = routes.iter().map(|r| r.kind).collect();
    let at: Vec<DateTime<Utc>> = routes.iter().map(|r| r.event.created_at).collect();
    let wanted: Vec<&str> = routes.iter().map(|r| r.wanted).collect();
    sqlx::query(
        "INSERT INTO webhook_deliveries (id, webhook_id, tenant, session_id, seq, kind, \
         created_at, next_at, share_key) \
         SELECT r.id, w.id, r.tenant, r.session_id, r.seq, r.kind, r.created_at, r.created_at, \
           CASE WHEN w.tenant = '*' THEN '*' ELSE r.tenant END \
         FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[], $5::text[], $6::text[], \
           $7::timestamptz[], $8::text[]) \
           AS r(id, tenant, session_id, seq, turn_id, kind, created_at, wanted) \
         JOIN events x ON x.session_id = r.session_id AND x.seq = r.seq AND x.turn_id = r.turn_id \
         JOIN webhooks w ON (w.tenant = '*' OR w.tenant = r.tenant) \
           AND position(r.wanted IN w.events) > 0 \
         ON CONFLICT DO NOTHING",
    )
    .bind(message)
    .bind(tenant)
    .bind(session)
    .bind(seq)
    .bind(turn)
    .bind(kind)
    .bind(at)
    .bind(wanted)
    .execute(executor)
    .await?;
    Ok(())
}
