//! The connection loop: accepts TCP connections and serves HTTP/1.1 and
//! HTTP/2 on each, with the limits `axum::serve` does not offer.
//!
//! - A connection may wait `idle_timeout` for a request's first byte (its
//!   first request's from its accept, a later one's from the end of the
//!   one before), and then has `header_read_timeout` for the rest of the
//!   head (a slowloris client is cut off); see `conn_timer`.
//! - At most `max_connections` are open at once, so held connections cannot
//!   exhaust the process's file descriptors (the default is three quarters
//!   of them). When all are taken, a new connection takes the slot of the
//!   one that has waited longest without a request in flight; see `slots`.
//! - Headers beyond `max_header_bytes` are refused by hyper itself; the
//!   service's own, lower limits answer problem+json first (see
//!   `limits`).
//!
//! Shutdown: stop accepting, ask every connection to finish gracefully
//! (in-flight requests and open streams complete), return when all are
//! closed.

mod raw;
mod slots;

use std::{
    convert::Infallible,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use axum::{
    Router,
    body::{Body, HttpBody},
    extract::Request,
    response::{IntoResponse, Response},
};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
    service::TowerToHyperService,
};
use tokio::net::TcpListener;
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tower::ServiceExt;

use super::conn_timer::{Activity, HeadTimer, first_head_due};
use crate::{protocols::error::ApiError, when_woken::when_woken};
use raw::{Framing, TrackedIo};
use slots::{Slot, Slots};

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
#[expect(
    clippy::too_many_lines,
    reason = "the accept loop and its limits in one place"
)]
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
    let slots = Slots::new(limits.max_connections);
    let connections = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (tcp, peer) = match accepted {
            Ok(accepted) => accepted,
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
        let Some(slot) = slots.admit() else {
            tracing::warn!(
                limit = limits.max_connections,
                "every connection has a request in flight; closing a new one"
            );
            drop(tcp);
            continue;
        };
        // Events are small writes: without TCP_NODELAY, Nagle holds each
        // one back until the previous is acknowledged (up to 40 ms).
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::warn!(error = %e, "cannot set TCP_NODELAY");
        }
        let framing = Framing::default();
        let service = TowerToHyperService::new(tracked_service(
            router.clone(),
            slot.clone(),
            framing.clone(),
            peer,
        ));
        // The head timer of each connection watches its own reads.
        let activity = Activity::new();
        let mut builder = builder.clone();
        builder.http1().timer(HeadTimer {
            activity: activity.clone(),
            idle: limits.idle_timeout,
            head: limits.header_read_timeout,
        });
        // A child, whose lock is the connection's own; polled only after
        // its own wake, not at each wake of the connection's task (each
        // event it writes: see `when_woken`).
        let shutdown = shutdown.child_token();
        let first_head_due = first_head_due(
            activity.clone(),
            limits.idle_timeout,
            limits.header_read_timeout,
        );
        let slots = slots.clone();
        connections.spawn(async move {
            let io = TokioIo::new(TrackedIo::new(tcp, activity.clone(), slot.clone(), &framing));
            let connection = builder.serve_connection_with_upgrades(io, service);
            let mut connection = std::pin::pin!(connection);
            // Until its first request arrives, a connection has the idle
            // timeout from its accept for its first byte, then the head
            // timeout; hyper's own timer only starts once bytes came (its
            // protocol sniffing waits without one). See `conn_timer`.
            let first_head_late = async {
                tokio::select! {
                    () = silent_in_a_flood(&slots, &activity, limits) => {}
                    () = first_head_due => {}
                    () = slot.first_request() => std::future::pending().await,
                }
            };
            let result = tokio::select! {
                result = connection.as_mut() => result,
                () = first_head_late => {
                    tracing::debug!("the first request's head did not come in time; closing");
                    Ok(())
                }
                () = when_woken(slot.closed_for_another()) => {
                    tracing::debug!("connection limit reached; closing the longest-waiting connection");
                    Ok(())
                }
                () = when_woken(shutdown.cancelled()) => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            slot.end();
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

/// Resolves when a connection that has sent nothing by the head timeout
/// after its accept finds silent connections flooding in (more than
/// `slots::SILENT_SPARE` without a request, or such a flood within the
/// idle timeout): it is closed then, as the service promises of a flood of
/// silent sockets (past the file limit too). Otherwise a silent
/// connection waits the idle timeout (a client pool's spare connection;
/// see `conn_timer`). Never resolves once the connection sent a byte.
async fn silent_in_a_flood(slots: &Slots, activity: &Activity, limits: ConnectionLimits) {
    tokio::time::sleep(limits.header_read_timeout).await;
    if activity.has_read() || !slots.flooded(limits.idle_timeout) {
        std::future::pending::<()>().await;
    }
    tracing::debug!("a silent connection past the head timeout in a flood of them; closing");
}

/// The router as one connection's service: each request marks the
/// connection busy until its response body is done, and carries the
/// peer's address (`ConnectInfo`); a chunked request whose head also had
/// a `Content-Length` is refused (see `raw`).
fn tracked_service(
    router: Router,
    slot: Arc<Slot>,
    framing: Framing,
    peer: std::net::SocketAddr,
) -> impl tower::Service<
    Request<Incoming>,
    Response = Response,
    Error = Infallible,
    Future = impl Future<Output = Result<Response, Infallible>> + Send,
> + Clone {
    tower::service_fn(move |mut request: Request<Incoming>| {
        request
            .extensions_mut()
            .insert(axum::extract::ConnectInfo(peer));
        let in_flight = slot.request();
        let router = router.clone();
        let chunked = request
            .headers()
            .contains_key(axum::http::header::TRANSFER_ENCODING);
        let refused = framing.refuses(chunked);
        async move {
            let response = if refused {
                ApiError::MalformedRequest(
                    "the request has both Content-Length and Transfer-Encoding".into(),
                )
                .into_response()
            } else {
                router.oneshot(request.map(Body::new)).await?
            };
            Ok(response.map(|body| Holding::body(body, in_flight)))
        }
    })
}

/// A response body that holds `G` (a guard: its connection's
/// `InFlight`, a tenant's permit) until the body is done.
pub(crate) struct Holding<G> {
    body: Body,
    _held: G,
}

impl<G: Send + Unpin + 'static> Holding<G> {
    /// `body`, holding `held` while it lives.
    pub(crate) fn body(body: Body, held: G) -> Body {
        Body::new(Self { body, _held: held })
    }
}

impl<G: Send + Unpin + 'static> HttpBody for Holding<G> {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
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
