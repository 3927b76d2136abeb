//! The Postgres backend, selected by a `postgres://` `DATABASE_URL`.

use std::time::Duration;

use sqlx::{
    Postgres, Transaction,
    migrate::Migrator,
    postgres::{PgPool, PgPoolOptions},
};

use super::StoreError;

/// Postgres implementation of [`super::Store`].
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
}

impl PostgresStore {
    pub(super) const MIGRATOR: Migrator = sqlx::migrate!("./migrations/postgres");

    pub async fn connect(
        url: &str,
        max_connections: u32,
        acquire_timeout: Duration,
    ) -> Result<Self, StoreError> {
        let pool = Self::pool_options(max_connections, acquire_timeout)
            .connect(url)
            .await?;
        Ok(Self { pool })
    }

    /// The pool's settings: a request that cannot get a connection within
    /// `acquire_timeout` (the database is down) fails instead of waiting.
    pub fn pool_options(max_connections: u32, acquire_timeout: Duration) -> PgPoolOptions {
        PgPoolOptions::new()
            .max_connections(max_connections.max(1))
            .acquire_timeout(acquire_timeout)
    }

    /// Uses an existing pool (tests point it at a schema of their own).
    pub fn from_pool(pool: PgPool) -> Self {
        Self { pool }
    }

    fn writer(&self) -> &PgPool {
        &self.pool
    }

    fn reader(&self) -> &PgPool {
        &self.pool
    }

    async fn begin_write(&self) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        self.pool.begin().await
    }
}

impl PostgresStore {
    /// A listener on [`super::CANCEL_CHANNEL`]; see
    /// [`super::Store::cancel_requests`].
    pub(super) async fn cancel_listener(
        &self,
    ) -> Result<Option<super::CancelRequests>, StoreError> {
        use futures::StreamExt;
        let mut listener = sqlx::postgres::PgListener::connect_with(&self.pool).await?;
        listener.listen(super::CANCEL_CHANNEL).await?;
        let requests = async_stream::stream! {
            loop {
                // `recv` reconnects a lost connection on the next call.
                match listener.recv().await {
                    Ok(notification) => {
                        if let Ok(turn_id) = uuid::Uuid::parse_str(notification.payload()) {
                            yield Ok(turn_id);
                        }
                    }
                    Err(e) => yield Err(StoreError::from(e)),
                }
            }
        };
        Ok(Some(requests.boxed()))
    }
}

super::sql::impl_store!(PostgresStore, Postgres, "postgres");
super::sql::impl_sql_writes!(PostgresStore, Postgres);
