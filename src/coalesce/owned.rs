//! A buffered owner's flight, run on the owner's own task.
//!
//! Why not a task of its own from the start: a miss is most of the traffic,
//! and a spawned flight costs every one of them a task (its allocation and
//! scheduling), the owner's registration on the flight's outcome, and the
//! wake-up that outcome sends it, which on an idle runtime is another
//! worker's unpark (a futex call, and the answer's last steps on the other
//! core): `perf` saw one such wake per miss (BENCHMARKS.md, issue 41).
//!
//! What a spawned flight promised still holds: the upstream call and the
//! cache write finish even when the owner's client goes away or the owner
//! stops waiting. Dropped before it ended, an [`OwnedFlight`] hands what is
//! left of the flight to a task of its own, which finishes it for the
//! followers and the cache. A panic inside the flight ends only the flight,
//! as it would end only its task: its guard drops, and its waiters (the
//! owner included) see it abandoned and elect a new owner.
//!
//! A streamed flight is always spawned: its owner reads the live log while
//! the flight writes it.

use std::{
    future::Future,
    panic::AssertUnwindSafe,
    pin::Pin,
    task::{Context, Poll},
};

use tokio_util::task::TaskTracker;

use super::flight::{Waited, WaiterTicket};

/// A flight's whole future, boxed once so it can move to a task of its own.
pub(super) type FlightFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// See the module documentation.
pub(super) struct OwnedFlight {
    /// `None` once it ended (or panicked).
    flight: Option<FlightFuture>,
    /// Where what is left goes when the owner lets go: the gateway's tasks,
    /// which a graceful shutdown drains.
    tasks: TaskTracker,
}

impl OwnedFlight {
    pub(super) fn new(flight: FlightFuture, tasks: TaskTracker) -> Self {
        Self {
            flight: Some(flight),
            tasks,
        }
    }

    /// Runs the flight on this task until it ends or `deadline` passes, then
    /// reads its outcome from `ticket` (at once: the flight has published
    /// it, or dropped its guard). The ticket is not polled while the flight
    /// runs here: the flight's outcome would otherwise wake this very task.
    pub(super) async fn run_until(
        &mut self,
        deadline: tokio::time::Instant,
        ticket: &WaiterTicket,
    ) -> Waited {
        match tokio::time::timeout_at(deadline, &mut *self).await {
            Ok(()) => ticket.wait_for(deadline, false).await,
            Err(_elapsed) => Waited::TimedOut,
        }
    }
}

impl Future for OwnedFlight {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(flight) = self.flight.as_mut() else {
            return Poll::Ready(());
        };
        // A task would catch the flight's panic; here the owner's request
        // must not be the one it ends.
        match std::panic::catch_unwind(AssertUnwindSafe(|| flight.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(())) | Err(_) => {
                // Ended, or panicked: dropping it drops its guard, so its
                // waiters see the outcome or an abandoned flight.
                self.flight = None;
                Poll::Ready(())
            }
        }
    }
}

impl Drop for OwnedFlight {
    fn drop(&mut self) {
        // The owner let go before the flight ended: it finishes on its own.
        // Outside a runtime (it is shutting down) there is nothing to run it.
        if let Some(flight) = self.flight.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            self.tasks.spawn_on(flight, &runtime);
        }
    }
}
