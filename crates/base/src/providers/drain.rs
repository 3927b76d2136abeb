//! What is left of a provider's answer after its last event.
//!
//! An HTTP/1.1 connection goes back to the client's pool only once its
//! answer has been read to the end. A stream's last event (`[DONE]`,
//! `message_stop`, `done`) comes before the body's own end (the last empty
//! chunk), often in a write of its own; an answer dropped at its last event
//! closes the connection, and the next call opens another: a TCP handshake
//! on both sides, and a TLS one with a real provider. So each adapter hands
//! the rest of its answer to its [`Drains`], which reads it to its end in a
//! task of its own, and the step goes on at once.
//!
//! Each drain is bounded: a few events, [`GRACE`] of time, and [`MOST`]
//! drains at once; past any of these the rest is dropped and the
//! connection closed, as it was before. The tasks stop when the last clone
//! of the adapter's `Drains` is dropped.

use std::{pin::Pin, sync::Arc, time::Duration};

use futures::{Stream, StreamExt};
use tokio_util::{sync::CancellationToken, task::TaskTracker};

/// How long a drain waits for the answer's end.
const GRACE: Duration = Duration::from_secs(2);

/// Drains at once, per adapter.
const MOST: usize = 256;

/// Items (events or lines) read at most after the last event.
const MOST_ITEMS: usize = 16;

/// Reads the rest of finished answers so that their connections are used
/// again (see the module's documentation).
#[derive(Debug, Clone, Default)]
pub(crate) struct Drains(Option<Arc<Tasks>>);

#[derive(Debug)]
struct Tasks {
    tracker: TaskTracker,
    stop: CancellationToken,
}

impl Drop for Tasks {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Drains {
    /// Drains that read what they are handed.
    pub(crate) fn new() -> Self {
        Self(Some(Arc::new(Tasks {
            tracker: TaskTracker::new(),
            stop: CancellationToken::new(),
        })))
    }

    /// Reads `rest` to its end in a task of its own, within the bounds;
    /// drops it (closing its connection) when a drain cannot be started.
    pub(crate) fn hand_over<S>(&self, rest: Pin<Box<S>>)
    where
        S: Stream + Send + ?Sized + 'static,
    {
        let Some(tasks) = &self.0 else { return };
        if tasks.tracker.len() >= MOST {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let stop = tasks.stop.clone();
        tasks.tracker.spawn_on(
            async move {
                let mut rest = rest;
                let read = async {
                    for _ in 0..MOST_ITEMS {
                        if rest.next().await.is_none() {
                            return;
                        }
                    }
                };
                tokio::select! {
                    () = stop.cancelled() => {}
                    _ = tokio::time::timeout(GRACE, read) => {}
                }
            },
            &runtime,
        );
    }

    /// Drains under way (tests).
    #[cfg(test)]
    pub(crate) fn running(&self) -> usize {
        self.0.as_ref().map_or(0, |tasks| tasks.tracker.len())
    }

    /// Waits until every drain under way has ended (tests).
    #[cfg(test)]
    pub(crate) async fn settled(&self) {
        if let Some(tasks) = &self.0 {
            tasks.tracker.close();
            tasks.tracker.wait().await;
            tasks.tracker.reopen();
        }
    }
}

#[cfg(test)]
mod tests;
