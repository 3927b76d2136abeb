//! Reading a turn's events: replay from the log after a seq, then follow
//! live, with no gap and no duplicate, until the terminal event.
//!
//! The subscriber subscribes to the live broadcast *before* reading the log.
//! Events are broadcast only after they are committed, so each event is in
//! the log read, in the broadcast, or both; the seq removes duplicates and a
//! gap (a lagging receiver) sends the reader back to the log. A turn that
//! runs in another process has no local broadcast: the log is polled.

use std::sync::Arc;

use futures::Stream;
use tokio::sync::broadcast::error::RecvError;
use uuid::Uuid;

use super::{LiveStart, TurnRunner};
use crate::{
    events::StoredEvent,
    ids::SessionKey,
    store::{StoreError, TurnLogCursor, TurnStatus},
    when_woken::when_woken,
};

/// Tries of a log read before the stream gives up on the log: the first
/// pause is [`READ_RETRY_FIRST`], doubled each time (about 1.4 s in all).
const READ_ATTEMPTS: u32 = 4;
const READ_RETRY_FIRST: std::time::Duration = std::time::Duration::from_millis(200);

/// `read`, tried again after a failure (the database may be restarting)
/// until [`READ_ATTEMPTS`] or until streams close.
async fn retrying<T, F, Fut>(
    closing: &tokio_util::sync::CancellationToken,
    mut read: F,
) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut delay = READ_RETRY_FIRST;
    let mut attempt = 1;
    loop {
        match read().await {
            Err(e) if attempt < READ_ATTEMPTS && !closing.is_cancelled() => {
                tracing::debug!(error = %e, attempt, "reading the event log failed; retrying");
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = closing.cancelled() => {}
                }
                delay *= 2;
                attempt += 1;
            }
            other => return other,
        }
    }
}

impl TurnRunner {
    /// The events of `turn_id` with seq greater than `after`, replayed and
    /// then followed live; the stream ends after the terminal event, or when
    /// the service shuts down.
    pub fn subscribe(
        &self,
        session_id: SessionKey,
        turn_id: Uuid,
        after: i64,
    ) -> impl Stream<Item = Result<Arc<StoredEvent>, StoreError>> + Send + 'static {
        self.follow(session_id, turn_id, after, None)
    }

    /// The events of a turn this process just started, from its first one,
    /// with the subscription [`TurnRunner::start`] took before the turn could
    /// emit anything: no log read is needed to begin.
    pub fn subscribe_started(
        &self,
        session_id: SessionKey,
        start: LiveStart,
    ) -> impl Stream<Item = Result<Arc<StoredEvent>, StoreError>> + Send + 'static {
        let turn_id = start.live.turn_id;
        self.follow(session_id, turn_id, 0, Some(start))
    }

    #[expect(
        clippy::too_many_lines,
        reason = "the replay, then live, of a turn's events as one generator"
    )]
    fn follow(
        &self,
        session_id: SessionKey,
        turn_id: Uuid,
        after: i64,
        start: Option<LiveStart>,
    ) -> impl Stream<Item = Result<Arc<StoredEvent>, StoreError>> + Send + 'static {
        let runner = self.clone();
        let open = self.inner.streams.token();
        // The stream's own child of `close_streams`: it is polled as each
        // event passes, and a child's lock is the stream's own, not one
        // that every open stream takes.
        let close = self.inner.close_streams.child_token();
        async_stream::try_stream! {
            let _open = open;
            let inner = &runner.inner;
            let mut log = TurnLogCursor::new(&session_id, turn_id, after);
            let (live, mut receiver, mut skip_first_read) = match start {
                Some(start) => {
                    log.passed(start.started.seq);
                    yield start.started;
                    (Some(start.live), Some(start.receiver), true)
                }
                None => {
                    let live = inner.live.get(turn_id);
                    let receiver = live.as_ref().map(|l| l.subscribe());
                    (live, receiver, false)
                }
            };
            let mut idle_polls = 0u32;
            // Set when the service closes streams: read the log once more
            // (the terminal event may just have been committed), then end.
            let mut closing = false;
            loop {
                // Everything committed after the cursor, page by page
                // (skipped once for a stream that starts from a known
                // first event).
                let mut reading = !std::mem::take(&mut skip_first_read);
                while reading {
                    let page = retrying(&close, || log.read(inner.store.as_ref()))
                        .await?;
                    reading = log.took(&page);
                    for event in page {
                        let terminal = event.is_terminal();
                        yield Arc::new(event);
                        if terminal {
                            return;
                        }
                    }
                }
                if closing {
                    return;
                }
                // Then wait for more: live when the turn runs here.
                if let (Some(live), Some(rx)) = (live.as_ref(), receiver.as_mut()) {
                    // Made once, polled only after their own wakes: not at
                    // each event the stream relays (see `when_woken`).
                    let mut ended = when_woken(live.closed.cancelled());
                    let mut closed = when_woken(close.cancelled());
                    loop {
                        tokio::select! {
                            biased;
                            received = rx.recv() => match received {
                                Ok(events) => {
                                    let mut gap = false;
                                    for event in events.iter() {
                                        if event.seq <= log.after() {
                                            continue;
                                        }
                                        if event.seq != log.after() + 1 {
                                            gap = true;
                                            break;
                                        }
                                        log.passed(event.seq);
                                        let terminal = event.is_terminal();
                                        yield event.clone();
                                        if terminal {
                                            return;
                                        }
                                    }
                                    // A gap: the log has what was missed.
                                    if gap {
                                        break;
                                    }
                                }
                                // A lag: the log has what was missed.
                                Err(RecvError::Lagged(_)) => break,
                                Err(RecvError::Closed) => {
                                    receiver = None;
                                    break;
                                }
                            },
                            () = &mut ended => {
                                // Terminal committed (or the turn's writes
                                // failed): finish from the log, then poll.
                                receiver = None;
                                break;
                            }
                            () = &mut closed => {
                                closing = true;
                                break;
                            }
                        }
                    }
                    continue;
                }
                // Elsewhere (or no longer live here): poll the log.
                tokio::select! {
                    () = close.cancelled() => {
                        closing = true;
                        continue;
                    }
                    () = tokio::time::sleep(inner.config.poll_interval) => {}
                }
                idle_polls += 1;
                // A turn that is no longer running but has no terminal event
                // cannot produce one any more; do not wait forever.
                if idle_polls.is_multiple_of(20) {
                    let record = retrying(&close, || {
                        inner.store.get_turn(&session_id, turn_id)
                    })
                    .await?;
                    if record.is_none_or(|r| r.status != TurnStatus::Running) {
                        // The rest of its log, every page of it.
                        loop {
                            let page =
                                retrying(&close, || log.read(inner.store.as_ref()))
                                    .await?;
                            let more = log.took(&page);
                            for event in page {
                                yield Arc::new(event);
                            }
                            if !more {
                                return;
                            }
                        }
                    }
                }
            }
        }
    }
}
