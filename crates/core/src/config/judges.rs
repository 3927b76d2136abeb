//! `[judges]`: LLM judges of turns.

use clap::ArgAction;
use clap::builder::BoolishValueParser;

use crate::background::judges::JudgeList;

/// LLM judges of turns whose prompt has an id.
#[derive(Debug, Clone, clap::Args)]
pub struct JudgeSettings {
    /// Schedule the declared judges after turns (with HARNESS_PROMPT_ID).
    #[arg(id = "judges.enabled", long = "judges-enabled", default_value_t = true, action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub enabled: bool,
    /// Let the judges see the images and PDFs of the turn they score
    /// (sent to the judge's model with the conversation's text); off, they
    /// read the text alone.
    #[arg(id = "judges.images", long = "judges-images", default_value_t = false, action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub images: bool,
    /// The judges: a JSON list of {name, criteria, prompt_ids, threshold,
    /// model} (a `[[judges.list]]` table each in the file) [default: none].
    #[arg(id = "judges.list", long = "judges")]
    pub list: Option<JudgeList>,
    /// Longest a judge's call may take, in seconds.
    #[arg(
        id = "judges.timeout_s",
        long = "judges-timeout-s",
        default_value_t = 30,
        value_parser = clap::value_parser!(u64).range(1..=300)
    )]
    pub timeout_s: u64,
    /// Most tokens a judge's answer may take.
    #[arg(
        id = "judges.max_output_tokens",
        long = "judges-max-output-tokens",
        default_value_t = 300,
        value_parser = clap::value_parser!(u32).range(50..=8000)
    )]
    pub max_output_tokens: u32,
}
