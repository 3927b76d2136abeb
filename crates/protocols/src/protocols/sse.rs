//! The Server-Sent Events of every protocol, as encoders under one driver.
//!
//! A format turns the turn's events into frames ([`WireFormat`]);
//! [`stream_turn`] owns everything else: the response and its headers, the
//! loop over the events (live or replayed from the log), the keep-alive
//! comment after every quiet interval, the frames of a log that cannot be
//! read, and the end. Every format here is Server-Sent Events, so every one
//! gets the same keep-alive (`:` comment lines, which SSE parsers skip):
//! a gateway with an idle timeout keeps a stream open through a long tool
//! wave whatever its format.

use std::{convert::Infallible, sync::Arc, time::Duration};

use axum::{
    body::Body,
    http::{HeaderMap, HeaderValue, header},
    response::{IntoResponse, Response},
};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use tokio::time::Instant;

use crate::{events::StoredEvent, metrics::Metrics, service::StoreError};

/// A keep-alive: an SSE comment line, skipped by SSE parsers.
pub const KEEP_ALIVE: &[u8] = b":\n\n";

/// What a format makes of one event.
#[derive(Debug, Default)]
pub struct Encoded {
    pub frames: Vec<Bytes>,
    /// The stream ends after these frames (the turn ended).
    pub done: bool,
}

impl Encoded {
    pub fn frames(frames: Vec<Bytes>) -> Self {
        Self {
            frames,
            done: false,
        }
    }

    pub fn last(frames: Vec<Bytes>) -> Self {
        Self { frames, done: true }
    }
}

/// One wire format: a turn's events as frames.
pub trait WireFormat: Send + 'static {
    /// Headers of the response beside `content-type: text/event-stream`
    /// and `cache-control: no-cache`.
    fn headers(&self, _headers: &mut HeaderMap) {}

    /// Frames before the first event.
    fn start(&mut self) -> Vec<Bytes> {
        Vec::new()
    }

    /// Frames of one event, typed where the format needs it
    /// ([`StoredEvent::event`]).
    fn encode(&mut self, event: &StoredEvent) -> Encoded;

    /// Frames that end a stream whose log cannot be read.
    fn unreadable(&mut self) -> Vec<Bytes>;

    /// Frames after the last event (a `[DONE]` line, say).
    fn end(&mut self) -> Vec<Bytes> {
        Vec::new()
    }
}

/// Counts an open stream while it lives.
struct OpenStream(Arc<Metrics>);

impl OpenStream {
    fn new(metrics: Arc<Metrics>) -> Self {
        metrics.stream_opened();
        Self(metrics)
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.stream_closed();
    }
}

/// Streams `events` in `format`, with a keep-alive comment after every
/// `keepalive` without a frame.
pub fn stream_turn<F: WireFormat>(
    mut format: F,
    events: impl Stream<Item = Result<Arc<StoredEvent>, StoreError>> + Send + 'static,
    keepalive: Duration,
    metrics: Arc<Metrics>,
) -> Response {
    let mut headers = HeaderMap::new();
    format.headers(&mut headers);
    let open = OpenStream::new(metrics);
    let frames = async_stream::stream! {
        let _open = open;
        for frame in format.start() {
            yield Ok::<_, Infallible>(frame);
        }
        let mut events = std::pin::pin!(events);
        // The timer is not moved at each frame (a reset takes the timer's
        // lock, once per token): when it fires, it is set again for one
        // interval after the last frame, and a keep-alive is written only
        // if that has passed.
        let mut last_frame = Instant::now();
        let quiet = tokio::time::sleep(keepalive);
        let mut quiet = std::pin::pin!(quiet);
        loop {
            tokio::select! {
                item = events.next() => match item {
                    Some(Ok(event)) => {
                        last_frame = Instant::now();
                        let encoded = format.encode(&event);
                        for frame in encoded.frames {
                            yield Ok(frame);
                        }
                        if encoded.done {
                            break;
                        }
                    }
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "the event log cannot be read; ending the stream");
                        for frame in format.unreadable() {
                            yield Ok(frame);
                        }
                        break;
                    }
                    None => break,
                },
                () = quiet.as_mut() => {
                    let due = last_frame + keepalive;
                    let now = Instant::now();
                    if now >= due {
                        yield Ok(Bytes::from_static(KEEP_ALIVE));
                        last_frame = now;
                        quiet.as_mut().reset(now + keepalive);
                    } else {
                        quiet.as_mut().reset(due);
                    }
                }
            }
        }
        for frame in format.end() {
            yield Ok(frame);
        }
    };
    let mut response = Body::from_stream(frames).into_response();
    let all = response.headers_mut();
    all.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    all.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // Tell buffering proxies (nginx and friends) to pass events through.
    all.insert("x-accel-buffering", HeaderValue::from_static("no"));
    all.extend(headers);
    response
}

/// [`stream_turn`] with the service's keep-alive interval and metrics.
pub fn stream_for<F: WireFormat>(
    app: &crate::protocols::Shared,
    format: F,
    events: impl Stream<Item = Result<Arc<StoredEvent>, StoreError>> + Send + 'static,
) -> Response {
    stream_turn(
        format,
        events,
        app.sse_keepalive(),
        app.turns.metrics().clone(),
    )
}

/// A `data:` line of JSON, the frame of the formats that are not native.
pub fn data_frame(value: &impl serde::Serialize) -> Bytes {
    let mut frame = b"data: ".to_vec();
    if let Err(e) = serde_json::to_writer(&mut frame, value) {
        // Every type framed has string keys only: this cannot happen.
        tracing::error!(error = %e, "a frame could not be serialised");
        return Bytes::new();
    }
    frame.extend_from_slice(b"\n\n");
    Bytes::from(frame)
}

/// The typed event of `stored`, or `None` (logged) for one this build
/// cannot read: a format skips it rather than end a stream over it.
pub fn typed(stored: &StoredEvent) -> Option<&crate::events::TurnEvent> {
    let event = stored.event();
    if event.is_none() {
        tracing::warn!(
            seq = stored.seq,
            event_type = %stored.event_type,
            "an event this build cannot read is left out of the stream"
        );
    }
    event
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::TurnEvent;

    /// Each event's `seq` as its frame.
    struct Seqs;

    impl WireFormat for Seqs {
        fn encode(&mut self, event: &StoredEvent) -> Encoded {
            Encoded::frames(vec![Bytes::from(format!("{}\n\n", event.seq))])
        }

        fn unreadable(&mut self) -> Vec<Bytes> {
            Vec::new()
        }
    }

    /// A keep-alive follows every interval without a frame, and only
    /// those: events closer together than the interval get none between
    /// them, however long they go on.
    #[tokio::test(start_paused = true)]
    async fn a_keep_alive_comes_after_each_quiet_interval_and_never_between_close_events() {
        let turn = uuid::Uuid::now_v7();
        let event = move |seq| {
            let delta = TurnEvent::MessageDelta {
                step: 1,
                text: "t".into(),
            };
            Ok(Arc::new(
                StoredEvent::from_event("s", turn, seq, delta, chrono::Utc::now()).unwrap(),
            ))
        };
        // Ten events 40 ms apart, then 250 ms of quiet, then one more.
        let events = async_stream::stream! {
            for seq in 1..=10 {
                tokio::time::sleep(Duration::from_millis(40)).await;
                yield event(seq);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
            yield event(11);
        };
        let metrics = Arc::new(Metrics::default());
        let response = stream_turn(Seqs, events, Duration::from_millis(100), metrics);
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        let frames: Vec<&str> = std::str::from_utf8(&body)
            .unwrap()
            .split_terminator("\n\n")
            .collect();
        let mut want: Vec<String> = (1..=10).map(|seq| seq.to_string()).collect();
        want.extend([":".into(), ":".into(), "11".into()]);
        assert_eq!(frames, want);
    }
}
