//! [`Leases`] on SQLite: each write is one job on the writer thread.

use async_trait::async_trait;
use rusqlite::params;

use super::{Claim, Leases, Queue, Share, per_queue};
use crate::store::{
    Result,
    sqlite::{SqliteStore, writer::ts},
};

macro_rules! claim_sql {
    ($table:literal, $key:literal, $open:literal) => {
        concat!(
            "UPDATE ",
            $table,
            " SET lease_owner = ?1, lease_until = ?2 \
             WHERE rowid IN (SELECT rowid FROM ( \
               SELECT rowid, next_at, ROW_NUMBER() OVER (PARTITION BY share_key \
                 ORDER BY next_at, rowid) + COALESCE((SELECT j.value \
                 FROM json_each(?6) j WHERE j.key = share_key), 0) AS place \
               FROM ",
            $table,
            " WHERE ",
            $open,
            " AND next_at <= ?3 \
               AND (lease_until IS NULL OR lease_until < ?3)) \
             WHERE place <= ?5 ORDER BY place, next_at LIMIT ?4)"
        )
    };
}

macro_rules! release_sql {
    ($table:literal, $key:literal, $open:literal) => {
        concat!(
            "UPDATE ",
            $table,
            " SET lease_owner = NULL, lease_until = NULL \
             WHERE substr(lease_owner, 1, length(?1)) = ?1"
        )
    };
}

#[async_trait]
impl Leases for SqliteStore {
    /// Round robin by tenant within each tenant's share.
    async fn claim(&self, queue: Queue, claim: Claim<'_>, share: &Share) -> Result<u64> {
        let sql = per_queue!(queue, claim_sql);
        let owner = claim.owner.to_owned();
        let (until, now, limit) = (ts(claim.until), ts(claim.now), claim.limit);
        let (per_tenant, busy) = (share.per_tenant(), share.busy_json());
        self.writes
            .run(move |connection| {
                let claimed = connection
                    .prepare_cached(sql)?
                    .execute(params![owner, until, now, limit, per_tenant, busy])?;
                Ok(claimed as u64)
            })
            .await
    }

    async fn release(&self, queue: Queue, owner: &str) -> Result<()> {
        let sql = per_queue!(queue, release_sql);
        let owner = owner.to_owned();
        self.writes
            .run(move |connection| {
                connection.prepare_cached(sql)?.execute(params![owner])?;
                Ok(())
            })
            .await
    }
}
