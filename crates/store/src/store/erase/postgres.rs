//! [`Erase`] on Postgres: one transaction that holds the session's row
//! (a turn cannot begin in it meanwhile).

use async_trait::async_trait;

use super::{
    ERASE, Erase, Erased, RUNNING, SESSION, forks_named, own_scope, sessions_of_user_sql,
    tenant_statements,
};
use crate::{
    ids::SessionKey,
    store::{
        Result,
        forks::{FORKS_NAMED, FORKS_OF},
        postgres::PostgresStore,
        reader::{Reads, args},
        records::parse_uuid,
    },
};

#[async_trait]
impl Erase for PostgresStore {
    async fn erase_session(&self, key: &SessionKey) -> Result<Erased> {
        let scope = own_scope(key);
        self.bounded(async {
            let mut tx = self.begin_write().await?;
            sqlx::query("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE")
                .bind(key.as_str())
                .execute(&mut *tx)
                .await?;
            let running: Option<(String,)> = sqlx::query_as(RUNNING)
                .bind(key.as_str())
                .fetch_optional(&mut *tx)
                .await?;
            if let Some((turn,)) = running {
                return Ok(Erased::Running(parse_uuid(&turn)?));
            }
            // A fork takes the source's row `FOR SHARE`: under this lock,
            // none is being made.
            let forks: Vec<(String,)> = sqlx::query_as(FORKS_OF)
                .bind(key.as_str())
                .bind(i64::from(FORKS_NAMED))
                .fetch_all(&mut *tx)
                .await?;
            if let Some(forked) = forks_named(forks.into_iter().map(|(k,)| k).collect()) {
                return Ok(forked);
            }
            crate::store::files::postgres::lock_files(&mut tx, key.tenant()).await?;
            for (sql, with_scope) in ERASE {
                let statement = sqlx::query(sqlx::AssertSqlSafe(*sql)).bind(key.as_str());
                let statement = if *with_scope {
                    statement.bind(&scope)
                } else {
                    statement
                };
                statement.execute(&mut *tx).await?;
            }
            let gone = sqlx::query(SESSION)
                .bind(key.as_str())
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(if gone.rows_affected() == 1 {
                Erased::Erased
            } else {
                Erased::NotFound
            })
        })
        .await
    }

    async fn sessions_of_user(&self, tenant: &str, user: &str, limit: u32) -> Result<Vec<String>> {
        let sql = sessions_of_user_sql("harness_json_field(t.request, 'user_id')");
        let rows: Vec<(String,)> = self
            .reader()
            .rows(sqlx::AssertSqlSafe(sql), args![tenant, user, limit])
            .await?;
        Ok(rows.into_iter().map(|(id,)| id).collect())
    }

    async fn erase_tenant_rest(&self, tenant: &str) -> Result<()> {
        self.bounded(async {
            let mut tx = self.begin_write().await?;
            crate::store::files::postgres::lock_files(&mut tx, tenant).await?;
            for sql in tenant_statements(tenant) {
                sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(tenant)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            Ok(())
        })
        .await
    }
}
