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
//!
//! A new connection is waited on the same way ([`first_head_due`]): hyper's
//! timer only starts once bytes came (its protocol sniffing reads without
//! one), so the server arms `idle` from the accept and `head` from the
//! connection's first byte. A connection that has sent nothing yet is, to
//! its client, an idle one: pools open connections ahead of need (a
//! request that found another connection free leaves its new one unused),
//! and one closed at the head timeout is one a client may send its next
//! request on as it closes. Silent sockets are bounded by the connection
//! slots (the longest waiting goes first when they are full).

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
    /// The same for the connection's very first byte; never reset.
    first_ever: AtomicU64,
    /// The pending head timer, woken by the first byte.
    waker: AtomicWaker,
    /// The first head's timer, woken by the connection's first byte.
    first_waker: AtomicWaker,
}

impl Activity {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            base: Instant::now(),
            first_read: AtomicU64::new(0),
            first_ever: AtomicU64::new(0),
            waker: AtomicWaker::new(),
            first_waker: AtomicWaker::new(),
        })
    }

    /// Whether the connection ever sent a byte.
    pub fn has_read(&self) -> bool {
        self.first_ever.load(Ordering::Acquire) != 0
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
        // Only the first wait's first read can be the connection's first.
        if self
            .first_ever
            .compare_exchange(0, at, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.first_waker.wake();
        }
    }

    fn at(&self, millis: &AtomicU64) -> Option<Instant> {
        match millis.load(Ordering::Acquire) {
            0 => None,
            at => Some(self.base + Duration::from_millis(at - 1)),
        }
    }
}

/// Resolves when a new connection's first request head is late: `idle`
/// after its accept while it has sent nothing, `head` after its first
/// byte. (The caller stops waiting once that request reached the service.)
pub fn first_head_due(
    activity: Arc<Activity>,
    idle: Duration,
    head: Duration,
) -> impl std::future::Future<Output = ()> + Send {
    let began = activity.base;
    HeadSleep {
        // Re-armed at its first poll, at whichever is due.
        inner: Box::pin(tokio::time::sleep_until((began + head).into())),
        activity,
        watch: Watch::FirstEver,
        began,
        idle,
        head,
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
            watch: Watch::ThisWait,
            began,
            idle: self.idle,
            head: self.head,
            inner: Box::pin(tokio::time::sleep_until(
                deadline.min(began + self.head).into(),
            )),
        })
    }
}

/// Which first byte a [`HeadSleep`] watches.
#[derive(Debug, Clone, Copy)]
enum Watch {
    /// The first since the current wait for a request began.
    ThisWait,
    /// The connection's first.
    FirstEver,
}

/// Fires `idle` after `began`, or `head` after the first byte, whichever
/// the reader's activity makes due first.
struct HeadSleep {
    activity: Arc<Activity>,
    watch: Watch,
    began: Instant,
    idle: Duration,
    head: Duration,
    inner: Pin<Box<tokio::time::Sleep>>,
}

impl HeadSleep {
    fn due(&self) -> Instant {
        let first = match self.watch {
            Watch::ThisWait => &self.activity.first_read,
            Watch::FirstEver => &self.activity.first_ever,
        };
        match self.activity.at(first) {
            Some(first) => first + self.head,
            None => self.began + self.idle,
        }
    }
}

impl std::future::Future for HeadSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match self.watch {
            Watch::ThisWait => self.activity.waker.register(cx.waker()),
            Watch::FirstEver => self.activity.first_waker.register(cx.waker()),
        }
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
