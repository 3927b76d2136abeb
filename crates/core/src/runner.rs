//! The turn runner: starts each turn in its own tracked task with its own
//! cancellation token, detached from the HTTP connection that asked for it;
//! numbers its events, sends them through the event log writer to live
//! subscribers, and commits its end.
//!
//! Only `POST .../cancel`, shutdown (after the grace period) or the turn's
//! budget stop a turn; a client that goes away merely stops listening.

mod attachments;
mod cancel;
mod heartbeat;
pub mod live;
mod orphans;
mod policy;
mod queue;
mod resume;
mod retention;
mod shutdown;
mod sink;
mod steer;
mod subscribe;
mod tenancy;
mod turn;
mod writer;

use std::{collections::HashMap, sync::Arc, time::Duration};

use chrono::{SubsecRound, Utc};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::Instrument;
use uuid::Uuid;

use crate::{
    events::{StoredEvent, TurnEvent},
    harness::AgentHarness,
    ids::SessionKey,
    metrics::Metrics,
    store::{
        BeginTurnError, NewTurn, Store, StoreError, TenantLimits, TurnReads, TurnRecord, TurnStatus,
    },
    turn::{TurnRequest, WebMode},
};
use live::{LiveTurn, LiveTurns};
pub use policy::StartPolicy;
pub use queue::QueuedStartError;
pub use steer::SteerError;
use writer::EventWriter;
pub use writer::WriterLimits;

/// Settings of the runner.
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    pub instance_id: String,
    pub history_max_messages: u32,
    pub heartbeat_interval: Duration,
    pub stale_turn_after: Duration,
    /// Take-overs a turn may have before it ends `interrupted`.
    pub max_attempts: u32,
    /// How often a subscriber to a turn run elsewhere re-reads the log.
    pub poll_interval: Duration,
    /// The event writer's queue, group size and linger.
    pub events: writer::WriterLimits,
    /// Woken when a turn's end has stored jobs for the background worker.
    pub jobs_queued: Arc<tokio::sync::Notify>,
    /// The background jobs running in this process (an erase stops its
    /// session's).
    pub running_jobs: Arc<crate::background::RunningJobs>,
    /// What a request may ask for.
    pub policy: StartPolicy,
    /// How long sessions are kept.
    pub retention: Retention,
}

/// How long sessions are kept after their last activity, and how often
/// the sweep that erases older ones runs ([`TurnRunner::sweep_retention`]).
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    /// The service's (`None`: forever); a tenant's own overrides it.
    pub default: Option<Duration>,
    pub every: Duration,
    /// How long the audit trail keeps a row (`None`: forever).
    pub audit: Option<Duration>,
}

/// A turn that [`TurnRunner::start`] began, or found by its idempotency key.
pub struct StartedTurn {
    pub turn_id: Uuid,
    /// True when the idempotency key named an existing turn.
    pub replayed: bool,
    /// Seq of the turn's `turn.started` event.
    pub first_seq: i64,
    /// For a new turn: a subscription taken before it could emit anything.
    pub live: Option<LiveStart>,
}

/// The start of a new turn's event stream, without a log read.
pub struct LiveStart {
    pub(crate) live: Arc<LiveTurn>,
    pub(crate) receiver: tokio::sync::broadcast::Receiver<live::Committed>,
    pub(crate) started: Arc<StoredEvent>,
}

/// Why a turn did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("the session already has a running turn {0}")]
    AlreadyRunning(Uuid),
    #[error("the idempotency key was used for a different request (turn {0})")]
    IdempotencyMismatch(Uuid),
    #[error("the service is shutting down")]
    ShuttingDown,
    /// The session belongs to another tenant.
    #[error("no such session")]
    SessionNotFound,
    /// The turn the request continues is not one of the session's.
    #[error("turn {0} is not a turn of this session")]
    ParentNotFound(Uuid),
    /// The request names a model the operator did not configure.
    #[error("the model {model:?} is not offered here; allowed: {}", allowed.join(", "))]
    ModelNotAllowed { model: String, allowed: Vec<String> },
    /// The request's client tools are larger than the operator allows.
    #[error("the client tools take {bytes} bytes, more than the {most} allowed")]
    ClientToolsTooLarge { bytes: usize, most: usize },
    /// A field of the request holds U+0000 (see
    /// [`crate::turn::TurnRequest::field_with_nul`]).
    #[error("`{0}` contains U+0000, which is not accepted")]
    HoldsNul(&'static str),
    /// The tenant runs as many turns as it may.
    #[error("the tenant runs {0} turns, as many as it may at once; retry when one ends")]
    TenantBusy(u32),
    /// The tenant used its tokens of the UTC day.
    #[error("the tenant used {used} of its {limit} tokens of today (UTC); retry after the reset")]
    QuotaExceeded {
        used: u64,
        limit: u64,
        /// Seconds until the next UTC midnight.
        retry_after: u64,
    },
    /// The output schema a request gives is not a JSON Schema.
    #[error("{0}")]
    InvalidOutputSchema(String),
    /// A part names a file the tenant does not have.
    #[error("file {0} not found")]
    FileNotFound(String),
    /// A part's file cannot be stored (too large, of no allowed type, over
    /// the tenant's quota).
    #[error("{field}: {error}")]
    Attachment {
        /// The part, as the client's request names it (`message[1]`).
        field: String,
        error: crate::files::FileError,
    },
    /// A part is not what it says (an image that is a PDF, data that is
    /// not base64, a URL that cannot be fetched).
    #[error("{field}: {detail}")]
    InvalidAttachment { field: String, detail: String },
    /// The turn's model does not read what a part is.
    #[error("the model {model} does not read {what}; use a model that does, or send text")]
    UnsupportedContent { model: String, what: &'static str },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a cancel did.
#[derive(Debug)]
pub enum CancelOutcome {
    /// The turn ended; here is its record (normally `cancelled`, or
    /// whatever it reached first).
    Ended(Box<TurnRecord>),
    /// The turn runs in another process; its owner will stop it.
    Requested,
}

/// Why a cancel was refused.
#[derive(Debug, thiserror::Error)]
pub enum CancelError {
    #[error("turn not found")]
    NotFound,
    #[error("turn is not running (status {0})")]
    NotRunning(TurnStatus),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Runs turns; cheap to clone.
#[derive(Clone)]
pub struct TurnRunner {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    harness: Arc<AgentHarness>,
    writer: EventWriter,
    live: LiveTurns,
    config: RunnerConfig,
    process_id: String,
    /// Turn tasks.
    turns: TaskTracker,
    /// Writer and heartbeat.
    background: TaskTracker,
    /// Set when shutdown begins: no new turns.
    draining: CancellationToken,
    /// Set when the grace period is over: running turns end `interrupted`
    /// (or, when take-over is on, are handed over wherever they stand).
    interrupt: CancellationToken,
    /// Set when shutdown begins, with take-over on: running turns stop at
    /// their next step boundary and are handed over.
    handover: CancellationToken,
    /// When this process last kept its turns alive.
    lease_clock: live::LeaseClock,
    /// Stops the heartbeat and then the writer.
    stop_background: CancellationToken,
    /// Ends every open event stream.
    close_streams: CancellationToken,
    /// How images and files given by URL are fetched (`None`: its client
    /// could not be built, and such a part is refused).
    outbound: Option<crate::outbox::Outbound>,
    /// The open event streams (each holds a token while it lives).
    streams: TaskTracker,
    /// The turns this process handed over at shutdown: session, turn and
    /// the attempt it held (a claim raises it).
    handed_over: std::sync::Mutex<Vec<(SessionKey, Uuid, u32)>>,
    /// Tenants' own limits as last read, and when.
    tenant_limits: std::sync::Mutex<HashMap<String, (std::time::Instant, TenantLimits)>>,
    /// Held while the limits are read: a burst of requests that finds
    /// them stale reads them once, not once each (a thousand reads at once
    /// would drain the pool).
    reading_limits: tokio::sync::Mutex<()>,
}

/// How long a tenant's own limits are taken as read.
const LIMITS_TTL: Duration = Duration::from_secs(5);

/// Tenants whose limits are kept at once.
const LIMITS_CACHED: usize = 10_000;

impl TurnRunner {
    /// Builds the runner and starts its writer and heartbeat.
    pub fn start_runner(
        store: Arc<dyn Store>,
        harness: Arc<AgentHarness>,
        config: RunnerConfig,
        metrics: Arc<Metrics>,
    ) -> Self {
        let background = TaskTracker::new();
        let stop_background = CancellationToken::new();
        let writer_stop = CancellationToken::new();
        // Half the time a turn takes to go stale: a beat may be a whole
        // interval late before writes are fenced.
        let lease_clock = live::LeaseClock::new(config.stale_turn_after / 2);
        let writer = EventWriter::spawn(
            store.clone(),
            metrics.clone(),
            config.events,
            &background,
            writer_stop.clone(),
            lease_clock.clone(),
        );
        let outbound = match crate::outbox::Outbound::new(&config.policy.outbound) {
            Ok(outbound) => Some(outbound),
            Err(e) => {
                tracing::error!(error = %e, "no client to fetch attachments by URL");
                None
            }
        };
        let runner = Self {
            inner: Arc::new(Inner {
                outbound,
                store,
                metrics,
                harness,
                writer,
                live: LiveTurns::default(),
                config,
                process_id: Uuid::now_v7().to_string(),
                turns: TaskTracker::new(),
                background,
                draining: CancellationToken::new(),
                interrupt: CancellationToken::new(),
                handover: CancellationToken::new(),
                lease_clock,
                stop_background,
                close_streams: CancellationToken::new(),
                streams: TaskTracker::new(),
                handed_over: std::sync::Mutex::default(),
                tenant_limits: std::sync::Mutex::default(),
                reading_limits: tokio::sync::Mutex::new(()),
            }),
        };
        let heartbeat_runner = runner.clone();
        let stop = runner.inner.stop_background.clone();
        runner.inner.background.spawn(async move {
            heartbeat::run(heartbeat_runner, stop).await;
            // The writer outlives the heartbeat so that late finishes commit.
            writer_stop.cancel();
        });
        runner
            .inner
            .background
            .spawn(heartbeat::listen_for_announcements(
                runner.clone(),
                runner.inner.stop_background.clone(),
            ));
        runner.inner.background.spawn(retention::run(
            runner.clone(),
            runner.inner.stop_background.clone(),
        ));
        runner
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// Stops this process's background jobs of the session stored as
    /// `session_id` (it was erased): what they would still write is
    /// refused by the store, and their model calls end now.
    pub fn stop_jobs_of(&self, session_id: &str) {
        let stopped = self.inner.config.running_jobs.stop_session(session_id);
        if stopped > 0 {
            tracing::info!(
                jobs = stopped,
                "stopped the background jobs of an erased session"
            );
        }
    }

    pub fn harness(&self) -> &Arc<AgentHarness> {
        &self.inner.harness
    }

    /// Turns running in this process.
    pub fn running_turns(&self) -> usize {
        self.inner.live.len()
    }

    pub fn is_draining(&self) -> bool {
        self.inner.draining.is_cancelled()
    }

    /// The tenant's limits, and what they make of a turn about to begin.
    async fn admission(&self, tenant: &str) -> Result<Admission, StartError> {
        let limits = self.tenant_limits(tenant).await?;
        // The turns this process runs are among the tenant's: when they
        // alone fill its share, no turn is written (a flood's refusals
        // then cost no write, and hold no other tenant's back).
        let busy_here = limits
            .max_running_turns
            .filter(|most| self.inner.live.count_of_tenant(tenant) >= *most as usize)
            .map(StartError::TenantBusy);
        // Held back, not refused yet: a request sent again with its key
        // still gets its turn (see `Turns::begin_turn`).
        let (quota_warning, held_back) = match self.quota(tenant, &limits).await {
            Ok(warning) => (warning, busy_here),
            Err(exceeded @ StartError::QuotaExceeded { .. }) => (None, Some(exceeded)),
            Err(other) => return Err(other),
        };
        Ok(Admission {
            limits,
            quota_warning,
            held_back,
        })
    }

    /// The `turn.started` of a turn of `spec`: its message, the provider
    /// and model it runs on, and what it will do otherwise than it asks.
    fn started_event(&self, spec: &TurnRequest) -> TurnEvent {
        let (provider, model) = self.inner.harness.resolve_provider_model(
            spec.runtime_provider.as_deref(),
            spec.runtime_model.as_deref(),
        );
        TurnEvent::TurnStarted {
            message: spec.message.clone(),
            provider,
            model,
            warnings: self.warnings(spec),
        }
    }

    /// What a turn of `spec` reads before its first provider call.
    fn first_reads(&self, spec: &TurnRequest, memory_scope: &str) -> TurnReads {
        TurnReads {
            history: spec
                .history
                .is_none()
                .then_some(self.inner.config.history_max_messages),
            memory: self.inner.harness.memory_query(memory_scope, &spec.message),
        }
    }

    /// What a turn of `spec` will do otherwise than it asks.
    fn warnings(&self, spec: &TurnRequest) -> Vec<String> {
        let mut warnings = Vec::new();
        let tools = self.inner.harness.tools();
        if spec.web_mode == WebMode::On && tools.get("web_search").is_none() {
            warnings.push(
                "web_mode is on, but no search service is set (HARNESS_WEB_SEARCH_URL): \
                 only fetch_url is offered, for pages the message names"
                    .to_owned(),
            );
        }
        warnings
    }

    /// Begins a turn of a tenant's session and starts it in the background.
    pub async fn start(
        &self,
        session_id: &SessionKey,
        spec: TurnRequest,
        idempotency_key: Option<String>,
    ) -> Result<StartedTurn, StartError> {
        if self.is_draining() {
            return Err(StartError::ShuttingDown);
        }
        let inner = &self.inner;
        // Every route that starts a turn comes here.
        inner.config.policy.admit(&spec)?;
        let Admission {
            limits,
            quota_warning,
            held_back,
        } = self.admission(session_id.tenant()).await?;
        let mut spec = spec;
        let made = self.resolve_attachments(session_id, &mut spec).await?;
        let started = self
            .begin(
                session_id,
                spec,
                idempotency_key,
                limits,
                quota_warning,
                held_back,
            )
            .await;
        if started.as_ref().is_err() {
            self.take_back(session_id, &made).await;
        }
        started
    }

    /// Begins a turn admitted and resolved (see [`Self::start`]).
    async fn begin(
        &self,
        session_id: &SessionKey,
        spec: TurnRequest,
        idempotency_key: Option<String>,
        limits: TenantLimits,
        quota_warning: Option<TurnEvent>,
        held_back: Option<StartError>,
    ) -> Result<StartedTurn, StartError> {
        let inner = &self.inner;
        let turn_id = Uuid::now_v7();
        let now = Utc::now().trunc_subsecs(6);
        let started = self.started_event(&spec);
        let encode = |e: serde_json::Error| StoreError::Corrupt(e.to_string());
        let memory_scope = spec.memory_scope(session_id);
        let span = turn_span(turn_id, session_id);
        let new_turn = NewTurn {
            id: turn_id,
            session_id: session_id.clone(),
            tenant: session_id.tenant().to_owned(),
            request: spec.clone(),
            idempotency_key,
            owner_instance: inner.config.instance_id.clone(),
            owner_process: inner.process_id.clone(),
            created_at: now,
            started_payload: serde_json::to_string(&started).map_err(encode)?,
            traceparent: crate::telemetry::traceparent(&span),
            reads: self.first_reads(&spec, &memory_scope),
            max_running: limits.max_running_turns,
            held_back: held_back.is_some(),
        };
        let began = match inner.store.begin_turn(&new_turn).await {
            Ok(began) => began,
            Err(refused) => return not_begun(refused, &new_turn, &limits, held_back),
        };
        inner.metrics.turn_started();
        let live = inner.live.insert(session_id, turn_id, 0);
        // Subscribed before the task can publish anything: the caller's
        // stream starts from the known `turn.started` without a log read.
        let receiver = live.subscribe();
        let started_event = Arc::new(
            StoredEvent::new(session_id.as_str(), turn_id, began.first_seq, &started, now)
                .map_err(encode)?,
        );
        let runner = self.clone();
        let first_seq = began.first_seq;
        inner.turns.spawn(
            runner
                .drive(
                    live.clone(),
                    Arc::new(spec),
                    began,
                    memory_scope,
                    quota_warning,
                )
                .instrument(span),
        );
        Ok(StartedTurn {
            turn_id,
            replayed: false,
            first_seq,
            live: Some(LiveStart {
                live,
                receiver,
                started: started_event,
            }),
        })
    }

    /// A token cancelled when open streams must end.
    pub fn streams_closed(&self) -> CancellationToken {
        self.inner.close_streams.clone()
    }
}

/// The span of a turn a request began (its trace is the request's).
fn turn_span(turn_id: Uuid, session_id: &SessionKey) -> tracing::Span {
    tracing::info_span!(
        "turn",
        otel.name = "invoke_agent",
        gen_ai.operation.name = "invoke_agent",
        turn.id = %turn_id,
        session.id = %session_id,
        turn.status = tracing::field::Empty,
    )
}

/// What a tenant's limits make of a turn about to begin.
struct Admission {
    limits: TenantLimits,
    /// `quota.warning`, when the tenant is past 80% of its quota.
    quota_warning: Option<TurnEvent>,
    /// Why the turn is held back (its tenant is at a limit): the begin
    /// writes nothing, and answers the turn's conflict if it has one.
    held_back: Option<StartError>,
}

/// What a begin the store refused answers: the turn its idempotency key
/// names when the request is the same, else the refusal.
fn not_begun(
    refused: BeginTurnError,
    new_turn: &NewTurn,
    limits: &TenantLimits,
    held_back: Option<StartError>,
) -> Result<StartedTurn, StartError> {
    match refused {
        BeginTurnError::AlreadyRunning(running) => Err(StartError::AlreadyRunning(running)),
        BeginTurnError::IdempotencyKeyExists(existing) => {
            if existing.request == new_turn.request {
                Ok(StartedTurn {
                    turn_id: existing.id,
                    replayed: true,
                    first_seq: existing.first_seq,
                    live: None,
                })
            } else {
                Err(StartError::IdempotencyMismatch(existing.id))
            }
        }
        BeginTurnError::SessionNotFound => Err(StartError::SessionNotFound),
        BeginTurnError::ParentNotFound => Err(StartError::ParentNotFound(
            new_turn.request.follows.unwrap_or_default(),
        )),
        BeginTurnError::TenantBusy => Err(StartError::TenantBusy(
            limits.max_running_turns.unwrap_or_default(),
        )),
        BeginTurnError::HeldBack => Err(held_back.unwrap_or(StartError::TenantBusy(0))),
        BeginTurnError::Store(e) => Err(e.into()),
    }
}
