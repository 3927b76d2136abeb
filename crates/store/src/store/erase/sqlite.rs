//! [`Erase`] on SQLite: one job on the writer thread (one transaction).

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};

use super::{
    ERASE, Erase, Erased, RUNNING, SESSION, forks_named, own_scope, sessions_of_user_sql,
    tenant_statements,
};
use crate::{
    ids::SessionKey,
    store::{
        Result,
        forks::{FORKS_NAMED, FORKS_OF},
        reader::{Reads, args},
        records::parse_uuid,
        sqlite::SqliteStore,
    },
};

#[async_trait]
impl Erase for SqliteStore {
    async fn erase_session(&self, key: &SessionKey) -> Result<Erased> {
        let (key, scope) = (key.as_str().to_owned(), own_scope(key));
        self.writes
            .run_logged(move |tx, stage| {
                let running: Option<String> = tx
                    .prepare_cached(RUNNING)?
                    .query_row(params![key], |row| row.get(0))
                    .optional()?;
                if let Some(turn) = running {
                    return Ok(Erased::Running(parse_uuid(&turn)?));
                }
                let forks = tx
                    .prepare_cached(FORKS_OF)?
                    .query_map(params![key, FORKS_NAMED], |row| row.get(0))?
                    .collect::<rusqlite::Result<Vec<String>>>()?;
                if let Some(forked) = forks_named(forks) {
                    return Ok(forked);
                }
                // What the erase deletes is overwritten with zeros in the
                // file (the pages it frees too), not only unlinked; the
                // writer's other work keeps the default.
                tx.execute_batch("PRAGMA secure_delete = ON")?;
                let erased = erase_rows(tx, stage, &key, &scope);
                tx.execute_batch("PRAGMA secure_delete = OFF")?;
                erased
            })
            .await
    }

    async fn sessions_of_user(&self, tenant: &str, user: &str, limit: u32) -> Result<Vec<String>> {
        let sql = sessions_of_user_sql("json_extract(t.request, '$.user_id')");
        let rows: Vec<(String,)> = self
            .reader()
            .rows(sqlx::AssertSqlSafe(sql), args![tenant, user, limit])
            .await?;
        Ok(rows.into_iter().map(|(id,)| id).collect())
    }

    async fn erase_tenant_rest(&self, tenant: &str) -> Result<()> {
        let tenant = tenant.to_owned();
        self.writes
            .run(move |tx| {
                // Overwritten with zeros, as a session's erase is.
                tx.execute_batch("PRAGMA secure_delete = ON")?;
                let erased = tenant_statements(&tenant)
                    .iter()
                    .try_for_each(|sql| tx.prepare_cached(sql)?.execute(params![tenant]).map(drop));
                tx.execute_batch("PRAGMA secure_delete = OFF")?;
                Ok(erased?)
            })
            .await
    }
}

/// The erase's deletes, in the writer's transaction.
fn erase_rows(
    tx: &rusqlite::Connection,
    stage: &mut crate::store::event_log::journal::Stage<'_>,
    key: &str,
    scope: &str,
) -> Result<Erased> {
    for (sql, with_scope) in ERASE {
        let mut statement = tx.prepare_cached(sql)?;
        if *with_scope {
            statement.execute(params![key, scope])?;
        } else {
            statement.execute(params![key])?;
        }
    }
    // Its rows in the event journal (see `event_log/journal.rs`).
    crate::store::event_log::journal::erase_session(tx, key)?;
    stage.forget(key);
    let gone = tx.prepare_cached(SESSION)?.execute(params![key])?;
    Ok(if gone == 1 {
        Erased::Erased
    } else {
        Erased::NotFound
    })
}
