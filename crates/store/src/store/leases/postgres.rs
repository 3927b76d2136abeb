//! [`Leases`] on Postgres.

use async_trait::async_trait;

use super::{Claim, Leases, Queue, Share, per_queue};
use crate::store::{Result, postgres::PostgresStore, reader::args};

macro_rules! claim_sql {
    ($table:literal, $key:literal, $open:literal) => {
        concat!(
            "UPDATE ",
            $table,
            " SET lease_owner = $1, lease_until = $2 \
             WHERE ",
            $open,
            " AND (lease_until IS NULL OR lease_until < $3) \
             AND (",
            $key,
            ") IN (SELECT ",
            $key,
            " FROM ( \
               SELECT ",
            $key,
            ", next_at, ROW_NUMBER() OVER (PARTITION BY share_key \
                 ORDER BY next_at, ",
            $key,
            ") + COALESCE(($6::jsonb ->> share_key)::int8, 0) \
                 AS place \
               FROM ",
            $table,
            " WHERE ",
            $open,
            " AND next_at <= $3 \
               AND (lease_until IS NULL OR lease_until < $3)) due \
             WHERE place <= $5 ORDER BY place, next_at LIMIT $4)"
        )
    };
}

macro_rules! release_sql {
    ($table:literal, $key:literal, $open:literal) => {
        concat!(
            "UPDATE ",
            $table,
            " SET lease_owner = NULL, lease_until = NULL \
             WHERE substr(lease_owner, 1, length($1)) = $1"
        )
    };
}

#[async_trait]
impl Leases for PostgresStore {
    /// Round robin by tenant within each tenant's share.
    async fn claim(&self, queue: Queue, claim: Claim<'_>, share: &Share) -> Result<u64> {
        let busy = share.busy_json();
        self.execute(
            per_queue!(queue, claim_sql),
            args![
                claim.owner,
                claim.until,
                claim.now,
                claim.limit,
                share.per_tenant(),
                busy.as_str()
            ],
        )
        .await
    }

    async fn release(&self, queue: Queue, owner: &str) -> Result<()> {
        self.execute(per_queue!(queue, release_sql), args![owner])
            .await?;
        Ok(())
    }
}
