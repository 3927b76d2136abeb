//! `resources/subscribe` of the versions up to 2025-11-25: a session
//! (the `Mcp-Session-Id` that `initialize` gave) names the resources it
//! follows, and its `GET /mcp` stream says when one of them changes
//! (`notifications/resources/updated`).
//!
//! Unlike the rest of those versions, this is state: the process that
//! answered `initialize` keeps the session's subscriptions, and only its
//! `GET /mcp` serves them (a gateway routes a session to one replica, by
//! its `Mcp-Session-Id`, for these). Elsewhere the stream is refused 404
//! `mcp_session_not_found`, the answer the transport gives for a session
//! the server does not know: the client begins a new one. 2026-07-28 has
//! no sessions: its `subscriptions/listen` keeps no state at all.

use std::{collections::BTreeMap, convert::Infallible, time::Duration};

use axum::{
    body::Body,
    http::{HeaderValue, header},
    response::{IntoResponse, Response},
};
use bytes::Bytes;
use tokio::time::Instant;

use super::{
    resources,
    wire::{Notification, Updated, message_frame},
};
use crate::{
    ids::Tenant, protocols::Shared, protocols::error::ApiError, protocols::sse::KEEP_ALIVE,
};

/// How often a stream looks for changes.
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// A keep-alive comment after this long without a notification.
const QUIET: Duration = Duration::from_secs(15);

/// `GET /mcp` of a session: its notifications, until the client leaves,
/// another `GET` of the session takes over, or the service shuts down.
pub(super) fn stream(app: Shared, tenant: Tenant, session: &str) -> Result<Response, ApiError> {
    let place = app.mcp.listens.enter(&tenant.0).ok_or_else(|| {
        ApiError::TooManyStreams(format!(
            "the tenant holds {} MCP listens here, as many as it may",
            crate::protocols::mcp::state::MCP_LISTENS_PER_TENANT
        ))
    })?;
    let key = (tenant.0.clone(), session.to_owned());
    let stream_id = app
        .mcp
        .sessions
        .take(&key)
        .ok_or(ApiError::McpSessionNotFound)?;
    let closing = app.turns.streams_closed();
    let body = async_stream::stream! {
        let _place = place;
        let mut seen: BTreeMap<String, Option<u64>> = BTreeMap::new();
        let mut quiet_since = Instant::now();
        while let Some(uris) = app.mcp.sessions.followed(&key, stream_id) {
            seen.retain(|uri, _| uris.contains(uri));
            for uri in uris {
                let now = resources::version(&app, &tenant, &uri).await;
                match seen.insert(uri.clone(), now) {
                    // First look: what it is now is what changes are from.
                    None => {}
                    Some(before) if now.is_some() && before.is_some() && now != before => {
                        let note = Notification::new(
                            "notifications/resources/updated",
                            Updated { uri: &uri },
                        );
                        quiet_since = Instant::now();
                        yield Ok::<_, Infallible>(message_frame(&note));
                    }
                    // Unreadable now: the look after compares with before.
                    Some(before) if now.is_none() => {
                        seen.insert(uri, before);
                    }
                    Some(_) => {}
                }
            }
            if quiet_since.elapsed() >= QUIET {
                quiet_since = Instant::now();
                yield Ok(Bytes::from_static(KEEP_ALIVE));
            }
            tokio::select! {
                () = closing.cancelled() => break,
                () = tokio::time::sleep(LOOK_EVERY) => {}
            }
        }
    };
    let mut response = Body::from_stream(body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(response)
}
