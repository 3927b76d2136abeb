//! `ProviderChain`: an ordered list of providers that keeps a turn alive
//! when one fails.
//!
//! Each provider gets up to `max_attempts` tries with exponential backoff
//! and jitter on retryable errors (429 honouring `Retry-After`, 5xx and
//! 529, connect errors, timeouts, in-stream overloads); then the chain falls
//! over to the next provider. Nothing waits past the turn's deadline.
//! Non-retryable errors (400, 401/403, context length, protocol) fail at
//! once. A stream that fails after output already went out is retried too,
//! preceded by [`ProviderEvent::Restart`] so the client can drop the
//! partial text; the client never sees the same text twice without that
//! marker between.

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use futures::StreamExt;
use tokio::time::Instant;

use super::{ChatRequest, LlmProvider, ProviderError, ProviderEvent, ProviderStream};

/// How a chain retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Tries per provider (1: no retry).
    pub max_attempts: u32,
    /// Delay before the second try; doubled each time.
    pub base_delay: Duration,
    /// Longest delay between tries.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            base_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(5),
        }
    }
}

impl RetryPolicy {
    /// The delay after failed try `attempt` (1-based): the service's
    /// backoff ([`crate::retry::Backoff`]: exponential, capped, jittered
    /// to between half and all of it); a `Retry-After` wins when it is
    /// longer.
    pub fn delay(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        let backoff = crate::retry::Backoff {
            first: self.base_delay,
            most: self.max_delay,
        }
        .delay(attempt);
        retry_after.map_or(backoff, |after| after.max(backoff))
    }
}

/// Providers in order of preference.
pub struct ProviderChain {
    entries: Vec<Arc<dyn LlmProvider>>,
    policy: RetryPolicy,
    default_model: String,
}

impl ProviderChain {
    /// A chain of `entries` (at least one).
    pub fn new(
        entries: Vec<Arc<dyn LlmProvider>>,
        policy: RetryPolicy,
    ) -> Result<Self, ProviderError> {
        let first = entries.first().ok_or_else(|| {
            ProviderError::BadRequest(super::ProviderFailure {
                status: 0,
                message: "a provider chain needs at least one provider".into(),
                body: String::new(),
            })
        })?;
        let default_model = format!("{}:{}", first.name(), first.default_model());
        Ok(Self {
            entries,
            policy,
            default_model,
        })
    }

    /// The providers' names, in order (what `runtime_provider` may name).
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for entry in &self.entries {
            if !names.iter().any(|n| n == entry.name()) {
                names.push(entry.name().to_owned());
            }
        }
        names
    }
}

fn retryable(error: &ProviderError, deadline: Instant) -> bool {
    error.is_retryable() && Instant::now() < deadline
}

fn retry_after(error: &ProviderError) -> Option<Duration> {
    match error {
        ProviderError::RateLimited { retry_after, .. } => *retry_after,
        _ => None,
    }
}

#[expect(
    clippy::too_many_lines,
    reason = "a provider's retries and the fallover to the next are one loop"
)]
#[async_trait]
impl LlmProvider for ProviderChain {
    fn name(&self) -> &str {
        "chain"
    }

    /// `name:model` of the first provider (seeds: a chain resolves to its
    /// first provider).
    fn default_model(&self) -> &str {
        &self.default_model
    }

    fn model_for(&self, provider: &str) -> Option<String> {
        self.entries
            .iter()
            .find(|e| e.name() == provider)
            .map(|e| e.default_model().to_owned())
    }

    async fn stream(&self, request: ChatRequest) -> Result<ProviderStream, ProviderError> {
        let deadline = Instant::now() + request.timeout;
        let candidates: Vec<Arc<dyn LlmProvider>> = match &request.provider {
            Some(name) => self
                .entries
                .iter()
                .filter(|e| e.name() == name)
                .cloned()
                .collect(),
            None => self.entries.clone(),
        };
        if candidates.is_empty() {
            return Err(ProviderError::BadRequest(super::ProviderFailure {
                status: 0,
                message: format!("no provider named {:?} in the chain", request.provider),
                body: String::new(),
            }));
        }
        let policy = self.policy;
        let stream = async_stream::stream! {
            let mut last_error = ProviderError::Timeout("the turn's deadline passed".into());
            for (position, provider) in candidates.into_iter().enumerate() {
                let model = if position == 0 {
                    request.model.clone()
                } else {
                    provider.default_model().to_owned()
                };
                for attempt in 1..=policy.max_attempts.max(1) {
                    let remaining = deadline.saturating_duration_since(Instant::now());
                    if remaining.is_zero() {
                        yield Err(last_error);
                        return;
                    }
                    let call = ChatRequest {
                        model: model.clone(),
                        timeout: remaining,
                        ..request.clone()
                    };
                    let failure = match provider.stream(call).await {
                        Err(e) => e,
                        Ok(mut events) => {
                            let mut produced = false;
                            let mut failure = None;
                            while let Some(event) = events.next().await {
                                match event {
                                    Ok(event) => {
                                        let done = matches!(event, ProviderEvent::Finished(_));
                                        produced |= !matches!(event, ProviderEvent::Usage(_));
                                        yield Ok(event);
                                        if done {
                                            return;
                                        }
                                    }
                                    Err(e) => {
                                        failure = Some((e, produced));
                                        break;
                                    }
                                }
                            }
                            let (error, produced) = failure.unwrap_or_else(|| {
                                (ProviderError::Interrupted("the stream ended without finishing".into()), produced)
                            });
                            if produced && retryable(&error, deadline) {
                                yield Ok(ProviderEvent::Restart { reason: error.code().to_owned() });
                            }
                            error
                        }
                    };
                    if !retryable(&failure, deadline) {
                        yield Err(failure);
                        return;
                    }
                    tracing::warn!(
                        provider = provider.name(),
                        attempt,
                        error = %failure,
                        "provider call failed; retrying"
                    );
                    let delay = policy.delay(attempt, retry_after(&failure));
                    last_error = failure;
                    if attempt == policy.max_attempts.max(1) {
                        break;
                    }
                    if delay >= deadline.saturating_duration_since(Instant::now()) {
                        // Waiting would overrun the turn: try the next provider now.
                        break;
                    }
                    tokio::time::sleep(delay).await;
                }
                tracing::warn!(provider = provider.name(), "falling over to the next provider");
            }
            yield Err(last_error);
        };
        Ok(stream.boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_cap_and_honour_retry_after() {
        let policy = RetryPolicy {
            max_attempts: 5,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(1000),
        };
        for _ in 0..50 {
            let first = policy.delay(1, None);
            assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
            let third = policy.delay(3, None);
            assert!(third >= Duration::from_millis(200) && third <= Duration::from_millis(400));
            let capped = policy.delay(10, None);
            assert!(capped <= Duration::from_millis(1000));
        }
        assert_eq!(
            policy.delay(1, Some(Duration::from_secs(3))),
            Duration::from_secs(3)
        );
    }
}
