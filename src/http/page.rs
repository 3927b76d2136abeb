//! `GET /`: a chat page, shipped in the binary. It streams a turn (answer,
//! tool calls, sources), resumes a dropped stream with `Last-Event-ID`, and
//! can cancel the turn.

use axum::{
    http::{HeaderValue, header},
    response::{IntoResponse, Response},
};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::app::AppState;

/// The page.
pub const PAGE: &str = include_str!("../../static/index.html");

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(chat_page))
}

/// The chat page.
#[utoipa::path(
    get,
    path = "/",
    tag = "operations",
    responses((status = 200, description = "An HTML page to chat with the service", content_type = "text/html", body = String))
)]
async fn chat_page() -> Response {
    let mut response = PAGE.into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    // The page's own script and style only; it calls this origin alone.
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'",
        ),
    );
    response
}
