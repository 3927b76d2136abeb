//! Limits on a request's head, answered as problem+json.
//!
//! Hyper refuses a head past its own ceiling with a bare 414 or 431 before
//! the service sees it; these lower limits come first, so that a client
//! gets the service's problem document (and CORS headers) in the usual case.

use axum::{extract::Request, middleware::Next, response::Response};

use super::error::ApiError;

/// Longest path and query accepted.
pub const MAX_URI_BYTES: usize = 8 * 1024;

/// Largest total of header names and values accepted.
pub const MAX_HEADER_BYTES: usize = 32 * 1024;

/// Hyper's own ceiling on a request head (a bare 431 past it): well above
/// `MAX_HEADER_BYTES`, well below what many held connections could
/// afford each.
pub const HYPER_MAX_HEAD_BYTES: usize = 64 * 1024;

/// Refuses an over-long URI (414) or over-large headers (431).
pub async fn request_head(request: Request, next: Next) -> Result<Response, ApiError> {
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
    Ok(next.run(request).await)
}
