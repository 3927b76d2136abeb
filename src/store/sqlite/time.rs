//! Times as the SQLite store writes and reads them.

use chrono::{DateTime, SecondsFormat, Utc};

use crate::store::{Result, StoreError};

/// Timestamps as sqlx's SQLite driver writes them, so both sides compare.
pub(in crate::store) fn ts(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::AutoSi, false)
}

/// A timestamp as [`ts`] (or sqlx) wrote it.
pub(in crate::store) fn parse_ts(raw: &str) -> Result<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(raw)
        .map(|at| at.with_timezone(&Utc))
        .or_else(|_| {
            chrono::NaiveDateTime::parse_from_str(raw, "%Y-%m-%d %H:%M:%S%.f")
                .map(|at| at.and_utc())
        })
        .map_err(|e| StoreError::Corrupt(format!("timestamp {raw:?}: {e}")))
}
