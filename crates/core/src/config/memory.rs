//! `[memory]`: memory and the background jobs.

use clap::ArgAction;
use clap::builder::BoolishValueParser;

/// Memory: what the service remembers of a user (or a session) between
/// turns, and the research learner's observations.
#[derive(Debug, Clone, clap::Args)]
pub struct MemorySettings {
    /// Put the scope's relevant memories and its preferences in each
    /// turn's prompt.
    #[arg(id = "memory.retrieval", long = "memory-retrieval", default_value_t = true, action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub retrieval: bool,
    /// After each completed turn, ask the turn's model (in the background)
    /// for facts and preferences worth remembering: one more model call per
    /// turn.
    #[arg(id = "memory.extraction", long = "memory-extraction", default_value_t = false, action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub extraction: bool,
    /// Let memory extraction see the images and PDFs of the turn it reads
    /// (sent to the turn's model with the exchange's text); off, it reads
    /// the text alone.
    #[arg(id = "memory.images", long = "memory-images", default_value_t = false, action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub images: bool,
    /// Background jobs (memory extraction, judges) run at once.
    #[arg(
        id = "memory.job_concurrency",
        long = "job-concurrency",
        default_value_t = 4,
        value_parser = clap::value_parser!(u32).range(1..=64)
    )]
    pub job_concurrency: u32,
    /// Background jobs that may wait; past it the oldest waiting memory
    /// extractions are given up (judge jobs never are).
    #[arg(
        id = "memory.job_backlog_max",
        long = "job-backlog-max",
        default_value_t = 1000,
        value_parser = clap::value_parser!(u64).range(1..=1_000_000)
    )]
    pub job_backlog_max: u64,
    /// Memories put in a prompt, at most.
    #[arg(
        id = "memory.top_k",
        long = "memory-top-k",
        default_value_t = 8,
        value_parser = clap::value_parser!(u32).range(1..=50)
    )]
    pub top_k: u32,
    /// Longest an extraction call may take, in seconds.
    #[arg(
        id = "memory.timeout_s",
        long = "memory-timeout-s",
        default_value_t = 30,
        value_parser = clap::value_parser!(u64).range(1..=300)
    )]
    pub timeout_s: u64,
    /// Most tokens an extraction's answer may take.
    #[arg(
        id = "memory.max_output_tokens",
        long = "memory-max-output-tokens",
        default_value_t = 400,
        value_parser = clap::value_parser!(u32).range(50..=8000)
    )]
    pub max_output_tokens: u32,
    /// Keep each turn's question and answer as a research observation.
    #[arg(id = "memory.research_learner", long = "research-learner", default_value_t = true, action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub research_learner: bool,
}
