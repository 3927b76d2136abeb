//! The typed error of every provider.

use std::time::Duration;

/// What the provider answered, kept for logs. The API key is never here:
/// only the status and the (truncated) body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderFailure {
    pub status: u16,
    /// The provider's own error message when its body had one.
    pub message: String,
    /// The raw body, truncated to [`ProviderFailure::BODY_LIMIT`] bytes.
    pub body: String,
}

impl ProviderFailure {
    pub const BODY_LIMIT: usize = 4096;
}

/// Why a provider call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    #[error("provider rate limited the request (HTTP {}): {}", .failure.status, .failure.message)]
    RateLimited {
        retry_after: Option<Duration>,
        failure: ProviderFailure,
    },
    #[error("provider is overloaded (HTTP {}): {}", .0.status, .0.message)]
    Overloaded(ProviderFailure),
    #[error("prompt exceeds the model's context length: {}", .0.message)]
    ContextLengthExceeded(ProviderFailure),
    #[error("provider rejected the credentials (HTTP {}): {}", .0.status, .0.message)]
    Auth(ProviderFailure),
    #[error("provider rejected the request (HTTP {}): {}", .0.status, .0.message)]
    BadRequest(ProviderFailure),
    #[error("provider timed out: {0}")]
    Timeout(String),
    #[error("provider unreachable: {0}")]
    Network(String),
    #[error("provider failed (HTTP {}): {}", .0.status, .0.message)]
    Server(ProviderFailure),
    #[error("provider answered something that is not its protocol: {0}")]
    Protocol(String),
    /// The answer stopped before its end: the connection was reset or
    /// closed mid-body, or the stream ended without its closing event.
    /// Another try may well get the whole answer.
    #[error("the provider's answer was cut off: {0}")]
    Interrupted(String),
}

impl ProviderError {
    /// The stable code of the turn failure this error causes.
    pub fn code(&self) -> &'static str {
        match self {
            Self::RateLimited { .. } => "provider_rate_limited",
            Self::Overloaded(_) => "provider_overloaded",
            Self::ContextLengthExceeded(_) => "provider_context_length_exceeded",
            Self::Auth(_) => "provider_auth_failed",
            Self::BadRequest(_) => "provider_bad_request",
            Self::Timeout(_) => "provider_timeout",
            Self::Network(_) => "provider_unreachable",
            Self::Server(_) => "provider_server_error",
            Self::Protocol(_) => "provider_protocol_error",
            Self::Interrupted(_) => "provider_stream_interrupted",
        }
    }

    /// Whether trying again (here or on another provider) may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::RateLimited { .. }
                | Self::Overloaded(_)
                | Self::Timeout(_)
                | Self::Network(_)
                | Self::Server(_)
                | Self::Interrupted(_)
        )
    }

    /// Classifies an HTTP error answer. `message` is the provider's error
    /// message if its body had one; `code` its machine-readable code.
    pub fn from_status(
        status: u16,
        retry_after: Option<Duration>,
        code: Option<&str>,
        failure: ProviderFailure,
    ) -> Self {
        let context_length = code == Some("context_length_exceeded")
            || failure.message.contains("context length")
            || failure.message.contains("context_length_exceeded")
            || failure.message.contains("prompt is too long");
        match status {
            401 | 403 => Self::Auth(failure),
            429 => Self::RateLimited {
                retry_after,
                failure,
            },
            400 | 413 if context_length => Self::ContextLengthExceeded(failure),
            503 | 529 => Self::Overloaded(failure),
            500..=599 => Self::Server(failure),
            _ => Self::BadRequest(failure),
        }
    }
}
