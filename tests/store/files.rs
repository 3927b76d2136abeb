//! A file's bytes on both backends: a large upload comes back whole (on
//! SQLite it is written in several short writer jobs, each of a few
//! chunks, so that it never holds the one writer for long), an upload
//! that a dead process left half-written is finished by the same bytes
//! put again, and swept an hour after it began when none comes.

use chrono::{Duration, SubsecRound, Utc};
use harness_store::store::{FilePut, FileRecord, Store};
use sha2::Digest as _;

use crate::support::{Backend, TestDb};

fn bytes_of(n: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.max(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8
        })
        .collect()
}

fn record(id: &str, bytes: &[u8]) -> FileRecord {
    FileRecord {
        tenant: "acme".into(),
        id: id.into(),
        sha256: hex::encode(sha2::Sha256::digest(bytes)),
        bytes: bytes.len() as i64,
        media_type: "application/pdf".into(),
        filename: "a.pdf".into(),
        purpose: "user_data".into(),
        session_id: None,
        user_id: None,
        created_at: Utc::now().trunc_subsecs(6),
    }
}

async fn put(store: &dyn Store, file: &FileRecord, bytes: &[u8]) -> FilePut {
    let spooled = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(spooled.path(), bytes).unwrap();
    store
        .put_file(file, spooled.path(), u64::MAX)
        .await
        .unwrap()
}

async fn read_back(store: &dyn Store, file: &FileRecord) -> Vec<u8> {
    let mut read = Vec::new();
    for index in 0..file.chunks() {
        let chunk = store.file_chunk("acme", &file.sha256, index).await.unwrap();
        read.extend(chunk.unwrap_or_else(|| panic!("chunk {index} of {}", file.id)));
    }
    read
}

/// What a process that died after a put's first jobs leaves: the blob's
/// row (begun `ago`) and its first chunk, and no file.
async fn left_half_written(db: &TestDb, backend: Backend, bytes: &[u8], ago: Duration) {
    let sha256 = hex::encode(sha2::Sha256::digest(bytes));
    let at = (Utc::now() - ago)
        .trunc_subsecs(0)
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, false);
    let first = hex::encode(&bytes[..bytes.len().min(256 * 1024)]);
    let blob = format!(
        "INSERT INTO file_blobs (tenant, sha256, bytes, created_at) \
         VALUES ('acme', '{sha256}', {}, '{at}');",
        bytes.len()
    );
    match backend {
        Backend::Sqlite => {
            db.execute_sqlite(&format!(
                "{blob} INSERT INTO file_chunks VALUES ('acme', '{sha256}', 0, X'{first}');"
            ))
            .await;
        }
        Backend::Postgres => {
            db.execute_postgres(&format!(
                "{blob} INSERT INTO file_chunks VALUES ('acme', '{sha256}', 0, '\\x{first}'::bytea);"
            ))
            .await;
        }
    }
}

async fn a_large_or_half_written_upload_comes_back_whole_and_an_abandoned_one_is_swept(
    backend: Backend,
) {
    let db = TestDb::new(backend).await;
    let store = db.open().await;
    // 5 MiB and 3 bytes: 21 chunks, six writer jobs on SQLite.
    let large = bytes_of(5 * 1024 * 1024 + 3, 7);
    let file = record("file-large", &large);
    assert_eq!(
        put(store.as_ref(), &file, &large).await,
        FilePut::Stored { new_bytes: true }
    );
    assert_eq!(read_back(store.as_ref(), &file).await, large);
    assert_eq!(
        store.stored_file_bytes("acme").await.unwrap(),
        large.len() as u64
    );

    // Half-written by a process that died: the same bytes put again
    // finish it (the quota it took is its own), and it comes back whole.
    let half = bytes_of(700 * 1024, 11);
    left_half_written(&db, backend, &half, Duration::minutes(1)).await;
    let again = record("file-again", &half);
    assert_eq!(
        put(store.as_ref(), &again, &half).await,
        FilePut::Stored { new_bytes: true }
    );
    assert_eq!(read_back(store.as_ref(), &again).await, half);

    // Abandoned: swept an hour after it began, not before; bytes that a
    // file names never are.
    let abandoned = bytes_of(300 * 1024, 13);
    let fresh = bytes_of(300 * 1024, 17);
    left_half_written(&db, backend, &abandoned, Duration::hours(2)).await;
    left_half_written(&db, backend, &fresh, Duration::minutes(5)).await;
    let stored = store.stored_file_bytes("acme").await.unwrap();
    let swept = store
        .sweep_unfinished_files(Utc::now() - Duration::hours(1))
        .await
        .unwrap();
    assert_eq!(swept, 1);
    assert_eq!(
        store.stored_file_bytes("acme").await.unwrap(),
        stored - abandoned.len() as u64
    );
    let sha = |bytes: &[u8]| hex::encode(sha2::Sha256::digest(bytes));
    assert_eq!(
        store.file_chunk("acme", &sha(&abandoned), 0).await.unwrap(),
        None,
        "its chunks went with it"
    );
    assert!(
        store
            .file_chunk("acme", &sha(&fresh), 0)
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(read_back(store.as_ref(), &file).await, large);
    assert_eq!(read_back(store.as_ref(), &again).await, half);
}

crate::on_both_backends!(
    a_large_or_half_written_upload_comes_back_whole_and_an_abandoned_one_is_swept,
);
