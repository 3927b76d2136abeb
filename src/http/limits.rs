//! Limits on a request's head, answered as problem+json.
//!
//! Hyper refuses a head past its own ceiling with a bare 414 or 431 before
//! the service sees it; these lower limits come first, so that a client
//! gets the service's problem document (and CORS headers) in the usual case.

use axum::{
    extract::{Request, State},
    http::header,
    middleware::Next,
    response::Response,
};

use crate::protocols::error::ApiError;

/// Longest path and query accepted.
pub const MAX_URI_BYTES: usize = 8 * 1024;

/// Largest total of header names and values accepted.
pub const MAX_HEADER_BYTES: usize = 32 * 1024;

/// Hyper's own ceiling on a request head (a bare 431 past it): well above
/// `MAX_HEADER_BYTES`, well below what many held connections could
/// afford each.
pub const HYPER_MAX_HEAD_BYTES: usize = 64 * 1024;

/// The bodies a request may announce.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    /// Any request's but an upload's.
    pub body: usize,
    /// An upload's file (`POST /files`), its form around it aside.
    pub file: u64,
}

/// Refuses an over-long URI (414), over-large headers (431), or a body
/// whose announced length is over its limit (413, before a client that
/// sent `Expect: 100-continue` is told to send it).
pub async fn request_head(
    State(limits): State<BodyLimits>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let uri = request
        .uri()
        .path_and_query()
        .map_or(0, |p| p.as_str().len());
    if uri > MAX_URI_BYTES {
        return Err(ApiError::UriTooLong(MAX_URI_BYTES));
    }
    let headers: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    if headers > MAX_HEADER_BYTES {
        return Err(ApiError::HeadersTooLarge(MAX_HEADER_BYTES));
    }
    let announced = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if super::files::is_upload(request.method(), request.uri().path()) {
        let most = limits.file.saturating_add(super::files::UPLOAD_OVERHEAD);
        if announced.is_some_and(|length| length > most) {
            return Err(ApiError::FileTooLarge(limits.file));
        }
    } else if announced.is_some_and(|length| length > limits.body as u64) {
        return Err(ApiError::PayloadTooLarge(limits.body));
    }
    Ok(next.run(request).await)
}
