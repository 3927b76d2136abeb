//! A subscriber for one test's thread, set so that other tests running
//! alongside cannot blind it.
//!
//! `tracing` caches, per callsite and for the whole process, whether any
//! subscriber wants it. A test that reaches a span with no subscriber of its
//! own, while no other is registered, caches "never" for that span, and a
//! later thread-local subscriber no longer sees it. A global subscriber that
//! wants everything keeps that cache from ever saying "never"; rebuilding
//! the cache after setting the thread's subscriber undoes what was cached
//! before the global one was there.

use std::sync::Once;

use tracing::subscriber::DefaultGuard;

/// Sets `subscriber` as this thread's until the guard is dropped.
pub fn capture<S>(subscriber: S) -> DefaultGuard
where
    S: tracing::Subscriber + Send + Sync + 'static,
{
    static GLOBAL: Once = Once::new();
    GLOBAL.call_once(|| {
        // Fails only if another global subscriber is set, which keeps the
        // cache just as open.
        let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry());
    });
    let guard = tracing::subscriber::set_default(subscriber);
    tracing::callsite::rebuild_interest_cache();
    guard
}
