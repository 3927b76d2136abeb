//! Two timeouts out of hyper's one: hyper starts its header-read timer as
//! soon as a connection waits for a request, so one setting would make
//! the time to send a request's head and the time a keep-alive connection
//! may sit idle the same. Behind a load balancer the idle time must be the
//! longer (a balancer that reuses a connection the server just closed
//! answers 502); against slowloris the head time must be short.
//!
//! So the timer hyper is given ([`HeadTimer`]) fires at whichever comes
//! first of `idle` after the wait began and `head` after the first byte of
//! the request arrived; the connection's reader ([`TrackedIo`]) tells it
//! when that first byte came.

use std::{
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::{Duration, Instant},
};

use futures::task::AtomicWaker;
use hyper::rt::{Sleep, Timer};

/// What the reader saw since the connection began waiting for a request.
#[derive(Debug)]
pub struct Activity {
    base: Instant,
    /// Milliseconds after `base` (plus one) of the first byte read since the
    /// wait began; 0: none yet.
    first_read: AtomicU64,
    /// The pending head timer, woken by the first byte.
    waker: AtomicWaker,
}

impl Activity {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            base: Instant::now(),
            first_read: AtomicU64::new(0),
            waker: AtomicWaker::new(),
        })
    }

    fn begin_wait(&self) {
        self.first_read.store(0, Ordering::Release);
    }

    /// A read brought bytes.
    pub(crate) fn note_read(&self) {
        if self.first_read.load(Ordering::Acquire) != 0 {
            return;
        }
        let at = u64::try_from(self.base.elapsed().as_millis())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1);
        if self
            .first_read
            .compare_exchange(0, at, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.waker.wake();
        }
    }

    fn first_read(&self) -> Option<Instant> {
        match self.first_read.load(Ordering::Acquire) {
            0 => None,
            at => Some(self.base + Duration::from_millis(at - 1)),
        }
    }
}

/// The timer of one HTTP/1 connection's request heads.
#[derive(Debug, Clone)]
pub struct HeadTimer {
    pub activity: Arc<Activity>,
    /// Longest wait for a request's first byte.
    pub idle: Duration,
    /// Longest time from a request's first byte to the end of its head.
    pub head: Duration,
}

impl Timer for HeadTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Sleep>> {
        Box::pin(PlainSleep(Box::pin(tokio::time::sleep(duration))))
    }

    /// Hyper asks for a head deadline when it starts waiting for a request.
    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn Sleep>> {
        self.activity.begin_wait();
        let began = Instant::now();
        Box::pin(HeadSleep {
            activity: self.activity.clone(),
            began,
            idle: self.idle,
            head: self.head,
            inner: Box::pin(tokio::time::sleep_until(
                deadline.min(began + self.head).into(),
            )),
        })
    }
}

/// Fires `idle` after `began`, or `head` after the first byte, whichever
/// the reader's activity makes due first.
struct HeadSleep {
    activity: Arc<Activity>,
    began: Instant,
    idle: Duration,
    head: Duration,
    inner: Pin<Box<tokio::time::Sleep>>,
}

impl HeadSleep {
    fn due(&self) -> Instant {
        match self.activity.first_read() {
            Some(first) => first + self.head,
            None => self.began + self.idle,
        }
    }
}

impl std::future::Future for HeadSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.activity.waker.register(cx.waker());
        // Bounded: each pass either fires or re-arms at a later instant.
        for _ in 0..4 {
            let due = self.due();
            if Instant::now() >= due {
                return Poll::Ready(());
            }
            if self.inner.deadline().into_std() != due {
                self.inner.as_mut().reset(due.into());
            }
            if self.inner.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
        Poll::Ready(())
    }
}

impl Sleep for HeadSleep {}

/// A plain sleep, for hyper's other timers.
struct PlainSleep(Pin<Box<tokio::time::Sleep>>);

impl std::future::Future for PlainSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.0.as_mut().poll(cx)
    }
}

impl Sleep for PlainSleep {}
