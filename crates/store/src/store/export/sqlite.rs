//! [`Export`]'s import on SQLite: one job on the writer thread (one
//! transaction).

use async_trait::async_trait;
use rusqlite::{params, types::Value};

use super::{Cell, Export, Imported, PARTS, Parsed, SESSION, insert};
use crate::{
    ids::SessionKey,
    store::{
        Result,
        sqlite::{
            SqliteStore,
            writer::{is_unique_violation, ts},
        },
    },
};

/// A cell as SQLite keeps it.
fn value(cell: &Cell) -> Value {
    match cell {
        Cell::Null => Value::Null,
        Cell::Text(text) => Value::Text(text.clone()),
        Cell::Int(n) => Value::Integer(*n),
        Cell::Real(x) => Value::Real(*x),
        Cell::Flag(flag) => Value::Integer(i64::from(*flag)),
        Cell::At(at) => Value::Text(ts(*at)),
        Cell::Bytes(bytes) => Value::Blob(bytes.clone()),
    }
}

#[async_trait]
impl Export for SqliteStore {
    async fn import_session(&self, key: &SessionKey, parsed: &Parsed) -> Result<Imported> {
        let key = key.clone();
        let session: Vec<Value> = parsed.session.iter().map(value).collect();
        let linear = !super::tree::names_parents(parsed);
        let rows: Vec<(usize, Vec<Value>)> = parsed
            .rows
            .iter()
            .map(|(part, cells)| {
                let index = PARTS.iter().position(|p| p.line == part.line).unwrap_or(0);
                (index, cells.iter().map(value).collect())
            })
            .collect();
        self.writes
            .run(move |tx| {
                let exists = tx
                    .prepare_cached("SELECT COUNT(*) FROM sessions WHERE id = ?1")?
                    .query_row(params![key.as_str()], |row| row.get::<_, i64>(0))?;
                if exists > 0 {
                    return Ok(Imported::Exists);
                }
                // Its own savepoint: a taken id undoes the import alone.
                tx.execute_batch("SAVEPOINT import_session")?;
                let imported = write(tx, &key, &session, &rows, linear);
                match &imported {
                    Ok(Imported::Done) => tx.execute_batch("RELEASE import_session")?,
                    _ => tx.execute_batch("ROLLBACK TO import_session; RELEASE import_session")?,
                }
                imported
            })
            .await
    }
}

/// Writes the session's rows; [`Imported::Taken`] at the first id taken.
fn write(
    tx: &rusqlite::Connection,
    key: &SessionKey,
    session: &[Value],
    rows: &[(usize, Vec<Value>)],
    linear: bool,
) -> Result<Imported> {
    let mut first = vec![
        Value::Text(key.as_str().to_owned()),
        Value::Text(key.tenant().to_owned()),
    ];
    first.extend(session.iter().cloned());
    tx.prepare(&insert(&SESSION))?
        .execute(rusqlite::params_from_iter(first))?;
    let statements: Vec<String> = PARTS.iter().map(insert).collect();
    for (index, cells) in rows {
        let mut values = vec![Value::Text(key.as_str().to_owned())];
        values.extend(cells.iter().cloned());
        let inserted = tx
            .prepare_cached(&statements[*index])?
            .execute(rusqlite::params_from_iter(values));
        match inserted {
            Ok(_) => {}
            Err(e) if is_unique_violation(&e) => return Ok(Imported::Taken(PARTS[*index].table)),
            Err(e) => return Err(e.into()),
        }
    }
    tx.prepare(super::BLOBS)?.execute(params![key.as_str()])?;
    tx.prepare(super::UNANNOUNCE)?
        .execute(params![key.as_str()])?;
    if linear {
        tx.prepare(super::tree::LINEAR)?
            .execute(params![key.as_str()])?;
    }
    tx.prepare(super::tree::BRANCHED)?
        .execute(params![key.as_str()])?;
    Ok(Imported::Done)
}
