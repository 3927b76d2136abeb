//! [`Export`]'s import on Postgres: one transaction.

use async_trait::async_trait;

use super::{Export, Imported, PARTS, Parsed, SESSION, insert};
use crate::{
    ids::SessionKey,
    store::{
        Result,
        postgres::PostgresStore,
        reader::{Arg, bind_all},
    },
};

#[async_trait]
impl Export for PostgresStore {
    async fn import_session(&self, key: &SessionKey, parsed: &Parsed) -> Result<Imported> {
        self.bounded(async {
            let mut tx = self.begin_write().await?;
            let exists: Option<(i64,)> =
                sqlx::query_as("SELECT 1::BIGINT FROM sessions WHERE id = $1 FOR UPDATE")
                    .bind(key.as_str())
                    .fetch_optional(&mut *tx)
                    .await?;
            if exists.is_some() {
                return Ok(Imported::Exists);
            }
            let mut args = vec![Arg::Text(key.as_str()), Arg::Text(key.tenant())];
            let kinds = SESSION.columns.iter().map(|c| c.kind);
            args.extend(
                parsed
                    .session
                    .iter()
                    .zip(kinds)
                    .map(|(cell, kind)| cell.arg(kind)),
            );
            bind_all(sqlx::query(sqlx::AssertSqlSafe(insert(&SESSION))), args)
                .execute(&mut *tx)
                .await?;
            let statements: Vec<String> = PARTS.iter().map(insert).collect();
            for (part, cells) in &parsed.rows {
                let index = PARTS.iter().position(|p| p.line == part.line).unwrap_or(0);
                let mut args = vec![Arg::Text(key.as_str())];
                let kinds = part.columns.iter().map(|c| c.kind);
                args.extend(cells.iter().zip(kinds).map(|(cell, kind)| cell.arg(kind)));
                let sql = sqlx::AssertSqlSafe(statements[index].clone());
                match bind_all(sqlx::query(sql), args).execute(&mut *tx).await {
                    Ok(_) => {}
                    Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                        tx.rollback().await?;
                        return Ok(Imported::Taken(part.table));
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            sqlx::query(super::BLOBS)
                .bind(key.as_str())
                .execute(&mut *tx)
                .await?;
            sqlx::query(super::UNANNOUNCE)
                .bind(key.as_str())
                .execute(&mut *tx)
                .await?;
            if !super::tree::names_parents(parsed) {
                sqlx::query(super::tree::LINEAR)
                    .bind(key.as_str())
                    .execute(&mut *tx)
                    .await?;
            }
            sqlx::query(super::tree::BRANCHED)
                .bind(key.as_str())
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(Imported::Done)
        })
        .await
    }
}
