//! The native SSE encoding of a turn's events: `id:` is the seq, `event:` the
//! type, `data:` the envelope JSON. Errors become an in-stream `error` event.

use std::{
    convert::Infallible,
    fmt::Write as _,
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use axum::{
    body::Body,
    http::{HeaderValue, header},
    response::{IntoResponse, Response},
};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use tokio::time::Instant;

use super::error::ApiError;
use crate::{events::StoredEvent, metrics::Metrics, store::StoreError};

/// Counts an open stream while it lives.
struct OpenStream(Arc<Metrics>);

impl OpenStream {
    fn new(metrics: Arc<Metrics>) -> Self {
        metrics.streams_open.fetch_add(1, Ordering::Relaxed);
        Self(metrics)
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.streams_open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A keep-alive: an SSE comment line, ignored by clients.
const KEEP_ALIVE: &[u8] = b":\n\n";

/// Encodes `events` as an SSE response, with a keep-alive comment after
/// every `keepalive` without an event.
///
/// The frames are written here rather than through axum's `Sse`: each event
/// becomes one buffer of known size, with no per-field copying or newline
/// scanning (the envelope is compact JSON, which has no raw newlines).
pub fn response(
    events: impl Stream<Item = Result<Arc<StoredEvent>, StoreError>> + Send + 'static,
    keepalive: Duration,
    metrics: Arc<Metrics>,
) -> Response {
    let open = OpenStream::new(metrics);
    let frames = async_stream::stream! {
        let _open = open;
        let mut events = std::pin::pin!(events);
        let quiet = tokio::time::sleep(keepalive);
        let mut quiet = std::pin::pin!(quiet);
        loop {
            tokio::select! {
                item = events.next() => match item {
                    Some(Ok(event)) => yield Ok::<_, Infallible>(encode(&event)),
                    Some(Err(e)) => yield Ok(error_frame(e)),
                    None => break,
                },
                () = quiet.as_mut() => yield Ok(Bytes::from_static(KEEP_ALIVE)),
            }
            quiet.as_mut().reset(Instant::now() + keepalive);
        }
    };
    let mut response = Body::from_stream(frames).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // Tell buffering proxies (nginx and friends) to pass events through.
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

/// One event in the native encoding: `id:`, `event:`, `data:`.
pub fn encode(event: &StoredEvent) -> Bytes {
    let mut frame = String::with_capacity(event.envelope_len_hint() + 48);
    frame.push_str("id: ");
    // Writing to a String cannot fail.
    let _ = write!(frame, "{}", event.seq);
    frame.push_str("\nevent: ");
    frame.push_str(&event.event_type);
    frame.push_str("\ndata: ");
    event.write_envelope(&mut frame);
    frame.push_str("\n\n");
    Bytes::from(frame)
}

/// A failure to read the log, as an in-stream `error` event.
fn error_frame(e: StoreError) -> Bytes {
    let problem = ApiError::from(e).to_problem();
    let data = serde_json::to_string(&problem).unwrap_or_default();
    Bytes::from(format!("event: error\ndata: {data}\n\n"))
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use uuid::Uuid;

    use super::*;
    use crate::events::TurnEvent;

    #[test]
    fn an_event_is_one_frame_of_id_event_and_data() {
        let event = TurnEvent::MessageDelta {
            step: 1,
            text: "two\nlines".into(),
        };
        let stored = StoredEvent::new("s-1", Uuid::now_v7(), 12, &event, Utc::now()).unwrap();
        let frame = encode(&stored);
        let expected = format!(
            "id: 12\nevent: message.delta\ndata: {}\n\n",
            stored.envelope_json()
        );
        assert_eq!(frame, Bytes::from(expected));
        // One data line: a newline in the text stays escaped inside the JSON.
        assert_eq!(frame.iter().filter(|b| **b == b'\n').count(), 4);
    }

    #[test]
    fn a_log_failure_is_an_error_event() {
        let frame = error_frame(StoreError::Unavailable("disk gone".into()));
        let text = std::str::from_utf8(&frame).unwrap();
        assert!(text.starts_with("event: error\ndata: {"), "{text}");
        assert!(text.ends_with("}\n\n"), "{text}");
        let data: serde_json::Value =
            serde_json::from_str(&text["event: error\ndata: ".len()..text.len() - 2]).unwrap();
        assert!(data["code"].is_string(), "{data}");
    }
}
