//! The timer hyper's HTTP/1 server is given, one per connection, for the
//! header-read timeout.
//!
//! hyper asks its timer for a fresh sleep each time a connection starts
//! waiting for a request head and drops it once the head is read. With
//! `hyper_util`'s `TokioTimer` that is, per request, a boxed tokio `Sleep`
//! built from the runtime handle, put into tokio's timer wheel and taken out
//! again, under the driver's lock: on the cached-hit benchmark the request
//! that is served from memory spent about 6 % of its throughput there
//! (BENCHMARKS.md). Here each connection keeps one tokio `Sleep`, and the
//! sleeps hyper asks for only read it: one that is still set for an earlier
//! deadline (an earlier request's) wakes the connection early, once, and is
//! then moved to the deadline that counts. With requests arriving, a
//! connection touches the wheel about once per timeout, not twice per request.
//!
//! The deadline hyper asked for is kept exactly: a sleep never resolves before
//! it, and resolves when it has passed (the tokio sleep it waits on is never
//! set later than the earliest deadline a live sleep of the connection is
//! waiting for when it last polled).

use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use hyper::rt::{Sleep, Timer};

/// One per connection (see the module documentation).
#[derive(Clone, Default)]
pub struct ConnectionTimer {
    /// Made at the first sleep the connection is asked for; shared by every
    /// sleep after it. A sleep is only polled by its connection's task, so
    /// the lock is never contended.
    wheel_entry: Arc<Mutex<Option<Pin<Box<tokio::time::Sleep>>>>>,
}

impl Timer for ConnectionTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Sleep>> {
        self.sleep_until(self.now() + duration)
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn Sleep>> {
        Box::pin(HeadSleep {
            deadline: tokio::time::Instant::from_std(deadline),
            wheel_entry: self.wheel_entry.clone(),
        })
    }

    /// tokio's clock, so a test with a paused clock drives these sleeps too.
    fn now(&self) -> Instant {
        tokio::time::Instant::now().into_std()
    }
}

/// A deadline, waited for on the connection's shared tokio sleep.
struct HeadSleep {
    deadline: tokio::time::Instant,
    wheel_entry: Arc<Mutex<Option<Pin<Box<tokio::time::Sleep>>>>>,
}

impl Sleep for HeadSleep {}

impl Future for HeadSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // No clock read here: the tokio sleep knows whether its deadline has
        // passed, and it is never set later than this one.
        let deadline = self.deadline;
        let mut entry = self
            .wheel_entry
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let sleep = entry.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        // Set later than this deadline (none of hyper's, whose deadlines only
        // grow, but a sleep must not rely on that): bring it forward.
        if sleep.deadline() > deadline {
            sleep.as_mut().reset(deadline);
        }
        loop {
            match sleep.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                // Set for an earlier request's deadline, which has passed:
                // wait for this one (if it has passed too, the next poll says so).
                Poll::Ready(()) if sleep.deadline() < deadline => sleep.as_mut().reset(deadline),
                Poll::Ready(()) => return Poll::Ready(()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Polls `sleep` once, with a waker that counts its wake-ups.
    struct Probe {
        wakes: Arc<std::sync::atomic::AtomicUsize>,
        waker: std::task::Waker,
    }

    impl Probe {
        fn new() -> Self {
            struct Count(Arc<std::sync::atomic::AtomicUsize>);
            impl std::task::Wake for Count {
                fn wake(self: Arc<Self>) {
                    self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            }
            let wakes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let waker = std::task::Waker::from(Arc::new(Count(wakes.clone())));
            Self { wakes, waker }
        }

        fn poll(&self, sleep: &mut Pin<Box<dyn Sleep>>) -> Poll<()> {
            sleep.as_mut().poll(&mut Context::from_waker(&self.waker))
        }

        fn wakes(&self) -> usize {
            self.wakes.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_sleep_resolves_at_its_deadline_not_before() {
        let timer = ConnectionTimer::default();
        let probe = Probe::new();
        let mut sleep = timer.sleep(Duration::from_secs(10));
        assert!(probe.poll(&mut sleep).is_pending());
        tokio::time::advance(Duration::from_millis(9_999)).await;
        assert!(probe.poll(&mut sleep).is_pending());
        assert_eq!(probe.wakes(), 0);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(probe.wakes() > 0, "the connection is woken at the deadline");
        assert!(probe.poll(&mut sleep).is_ready());
    }

    #[tokio::test(start_paused = true)]
    async fn the_next_requests_sleep_waits_for_its_own_deadline() {
        let timer = ConnectionTimer::default();
        let probe = Probe::new();
        // One request's head: waited for 4 s, then read; its sleep is dropped.
        let mut first = timer.sleep(Duration::from_secs(10));
        assert!(probe.poll(&mut first).is_pending());
        tokio::time::advance(Duration::from_secs(4)).await;
        drop(first);
        // The next head's deadline is 14 s from the start.
        let mut second = timer.sleep(Duration::from_secs(10));
        assert!(probe.poll(&mut second).is_pending());
        // The shared sleep was set for the first deadline: at 10 s it wakes
        // the connection once, and the second sleep is still pending.
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(probe.wakes(), 1);
        assert!(probe.poll(&mut second).is_pending());
        tokio::time::advance(Duration::from_millis(3_999)).await;
        assert!(probe.poll(&mut second).is_pending());
        assert_eq!(probe.wakes(), 1, "no wake-up between the two deadlines");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(probe.wakes(), 2, "woken at the second deadline");
        assert!(probe.poll(&mut second).is_ready());
    }

    #[tokio::test(start_paused = true)]
    async fn an_earlier_deadline_brings_the_shared_sleep_forward() {
        let timer = ConnectionTimer::default();
        let probe = Probe::new();
        let mut long = timer.sleep(Duration::from_secs(30));
        assert!(probe.poll(&mut long).is_pending());
        let mut short = timer.sleep(Duration::from_secs(5));
        assert!(probe.poll(&mut short).is_pending());
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(probe.wakes(), 1);
        assert!(probe.poll(&mut short).is_ready());
        assert!(probe.poll(&mut long).is_pending(), "30 s have not passed");
        tokio::time::advance(Duration::from_secs(25)).await;
        assert_eq!(probe.wakes(), 2);
        assert!(probe.poll(&mut long).is_ready());
    }
}
