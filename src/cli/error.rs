//! What a command of the binary fails with, said on standard error (and
//! the exit code 1).

use harness_base::ids::SessionIdError;
use harness_store::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The database refused or could not be reached.
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("the tenant is not valid: {0}")]
    InvalidTenant(SessionIdError),
    #[error("no active key {0}")]
    NoSuchKey(String),
    #[error("cannot write the audit trail: {0}")]
    Audit(StoreError),
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{0} is larger than 1 GiB")]
    TooLarge(String),
    /// An import the service refused: its problem's detail and code.
    #[error("{detail} ({code})")]
    Import { detail: String, code: String },
    #[error("cannot write: {0}")]
    Write(#[from] std::io::Error),
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Startup(#[from] agent_harness::startup::StartupError),
    #[error("{0}")]
    Vault(#[from] harness_core::vault::VaultError),
    #[error("{0}")]
    Progress(#[from] indicatif::style::TemplateError),
}
