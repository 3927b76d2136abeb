//! `[vault]`: the folder of notes.

use clap::ArgAction;
use clap::builder::BoolishValueParser;
use std::path::PathBuf;

use super::EmbeddingModel;

/// The folder of notes the retrieval tools search and the write tools
/// change.
#[derive(Debug, Clone, clap::Args)]
pub struct VaultSettings {
    /// Folder of markdown notes (created by the first note written).
    #[arg(id = "vault.dir", long = "vault-dir", default_value = "./vault")]
    pub dir: PathBuf,
    /// Index the vault when the service starts (in the background; turns
    /// are served meanwhile).
    #[arg(id = "vault.index_on_start", long = "vault-index-on-start", default_value_t = true, action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub index_on_start: bool,
    /// Embed chunks with this model for ranking by meaning beside words:
    /// openai:{model} (the OpenAI base URL's /embeddings) or ollama:{model}
    /// [default: none, words only].
    #[arg(id = "vault.embeddings", long = "vault-embeddings")]
    pub embeddings: Option<EmbeddingModel>,
    /// One vault for all tenants (the folder itself), instead of each
    /// tenant its own under `{folder}/.tenants/{tenant}/`; only the
    /// `default` tenant writes to a shared vault, unless
    /// HARNESS_VAULT_SHARED_WRITABLE.
    #[arg(id = "vault.shared", long = "vault-shared", default_value_t = false, action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub shared: bool,
    /// Every tenant may write to a shared vault.
    #[arg(id = "vault.shared_writable", long = "vault-shared-writable", default_value_t = false, action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub shared_writable: bool,
}

impl VaultSettings {
    /// How the tenants share the folder.
    pub fn sharing(&self) -> crate::vault::Sharing {
        if self.shared {
            crate::vault::Sharing::Shared {
                writable: self.shared_writable,
            }
        } else {
            crate::vault::Sharing::PerTenant
        }
    }
}
