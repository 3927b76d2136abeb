//! [`Audit`] on SQLite: each write is one job on the writer thread.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rusqlite::params;

use super::{AUTH_FAILURE, Audit, AuditEntry, TRIM, insert_of, minute_of};
use crate::store::{
    Result,
    sqlite::{SqliteStore, writer::ts},
};

#[async_trait]
impl Audit for SqliteStore {
    async fn audit(&self, entry: &AuditEntry, at: DateTime<Utc>) -> Result<()> {
        let entry = entry.clone();
        let (sql, at) = insert_of(&entry, at);
        self.writes
            .run(move |connection| {
                connection.prepare_cached(sql)?.execute(params![
                    ts(at),
                    entry.tenant,
                    entry.kind,
                    entry.actor,
                    entry.subject,
                    entry.outcome
                ])?;
                Ok(())
            })
            .await
    }

    async fn audit_auth_failure(&self, address: &str, at: DateTime<Utc>) -> Result<()> {
        let address = address.to_owned();
        self.writes
            .run(move |connection| {
                connection
                    .prepare_cached(AUTH_FAILURE)?
                    .execute(params![ts(minute_of(at)), address])?;
                Ok(())
            })
            .await
    }

    async fn trim_audit(&self, before: DateTime<Utc>, limit: u32) -> Result<u64> {
        self.writes
            .run(move |connection| {
                let trimmed = connection
                    .prepare_cached(TRIM)?
                    .execute(params![ts(before), limit])?;
                Ok(u64::try_from(trimmed).unwrap_or(u64::MAX))
            })
            .await
    }
}
