//! Which pages may drive the service: the `Host` and `Origin` of a
//! request.
//!
//! With keys off (the loopback default), anything that can make this
//! machine's browser send a request could drive the service: a page that
//! rebinds its own name to 127.0.0.1 (DNS rebinding) sends its own name as
//! `Host`, and any page may post to `http://127.0.0.1:8080` from its own
//! `Origin`. So, while keys are off:
//! - on a loopback listener, a `Host` that is not a loopback name
//!   (`localhost`, `127.0.0.1`, `[::1]`, any port) is 421
//!   `host_not_allowed`;
//! - an `Origin` that is neither the service's own (the `Host` it was sent
//!   to) nor listed in `HARNESS_ALLOWED_ORIGINS` (or the CORS origins) is
//!   403 `origin_not_allowed`, on every route.
//!
//! With keys on, a page cannot use a key it does not have, but `/mcp`
//! checks `Origin` all the same, as the MCP specification asks of every
//! server. A request without `Origin` (a program, not a page) passes.

use axum::{
    extract::{Request, State},
    http::header,
    middleware::Next,
    response::Response,
};

use crate::config::CorsOrigins;
use crate::protocols::error::ApiError;

/// What the guard allows.
#[derive(Debug, Clone)]
pub(super) struct OriginGuard {
    /// Keys are off: every route is guarded.
    keys_off: bool,
    /// The listener is loopback only: `Host` must be a loopback name.
    loopback: bool,
    /// Any origin may call (`*`).
    any: bool,
    /// The origins that may call besides the service's own, lowercase.
    listed: Vec<String>,
}

impl OriginGuard {
    pub(super) fn new(settings: &crate::config::Settings) -> Self {
        let server = &settings.server;
        let mut guard = Self {
            keys_off: !server.auth_required(),
            loopback: server.listen.ip().is_loopback(),
            any: false,
            listed: Vec::new(),
        };
        for origins in [&server.allowed_origins, &server.cors_origins]
            .into_iter()
            .flatten()
        {
            match origins {
                CorsOrigins::Any => guard.any = true,
                CorsOrigins::List(list) => guard
                    .listed
                    .extend(list.iter().map(|o| o.to_ascii_lowercase())),
            }
        }
        guard
    }

    /// Whether a request to `path` with these headers may go on.
    fn check(&self, path: &str, host: Option<&str>, origin: Option<&str>) -> Result<(), ApiError> {
        if !self.keys_off && path != "/mcp" {
            return Ok(());
        }
        if self.keys_off && self.loopback && !host.is_some_and(is_loopback_host) {
            return Err(ApiError::HostNotAllowed(
                host.unwrap_or_default().chars().take(200).collect(),
            ));
        }
        let Some(origin) = origin else {
            return Ok(());
        };
        let origin = origin.to_ascii_lowercase();
        let own = host.is_some_and(|host| {
            let host = host.to_ascii_lowercase();
            origin == format!("http://{host}") || origin == format!("https://{host}")
        });
        if own || self.any || self.listed.contains(&origin) {
            Ok(())
        } else {
            Err(ApiError::OriginNotAllowed(
                origin.chars().take(200).collect(),
            ))
        }
    }
}

/// Whether `host` (a `Host` header: a name or address, maybe a port) is
/// a loopback name.
fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        // `[::1]:8080`: the address is inside the brackets.
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, port)| {
            if port.bytes().all(|b| b.is_ascii_digit()) {
                name
            } else {
                host
            }
        }),
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost"
        || name.ends_with(".localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Refuses a request its `Host` or `Origin` may not make (see the module).
pub(super) async fn guard(
    State(guard): State<std::sync::Arc<OriginGuard>>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let headers = request.headers();
    let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
    // HTTP/2 carries the host in the URI (`:authority`).
    let host = text(header::HOST).or_else(|| request.uri().authority().map(|a| a.as_str()));
    guard.check(request.uri().path(), host, text(header::ORIGIN))?;
    Ok(next.run(request).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(keys_off: bool, loopback: bool, listed: &[&str]) -> OriginGuard {
        OriginGuard {
            keys_off,
            loopback,
            any: false,
            listed: listed.iter().map(|o| (*o).to_owned()).collect(),
        }
    }

    #[test]
    fn loopback_names_with_any_port_are_loopback() {
        for host in [
            "localhost",
            "localhost:8080",
            "LOCALHOST.",
            "app.localhost:3000",
            "127.0.0.1",
            "127.0.0.1:8080",
            "127.9.9.9:1",
            "[::1]",
            "[::1]:8080",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "10.0.0.1:8080",
            "[::2]:80",
            "",
            "127.0.0.1.evil.example",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn with_keys_off_a_foreign_host_or_origin_is_refused_everywhere() {
        let guard = guard(true, true, &["https://app.example"]);
        let local = Some("127.0.0.1:8080");
        assert!(guard.check("/sessions/s", local, None).is_ok());
        assert!(
            guard
                .check("/sessions/s", local, Some("http://127.0.0.1:8080"))
                .is_ok()
        );
        assert!(
            guard
                .check("/healthz", local, Some("https://app.example"))
                .is_ok()
        );
        let refused = |path, host, origin| {
            guard
                .check(path, host, origin)
                .unwrap_err()
                .code()
                .to_owned()
        };
        assert_eq!(
            refused("/sessions/s", Some("evil.example:8080"), None),
            "host_not_allowed"
        );
        assert_eq!(refused("/healthz", None, None), "host_not_allowed");
        assert_eq!(
            refused("/sessions/s", local, Some("https://evil.example")),
            "origin_not_allowed"
        );
        assert_eq!(refused("/mcp", local, Some("null")), "origin_not_allowed");
        // Another loopback port is another origin.
        assert_eq!(
            refused("/a2a", local, Some("http://127.0.0.1:3000")),
            "origin_not_allowed"
        );
    }

    #[test]
    fn with_keys_on_only_mcp_checks_the_origin() {
        let guard = guard(false, false, &[]);
        let host = Some("agents.example");
        assert!(
            guard
                .check("/sessions/s", host, Some("https://evil.example"))
                .is_ok()
        );
        assert!(guard.check("/mcp", host, None).is_ok());
        assert!(
            guard
                .check("/mcp", host, Some("https://agents.example"))
                .is_ok()
        );
        assert_eq!(
            guard
                .check("/mcp", host, Some("https://evil.example"))
                .unwrap_err()
                .code(),
            "origin_not_allowed"
        );
    }
}
