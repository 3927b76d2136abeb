//! Building and running the service; shared by the binary and the tests.

mod adapters;
mod build;

use adapters::MetricsCallbacks;
use build::provider_names;

pub use adapters::{StoreApprovals, StoreArtifacts, StoreClientResults, VaultCheckpoints};

use std::{net::SocketAddr, sync::Arc, time::Duration};

use tokio::net::TcpListener;
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use crate::{
    app::{App, AppState},
    background::jobs::BackgroundWorker,
    config::Settings,
    http,
    metrics::Metrics,
    protocols::{Protocols, mcp::McpState},
    providers::{LlmProvider, ProviderError},
    runner::{RunnerConfig, TurnRunner},
    service::TurnService,
    store::{self, StoreError},
    tools::{Tool, mcp::McpHub},
    vault::{Vault, VaultError, Vaults},
};

pub use build::{
    build_harness, build_provider, build_vault, build_worker, declared_tools, retry_policy,
};

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("database: {0}")]
    Store(#[from] StoreError),
    #[error("provider: {0}")]
    Provider(#[from] ProviderError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("server error: {0}")]
    Serve(std::io::Error),
    #[error("tool {name:?}: {reason}")]
    Tool { name: String, reason: String },
}

/// A built service: store migrated, orphans recovered, socket bound.
pub struct Application {
    listener: TcpListener,
    /// `/metrics` alone, when `HARNESS_METRICS_LISTEN` sets it apart.
    metrics_listener: Option<TcpListener>,
    port: u16,
    app: AppState,
    shutdown: CancellationToken,
    worker: BackgroundWorker,
}

impl Application {
    /// Connects the store, applies migrations, interrupts turns a previous
    /// process left running, and binds the listener.
    pub async fn build(settings: Settings) -> Result<Self, StartupError> {
        let store =
            store::connect(settings.database.url.as_str(), settings.database.limits()).await?;
        store.migrate().await?;
        let provider = build_provider(&settings)?;
        Self::build_with(settings, store, provider).await
    }

    /// [`Application::build`] with a given store and provider.
    pub async fn build_with(
        settings: Settings,
        store: Arc<dyn store::Store>,
        provider: Arc<dyn LlmProvider>,
    ) -> Result<Self, StartupError> {
        Self::build_with_tools(settings, store, provider, Vec::new()).await
    }

    /// [`Application::build_with`] with tools beyond the built-in ones.
    #[expect(
        clippy::too_many_lines,
        reason = "builds each part of the service in the order they need each other"
    )]
    pub async fn build_with_tools(
        settings: Settings,
        store: Arc<dyn store::Store>,
        provider: Arc<dyn LlmProvider>,
        extra_tools: Vec<Arc<dyn Tool>>,
    ) -> Result<Self, StartupError> {
        let provider_names = provider_names(&settings);
        let vaults = Arc::new(Vaults::new(
            build_vault(&settings, store.clone())?,
            settings.vault.sharing(),
        ));
        let vault = vaults.default_vault().clone();
        let jobs = Arc::new(tokio::sync::Notify::new());
        let approvals = Arc::new(tokio::sync::Notify::new());
        let metrics = Arc::new(Metrics::default());
        let running_jobs = Arc::new(crate::background::RunningJobs::default());
        let worker = build_worker(
            &settings,
            store.clone(),
            provider.clone(),
            vault.embedder(),
            jobs.clone(),
        )
        .with_metrics(metrics.clone())
        .with_running(running_jobs.clone());
        let mut tools = declared_tools(&settings, |name| std::env::var(name).ok())?;
        let servers = settings
            .tools
            .mcp
            .as_ref()
            .map_or(&[][..], |list| list.0.as_slice());
        let (mcp, mcp_tools) = McpHub::start(servers, |name| std::env::var(name).ok()).await;
        tools.extend(mcp_tools);
        tools.extend(extra_tools);
        let harness = Arc::new(build_harness(
            &settings,
            store.clone(),
            vaults.clone(),
            provider,
            tools,
            approvals.clone(),
            Arc::new(MetricsCallbacks(metrics.clone())),
        ));
        let runner = TurnRunner::start_runner(
            store.clone(),
            harness,
            runner_config(&settings, jobs.clone(), running_jobs),
            metrics,
        );
        let recovered = runner.recover_orphans().await?;
        if recovered > 0 {
            tracing::warn!(
                turns = recovered,
                "interrupted turns left running by a previous process"
            );
        }
        let (listener, port, settings) = listen(settings).await?;
        let metrics_listener = match settings.server.metrics_listen {
            Some(addr) => Some(bind(addr, "metrics").await?),
            None => None,
        };
        let settings = Arc::new(settings);
        let protocols = Arc::new(Protocols {
            turns: TurnService::new(runner.clone(), approvals),
            settings: settings.clone(),
            vaults: vaults.clone(),
            provider_names,
            mcp: McpState::default(),
            pushes_due: Arc::default(),
        });
        let app = AppState::new(App {
            settings,
            store,
            runner,
            vaults,
            mcp: Arc::new(mcp),
            key_streams: Arc::default(),
            protocols,
        });
        Ok(Self {
            listener,
            metrics_listener,
            port,
            app,
            shutdown: CancellationToken::new(),
            worker,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn app(&self) -> &AppState {
        &self.app
    }

    /// A token that, when cancelled, shuts the service down gracefully.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Serves until the shutdown token is cancelled, then stops accepting,
    /// gives running turns the grace period, interrupts the rest, flushes
    /// the event log and ends open streams.
    pub async fn run_until_stopped(self) -> Result<(), StartupError> {
        let Self {
            listener,
            metrics_listener,
            app,
            shutdown,
            worker,
            ..
        } = self;
        let background = TaskTracker::new();
        worker.spawn(&background, shutdown.clone());
        if let Some(metrics) = metrics_listener {
            let router = http::metrics_router(app.clone());
            let stop = shutdown.clone();
            background.spawn(async move {
                let served = axum::serve(metrics, router)
                    .with_graceful_shutdown(stop.cancelled_owned())
                    .await;
                if let Err(e) = served {
                    tracing::error!(error = %e, "the metrics listener stopped");
                }
            });
        }
        spawn_outbox(&app, &background, &shutdown).await;
        background.spawn(crate::http::watch_revoked(app.clone(), shutdown.clone()));
        if app.settings.vault.index_on_start {
            background.spawn(index_vaults_at_start(app.vaults.clone(), shutdown.clone()));
        }
        background.close();
        let router = http::router(app.clone());
        let limits = http::server::ConnectionLimits {
            header_read_timeout: Duration::from_secs(app.settings.server.header_read_timeout_s),
            idle_timeout: Duration::from_secs(app.settings.server.idle_timeout_s),
            max_connections: app
                .settings
                .server
                .max_connections
                .unwrap_or_else(http::server::default_max_connections),
            max_header_bytes: http::HYPER_MAX_HEAD_BYTES,
        };
        let server = http::server::serve(listener, router, limits, shutdown.clone());
        let mut server = std::pin::pin!(server);
        tokio::select! {
            result = &mut server => {
                // The server stopped on its own: still end turns cleanly.
                shutdown.cancel();
                background.wait().await;
                app.runner.shutdown(Duration::ZERO).await;
                app.mcp.shutdown().await;
                return result.map_err(StartupError::Serve);
            }
            () = shutdown.cancelled() => {}
        }
        tracing::info!(running = app.runner.running_turns(), "shutting down");
        // The start-up indexing stops with the shutdown token.
        background.wait().await;
        let grace = Duration::from_secs(app.settings.server.shutdown_grace_s);
        let drain = app.runner.shutdown(grace);
        // Keep serving the open connections while turns drain.
        let (_, served) = tokio::join!(drain, async {
            match tokio::time::timeout(grace + Duration::from_secs(30), &mut server).await {
                Ok(result) => result,
                Err(_) => {
                    tracing::warn!("connections still open after shutdown; closing");
                    Ok(())
                }
            }
        });
        // Turns are over: the MCP servers can go.
        app.mcp.shutdown().await;
        served.map_err(StartupError::Serve)
    }
}

/// Indexes the vault in the background at start; a missing folder is no
/// vault, not an error. Stops when the service shuts down.
/// The runner's settings.
fn runner_config(
    settings: &Settings,
    jobs_queued: Arc<tokio::sync::Notify>,
    running_jobs: Arc<crate::background::RunningJobs>,
) -> RunnerConfig {
    RunnerConfig {
        instance_id: settings.server.instance_id.clone(),
        history_max_messages: settings.harness.history_max_messages,
        heartbeat_interval: Duration::from_secs(settings.server.heartbeat_interval_s),
        stale_turn_after: settings.server.stale_turn_after(),
        max_attempts: settings.server.turn_max_attempts,
        poll_interval: Duration::from_millis(250),
        events: crate::runner::WriterLimits {
            capacity: settings.database.event_queue_capacity,
            batch_max: settings.database.event_batch_max,
            linger: Duration::from_millis(settings.database.event_linger_ms),
        },
        jobs_queued,
        running_jobs,
        policy: crate::runner::StartPolicy {
            allowed_models: settings.allowed_models(),
            client_tools_max_bytes: settings.harness.client_tools_max_bytes,
            tenant_defaults: settings.server.tenant_defaults(),
            files: settings.server.file_limits(),
            outbound: outbound_trust(settings),
            pass_urls: settings.server.file_urls == crate::files::FileUrls::Pass,
        },
        retention: crate::runner::Retention {
            default: settings.server.retention.map(|span| span.0),
            every: settings.server.retention_sweep_interval.0,
            audit: settings.server.audit_retention.map(|span| span.0),
        },
    }
}

/// A listener on `addr` (`what` names it in the log).
async fn bind(addr: SocketAddr, what: &str) -> Result<TcpListener, StartupError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| StartupError::Bind { addr, source })?;
    if let Ok(at) = listener.local_addr() {
        tracing::info!(addr = %at, "{what} listening");
    }
    Ok(listener)
}

/// The service's listener, its port, and the settings with the public URL
/// the agent card and the links name: without one set, the address it
/// bound (port 0 chose a port).
async fn listen(mut settings: Settings) -> Result<(TcpListener, u16, Settings), StartupError> {
    let addr = settings.server.listen;
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| StartupError::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| StartupError::Bind { addr, source })?;
    if settings.server.public_url.is_none() {
        let host = if bound.ip().is_unspecified() {
            format!("localhost:{}", bound.port())
        } else {
            bound.to_string()
        };
        settings.server.public_url = format!("http://{host}").parse().ok();
    }
    Ok((listener, bound.port(), settings))
}

async fn index_vaults_at_start(vaults: Arc<Vaults>, shutdown: CancellationToken) {
    index_vault_at_start(vaults.default_vault(), &shutdown).await;
    // The tenants' vaults that have a folder (bounded: as many as kept).
    for tenant in vaults.tenants_with_folders(1_000) {
        index_vault_at_start(&vaults.of_tenant(&tenant), &shutdown).await;
    }
}

async fn index_vault_at_start(vault: &Vault, shutdown: &CancellationToken) {
    tokio::select! {
        result = vault.reindex(&()) => match result {
            Ok(report) => tracing::info!(summary = %report.summary(), "vault indexed"),
            Err(VaultError::Missing(path)) => tracing::info!(
                folder = %path.display(),
                "no vault folder: the retrieval tools find nothing until notes are written"
            ),
            Err(e) => tracing::warn!(error = %e, "the vault could not be indexed at start"),
        },
        () = shutdown.cancelled() => {}
    }
}

/// Resolves on SIGTERM or ctrl-c.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for ctrl-c");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}

/// Whom the service's own requests may reach and trust (the settings
/// were validated: a CA file that could not be read then stopped the
/// start; one gone since leaves the system's roots alone).
fn outbound_trust(settings: &Settings) -> crate::outbox::Trust {
    settings.server.outbound_trust().unwrap_or_else(|why| {
        tracing::error!(why, "HARNESS_OUTBOUND_CA_FILE: the system's roots alone");
        crate::outbox::Trust {
            allow_private: settings.server.outbound_allow_private,
            roots: Vec::new(),
        }
    })
}

/// The outbox's two users on `background`: A2A pushes, webhooks (the
/// operator's endpoint saved first).
async fn spawn_outbox(app: &AppState, background: &TaskTracker, shutdown: &CancellationToken) {
    let server = &app.settings.server;
    let instance = server.instance_id.clone();
    let trust = outbound_trust(&app.settings);
    let (store, stop) = (app.store.clone(), shutdown.clone());
    let wake = app.protocols.pushes_due.clone();
    let pushes = Arc::new(crate::protocols::a2a::push::fold::A2aPushes);
    let pushing = trust.clone();
    background.spawn(async move {
        let who = (instance.as_str(), &pushing);
        crate::outbox::pushes::deliver(store, pushes, who, wake, stop).await;
    });
    if let Err(e) = http::webhooks::put_operator(app).await {
        tracing::error!(error = %e, "webhooks: the operator's endpoint was not saved");
    }
    let (instance, store, stop) = (
        server.instance_id.clone(),
        app.store.clone(),
        shutdown.clone(),
    );
    background.spawn(async move {
        crate::outbox::webhooks::deliver(store, &instance, &trust, stop).await;
    });
}
