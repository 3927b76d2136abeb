//! `agent-harness index-vault`: the vault folder (and each tenant's own)
//! indexed into the database's full-text index, with a progress bar on a
//! terminal.

use std::io::{IsTerminal as _, Write as _};

use agent_harness::startup;
use harness_core::{config::Settings, vault};
use harness_store::store;

use super::error::CliError;

/// A progress bar on a terminal.
struct Bar(indicatif::ProgressBar);

impl vault::Progress for Bar {
    fn found(&self, total: usize) {
        self.0.set_length(u64::try_from(total).unwrap_or(u64::MAX));
    }

    fn indexed(&self, done: usize, path: &str) {
        self.0.set_position(u64::try_from(done).unwrap_or(u64::MAX));
        self.0.set_message(path.to_owned());
    }
}

pub async fn index_vault(settings: &Settings) -> Result<(), CliError> {
    let store = store::connect(settings.database.url.as_str(), settings.database.limits()).await?;
    store.migrate().await?;
    let vault = startup::build_vault(settings, store)?;
    let report = if std::io::stderr().is_terminal() {
        let style =
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} notes {wide_msg}")?;
        let bar = indicatif::ProgressBar::new(0).with_style(style);
        let report = vault.reindex(&Bar(bar.clone())).await;
        bar.finish_with_message("done");
        report
    } else {
        vault.reindex(&()).await
    }?;
    // The summary is this command's output.
    let mut stdout = std::io::stdout().lock();
    writeln!(
        stdout,
        "indexed {}: {}",
        vault.root().display(),
        report.summary()
    )?;
    for skipped in &report.skipped {
        writeln!(stdout, "skipped {}: {}", skipped.path, skipped.reason)?;
    }
    // Each tenant's own vault with a folder (`{folder}/.tenants/{tenant}`).
    let vaults = vault::Vaults::new(vault, settings.vault.sharing());
    for tenant in vaults.tenants_with_folders(usize::MAX) {
        let report = vaults.of_tenant(&tenant).reindex(&()).await?;
        writeln!(stdout, "indexed tenant {tenant}: {}", report.summary())?;
    }
    Ok(())
}
