//! Each Postgres call answers within a bound (see [`super::postgres`]):
//! the call's deadline, and the note of when one was last given up.

use std::{
    future::Future,
    sync::{
        OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use super::StoreError;
use crate::store::Result;

/// When a call last gave up on its connection, in ms after [`epoch`]
/// (0: never). Process-wide: the pools' release test reads it.
static ABANDONED_AT_MS: AtomicU64 = AtomicU64::new(0);

/// How long after a call gave up the pools test connections coming back.
/// The connection of a call that was given up comes back at once (its
/// future is dropped then), so this only needs to cover a busy moment.
const ABANDONED_WINDOW: Duration = Duration::from_secs(5);

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn since_epoch_ms() -> u64 {
    u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Whether a call gave up on its connection a moment ago: a connection
/// coming back to a pool now may be that one (mid-statement on a socket
/// that does not answer), so the pool tests it within a bound instead of
/// waiting on it for as long as TCP does.
pub(crate) fn recently_abandoned() -> bool {
    let at = ABANDONED_AT_MS.load(Ordering::Relaxed);
    at != 0 && since_epoch_ms().saturating_sub(at) <= ABANDONED_WINDOW.as_millis() as u64
}

/// `call`, or a transient error if it did not answer within `limit`.
pub(super) async fn within<T, E: Into<StoreError>>(
    limit: Duration,
    call: impl Future<Output = Result<T, E>>,
) -> Result<T> {
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result.map_err(Into::into),
        Err(_) => Err(gave_up(limit)),
    }
}

/// The error of a call that did not answer in time (its connection was
/// given up with it).
fn gave_up(limit: Duration) -> StoreError {
    ABANDONED_AT_MS.store(since_epoch_ms().max(1), Ordering::Relaxed);
    StoreError::Unavailable(format!(
        "the database did not answer within {} ms",
        limit.as_millis()
    ))
}
