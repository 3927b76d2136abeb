//! Event streams end when the key that opened them is revoked.
//!
//! A stream is authenticated once, when it opens; a parked turn's stream
//! may stay open for its whole wait (a day). So each event stream a key
//! opened is registered under the key's id, and ends (the body finishes,
//! cleanly) when the key is revoked: at once when this process revokes it
//! (a tenant's erase), else within [`WATCH_EVERY`], when the watcher reads
//! the keys revoked since its last look (the command line, another
//! replica). One read a look, whatever the number of streams.

use std::{
    future::Future as _,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use axum::{
    body::{Body, Bytes, HttpBody},
    http::header,
    response::Response,
};
use chrono::Utc;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::{
    app::{AppState, KeyStreamOpen},
    when_woken::{WhenWoken, when_woken},
};

/// How often the keys revoked since the last look are read.
pub const WATCH_EVERY: Duration = Duration::from_secs(5);

/// How far back each look reads (clocks of replicas differ; a key seen
/// twice is ended once).
const OVERLAP: chrono::Duration = chrono::Duration::seconds(60);

/// `response`, its body ending when `key_id` is revoked, if it is an
/// event stream; any other answer as it is.
pub(super) fn revocable(app: &AppState, key_id: &str, response: Response) -> Response {
    let streams = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if !streams {
        return response;
    }
    let (token, opened) = app.key_streams.open(key_id);
    response.map(|inner| {
        Body::new(Revocable {
            inner,
            ended: when_woken(token.cancelled_owned()),
            _opened: opened,
        })
    })
}

/// A body that ends when its key's token is cancelled.
struct Revocable {
    inner: Body,
    /// Polled only after its own wake: not at each frame.
    ended: WhenWoken<WaitForCancellationFutureOwned>,
    _opened: KeyStreamOpen,
}

impl HttpBody for Revocable {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        // The key was revoked: the stream ends here, between two events.
        if Pin::new(&mut this.ended).poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        Pin::new(&mut this.inner).poll_frame(cx)
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// Ends the streams of keys revoked elsewhere (the command line, another
/// replica), looking every [`WATCH_EVERY`] while any stream is open, until
/// `stop`.
pub async fn watch_revoked(app: AppState, stop: CancellationToken) {
    let mut since = Utc::now();
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(WATCH_EVERY) => {}
        }
        if !app.key_streams.any() {
            since = Utc::now();
            continue;
        }
        let now = Utc::now();
        match app.store.keys_revoked_since(since - OVERLAP).await {
            Ok(revoked) => {
                for key_id in revoked {
                    let ended = app.key_streams.revoked(&key_id);
                    if ended > 0 {
                        tracing::info!(key = %key_id, streams = ended, "ended the streams of a revoked key");
                    }
                }
                since = now;
            }
            Err(e) => tracing::warn!(error = %e, "the revoked keys cannot be read"),
        }
    }
}
