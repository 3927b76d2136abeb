//! The native SSE encoding of a turn's events: `id:` is the seq, `event:` the
//! type, `data:` the envelope JSON. Errors become an in-stream `error` event.

use std::{
    convert::Infallible,
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use axum::{
    http::{HeaderValue, header},
    response::{
        IntoResponse, Response,
        sse::{Event, KeepAlive, Sse},
    },
};
use futures::{Stream, StreamExt};

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

/// Encodes `events` as an SSE response with keep-alive comments.
pub fn response(
    events: impl Stream<Item = Result<Arc<StoredEvent>, StoreError>> + Send + 'static,
    keepalive: Duration,
    metrics: Arc<Metrics>,
) -> Response {
    let open = OpenStream::new(metrics);
    let encoded = events.map(move |item| -> Result<Event, Infallible> {
        let _open = &open;
        Ok(match item {
            Ok(event) => encode(&event),
            Err(e) => {
                let problem = ApiError::from(e).to_problem();
                Event::default()
                    .event("error")
                    .data(serde_json::to_string(&problem).unwrap_or_default())
            }
        })
    });
    let mut response = Sse::new(encoded)
        .keep_alive(KeepAlive::new().interval(keepalive))
        .into_response();
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // Tell buffering proxies (nginx and friends) to pass events through.
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

/// One event in the native encoding.
pub fn encode(event: &StoredEvent) -> Event {
    Event::default()
        .id(event.seq.to_string())
        .event(&event.event_type)
        .data(event.envelope_json())
}
