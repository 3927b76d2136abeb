//! A future polled only after a wake of its own.
//!
//! `tokio::select!` polls every branch at each wake of its task, and a
//! branch that waits for a rare signal is polled as often as the busy one.
//! A `CancellationToken`'s `cancelled()` takes the token's mutex and its
//! `Notify`'s at each poll: a turn, a stream and a connection each wait on
//! a few such tokens while they relay a token at every wake (the
//! profile's first symbol under paced streams). [`when_woken`] polls the
//! inner future once, then again only when the inner future's waker was
//! woken since: its own waker records the wake and passes it on to the
//! task.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll, Wake, Waker},
};

use futures::task::AtomicWaker;

/// The inner future's waker: records the wake, then wakes the task that
/// polled last.
#[derive(Default)]
struct Flag {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

/// `inner`, polled only after a wake of its own (see the module's text).
pub fn when_woken<F: Future>(inner: F) -> WhenWoken<F> {
    let flag = Arc::new(Flag::default());
    WhenWoken {
        inner: Box::pin(inner),
        waker: Waker::from(flag.clone()),
        flag,
        task: None,
    }
}

/// See [`when_woken`].
pub struct WhenWoken<F> {
    inner: Pin<Box<F>>,
    flag: Arc<Flag>,
    waker: Waker,
    /// The task's waker as last registered (`None`: never polled).
    task: Option<Waker>,
}

impl<F: Future> Future for WhenWoken<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        // First, so that a wake from here on reaches this task; only when
        // it changed (a task's waker seldom does), as the exchange it
        // takes is most of what a poll would cost.
        let polled = match &this.task {
            Some(task) if task.will_wake(cx.waker()) => true,
            known => {
                let polled = known.is_some();
                this.flag.task.register(cx.waker());
                this.task = Some(cx.waker().clone());
                polled
            }
        };
        // A load, then the exchange only when woken.
        if polled
            && !(this.flag.woken.load(Ordering::Acquire)
                && this.flag.woken.swap(false, Ordering::AcqRel))
        {
            return Poll::Pending;
        }
        this.inner
            .as_mut()
            .poll(&mut Context::from_waker(&this.waker))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_util::sync::CancellationToken;

    /// Counts the polls of the future it wraps.
    struct Counted<'a, F> {
        inner: Pin<Box<F>>,
        polls: &'a std::sync::atomic::AtomicUsize,
    }

    impl<F: Future> Future for Counted<'_, F> {
        type Output = F::Output;
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
            self.polls.fetch_add(1, Ordering::Relaxed);
            self.inner.as_mut().poll(cx)
        }
    }

    struct CountWakes(std::sync::atomic::AtomicUsize);
    impl Wake for CountWakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Polled again and again without a wake of its own (the task woke for
    /// another branch), the inner future is polled once; the token's
    /// cancel wakes the task, and the next poll is ready.
    #[test]
    fn the_inner_future_is_polled_only_after_its_own_wake() {
        let token = CancellationToken::new();
        let polls = std::sync::atomic::AtomicUsize::new(0);
        let mut future = when_woken(Counted {
            inner: Box::pin(token.cancelled()),
            polls: &polls,
        });
        let task = Arc::new(CountWakes(Default::default()));
        let waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&waker);
        for _ in 0..100 {
            assert!(Pin::new(&mut future).poll(&mut cx).is_pending());
        }
        assert_eq!(polls.load(Ordering::Relaxed), 1);
        assert_eq!(task.0.load(Ordering::Relaxed), 0);
        token.cancel();
        assert_eq!(task.0.load(Ordering::Relaxed), 1, "the task is woken");
        assert!(Pin::new(&mut future).poll(&mut cx).is_ready());
        assert_eq!(polls.load(Ordering::Relaxed), 2);
    }

    /// A token cancelled before the first poll: ready at once; cancelled
    /// while a task waits on it: that task wakes and ends.
    #[tokio::test]
    #[expect(
        clippy::disallowed_methods,
        reason = "the task is joined below: the test waits for its end"
    )]
    async fn a_cancel_before_or_between_polls_is_seen() {
        let token = CancellationToken::new();
        token.cancel();
        when_woken(token.cancelled()).await;
        let token = CancellationToken::new();
        let waiting = tokio::spawn({
            let token = token.clone();
            async move { when_woken(token.cancelled_owned()).await }
        });
        tokio::task::yield_now().await;
        token.cancel();
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .unwrap()
            .unwrap();
    }
}
