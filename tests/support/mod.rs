//! What the test binaries share: a fake provider speaking each provider's
//! recorded wire format ([`fake_provider`]), and databases for tests: a fresh SQLite file, or a fresh Postgres schema on
//! the server named by `TEST_DATABASE_URL` (default: the local trust-auth
//! server, database `test`). Both are real; nothing is mocked.

#![allow(dead_code, reason = "each test binary uses a different part")]

pub mod capture;
pub mod fake_provider;
pub mod https;
pub mod listening;
pub mod reply;

use std::{str::FromStr, sync::Arc};

use harness_store::store::{Store, postgres::PostgresStore, sqlite::SqliteStore};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tempfile::TempDir;

/// Which database a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// The Postgres server tests use.
pub fn postgres_url() -> String {
    std::env::var("TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A database of one test; reopen it with [`TestDb::open`] to simulate a
/// restart. A Postgres schema is dropped when its owner is dropped.
pub struct TestDb {
    pub backend: Backend,
    /// SQLite: the file's folder.
    dir: Option<TempDir>,
    /// Postgres: the test's own schema.
    schema: Option<String>,
    /// Drops the schema when dropped (not a [`TestDb::sharing`] handle).
    owner: bool,
}

impl TestDb {
    pub async fn new(backend: Backend) -> Self {
        match backend {
            Backend::Sqlite => Self {
                backend,
                dir: Some(tempfile::tempdir().expect("temp dir")),
                schema: None,
                owner: true,
            },
            Backend::Postgres => {
                // Fails at once (with the shared message) when the server
                // is known to be missing.
                assert!(
                    postgres_or_skip().await,
                    "a Postgres test ran without Postgres; it must call postgres_or_skip first"
                );
                let schema = format!("t_{}", uuid::Uuid::now_v7().simple());
                let admin = admin().await;
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
                    .execute(&admin)
                    .await
                    .expect("create schema");
                admin.close().await;
                Self {
                    backend,
                    dir: None,
                    schema: Some(schema),
                    owner: true,
                }
            }
        }
    }

    /// Another handle on this Postgres database, for a second replica; the
    /// schema stays until the first handle is dropped.
    pub fn sharing(&self) -> Self {
        assert_eq!(self.backend, Backend::Postgres, "replicas share Postgres");
        Self {
            backend: self.backend,
            dir: None,
            schema: self.schema.clone(),
            owner: false,
        }
    }

    /// The URL a service process opens this Postgres database with (its
    /// connections use the test's schema).
    pub fn postgres_service_url(&self) -> String {
        let schema = self.schema.as_deref().expect("a Postgres test database");
        let base = postgres_url();
        let separator = if base.contains('?') { '&' } else { '?' };
        format!("{base}{separator}options=-c%20search_path%3D{schema}")
    }

    /// The SQLite URL of this database (SQLite only).
    pub fn sqlite_url(&self) -> String {
        let dir = self.dir.as_ref().expect("a SQLite test database");
        format!("sqlite://{}/harness.db", dir.path().display())
    }

    /// The SQLite file of this database (SQLite only).
    pub fn sqlite_path(&self) -> std::path::PathBuf {
        let dir = self.dir.as_ref().expect("a SQLite test database");
        dir.path().join("harness.db")
    }

    /// Opens a store on this database, migrated.
    pub async fn open(&self) -> Arc<dyn Store> {
        let store = self.open_unmigrated().await;
        store.migrate().await.expect("migrate");
        store
    }

    /// Opens a Postgres store on this database through `proxy` (migrated).
    pub async fn open_through(&self, proxy: &FaultProxy) -> Arc<dyn Store> {
        self.open_through_with(proxy, test_limits()).await
    }

    /// [`TestDb::open_through`] with these limits.
    pub async fn open_through_with(
        &self,
        proxy: &FaultProxy,
        limits: harness_store::store::PoolLimits,
    ) -> Arc<dyn Store> {
        let schema = self.schema.as_deref().expect("a Postgres test database");
        let options = PgConnectOptions::from_str(&postgres_url())
            .expect("TEST_DATABASE_URL")
            .host("127.0.0.1")
            .port(proxy.addr.port())
            .options([("search_path", schema)]);
        let pool = PostgresStore::pool_options(limits)
            .connect_with(options)
            .await
            .expect("connect Postgres through the proxy");
        let store: Arc<dyn Store> = Arc::new(PostgresStore::from_pool(pool, limits.call_timeout));
        store.migrate().await.expect("migrate");
        store
    }

    /// `host:port` of the Postgres server.
    pub fn postgres_addr() -> String {
        let options = PgConnectOptions::from_str(&postgres_url()).expect("TEST_DATABASE_URL");
        format!("{}:{}", options.get_host(), options.get_port())
    }

    /// One connection to this Postgres database's schema.
    async fn schema_pool(&self) -> sqlx::PgPool {
        let schema = self.schema.as_deref().expect("a Postgres test database");
        let options = PgConnectOptions::from_str(&postgres_url())
            .expect("TEST_DATABASE_URL")
            .options([("search_path", schema)]);
        PgPoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .expect("connect Postgres")
    }

    /// Runs `sql` in this Postgres database's schema (a test's own
    /// triggers, a look at rows).
    pub async fn execute_postgres(&self, sql: &str) {
        let pool = self.schema_pool().await;
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&pool)
            .await
            .expect("the test's SQL");
        pool.close().await;
    }

    /// The rows of session `id` in this Postgres database's `events` table,
    /// by seq: each one's seq and (a run's) last seq.
    pub async fn postgres_event_rows(&self, id: &str) -> Vec<(i64, Option<i64>)> {
        let pool = self.schema_pool().await;
        let rows =
            sqlx::query_as("SELECT seq, seq_end FROM events WHERE session_id = $1 ORDER BY seq")
                .bind(id)
                .fetch_all(&pool)
                .await
                .expect("the events' rows");
        pool.close().await;
        rows
    }

    /// Every table of this database's schema, read from its catalogue (a
    /// table a migration adds is in it), with how many of its rows hold
    /// any of `needles` in any column (each column read as text). The
    /// audit trail is left out: it keeps the ids of what was done to
    /// erased data, by design, and never its content (`admin.rs` checks
    /// both).
    pub async fn rows_naming(&self, needles: &[String]) -> std::collections::BTreeMap<String, i64> {
        let matches = |columns: &[String]| {
            let mut any = Vec::new();
            for column in columns {
                for needle in needles {
                    assert!(
                        needle
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || "-_/:".contains(c)),
                        "{needle}"
                    );
                    any.push(format!("CAST(\"{column}\" AS TEXT) LIKE '%{needle}%'"));
                }
            }
            any.join(" OR ")
        };
        let mut found = std::collections::BTreeMap::new();
        // One scan, written once for both backends' pools: the catalogue's
        // tables, each one's columns, then a count of its rows naming any
        // needle.
        macro_rules! scan {
            ($pool:expr, $tables:expr, $columns:expr) => {{
                let pool = $pool;
                let tables: Vec<(String,)> = sqlx::query_as($tables)
                    .fetch_all(&pool)
                    .await
                    .expect("the catalogue");
                for (table,) in tables {
                    if table == "audit" {
                        continue;
                    }
                    let columns: Vec<(String,)> = sqlx::query_as($columns)
                        .bind(&table)
                        .fetch_all(&pool)
                        .await
                        .expect("the columns");
                    let columns: Vec<String> = columns.into_iter().map(|(c,)| c).collect();
                    let sql = format!(
                        "SELECT count(*) FROM \"{table}\" WHERE {}",
                        matches(&columns)
                    );
                    let (count,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(sql))
                        .fetch_one(&pool)
                        .await
                        .expect("a scan");
                    found.insert(table, count);
                }
                pool.close().await;
            }};
        }
        match self.backend {
            Backend::Sqlite => scan!(
                sqlx::sqlite::SqlitePoolOptions::new()
                    .max_connections(1)
                    .connect(&self.sqlite_url())
                    .await
                    .expect("open SQLite"),
                "SELECT name FROM sqlite_master WHERE type = 'table' \
                 AND name NOT LIKE 'sqlite_%' AND name NOT LIKE '_sqlx%'",
                "SELECT name FROM pragma_table_info(?1)"
            ),
            Backend::Postgres => scan!(
                self.schema_pool().await,
                "SELECT table_name::text FROM information_schema.tables \
                 WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' \
                 AND table_name NOT LIKE '_sqlx%'",
                "SELECT column_name::text FROM information_schema.columns \
                 WHERE table_schema = current_schema() AND table_name = $1"
            ),
        }
        found
    }

    /// This database's schema as its catalogue says it: each table with
    /// its columns, and the triggers (`trigger:{table}.{name}`, as a
    /// table of no columns).
    pub async fn schema(
        &self,
    ) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
        let mut schema = std::collections::BTreeMap::new();
        macro_rules! read {
            ($pool:expr, $columns:expr, $triggers:expr) => {{
                let pool = $pool;
                let columns: Vec<(String, String)> = sqlx::query_as($columns)
                    .fetch_all(&pool)
                    .await
                    .expect("the catalogue's columns");
                for (table, column) in columns {
                    schema
                        .entry(table)
                        .or_insert_with(std::collections::BTreeSet::new)
                        .insert(column);
                }
                let triggers: Vec<(String, String)> = sqlx::query_as($triggers)
                    .fetch_all(&pool)
                    .await
                    .expect("the catalogue's triggers");
                for (table, name) in triggers {
                    schema.insert(format!("trigger:{table}.{name}"), Default::default());
                }
                pool.close().await;
            }};
        }
        match self.backend {
            Backend::Sqlite => read!(
                sqlx::sqlite::SqlitePoolOptions::new()
                    .max_connections(1)
                    .connect(&self.sqlite_url())
                    .await
                    .expect("open SQLite"),
                "SELECT m.name, c.name FROM sqlite_master m, pragma_table_info(m.name) c \
                 WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%' \
                 AND m.name NOT LIKE '_sqlx%'",
                "SELECT tbl_name, name FROM sqlite_master WHERE type = 'trigger'"
            ),
            Backend::Postgres => read!(
                self.schema_pool().await,
                "SELECT c.table_name::text, c.column_name::text \
                 FROM information_schema.columns c JOIN information_schema.tables t \
                 ON t.table_schema = c.table_schema AND t.table_name = c.table_name \
                 WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE' \
                 AND c.table_name NOT LIKE '_sqlx%'",
                "SELECT c.relname::text, t.tgname::text FROM pg_trigger t \
                 JOIN pg_class c ON c.oid = t.tgrelid \
                 JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = current_schema() AND NOT t.tgisinternal"
            ),
        }
        schema
    }

    /// Runs `sql` in this SQLite database.
    pub async fn execute_sqlite(&self, sql: &str) {
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .connect(&self.sqlite_url())
            .await
            .expect("open SQLite");
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&pool)
            .await
            .expect("the test's SQL");
        pool.close().await;
    }

    /// Applies the migrations up to and including `version` (this
    /// backend's numbering), as a database made by an older release is.
    pub async fn migrate_to(&self, version: i64) {
        match self.backend {
            Backend::Sqlite => {
                let pool = sqlx::sqlite::SqlitePoolOptions::new()
                    .max_connections(1)
                    .connect_with(
                        sqlx::sqlite::SqliteConnectOptions::from_str(&self.sqlite_url())
                            .expect("SQLite URL")
                            .create_if_missing(true),
                    )
                    .await
                    .expect("open SQLite");
                sqlx::migrate!("./migrations/sqlite")
                    .run_to(version, &pool)
                    .await
                    .expect("migrate SQLite");
                pool.close().await;
            }
            Backend::Postgres => {
                let pool = self.schema_pool().await;
                sqlx::migrate!("./migrations/postgres")
                    .run_to(version, &pool)
                    .await
                    .expect("migrate Postgres");
                pool.close().await;
            }
        }
    }

    /// Opens a store without applying migrations.
    pub async fn open_unmigrated(&self) -> Arc<dyn Store> {
        match self.backend {
            Backend::Sqlite => Arc::new(
                SqliteStore::connect(&self.sqlite_url(), 4)
                    .await
                    .expect("open SQLite"),
            ),
            Backend::Postgres => {
                let schema = self.schema.as_deref().expect("schema");
                let options = PgConnectOptions::from_str(&postgres_url())
                    .expect("TEST_DATABASE_URL")
                    .options([("search_path", schema)]);
                let limits = test_limits();
                let pool = PostgresStore::pool_options(limits)
                    .connect_with(options)
                    .await
                    .expect("connect Postgres");
                Arc::new(PostgresStore::from_pool(pool, limits.call_timeout))
            }
        }
    }
}

/// The service's default use of its database's connections, on a pool of
/// eight.
pub fn test_limits() -> harness_store::store::PoolLimits {
    harness_store::store::PoolLimits {
        max_connections: 8,
        ..harness_core::config::Settings::default().database.limits()
    }
}

/// Whether the Postgres tests can run. Without a server, and with neither
/// `TEST_DATABASE_URL` nor `CI` set (a newcomer's `cargo test`), they are
/// skipped with one notice on the terminal; otherwise a missing server
/// fails them at once with one clear message.
pub async fn postgres_or_skip() -> bool {
    // Checked once per test binary; the answer (a failure too) is shared.
    static AVAILABLE: tokio::sync::OnceCell<Result<bool, String>> =
        tokio::sync::OnceCell::const_new();
    let available = AVAILABLE
        .get_or_init(|| async {
            let reachable = PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(std::time::Duration::from_secs(3))
                .connect(&postgres_url())
                .await;
            match reachable {
                Ok(pool) => {
                    pool.close().await;
                    Ok(true)
                }
                Err(e)
                    if std::env::var_os("TEST_DATABASE_URL").is_none()
                        && std::env::var_os("CI").is_none() =>
                {
                    use std::io::Write as _;
                    // Straight to the terminal: the test harness would hide
                    // a passing test's output.
                    let _ = writeln!(
                        std::io::stderr(),
                        "\nNOTICE: Postgres is not reachable at {} ({e}); the Postgres \
                         tests of this binary are skipped. Start Postgres or set \
                         TEST_DATABASE_URL to run them (`.ci/run` does).\n",
                        postgres_url()
                    );
                    Ok(false)
                }
                Err(e) => Err(format!(
                    "Postgres is not reachable at {} ({e}): start it (`.ci/run` does) or \
                     set TEST_DATABASE_URL",
                    postgres_url()
                )),
            }
        })
        .await;
    match available {
        Ok(available) => *available,
        Err(message) => panic!("{message}"),
    }
}

/// A connection to the Postgres server for creating and dropping schemas.
/// Without a server, the test fails at once with one clear message.
async fn admin() -> sqlx::PgPool {
    PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(std::time::Duration::from_secs(3))
        .connect(&postgres_url())
        .await
        .unwrap_or_else(|e| {
            panic!(
                "Postgres is not reachable at {} ({e}): start it (`.ci/run` does) or set \
                 TEST_DATABASE_URL",
                postgres_url()
            )
        })
}

impl Drop for TestDb {
    /// Drops the test's Postgres schema (the SQLite folder removes itself).
    /// `Drop` cannot await, so the schema goes on a thread of its own with
    /// a small runtime; a failure is reported, not raised.
    fn drop(&mut self) {
        let Some(schema) = self.schema.clone().filter(|_| self.owner) else {
            return;
        };
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async move {
                let admin = PgPoolOptions::new()
                    .max_connections(1)
                    .acquire_timeout(std::time::Duration::from_secs(3))
                    .connect(&postgres_url())
                    .await
                    .map_err(|e| e.to_string())?;
                // A connection of the test's app may still hold a lock for
                // a moment; never wait on it for long.
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "SET lock_timeout = '3s'; DROP SCHEMA IF EXISTS {schema} CASCADE"
                )))
                .execute(&admin)
                .await
                .map_err(|e| e.to_string())?;
                admin.close().await;
                Ok::<_, String>(())
            })
        })
        .join();
        match dropped {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("could not drop a test schema: {e}"),
            Err(_) => eprintln!("could not drop a test schema: the thread panicked"),
        }
    }
}

/// Runs an `async fn(Backend)` test once per backend, as two tests.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),+ $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    super::$name($crate::support::Backend::Sqlite).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres() {
                    if $crate::support::postgres_or_skip().await {
                        super::$name($crate::support::Backend::Postgres).await;
                    }
                }
            }
        )+
    };
}

/// A TCP proxy in front of a database that a test can cut: existing
/// connections are dropped and new ones closed at once, as a database that
/// went down looks to its clients; or black-hole: nothing gets through and
/// nothing is closed, as a network partition looks. `restore` lets
/// connections through again.
pub struct FaultProxy {
    pub addr: std::net::SocketAddr,
    down: Arc<std::sync::atomic::AtomicBool>,
    /// Set by [`FaultProxy::black_hole`].
    silent: Arc<std::sync::atomic::AtomicBool>,
    /// Armed by [`FaultProxy::cut_after_next_commit`].
    commit_cut: Arc<std::sync::atomic::AtomicBool>,
    connections: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// A proxy on 127.0.0.1 to `target` (`host:port`).
    pub async fn start(target: String) -> Self {
        use std::sync::atomic::Ordering;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let down = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let silent = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let commit_cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let connections: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
        let accept = {
            let (down, silent, connections, commit_cut) = (
                down.clone(),
                silent.clone(),
                connections.clone(),
                commit_cut.clone(),
            );
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    if down.load(Ordering::SeqCst) {
                        drop(client);
                        continue;
                    }
                    let target = target.clone();
                    let (commit_cut, silent) = (commit_cut.clone(), silent.clone());
                    let task = tokio::spawn(async move {
                        if silent.load(Ordering::SeqCst) {
                            // A connection made into a partition never
                            // gets an answer, not even after it heals.
                            return std::future::pending().await;
                        }
                        if let Ok(server) = tokio::net::TcpStream::connect(target).await {
                            relay(client, server, commit_cut, silent).await;
                        }
                    });
                    let mut open = connections.lock().unwrap();
                    open.retain(|t| !t.is_finished());
                    open.push(task);
                }
            })
        };
        Self {
            addr,
            down,
            silent,
            commit_cut,
            connections,
            accept,
        }
    }

    /// The next `COMMIT` a client sends reaches the server, and then that
    /// connection is cut before the server's answer comes back: the
    /// transaction is committed, and its client cannot know it.
    pub fn cut_after_next_commit(&self) {
        self.commit_cut
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether an armed cut after a `COMMIT` has happened.
    pub fn commit_was_cut(&self) -> bool {
        !self.commit_cut.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The database goes away: every connection is dropped, new ones closed.
    pub fn cut(&self) {
        self.down.store(true, std::sync::atomic::Ordering::SeqCst);
        for task in self.connections.lock().unwrap().drain(..) {
            task.abort();
        }
    }

    /// A network partition: from now on nothing gets through either way,
    /// and nothing is closed. A connection that carries a byte meanwhile
    /// stays dead after [`FaultProxy::restore`] (TCP's retries back off to
    /// minutes: its peer is as good as gone); a connection made meanwhile
    /// never gets an answer; an idle one goes on once restored.
    pub fn black_hole(&self) {
        self.silent.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// The database is back.
    pub fn restore(&self) {
        self.down.store(false, std::sync::atomic::Ordering::SeqCst);
        self.silent
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Relays one connection both ways; see [`FaultProxy::cut_after_next_commit`].
async fn relay(
    client: tokio::net::TcpStream,
    server: tokio::net::TcpStream,
    commit_cut: Arc<std::sync::atomic::AtomicBool>,
    silent: Arc<std::sync::atomic::AtomicBool>,
) {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut client_in, mut client_out) = client.into_split();
    let (mut server_in, mut server_out) = server.into_split();
    let muted = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // A connection that carried a byte into a partition: nothing of it
    // gets through again, and neither side learns of the other's close.
    let dead = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let lost = {
        let (silent, dead) = (silent.clone(), dead.clone());
        move || {
            if silent.load(Ordering::SeqCst) {
                dead.store(true, Ordering::SeqCst);
            }
            dead.load(Ordering::SeqCst)
        }
    };
    let ended = {
        let dead = dead.clone();
        move || async move {
            if dead.load(Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
        }
    };
    let up = {
        let muted = muted.clone();
        let (lost, ended) = (lost.clone(), ended.clone());
        async move {
            let mut buffer = vec![0u8; 64 * 1024];
            loop {
                let n = match client_in.read(&mut buffer).await {
                    Ok(0) | Err(_) => return ended().await,
                    Ok(n) => n,
                };
                if lost() {
                    continue;
                }
                let chunk = &buffer[..n];
                // A simple-protocol query message: `Q`, its length, the text.
                let commits = chunk.windows(7).any(|w| w == b"COMMIT\0");
                let cut = commits && commit_cut.swap(false, Ordering::SeqCst);
                if cut {
                    muted.store(true, Ordering::SeqCst);
                }
                if server_out.write_all(chunk).await.is_err() {
                    return;
                }
                if cut {
                    // Let the server commit, then drop both sides.
                    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                    return;
                }
            }
        }
    };
    let down = async move {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            let n = match server_in.read(&mut buffer).await {
                Ok(0) | Err(_) => return ended().await,
                Ok(n) => n,
            };
            if muted.load(Ordering::SeqCst) || lost() {
                continue;
            }
            if client_out.write_all(&buffer[..n]).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}
