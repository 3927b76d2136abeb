//! Masking secrets in what a provider says.
//!
//! A provider's error body may quote the key it was sent (a 401 that echoes
//! it, a proxy page that prints the request), and a transport error names
//! the URL, whose query may carry a key (`?key=`, Azure's `api-key=`) and
//! whose userinfo may carry a password (`http://user:password@host`).
//! Every adapter passes its errors through its [`Redactor`] before they
//! leave it, so no key reaches a client, an event, the database or a log.

use std::sync::Arc;

use reqwest::Url;
use tokio::time::Instant;

use super::{ChatRequest, LlmProvider, ProviderError, ProviderFailure, ProviderStream};

/// What a masked secret becomes.
pub const MASK: &str = "[redacted]";

/// Query parameters whose values are secrets wherever they appear.
const SECRET_PARAMS: &[&str] = &[
    "key",
    "api-key",
    "api_key",
    "apikey",
    "token",
    "access_token",
    "sig",
];

/// The secrets of one adapter: the values of the headers it sends with
/// keys in them, and the secret query values of its URL.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    secrets: Vec<String>,
}

impl Redactor {
    /// Masks `secrets` (empty ones are ignored), and the password and the
    /// secret query values of `url`.
    pub fn new(secrets: impl IntoIterator<Item = String>, url: Option<&Url>) -> Self {
        let mut all: Vec<String> = secrets
            .into_iter()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect();
        if let Some(url) = url {
            if let Some(password) = url.password() {
                all.push(password.to_owned());
                // As a client or server may quote it, decoded.
                if let Ok(decoded) = percent_encoding::percent_decode_str(password).decode_utf8() {
                    all.push(decoded.into_owned());
                }
            }
            for (name, value) in url.query_pairs() {
                if is_secret_param(&name) && !value.is_empty() {
                    all.push(value.into_owned());
                }
            }
        }
        // Longest first, so a secret that contains another is masked whole.
        all.sort_by_key(|s| std::cmp::Reverse(s.len()));
        all.dedup();
        Self { secrets: all }
    }

    /// `text` with every known secret, every secret query value and every
    /// URL's password masked.
    pub fn text(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for secret in &self.secrets {
            if out.contains(secret.as_str()) {
                out = out.replace(secret.as_str(), MASK);
            }
        }
        mask_userinfo_passwords(&mask_secret_params(&out))
    }

    /// `error` with its texts masked.
    pub fn error(&self, error: ProviderError) -> ProviderError {
        error.map_text(|t| self.text(t))
    }
}

/// Masks the password of every URL in `text` (`scheme://user:password@`).
fn mask_userinfo_passwords(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        out.push_str(&rest[..at + 3]);
        rest = &rest[at + 3..];
        let authority_end = rest
            .find(|c: char| "/?#\"'<>()[],".contains(c) || c.is_whitespace())
            .unwrap_or(rest.len());
        let authority = &rest[..authority_end];
        let Some(userinfo_end) = authority.rfind('@') else {
            continue;
        };
        let userinfo = &authority[..userinfo_end];
        if let Some(colon) = userinfo.find(':') {
            out.push_str(&userinfo[..=colon]);
            out.push_str(MASK);
            rest = &rest[userinfo_end..];
        }
    }
    out.push_str(rest);
    out
}

fn is_secret_param(name: &str) -> bool {
    SECRET_PARAMS.iter().any(|p| p.eq_ignore_ascii_case(name))
}

/// Masks the values of secret query parameters (`?key=...`, `&api-key=...`)
/// wherever a URL appears in `text`.
fn mask_secret_params(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(['?', '&']) {
        out.push_str(&rest[..=at]);
        rest = &rest[at + 1..];
        let Some(eq) = rest.find('=') else { continue };
        let name = &rest[..eq];
        if name.is_empty()
            || name.len() > 32
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            || !is_secret_param(name)
        {
            continue;
        }
        let value_end = rest[eq + 1..]
            .find(|c: char| c == '&' || c == '#' || c.is_whitespace() || "\"')<>,".contains(c))
            .map_or(rest.len(), |i| eq + 1 + i);
        out.push_str(&rest[..=eq]);
        out.push_str(MASK);
        rest = &rest[value_end..];
    }
    out.push_str(rest);
    out
}

impl ProviderError {
    /// This error with `f` applied to each of its texts.
    pub fn map_text(self, f: impl Fn(&str) -> String) -> Self {
        let failure = |x: ProviderFailure| ProviderFailure {
            status: x.status,
            message: f(&x.message),
            body: f(&x.body),
        };
        match self {
            Self::RateLimited {
                retry_after,
                failure: x,
            } => Self::RateLimited {
                retry_after,
                failure: failure(x),
            },
            Self::Overloaded(x) => Self::Overloaded(failure(x)),
            Self::ContextLengthExceeded(x) => Self::ContextLengthExceeded(failure(x)),
            Self::Auth(x) => Self::Auth(failure(x)),
            Self::BadRequest(x) => Self::BadRequest(failure(x)),
            Self::Server(x) => Self::Server(failure(x)),
            Self::Timeout(t) => Self::Timeout(f(&t)),
            Self::Network(t) => Self::Network(f(&t)),
            Self::Protocol(t) => Self::Protocol(f(&t)),
            Self::Interrupted(t) => Self::Interrupted(f(&t)),
        }
    }
}

/// An adapter of a provider's HTTP API: what differs between them. Each
/// is an [`LlmProvider`] whose errors, now and later in the stream, pass
/// through its [`Redactor`] first.
#[async_trait::async_trait]
pub trait HttpAdapter: Send + Sync + 'static {
    /// The provider's name (`openai`, `anthropic`, `ollama`).
    const NAME: &'static str;

    /// The model used when a request names none, and the adapter's
    /// secrets.
    fn setup(&self) -> (&str, &Arc<Redactor>);

    /// The answer's stream, before its errors are masked; nothing of it
    /// waits past `deadline` (the request's timeout from now).
    async fn open(&self, request: ChatRequest, deadline: Instant) -> Opened;
}

/// What an adapter's [`HttpAdapter::open`] answers.
pub type Opened = Result<ProviderStream, ProviderError>;

#[async_trait::async_trait]
impl<A: HttpAdapter> LlmProvider for A {
    fn name(&self) -> &str {
        A::NAME
    }

    fn default_model(&self) -> &str {
        self.setup().0
    }

    async fn stream(&self, request: ChatRequest) -> Result<ProviderStream, ProviderError> {
        let deadline = Instant::now() + request.timeout;
        redacted(self.open(request, deadline).await, self.setup().1)
    }
}

/// `opened` with every error, now and later in the stream, masked.
fn redacted(
    opened: Result<ProviderStream, ProviderError>,
    redactor: &Arc<Redactor>,
) -> Result<ProviderStream, ProviderError> {
    use futures::StreamExt;
    match opened {
        Err(e) => Err(redactor.error(e)),
        Ok(stream) => {
            let redactor = redactor.clone();
            Ok(stream
                .map(move |item| item.map_err(|e| redactor.error(e)))
                .boxed())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_passwords_are_masked_wherever_a_url_appears() {
        let url = Url::parse("http://proxy-user:pa%40ss-w0rd@llm.internal:8000/v1").unwrap();
        let redactor = Redactor::new([], Some(&url));
        let text = "error sending request for url (http://proxy-user:pa%40ss-w0rd@llm.internal:8000/v1/chat/completions); \
                    the proxy said: bad password pa@ss-w0rd; see https://u:other@x.example/a?key=k1 and postgres://db:hunter2@db/x";
        let masked = redactor.text(text);
        for secret in ["pa%40ss-w0rd", "pa@ss-w0rd", "other", "hunter2", "k1"] {
            assert!(!masked.contains(secret), "{secret}: {masked}");
        }
        assert!(
            masked.contains("http://proxy-user:[redacted]@llm.internal:8000/v1/chat/completions"),
            "{masked}"
        );
        assert!(masked.contains("postgres://db:[redacted]@db/x"), "{masked}");
        // A user without a password, and an address in prose, are left alone.
        let plain = "https://user@host/x mail me at a@b.example, see http://host/p@q";
        assert_eq!(Redactor::default().text(plain), plain);
    }

    #[test]
    fn keys_and_secret_query_values_are_masked() {
        let url = Url::parse("https://x.example/v1?api-version=2024-10-21&key=q-secret").unwrap();
        let redactor = Redactor::new(["sk-canary-123".to_owned(), String::new()], Some(&url));
        assert_eq!(
            redactor.text("Incorrect API key provided: sk-canary-123. Bearer sk-canary-123"),
            "Incorrect API key provided: [redacted]. Bearer [redacted]"
        );
        assert_eq!(
            redactor.text(
                "error sending request for url (https://x.example/v1/chat/completions?api-version=2024-10-21&key=q-secret)"
            ),
            "error sending request for url (https://x.example/v1/chat/completions?api-version=2024-10-21&key=[redacted])"
        );
        // A key this adapter does not know, in any URL's query, still goes.
        assert_eq!(
            redactor.text("see http://h/p?API_KEY=other&x=1 and http://h/q?token=t"),
            "see http://h/p?API_KEY=[redacted]&x=1 and http://h/q?token=[redacted]"
        );
        assert_eq!(redactor.text("a & b = c?"), "a & b = c?");
    }

    #[test]
    fn every_text_of_an_error_is_masked() {
        let redactor = Redactor::new(["sk-1".to_owned()], None);
        let error = redactor.error(ProviderError::Auth(ProviderFailure {
            status: 401,
            message: "bad sk-1".into(),
            body: "{\"key\":\"sk-1\"}".into(),
        }));
        assert_eq!(
            error,
            ProviderError::Auth(ProviderFailure {
                status: 401,
                message: "bad [redacted]".into(),
                body: "{\"key\":\"[redacted]\"}".into(),
            })
        );
    }
}
