//! The worker that runs the jobs turns leave behind: memory extraction and
//! judges. One per process; jobs are claimed from the store (so replicas
//! share them and a restart loses none), each model call bounded in time
//! and output tokens, its usage and cost recorded on the job.

mod announce;

use std::{sync::Arc, time::Duration};

use chrono::{SubsecRound, Utc};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::Instrument;
use uuid::Uuid;

use super::{
    JOB_JUDGE, JOB_JUDGEMENT_EVENT, JOB_MEMORY,
    answers::{EXTRACTION_PROMPT, Extracted, JUDGE_PROMPT, Verdict, cut, json_object, normal_key},
    judges::{JudgeConfig, JudgeJob},
    memory::ExtractionJob,
};
use crate::{
    providers::{
        ChatMessage, ChatRequest, LlmProvider, Role, Usage, catalogue::ModelCatalogue,
        collect_text, embeddings::Embedder,
    },
    store::{EventLog, JobOutcome, JobRecord, JobUsage, Jobs, JudgementRecord, NewMemory, Store},
};

/// How often the store is checked for jobs when nothing woke the worker.
const POLL: Duration = Duration::from_secs(2);

/// How often the backlog is measured (and shed past its bound).
const BACKLOG_EVERY: Duration = Duration::from_secs(1);

/// A job claimed longer ago than this is taken to have lost its runner.
const STALE_AFTER: chrono::Duration = chrono::Duration::minutes(5);

/// Tries of a job that asks a model.
const MODEL_ATTEMPTS: i64 = 4;

/// Tries of a judgement's event, 2 s apart, while the session is busy.
const EVENT_ATTEMPTS: i64 = 150;

/// Characters of a conversation or an answer shown to a side call.
const SHOWN_CHARS: usize = 8000;

/// Memories one extraction keeps, at most.
const MEMORIES_PER_TURN: usize = 5;

/// How long a side call may take and how long its answer may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SideCallLimits {
    pub timeout: Duration,
    pub max_output_tokens: u32,
}

/// What the worker runs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// `None`: memory extraction is off (queued jobs are given up).
    pub extraction: Option<SideCallLimits>,
    pub judges: Vec<JudgeConfig>,
    /// `None`: judges are off.
    pub judging: Option<SideCallLimits>,
    /// Mask personal data in judgements (`HARNESS_REDACT_LOGS`).
    pub redact: bool,
    /// Jobs run at once (`HARNESS_JOB_CONCURRENCY`).
    pub concurrency: usize,
    /// Waiting jobs past which the oldest memory extractions are given up
    /// (`HARNESS_JOB_BACKLOG_MAX`).
    pub backlog_max: u64,
    /// Which jobs see the images and PDFs of the turn they read.
    pub images: super::images::JobImages,
}

/// The background worker.
pub struct BackgroundWorker {
    /// Where jobs, memories and judgements are kept.
    jobs: Arc<dyn Jobs>,
    /// Where a turn's images are read from (for the jobs that see them).
    store: Arc<dyn Store>,
    /// Where a judgement is announced to the session's stream.
    log: Arc<dyn EventLog>,
    provider: Arc<dyn LlmProvider>,
    pricing: Arc<ModelCatalogue>,
    embedder: Option<Arc<dyn Embedder>>,
    config: WorkerConfig,
    notify: Arc<tokio::sync::Notify>,
    /// The backlog's gauges and the shed counter.
    metrics: Option<Arc<crate::metrics::Metrics>>,
    /// The jobs running, which an erase stops.
    running: Arc<super::RunningJobs>,
}

/// The model usage of one run of a job.
#[derive(Debug, Default)]
struct Spent(JobUsage);

/// How a job ends whose session was erased while it ran: it wrote nothing.
fn erased() -> JobOutcome {
    failed("its session was erased".into())
}

/// A step of a job: its value, or how the job's run ends.
type Step<T> = Result<T, JobOutcome>;

/// The end of trying a job.
fn failed(error: String) -> JobOutcome {
    JobOutcome::Failed { error }
}

/// A model call or a write that failed: tried again later, a few times.
fn retry(job: &JobRecord, error: String) -> JobOutcome {
    BackgroundWorker::again(job, error, MODEL_ATTEMPTS, Duration::from_secs(10))
}

/// A job's payload as `T` (one that does not read never will).
fn payload<T: serde::de::DeserializeOwned>(job: &JobRecord) -> Step<T> {
    serde_json::from_str(&job.payload).map_err(|e| failed(e.to_string()))
}

impl BackgroundWorker {
    pub fn new(
        store: Arc<dyn Store>,
        provider: Arc<dyn LlmProvider>,
        pricing: Arc<ModelCatalogue>,
        embedder: Option<Arc<dyn Embedder>>,
        config: WorkerConfig,
        notify: Arc<tokio::sync::Notify>,
    ) -> Self {
        Self {
            jobs: store.clone(),
            log: store.clone(),
            store,
            provider,
            pricing,
            embedder,
            config,
            notify,
            metrics: None,
            running: Arc::default(),
        }
    }

    /// Registers each running job in `running` (which an erase stops).
    pub fn with_running(mut self, running: Arc<super::RunningJobs>) -> Self {
        self.running = running;
        self
    }

    /// Reports the backlog to `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Runs the worker on `tracker` until `stop`. A job running when it
    /// stops stays claimed, and is claimed again once stale.
    pub fn spawn(self, tracker: &TaskTracker, stop: CancellationToken) {
        tracker.spawn(Arc::new(self).run(stop));
    }

    /// Claims jobs while fewer than `concurrency` run, runs each on its own
    /// task (in a set owned here: stopping the worker stops them), and
    /// keeps the backlog within its bound.
    async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut running = tokio::task::JoinSet::new();
        let mut checked: Option<tokio::time::Instant> = None;
        loop {
            if checked.is_none_or(|at| at.elapsed() >= BACKLOG_EVERY) {
                self.check_backlog().await;
                checked = Some(tokio::time::Instant::now());
            }
            while running.len() < self.config.concurrency.max(1) {
                let now = Utc::now();
                let claimed = tokio::select! {
                    claimed = self.jobs.claim_job(now, now - STALE_AFTER) => claimed,
                    () = stop.cancelled() => return,
                };
                match claimed {
                    Ok(Some(job)) => {
                        running.spawn(self.clone().run_one(job));
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot claim a background job");
                        break;
                    }
                }
            }
            tokio::select! {
                Some(_) = running.join_next(), if !running.is_empty() => {}
                () = self.notify.notified() => {}
                () = tokio::time::sleep(POLL) => {}
                () = stop.cancelled() => return,
            }
        }
    }

    /// Runs one claimed job and records how it ended.
    async fn run_one(self: Arc<Self>, job: JobRecord) {
        let span = tracing::info_span!(
            "background_job",
            job.id = %job.id,
            job.kind = %job.kind,
            session_id = %job.session_id,
            turn_id = %job.turn_id,
        );
        let mut spent = Spent::default();
        let stop = self.running.begin(&job.id, &job.session_id);
        let outcome = tokio::select! {
            outcome = self.run_job(&job, &mut spent).instrument(span) => outcome,
            // Its session was erased: what it would write is refused.
            () = stop.cancelled() => erased(),
        };
        self.running.end(&job.id);
        if let JobOutcome::Failed { error } | JobOutcome::Retry { error, .. } = &outcome {
            tracing::warn!(job = %job.id, kind = %job.kind, error = %error, "background job did not finish");
        }
        if let Err(e) = self
            .jobs
            .finish_job(&job.id, &outcome, &spent.0, Utc::now())
            .await
        {
            tracing::warn!(error = %e, job = %job.id, "cannot record a background job's end");
        }
    }

    /// Shows the backlog in the metrics, and past its bound gives up the
    /// oldest waiting memory extractions (a user's later turns bring later
    /// ones); judge jobs are never given up.
    async fn check_backlog(&self) {
        let backlog = match self.jobs.job_backlog().await {
            Ok(backlog) => backlog,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the job backlog");
                return;
            }
        };
        let mut shed_any = false;
        if backlog.pending > self.config.backlog_max {
            let why = format!(
                "given up: more than {} jobs were waiting (HARNESS_JOB_BACKLOG_MAX)",
                self.config.backlog_max
            );
            match self
                .jobs
                .shed_jobs(JOB_MEMORY, self.config.backlog_max, &why, Utc::now())
                .await
            {
                Ok(shed) if shed > 0 => {
                    shed_any = true;
                    tracing::warn!(
                        jobs = shed,
                        bound = self.config.backlog_max,
                        "memory extractions given up: the backlog is over its bound"
                    );
                    if let Some(metrics) = &self.metrics {
                        metrics.jobs_shed(JOB_MEMORY, shed);
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "cannot shed the job backlog"),
            }
        }
        if let Some(metrics) = &self.metrics {
            // Read again only when some were given up.
            let backlog = if shed_any {
                self.jobs.job_backlog().await.unwrap_or(backlog)
            } else {
                backlog
            };
            let age = backlog.oldest.map_or(0.0, |at| {
                (Utc::now() - at).num_milliseconds().max(0) as f64 / 1000.0
            });
            metrics.job_backlog(backlog.pending, age);
        }
    }

    async fn run_job(&self, job: &JobRecord, spent: &mut Spent) -> JobOutcome {
        let ran = match job.kind.as_str() {
            JOB_MEMORY => self.extract(job, spent).await,
            JOB_JUDGE => self.judge(job, spent).await,
            JOB_JUDGEMENT_EVENT => return self.append_event(job).await,
            other => Err(failed(format!("unknown job kind {other:?}"))),
        };
        ran.map_or_else(|outcome| outcome, |()| JobOutcome::Done)
    }

    /// Asks `task`'s model and reads its answer as a JSON object of `T`.
    /// The call is paid for whatever comes of it; a model that did not
    /// answer is asked again later, one that answered something else is
    /// not (it would not do better).
    async fn ask_for<T: serde::de::DeserializeOwned>(
        &self,
        job: &JobRecord,
        spent: &mut Spent,
        (provider, model): (&str, &str),
        (system, user): (&str, ChatMessage),
        limits: SideCallLimits,
    ) -> Step<T> {
        let (answer, usage) = self.ask(provider, model, system, user, limits).await;
        self.spend(spent, model, &usage);
        let text = answer.map_err(|e| retry(job, e))?;
        json_object(&text).map_err(failed)
    }

    /// A retry later, or the end of trying.
    fn again(job: &JobRecord, error: String, attempts: i64, delay: Duration) -> JobOutcome {
        if job.attempts >= attempts {
            return JobOutcome::Failed { error };
        }
        let after = Utc::now() + chrono::Duration::from_std(delay).unwrap_or_default();
        JobOutcome::Retry { error, after }
    }

    /// Asks `provider`'s `model`; the text and usage, or why not.
    async fn ask(
        &self,
        provider: &str,
        model: &str,
        system: &str,
        user: ChatMessage,
        limits: SideCallLimits,
    ) -> (Result<String, String>, Usage) {
        let request = ChatRequest {
            provider: Some(provider.to_owned()),
            ..ChatRequest::new(
                model,
                vec![ChatMessage::new(Role::System, system.to_owned()), user],
                limits.timeout,
            )
        }
        .with_max_output_tokens(limits.max_output_tokens);
        let collected = match tokio::time::timeout(
            limits.timeout,
            collect_text(self.provider.as_ref(), request),
        )
        .await
        {
            Ok(collected) => collected,
            Err(_) => {
                return (
                    Err("the model did not answer in time".into()),
                    Usage::default(),
                );
            }
        };
        tracing::info!(
            gen_ai.request.model = %model,
            gen_ai.usage.input_tokens = collected.usage.input_tokens,
            gen_ai.usage.output_tokens = collected.usage.output_tokens,
            "side call"
        );
        match collected.error {
            Some(e) => (Err(e.to_string()), collected.usage),
            None => (Ok(collected.text), collected.usage),
        }
    }

    /// A job's prompt, with the images and PDFs of the turn it reads when
    /// the operator lets it see them (`images`).
    async fn shown(&self, job: &JobRecord, images: bool, text: String) -> Step<ChatMessage> {
        let mut message = ChatMessage::new(Role::User, text);
        if images {
            let at = message.content.len();
            message.attachments =
                super::images::of_turn(self.store.as_ref(), &job.session_id, &job.turn_id)
                    .await
                    .map_err(|e| retry(job, e.to_string()))?
                    .into_iter()
                    .map(|a| crate::providers::Attachment { at, ..a })
                    .collect();
        }
        Ok(message)
    }

    /// Counts a model call of a run: it is paid for, whatever comes of it.
    fn spend(&self, spent: &mut Spent, model: &str, usage: &Usage) {
        let total = &mut spent.0;
        total.input_tokens += usage.input_tokens;
        total.output_tokens += usage.output_tokens;
        if let Some(cost) = self.pricing.cost(model, usage) {
            total.cost_usd = Some(total.cost_usd.unwrap_or(0.0) + cost);
        }
    }

    async fn extract(&self, job: &JobRecord, spent: &mut Spent) -> Step<()> {
        let limits = self
            .config
            .extraction
            .ok_or_else(|| failed("memory extraction is off".into()))?;
        let task: ExtractionJob = payload(job)?;
        let known = self
            .jobs
            .list_memories(&task.scope, None, 30)
            .await
            .map_err(|e| retry(job, e.to_string()))?;
        let known: Vec<String> = known
            .iter()
            .map(|m| format!("- {} ({}): {}", m.key, m.kind, m.content))
            .collect();
        let user = format!(
            "Known memories (reuse a key to update one):\n{}\n\nThe exchange:\nUser: {}\nAssistant: {}",
            if known.is_empty() {
                "(none)".to_owned()
            } else {
                known.join("\n")
            },
            cut(&task.user_message, SHOWN_CHARS),
            cut(&task.assistant_message, SHOWN_CHARS),
        );
        let user = self.shown(job, self.config.images.memory, user).await?;
        let model = (task.provider.as_str(), task.model.as_str());
        let extracted: Extracted = self
            .ask_for(job, spent, model, (EXTRACTION_PROMPT, user), limits)
            .await?;
        let items: Vec<(String, String, String)> = extracted
            .memories
            .into_iter()
            .filter_map(|m| {
                let kind = m.kind.trim().to_ascii_lowercase();
                let key = normal_key(&m.key);
                let content = m.content.trim().to_owned();
                let ok = matches!(kind.as_str(), "fact" | "preference")
                    && !key.is_empty()
                    && !content.is_empty()
                    && content.chars().count() <= 500;
                ok.then_some((kind, key, content))
            })
            .take(MEMORIES_PER_TURN)
            .collect();
        let contents: Vec<String> = items.iter().map(|(_, _, c)| c.clone()).collect();
        let embedded = match (&self.embedder, contents.is_empty()) {
            (Some(embedder), false) => match embedder.embed(&contents).await {
                Ok(vectors) => Some((embedder.model_id().to_owned(), vectors)),
                Err(e) => {
                    tracing::warn!(error = %e, "memories kept without embeddings");
                    None
                }
            },
            _ => None,
        };
        self.keep_memories(job, &task, items, embedded).await
    }

    /// Keeps what an extraction found, each with its embedding, while the
    /// job's row is there (its session not erased).
    async fn keep_memories(
        &self,
        job: &JobRecord,
        task: &ExtractionJob,
        items: Vec<(String, String, String)>,
        embedded: Option<(String, Vec<Vec<f32>>)>,
    ) -> Step<()> {
        for (index, (kind, key, content)) in items.into_iter().enumerate() {
            let (embedding, embedding_model) = match &embedded {
                Some((model, vectors)) => (vectors.get(index).cloned(), Some(model.clone())),
                None => (None, None),
            };
            let memory = NewMemory {
                id: format!("mem_{}", Uuid::now_v7().simple()),
                scope: task.scope.clone(),
                kind,
                key,
                content,
                source_session_id: task.session_id.clone(),
                source_turn_id: task.turn_id.clone(),
                embedding,
                embedding_model,
                at: Utc::now(),
            };
            let kept = self
                .jobs
                .upsert_memory(&memory, Some(&job.id))
                .await
                .map_err(|e| retry(job, e.to_string()))?;
            if !kept {
                return Err(erased());
            }
        }
        Ok(())
    }

    async fn judge(&self, job: &JobRecord, spent: &mut Spent) -> Step<()> {
        let limits = self
            .config
            .judging
            .ok_or_else(|| failed("judges are off".into()))?;
        let JudgeJob {
            judge,
            request: task,
        } = payload(job)?;
        let config = self
            .config
            .judges
            .iter()
            .find(|j| j.name == judge)
            .ok_or_else(|| failed(format!("no judge {judge:?} is configured any more")))?;
        let facts = if task.facts.is_empty() {
            "(none)".to_owned()
        } else {
            task.facts
                .iter()
                .map(|f| format!("- {}", cut(f, 600)))
                .collect::<Vec<_>>()
                .join("\n")
        };
        let system = format!("{JUDGE_PROMPT}\n\nCriteria: {}", config.criteria);
        let user = format!(
            "Facts the assistant had:\n{facts}\n\nThe conversation:\n{}\n\nThe answer to score:\n{}",
            cut(&task.messages_text, SHOWN_CHARS),
            cut(&task.response, SHOWN_CHARS / 2),
        );
        let user = self.shown(job, self.config.images.judges, user).await?;
        let model = (task.provider.as_str(), task.model.as_str());
        let verdict: Verdict = self
            .ask_for(job, spent, model, (&system, user), limits)
            .await?;
        if !verdict.score.is_finite() {
            return Err(failed("the score is not a number".into()));
        }
        let score = verdict.score.clamp(0.0, 1.0);
        let judgement = JudgementRecord {
            id: format!("jdg_{}", Uuid::now_v7().simple()),
            session_id: task.session_id.as_str().to_owned(),
            turn_id: task.turn_id.clone(),
            judge: judge.clone(),
            prompt_id: task.prompt_id.clone(),
            prompt_version: task.prompt_version.clone(),
            score,
            passed: score >= config.threshold,
            rationale: crate::pii::redact_if(
                self.config.redact,
                &cut(verdict.rationale.trim(), 1000),
            ),
            provider: task.provider.clone(),
            model: task.model.clone(),
            created_at: Utc::now().trunc_subsecs(6),
        };
        let kept = self
            .jobs
            .put_judgement(&judgement, Some(&job.id))
            .await
            .map_err(|e| retry(job, e.to_string()))?;
        if !kept {
            return Err(erased());
        }
        self.announce(job, &judgement).await;
        Ok(())
    }
}
