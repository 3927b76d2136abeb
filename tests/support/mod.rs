//! Databases for tests: a fresh SQLite file, or a fresh Postgres schema on
//! the server named by `TEST_DATABASE_URL` (default: the local trust-auth
//! server, database `test`). Both are real; nothing is mocked.

#![allow(dead_code, reason = "each test binary uses a different part")]

use std::{str::FromStr, sync::Arc};

use agent_harness::store::{Store, postgres::PostgresStore, sqlite::SqliteStore};
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

/// A database of one test; reopen it with [`TestDb::open`] to simulate a restart.
pub struct TestDb {
    pub backend: Backend,
    /// SQLite: the file's folder.
    dir: Option<TempDir>,
    /// Postgres: the test's own schema.
    schema: Option<String>,
}

impl TestDb {
    pub async fn new(backend: Backend) -> Self {
        match backend {
            Backend::Sqlite => Self {
                backend,
                dir: Some(tempfile::tempdir().expect("temp dir")),
                schema: None,
            },
            Backend::Postgres => {
                let schema = format!("t_{}", uuid::Uuid::now_v7().simple());
                let admin = PgPoolOptions::new()
                    .max_connections(1)
                    .connect(&postgres_url())
                    .await
                    .unwrap_or_else(|e| {
                        panic!(
                            "Postgres is not reachable at {} ({e}); start it or set TEST_DATABASE_URL",
                            postgres_url()
                        )
                    });
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
                    .execute(&admin)
                    .await
                    .expect("create schema");
                admin.close().await;
                Self {
                    backend,
                    dir: None,
                    schema: Some(schema),
                }
            }
        }
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
        let schema = self.schema.as_deref().expect("a Postgres test database");
        let options = PgConnectOptions::from_str(&postgres_url())
            .expect("TEST_DATABASE_URL")
            .host("127.0.0.1")
            .port(proxy.addr.port())
            .options([("search_path", schema)]);
        let pool = PostgresStore::pool_options(8, std::time::Duration::from_secs(1))
            .connect_with(options)
            .await
            .expect("connect Postgres through the proxy");
        let store: Arc<dyn Store> = Arc::new(PostgresStore::from_pool(pool));
        store.migrate().await.expect("migrate");
        store
    }

    /// `host:port` of the Postgres server.
    pub fn postgres_addr() -> String {
        let options = PgConnectOptions::from_str(&postgres_url()).expect("TEST_DATABASE_URL");
        format!("{}:{}", options.get_host(), options.get_port())
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
                let pool = PostgresStore::pool_options(8, std::time::Duration::from_secs(1))
                    .connect_with(options)
                    .await
                    .expect("connect Postgres");
                Arc::new(PostgresStore::from_pool(pool))
            }
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
                    super::$name($crate::support::Backend::Postgres).await;
                }
            }
        )+
    };
}

/// A TCP proxy in front of a database that a test can cut: existing
/// connections are dropped and new ones closed at once, as a database that
/// went down looks to its clients; `restore` lets connections through again.
pub struct FaultProxy {
    pub addr: std::net::SocketAddr,
    down: Arc<std::sync::atomic::AtomicBool>,
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
        let connections: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
        let accept = {
            let (down, connections) = (down.clone(), connections.clone());
            tokio::spawn(async move {
                while let Ok((mut client, _)) = listener.accept().await {
                    if down.load(Ordering::SeqCst) {
                        drop(client);
                        continue;
                    }
                    let target = target.clone();
                    let task = tokio::spawn(async move {
                        if let Ok(mut server) = tokio::net::TcpStream::connect(target).await {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
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
            connections,
            accept,
        }
    }

    /// The database goes away: every connection is dropped, new ones closed.
    pub fn cut(&self) {
        self.down.store(true, std::sync::atomic::Ordering::SeqCst);
        for task in self.connections.lock().unwrap().drain(..) {
            task.abort();
        }
    }

    /// The database is back.
    pub fn restore(&self) {
        self.down.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}
