//! The Postgres backend, selected by a `postgres://` `DATABASE_URL`.
//!
//! Each call answers within a bound, for a database across a network.
//! sqlx has no socket timeouts, and a connection whose peer went silent (a
//! partition, a host that died without closing its sockets) never fails:
//! a call on it waits until TCP gives up, many minutes later, holding its
//! pool slot, and a turn waiting on it stays `running` as long. Here each
//! call gets the call timeout (`HARNESS_DATABASE_CALL_TIMEOUT_MS`) to
//! answer; past it, it fails as if the database were down (transient: the
//! event writer and a turn's end try again on another connection), and the
//! call's connection is not trusted again (see [`super::deadline::recently_abandoned`]: the pool tests it within a bound as
//! it comes back, and drops it when it does not answer).

use std::{future::Future, time::Duration};

use async_trait::async_trait;
use sqlx::{
    Postgres, Transaction,
    migrate::Migrator,
    postgres::{PgPool, PgPoolOptions},
};

use super::{
    PoolLimits, Reader, Readiness, Reads, Store,
    deadline::{recently_abandoned, within},
    reader::{Arg, bind_all},
};
use crate::store::Result;

/// Postgres implementation of [`super::Store`].
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
    /// Connections of their own for the heartbeat and the orphan sweep: a
    /// pool busy with requests must not delay a live turn's heartbeat
    /// until another replica takes the turn for an orphan.
    control: PgPool,
    /// The longest a call waits for an answer (see [`Self::bounded`]).
    call_timeout: Duration,
}

/// Connections of [`PostgresStore::control`].
const CONTROL_CONNECTIONS: u32 = 2;

/// How long a connection coming back after a call gave up on it has to
/// answer a ping before it is dropped.
const RELEASE_TEST: Duration = Duration::from_secs(1);

impl PostgresStore {
    pub(super) const MIGRATOR: Migrator = sqlx::migrate!("../../migrations/postgres");

    pub async fn connect(url: &str, limits: PoolLimits) -> Result<Self> {
        let pool = Self::pool_options(limits).connect(url).await?;
        Ok(Self::from_pool(pool, limits.call_timeout))
    }

    /// The pool's settings: a request that cannot get a connection within
    /// `acquire_timeout` (the database is down) fails instead of waiting.
    ///
    /// A session the server holds for a client that went silent inside a
    /// transaction (its link cut) keeps its row locks until the server
    /// ends it: each connection asks the server to end such a session
    /// after `call_timeout` idle in a transaction (no transaction of the
    /// service waits between its statements). A connection coming back
    /// just after a call gave up on it is tested within a bound, and
    /// dropped if it does not answer, instead of holding its slot for as
    /// long as TCP waits.
    pub fn pool_options(limits: PoolLimits) -> PgPoolOptions {
        let idle_in_transaction = format!(
            "SET idle_in_transaction_session_timeout = {}",
            limits.call_timeout.as_millis().max(1)
        );
        PgPoolOptions::new()
            .max_connections(limits.max_connections.max(1))
            .acquire_timeout(limits.acquire_timeout)
            .after_connect(move |conn, _| {
                let statement = idle_in_transaction.clone();
                Box::pin(async move {
                    sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
                        .execute(conn)
                        .await
                        .map(|_| ())
                })
            })
            .after_release(|conn, _| {
                Box::pin(async move {
                    if !recently_abandoned() {
                        return Ok(true);
                    }
                    match tokio::time::timeout(RELEASE_TEST, sqlx::Connection::ping(conn)).await {
                        Ok(answered) => answered.map(|()| true),
                        Err(_) => Err(sqlx::Error::Io(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "the connection did not answer",
                        ))),
                    }
                })
            })
    }

    /// Uses an existing pool made with [`Self::pool_options`] (tests point
    /// it at a schema of their own).
    pub fn from_pool(pool: PgPool, call_timeout: Duration) -> Self {
        let limits = PoolLimits {
            max_connections: CONTROL_CONNECTIONS,
            acquire_timeout: pool.options().get_acquire_timeout(),
            call_timeout,
        };
        let control =
            Self::pool_options(limits).connect_lazy_with((*pool.connect_options()).clone());
        Self {
            pool,
            control,
            call_timeout,
        }
    }

    /// The pool of requests' calls (reads go through [`Reads::reader`]).
    pub(super) fn writer(&self) -> &PgPool {
        &self.pool
    }

    /// The connections of the heartbeat and the orphan sweep.
    pub(super) fn control(&self) -> &PgPool {
        &self.control
    }

    pub(super) async fn begin_write(&self) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        self.pool.begin().await
    }

    /// Runs `call` within the call timeout: past it, the call fails as if
    /// the database were down, and its connection is not trusted again.
    pub(super) async fn bounded<T>(&self, call: impl Future<Output = Result<T>>) -> Result<T> {
        within(self.call_timeout, call).await
    }

    /// Runs one statement (its own transaction) within the call timeout;
    /// how many rows it changed.
    pub(super) async fn execute(&self, sql: &'static str, args: Vec<Arg<'_>>) -> Result<u64> {
        let statement = bind_all(sqlx::query(sql), args).execute(&self.pool);
        Ok(within(self.call_timeout, statement).await?.rows_affected())
    }
}

impl Reads for PostgresStore {
    fn reader(&self) -> Reader<'_> {
        Reader::Postgres {
            pool: &self.pool,
            limit: self.call_timeout,
        }
    }
}

#[async_trait]
impl Store for PostgresStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    /// Not bounded: a migration may rightly take long, and it runs before
    /// the service serves.
    async fn migrate(&self) -> Result<()> {
        Self::MIGRATOR.run(&self.pool).await?;
        Ok(())
    }

    async fn readiness(&self) -> Readiness {
        self.reader().readiness(&Self::MIGRATOR).await
    }
}
