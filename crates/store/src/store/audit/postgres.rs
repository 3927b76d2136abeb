//! [`Audit`] on Postgres: plain sqlx, each call bounded by the call
//! timeout.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{AUTH_FAILURE, Audit, AuditEntry, TRIM, insert_of, minute_of};
use crate::store::{Result, postgres::PostgresStore, reader::args};

#[async_trait]
impl Audit for PostgresStore {
    async fn audit(&self, entry: &AuditEntry, at: DateTime<Utc>) -> Result<()> {
        let (sql, at) = insert_of(entry, at);
        let args = args![
            at,
            entry.tenant.as_str(),
            entry.kind,
            entry.actor.as_str(),
            entry.subject.as_deref(),
            entry.outcome.as_deref()
        ];
        self.execute(sql, args).await?;
        Ok(())
    }

    async fn audit_auth_failure(&self, address: &str, at: DateTime<Utc>) -> Result<()> {
        self.execute(AUTH_FAILURE, args![minute_of(at), address])
            .await?;
        Ok(())
    }

    async fn trim_audit(&self, before: DateTime<Utc>, limit: u32) -> Result<u64> {
        self.execute(TRIM, args![before, limit]).await
    }
}
