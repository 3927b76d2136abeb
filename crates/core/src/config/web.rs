//! `[web]`: the web tools.

use std::time::Duration;

use super::HttpUrl;
use crate::{tools::web::WebConfig, tools::web::guard::NetGuard};

/// The web tools (offered to turns with `web_mode: on`).
#[derive(Debug, Clone, clap::Args)]
pub struct WebSettings {
    /// A SearXNG-compatible search service (its JSON format); web_search
    /// exists only with one [default: none].
    #[arg(id = "web.search_url", long = "web-search-url", hide_env_values = true)]
    pub search_url: Option<HttpUrl>,
    /// Largest page fetch_url reads, in bytes (a longer one is cut there).
    #[arg(id = "web.fetch_max_bytes", long = "web-fetch-max-bytes", default_value_t = 2 * 1024 * 1024, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1024..=67_108_864))]
    pub fetch_max_bytes: usize,
    /// Longest a search or a fetch may take, in seconds.
    #[arg(
        id = "web.timeout_s",
        long = "web-timeout-s",
        default_value_t = 15,
        value_parser = clap::value_parser!(u64).range(1..=300)
    )]
    pub timeout_s: u64,
    /// Hosts, addresses or networks fetch_url may reach although they are
    /// internal (loopback, private, link-local), comma-separated
    /// [default: none].
    #[arg(id = "web.allow", long = "web-allow")]
    pub allow: Option<NetGuard>,
}

impl WebSettings {
    pub fn config(&self) -> WebConfig {
        WebConfig {
            search_url: self.search_url.as_ref().map(ToString::to_string),
            fetch_max_bytes: self.fetch_max_bytes,
            timeout: Duration::from_secs(self.timeout_s),
            guard: self.allow.clone().unwrap_or_default(),
        }
    }
}
