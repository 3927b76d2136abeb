//! The finalizer's collaborators on the store: memory (retrieval in stage 1,
//! extraction after the turn), the judges and the research learner.
//!
//! Extraction and judging ask a model, so they never run on the turn's
//! path: the finalizer queues a job in the store ([`JOB_MEMORY`],
//! [`JOB_JUDGE`]) and the [`jobs`] worker runs it, bounded in time
//! and tokens, its usage and cost recorded on the job. A job survives a
//! restart; a failing one is retried a few times, then given up, and never
//! touches the turn.

mod answers;
pub mod images;
pub mod jobs;
pub mod judges;
pub mod learner;
pub mod memory;

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The job kind of a memory extraction.
pub const JOB_MEMORY: &str = "memory_extraction";
/// The job kind of one judge's scoring of a turn.
pub const JOB_JUDGE: &str = "judge";
/// The job kind of a judgement's event, waiting for the session to be free.
pub const JOB_JUDGEMENT_EVENT: &str = "judgement_event";

/// A new job's id.
pub fn new_job_id() -> String {
    format!("job_{}", Uuid::now_v7().simple())
}

/// The jobs this process runs, by id, each with its session and a token
/// that stops it: an erase stops the jobs of what it erased (whatever they
/// would still write is refused anyway, their rows being gone). At most
/// the worker's concurrency.
#[derive(Debug, Default)]
pub struct RunningJobs {
    jobs: std::sync::Mutex<std::collections::HashMap<String, (String, CancellationToken)>>,
}

impl RunningJobs {
    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, (String, CancellationToken)>>
    {
        self.jobs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A job of `session_id` (its stored key) begins: its token.
    pub fn begin(&self, job_id: &str, session_id: &str) -> CancellationToken {
        let token = CancellationToken::new();
        self.lock()
            .insert(job_id.to_owned(), (session_id.to_owned(), token.clone()));
        token
    }

    /// A job ended.
    pub fn end(&self, job_id: &str) {
        self.lock().remove(job_id);
    }

    /// Stops the jobs of the session stored as `session_id`; how many.
    pub fn stop_session(&self, session_id: &str) -> usize {
        let jobs = self.lock();
        let stopped = jobs.values().filter(|(session, _)| session == session_id);
        stopped.map(|(_, token)| token.cancel()).count()
    }
}
