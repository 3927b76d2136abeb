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
pub mod jobs;
pub mod judges;
pub mod learner;
pub mod memory;

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
