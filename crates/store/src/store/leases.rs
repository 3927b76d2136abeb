//! The queues replicas share by lease: A2A push configurations (a cursor
//! over a task's log each) and webhook deliveries (a message each). A
//! replica claims due rows for a while (`lease_owner`, `lease_until`),
//! delivers them and records each; a replica that dies leaves its rows
//! to the others when the lease runs out. One claim statement and one
//! release statement per backend serve both queues
//! (`leases/sqlite.rs`, `leases/postgres.rs`).

mod postgres;
mod sqlite;

use std::collections::BTreeMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::reader::{Reads, args};
use crate::store::Result;

/// A queue of leased rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queue {
    /// `push_configs`: open while not `done`.
    Pushes,
    /// `webhook_deliveries`: open while `pending`.
    Webhooks,
}

/// Writes a statement once for each queue: `$table`, `$key` (the
/// primary key's columns) and `$open` (a row still to deliver) filled in.
macro_rules! per_queue {
    ($queue:expr, $sql:ident) => {
        match $queue {
            Queue::Pushes => $sql!("push_configs", "task_id, id", "NOT done"),
            Queue::Webhooks => $sql!("webhook_deliveries", "webhook_id, id", "status = 'pending'"),
        }
    };
}
pub(super) use per_queue;

macro_rules! due_sql {
    ($table:literal, $key:literal, $open:literal) => {
        concat!(
            "SELECT COUNT(*) FROM (SELECT 1 FROM ",
            $table,
            " WHERE ",
            $open,
            " AND next_at <= $1 AND (lease_until IS NULL OR lease_until < $1) LIMIT 1) due"
        )
    };
}

/// How much of each tenant's due work one claim may take: up to
/// `per_tenant` a tenant, less what it has in flight already (`busy`),
/// taken round robin (every tenant's oldest first, then every tenant's
/// second, ...). So one tenant's backlog is never claimed ahead of
/// another's due work, and nothing is claimed that its tenant's share
/// would not let be sent. A row's tenant is its `share_key`, written with
/// it (`*` for the operator's webhook endpoint).
#[derive(Debug, Clone, Default)]
pub struct Share {
    pub per_tenant: u32,
    /// In flight now, by share key.
    pub busy: BTreeMap<String, u32>,
}

impl Share {
    /// No limit (a store test's claim).
    pub fn unlimited() -> Self {
        Self {
            per_tenant: u32::MAX,
            busy: BTreeMap::new(),
        }
    }

    /// `busy` as the JSON object the claim statements read.
    pub(super) fn busy_json(&self) -> String {
        serde_json::to_string(&self.busy).unwrap_or_else(|_| "{}".to_owned())
    }

    pub(super) fn per_tenant(&self) -> i64 {
        i64::from(self.per_tenant)
    }
}

/// A claim: who takes the rows, and until when.
#[derive(Debug, Clone, Copy)]
pub struct Claim<'a> {
    pub owner: &'a str,
    pub now: DateTime<Utc>,
    pub until: DateTime<Utc>,
    pub limit: u32,
}

/// The leases of both queues.
#[async_trait]
pub trait Leases: Reads + Send + Sync + 'static {
    /// Leases up to `claim.limit` rows of `queue` that are due and held by
    /// no live lease to `claim.owner`, within each tenant's `share`; how
    /// many it took (the queue's own read gives them back).
    async fn claim(&self, queue: Queue, claim: Claim<'_>, share: &Share) -> Result<u64>;

    /// Gives up every lease of `queue` held by `owner` or by an owner it
    /// begins (a replica names each claim `{owner}:{n}`): a replica that
    /// stops, so that another goes on at once rather than when the
    /// leases run out.
    async fn release(&self, queue: Queue, owner: &str) -> Result<()>;

    /// Whether any row of `queue` is due and free: a read, so that an
    /// idle replica's look costs no write (on SQLite, no job on the
    /// writer thread).
    async fn due(&self, queue: Queue, now: DateTime<Utc>) -> Result<bool> {
        let sql = per_queue!(queue, due_sql);
        let (due,): (i64,) = self.reader().row(sql, args![now]).await?.unwrap_or((0,));
        Ok(due > 0)
    }
}
