//! `agent-harness import`: a session made from an export, in this
//! database, for a tenant; whole or not at all (the route's own import,
//! `POST /admin/import`, as the operator at the console).

use std::io::{Read as _, Write as _};

use harness_base::ids::SessionId;
use harness_core::config::Settings;
use harness_store::store::audit::acting_as;

use super::{admin::migrated_store, error::CliError};

/// The largest export `import` reads.
const IMPORT_MAX_BYTES: u64 = 1 << 30;

/// Imports the export in `file` (`-`: standard input) for `tenant`;
/// prints what was made.
pub async fn import(
    settings: &Settings,
    file: &std::path::Path,
    tenant: &str,
) -> Result<(), CliError> {
    SessionId::parse(tenant).map_err(CliError::InvalidTenant)?;
    let mut text = String::new();
    let read = if file.as_os_str() == "-" {
        std::io::stdin()
            .take(IMPORT_MAX_BYTES + 1)
            .read_to_string(&mut text)
    } else {
        std::fs::File::open(file)
            .and_then(|f| f.take(IMPORT_MAX_BYTES + 1).read_to_string(&mut text))
    };
    let path = || file.display().to_string();
    read.map_err(|source| CliError::Read {
        path: path(),
        source,
    })?;
    if text.len() as u64 > IMPORT_MAX_BYTES {
        return Err(CliError::TooLarge(path()));
    }
    let store = migrated_store(settings).await?;
    let made = acting_as(
        "cli".to_owned(),
        agent_harness::http::sessions::export::import(&store, tenant, &text),
    )
    .await
    .map_err(|e| CliError::Import {
        detail: e.to_string(),
        code: e.code().to_owned(),
    })?;
    writeln!(
        std::io::stdout().lock(),
        "{}",
        serde_json::to_string(&made)?
    )?;
    Ok(())
}
