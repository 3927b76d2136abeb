//! The begin's count of a tenant's running turns, on a migrated SQLite
//! file: what it reads.

use super::RUNNING_OF_TENANT;
use crate::store::{Store, sqlite::SqliteStore};

/// The count reads the index of the tenant's running turns and nothing
/// else: it read every running turn of every tenant, and each one's
/// session, at every begin (0.5 ms a begin at 1,000 running turns, on the
/// writer thread that every commit waits for).
#[tokio::test]
async fn a_tenants_running_turns_are_counted_from_their_own_index() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("harness.db");
    let store = SqliteStore::connect(&format!("sqlite://{}", path.display()), 1)
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let connection = rusqlite::Connection::open(&path).unwrap();
    let plan: Vec<String> = connection
        .prepare(&format!("EXPLAIN QUERY PLAN {RUNNING_OF_TENANT}"))
        .unwrap()
        .query_map(["acme"], |row| row.get(3))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        plan,
        ["SEARCH turns USING COVERING INDEX turns_running_by_tenant \
        (tenant=? AND status=? AND parked_until=?)"]
    );
}
