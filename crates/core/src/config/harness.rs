//! `[harness]`: the turn loop.

use clap::ArgAction;
use clap::builder::BoolishValueParser;
use std::time::Duration;

use super::{EffectList, Span};
use crate::{providers::ThinkLevel, tools::PermissionMode};

/// The turn loop: limits, tools, reflection, compaction, the prompt.
#[derive(Debug, Clone, clap::Args)]
pub struct HarnessSettings {
    /// System prompt of every turn [default: the built-in prompt].
    #[arg(id = "harness.system_prompt", long = "system-prompt", default_value = crate::harness::DEFAULT_SYSTEM_PROMPT, hide_default_value = true)]
    pub system_prompt: String,
    /// Absolute deadline of a turn, in seconds.
    #[arg(
        id = "harness.turn_timeout_s",
        long = "turn-timeout-s",
        default_value_t = 60,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub turn_timeout_s: u64,
    /// Most model calls in a turn.
    #[arg(
        id = "harness.max_steps",
        long = "max-steps",
        default_value_t = 6,
        value_parser = clap::value_parser!(u32).range(1..=100)
    )]
    pub max_steps: u32,
    /// Most tool calls in a turn.
    #[arg(
        id = "harness.max_tool_calls",
        long = "max-tool-calls",
        default_value_t = 6,
        value_parser = clap::value_parser!(u32).range(1..=100)
    )]
    pub max_tool_calls: u32,
    /// Most reflections in a turn.
    #[arg(
        id = "harness.max_reflections",
        long = "max-reflections",
        default_value_t = 4,
        value_parser = clap::value_parser!(u32).range(0..=100)
    )]
    pub max_reflections: u32,
    /// Whether the model's reasoning reaches clients: `show`
    /// (`reasoning.delta` events, and each protocol's reasoning shape) or
    /// `hidden` (nothing of it leaves the service; its tokens still count).
    #[arg(
        id = "harness.reasoning",
        long = "reasoning",
        value_enum,
        default_value = "show"
    )]
    pub reasoning: crate::harness::Reasoning,
    /// How much the model is asked to think: off, low, medium or high.
    #[arg(
        id = "harness.think_level",
        long = "think-level",
        default_value = "off"
    )]
    pub think_level: ThinkLevel,
    /// The most thinking a request may ask for: off, low, medium or high
    /// (a request above it is lowered to it) [default: high].
    #[arg(
        id = "harness.max_think_level",
        long = "max-think-level",
        default_value = "high"
    )]
    pub max_think_level: ThinkLevel,
    /// The most output tokens a provider call may ask for, whatever the
    /// model (unknown models too) or the request says [default: the
    /// model's own limit, or the request's].
    #[arg(
        id = "harness.max_output_tokens",
        long = "max-output-tokens",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub max_output_tokens: Option<u32>,
    /// The most bytes a turn's client tools may hand the model (names,
    /// descriptions and schemas together); past it, 422 `invalid_field`.
    #[arg(
        id = "harness.client_tools_max_bytes",
        long = "client-tools-max-bytes",
        default_value_t = 16 * 1024,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
    )]
    pub client_tools_max_bytes: usize,
    /// Reflect on every N-th turn of a session; 0 never.
    #[arg(
        id = "harness.reflect_every",
        long = "reflect-every",
        default_value_t = 0
    )]
    pub reflect_every: u32,
    /// Run disjoint read-only tool calls in parallel.
    #[arg(id = "harness.parallel_tools", long = "parallel-tools", default_value_t = true, action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub parallel_tools: bool,
    /// Validate tool arguments against their schema.
    #[arg(id = "harness.tool_validation", long = "tool-validation", default_value_t = true, action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub tool_validation: bool,
    /// Keep each turn's decision record (`support.chat.turn`), committed
    /// with the turn.
    #[arg(id = "harness.record_decisions", long = "record-decisions", default_value_t = true, action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub record_decisions: bool,
    /// Let clients send `system` messages in a turn's history (`history`,
    /// and the earlier messages of `/v1/chat/completions`, `/v1/ui/chat`
    /// and `/v1/agui`); off, they are refused with 422
    /// `invalid_history_role`: a system message is trusted, and a client's
    /// text is not.
    #[arg(id = "harness.allow_client_system_messages", long = "allow-client-system-messages", default_value_t = false, action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub allow_client_system_messages: bool,
    /// Offer only the tools most related to the message.
    #[arg(id = "harness.semantic_tool_selection", long = "semantic-tool-selection", default_value_t = false, action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub semantic_tool_selection: bool,
    /// Tools offered when selection is on.
    #[arg(
        id = "harness.max_tools_per_turn",
        long = "max-tools-per-turn",
        default_value_t = 25,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
    )]
    pub max_tools_per_turn: usize,
    /// Which tools may run: auto (all, without asking), read_only or none.
    #[arg(
        id = "harness.tool_permission",
        long = "tool-permission",
        default_value = "auto"
    )]
    pub tool_permission: PermissionMode,
    /// Summarise older messages near the context limit.
    #[arg(id = "harness.auto_compact", long = "auto-compact", default_value_t = true, action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub auto_compact: bool,
    /// Context window of the model, in tokens.
    #[arg(
        id = "harness.context_window_tokens",
        long = "context-window-tokens",
        default_value_t = 128_000,
        value_parser = clap::value_parser!(u64).range(1024..)
    )]
    pub context_window_tokens: u64,
    /// Prompt id, for provenance and judges.
    #[arg(id = "harness.prompt_id", long = "prompt-id")]
    pub prompt_id: Option<String>,
    /// Prompt version.
    #[arg(id = "harness.prompt_version", long = "prompt-version")]
    pub prompt_version: Option<String>,
    /// Effect classes whose tool calls wait for a person's approval
    /// (`approval.requested`), e.g. LOCAL_WRITE,DESTRUCTIVE [default: none].
    #[arg(id = "harness.approval_required", long = "approval-required")]
    pub approval_required: Option<EffectList>,
    /// How long a call waits for a person's decision or a client tool's
    /// result before it ends `timed_out`: a span such as `24h`, `90m` or
    /// `3s` (at most 30 days). The turn's compute deadline stands still
    /// while it waits.
    #[arg(
        id = "harness.approval_timeout",
        long = "approval-timeout",
        default_value = "24h",
        value_parser = Span::of_a_wait
    )]
    pub approval_timeout: Span,
    /// How long a waiting turn keeps its worker before it is parked in the
    /// database (no worker, no lease) to go on, on whichever replica, when
    /// the answer comes: a span such as `10s` (`0s`: parked at once).
    #[arg(id = "harness.park_after", long = "park-after", default_value = "10s")]
    pub park_after: Span,
    /// Stored messages used as history when a request brings none.
    #[arg(
        id = "harness.history_max_messages",
        long = "history-max-messages",
        default_value_t = 50
    )]
    pub history_max_messages: u32,
}

impl HarnessSettings {
    pub fn turn_timeout(&self) -> Duration {
        Duration::from_secs(self.turn_timeout_s)
    }
}
