//! Holding streams before their first event: a reasoning model that thinks before it says
//! anything, for as long as a test needs, and no longer.
//!
//! A test that checks what a gateway does with a silent stream (its keep-alives) holds stream
//! starts, waits until [`MockProvider::streams_at_start`](super::MockProvider::streams_at_start)
//! counts the streams it sent (their response heads are out, their first events are not),
//! watches the silence, and releases them: an event to wait for, not a guess at a delay.

use std::time::Duration;

use super::Shared;

/// Whether stream starts are held, how many streams wait at theirs now, and a generation
/// bumped on every release (a stream that arrived in a hold waits for that hold to end).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct StreamStarts {
    pub(super) held: bool,
    pub(super) generation: u64,
    pub(super) waiting: usize,
}

impl Shared {
    pub(super) fn set_stream_starts_held(&self, held: bool) {
        self.stream_starts.send_modify(|state| {
            if state.held && !held {
                state.generation += 1;
            }
            state.held = held;
        });
    }

    pub(super) fn streams_at_start(&self) -> usize {
        self.stream_starts.borrow().waiting
    }

    /// Wait until at least `n` streams wait at their start, the timeout passes or the server
    /// stops; true if reached.
    pub(super) async fn wait_for_streams_at_start(&self, n: usize, timeout: Duration) -> bool {
        let mut starts = self.stream_starts.subscribe();
        tokio::select! {
            reached = tokio::time::timeout(timeout, starts.wait_for(|s| s.waiting >= n)) => {
                matches!(reached, Ok(Ok(_)))
            }
            () = self.stopping.cancelled() => self.streams_at_start() >= n,
        }
    }

    /// Called by a stream before its first event: returns at once unless stream starts are
    /// held, else when that hold is released (or the server stops).
    pub(super) async fn wait_at_stream_start(&self) {
        let mut generation = None;
        self.stream_starts.send_if_modified(|state| {
            if !state.held {
                return false;
            }
            generation = Some(state.generation);
            state.waiting += 1;
            true
        });
        let Some(generation) = generation else {
            return;
        };
        // Counted out however the wait ends, the client's disconnect included.
        let _waiting = WaitingAtStart { shared: self };
        let mut starts = self.stream_starts.subscribe();
        tokio::select! {
            _ = starts.wait_for(|state| !state.held || state.generation != generation) => {}
            () = self.stopping.cancelled() => {}
        }
    }
}

/// One stream counted in [`StreamStarts::waiting`] until dropped.
struct WaitingAtStart<'a> {
    shared: &'a Shared,
}

impl Drop for WaitingAtStart<'_> {
    fn drop(&mut self) {
        self.shared.stream_starts.send_modify(|state| {
            state.waiting = state.waiting.saturating_sub(1);
        });
    }
}
