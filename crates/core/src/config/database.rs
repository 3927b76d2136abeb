//! `[database]`: the store and its event writer.

use std::time::Duration;

use super::DatabaseUrl;

/// The store and its event writer.
#[derive(Debug, Clone, clap::Args)]
pub struct DatabaseSettings {
    /// sqlite://path or postgres://user@host/db.
    #[arg(
        id = "database.url",
        long = "database-url",
        env = "DATABASE_URL",
        hide_env_values = true,
        default_value = "sqlite://./data/agent-harness.db"
    )]
    pub url: DatabaseUrl,
    /// Connections in the database pool.
    #[arg(
        id = "database.max_connections",
        long = "database-max-connections",
        default_value_t = 10,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub max_connections: u32,
    /// Longest wait for a database connection, in ms: a request finds a
    /// database that is down this fast.
    #[arg(
        id = "database.acquire_timeout_ms",
        long = "database-acquire-timeout-ms",
        default_value_t = 1000,
        value_parser = clap::value_parser!(u64).range(100..=60_000)
    )]
    pub acquire_timeout_ms: u64,
    /// Longest wait for Postgres to answer one call (a statement, or the
    /// transaction of a few), in ms. A call past it fails as if the
    /// database were down and its connection is dropped, so a connection
    /// whose peer went silent (a network partition) holds up nothing for
    /// longer; the server ends a session idle this long in a transaction.
    #[arg(
        id = "database.call_timeout_ms",
        long = "database-call-timeout-ms",
        default_value_t = 3000,
        value_parser = clap::value_parser!(u64).range(100..=600_000)
    )]
    pub call_timeout_ms: u64,
    /// Most events written in one transaction.
    #[arg(
        id = "database.event_batch_max",
        long = "event-batch-max",
        default_value_t = 512,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
    )]
    pub event_batch_max: usize,
    /// Events that may wait for the writer before emitters are slowed down.
    #[arg(
        id = "database.event_queue_capacity",
        long = "event-queue-capacity",
        default_value_t = 8192,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
    )]
    pub event_queue_capacity: usize,
    /// Longest a text delta waits for the ones after it to share its
    /// commit, in ms (0: every delta is committed as soon as the writer
    /// is free). A step's first text and every other event never wait.
    /// On SQLite it applies only while no commit is under way
    /// (docs/architecture.md).
    #[arg(
        id = "database.event_linger_ms",
        long = "event-linger-ms",
        default_value_t = 2,
        value_parser = clap::value_parser!(u64).range(0..=100)
    )]
    pub event_linger_ms: u64,
}

impl DatabaseSettings {
    /// The store's use of its connections, as set.
    pub fn limits(&self) -> crate::store::PoolLimits {
        crate::store::PoolLimits {
            max_connections: self.max_connections,
            acquire_timeout: Duration::from_millis(self.acquire_timeout_ms),
            call_timeout: Duration::from_millis(self.call_timeout_ms),
        }
    }
}
