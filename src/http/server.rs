//! The connection loop: accepts TCP connections and serves HTTP/1.1 and
//! HTTP/2 on each, with the limits `axum::serve` does not offer.
//!
//! - A connection has `header_read_timeout` to send a request's head from
//!   its first byte (a slowloris client is cut off), and may wait
//!   `idle_timeout` for that first byte (a keep-alive connection idle that
//!   long is closed); see `conn_timer`.
//! - At most `max_connections` are open at once; one more is closed as
//!   soon as it is accepted, so held connections cannot exhaust the
//!   process's file descriptors (the default is three quarters of them).
//! - Headers beyond `max_header_bytes` are refused by hyper itself; the
//!   service's own, lower limits answer problem+json first (see
//!   `limits`).
//!
//! Shutdown: stop accepting, ask every connection to finish gracefully
//! (in-flight requests and open streams complete), return when all are
//! closed.

use std::{sync::Arc, time::Duration};

use axum::{Router, body::Body, extract::Request};
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
    service::TowerToHyperService,
};
use tokio::{net::TcpListener, sync::Semaphore};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tower::ServiceExt;

use super::conn_timer::{Activity, HeadTimer, TrackedIo};

/// Limits of the connection loop.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
    /// Hyper's own ceiling on a request head (it answers a bare 431 past it).
    pub max_header_bytes: usize,
}

/// Serves `router` on `listener` until `shutdown`, then waits for the open
/// connections to finish.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_header_bytes.max(8192));
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(limits.idle_timeout))
        .keep_alive_timeout(limits.header_read_timeout)
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX));
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let connections = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                // Out of file descriptors, most likely: wait a moment
                // rather than spin on accept.
                tracing::error!(error = %e, "accept failed");
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(Duration::from_millis(100)) => continue,
                }
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tracing::warn!(
                limit = limits.max_connections,
                "connection limit reached; closing a new connection"
            );
            drop(tcp);
            continue;
        };
        // Events are small writes: without TCP_NODELAY, Nagle holds each
        // one back until the previous is acknowledged (up to 40 ms).
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::warn!(error = %e, "cannot set TCP_NODELAY");
        }
        let service = TowerToHyperService::new(
            router
                .clone()
                .map_request(|request: Request<Incoming>| request.map(Body::new)),
        );
        // The head timer of each connection watches its own reads.
        let activity = Activity::new();
        let mut builder = builder.clone();
        builder.http1().timer(HeadTimer {
            activity: activity.clone(),
            idle: limits.idle_timeout,
            head: limits.header_read_timeout,
        });
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            let _permit = permit;
            let io = TokioIo::new(TrackedIo::new(tcp, activity));
            let connection = builder.serve_connection_with_upgrades(io, service);
            let mut connection = std::pin::pin!(connection);
            let result = tokio::select! {
                result = connection.as_mut() => result,
                () = shutdown.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    connections.close();
    connections.wait().await;
    Ok(())
}

/// Errors of one connection that do not concern the listener.
fn is_connection_error(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

/// The default connection limit: three quarters of the process's open-file
/// limit (the rest is for the database, providers and files), at least 64.
/// 4,096 where the limit cannot be read (not Linux).
pub fn default_max_connections() -> usize {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|limits| max_connections_for(&limits))
        .unwrap_or(4096)
}

/// The connection limit for a `/proc/<pid>/limits` text.
fn max_connections_for(limits: &str) -> Option<usize> {
    let soft = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))?
        .split_whitespace()
        .next()?;
    // "unlimited" has no number: the ceiling then applies.
    let soft = soft.parse::<usize>().unwrap_or(usize::MAX);
    Some((soft / 4 * 3).clamp(64, 100_000))
}

#[cfg(test)]
mod tests {
    use super::max_connections_for;

    #[test]
    fn the_default_limit_leaves_a_quarter_of_the_descriptors() {
        let limits = |soft: &str| {
            format!(
                "Limit                     Soft Limit           Hard Limit           Units\n\
                 Max processes             95574                95574                processes\n\
                 Max open files            {soft}                 524288               files\n"
            )
        };
        assert_eq!(max_connections_for(&limits("1024")), Some(768));
        assert_eq!(max_connections_for(&limits("20000")), Some(15_000));
        assert_eq!(max_connections_for(&limits("16")), Some(64));
        assert_eq!(max_connections_for(&limits("unlimited")), Some(100_000));
        assert_eq!(max_connections_for("nothing here"), None);
    }
}
