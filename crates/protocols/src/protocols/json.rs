//! The JSON body extractor: every way a body can be wrong gets its own
//! problem code, and the field at fault is named by its path.

use axum::{
    body::Bytes,
    extract::{FromRequest, Request},
    http::{StatusCode, header},
};
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// Like `axum::Json`, with this service's errors.
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let is_json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<mime_type::Essence>().ok())
            .is_some_and(|m| m.is_json());
        if !is_json {
            return Err(ApiError::UnsupportedMediaType);
        }
        let bytes = read_body(req, state).await?;
        parse(&bytes).map(ApiJson)
    }
}

/// The whole body, within the body limit and the body timeout.
async fn read_body<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    let limit = req
        .extensions()
        .get::<BodyLimit>()
        .map_or(usize::MAX, |l| l.0);
    let timeout = req
        .extensions()
        .get::<BodyTimeout>()
        .map_or(std::time::Duration::MAX, |t| t.0);
    // The whole body within the timeout: a client trickling it in a
    // byte at a time does not hold the connection for long.
    tokio::time::timeout(timeout, Bytes::from_request(req, state))
        .await
        .map_err(|_| ApiError::RequestTimeout(timeout.as_secs()))?
        .map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::PayloadTooLarge(limit)
            } else {
                ApiError::InvalidJson(rejection.body_text())
            }
        })
}

/// A JSON Lines body (`application/jsonl` or `application/x-ndjson`), as
/// text.
pub struct JsonLines(pub String);

impl<S: Send + Sync> FromRequest<S> for JsonLines {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let is_lines = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(|v| v.trim().to_ascii_lowercase())
            .is_some_and(|v| v == "application/jsonl" || v == "application/x-ndjson");
        if !is_lines {
            return Err(ApiError::UnsupportedMediaType);
        }
        let bytes = read_body(req, state).await?;
        String::from_utf8(bytes.to_vec())
            .map(JsonLines)
            .map_err(|_| ApiError::InvalidJson("the body is not UTF-8".into()))
    }
}

/// The configured body limit, put in request extensions so that the 413
/// problem can say what the limit is.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit(pub usize);

/// The longest a request body may take to arrive, whole.
#[derive(Debug, Clone, Copy)]
pub struct BodyTimeout(pub std::time::Duration);

/// Parses a JSON body, classifying the failure.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        match inner.classify() {
            serde_json::error::Category::Data => ApiError::InvalidBody {
                detail: if path == "." {
                    format!("invalid body: {inner}")
                } else {
                    format!("invalid value at `{path}`: {inner}")
                },
                field: (path != ".").then_some(path),
            },
            _ => ApiError::InvalidJson(inner.to_string()),
        }
    })?;
    deserializer
        .end()
        .map_err(|e| ApiError::InvalidJson(e.to_string()))?;
    Ok(value)
}

/// Just enough media-type parsing to accept `application/json`,
/// `application/json; charset=utf-8` and `application/*+json`.
mod mime_type {
    pub struct Essence(String);

    impl std::str::FromStr for Essence {
        type Err = ();
        fn from_str(s: &str) -> Result<Self, ()> {
            let essence = s.split(';').next().ok_or(())?.trim().to_ascii_lowercase();
            Ok(Self(essence))
        }
    }

    impl Essence {
        pub fn is_json(&self) -> bool {
            self.0 == "application/json"
                || (self.0.starts_with("application/") && self.0.ends_with("+json"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[expect(dead_code, reason = "fields exist to be deserialized")]
    struct Body {
        message: Option<String>,
        top_k: Option<u32>,
    }

    #[test]
    fn syntax_errors_and_shape_errors_get_different_codes() {
        assert_eq!(
            parse::<Body>(b"{\"message\":").unwrap_err().code(),
            "invalid_json"
        );
        assert_eq!(
            parse::<Body>(b"{} trailing").unwrap_err().code(),
            "invalid_json"
        );
        let err = parse::<Body>(br#"{"top_k":"five"}"#).unwrap_err();
        assert_eq!(err.code(), "invalid_body");
        assert_eq!(err.to_problem().field.as_deref(), Some("top_k"));
        assert_eq!(
            parse::<Body>(br#"{"mesage":"x"}"#).unwrap_err().code(),
            "invalid_body"
        );
    }
}
