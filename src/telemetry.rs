//! Logging setup: text by default, JSON with `log.format: json`; the level
//! comes from `RUST_LOG` (default `info`).
//!
//! Lines are formatted on the request's thread and appended to one bounded
//! in-memory batch; a writer thread writes the batch to stderr at most every
//! [`BATCH_INTERVAL`]. A request never waits on a `write(2)` to a pipe or a
//! slow log collector, and it never wakes another thread either: only the
//! first line into an empty batch wakes the writer, so under load the log
//! costs one wake-up and one system call per interval, not per line.
//!
//! Why not `tracing-appender`'s non-blocking writer, which this replaced: its
//! channel wakes the writer thread for every line that finds it idle, and with
//! a line per request that is a futex wake, a context switch and a `write(2)`
//! per request. On the cached-hit benchmark (BENCHMARKS.md) that made the
//! access log cost 17-26 % of corral's throughput on two cores; batched on a
//! timer it is within the noise. The price is that a line reaches stderr up to
//! one interval late.
//!
//! The batch is bounded ([`MAX_BATCH_BYTES`]); lines beyond it are dropped
//! rather than slowing requests, and counted (`LogGuard::dropped_lines`, and
//! one line saying how many when the writer catches up). Dropping the guard
//! writes what is still batched, so the binary keeps it for its whole life and
//! exits through it (a SIGKILL loses at most the last interval's lines).

use std::{
    io::{self, Write},
    mem,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    thread::{self, JoinHandle},
    time::Duration,
};

use tracing_subscriber::{EnvFilter, fmt, fmt::MakeWriter};

use crate::config::LogFormat;

/// How long the writer lets lines gather after the first one of a batch.
pub const BATCH_INTERVAL: Duration = Duration::from_millis(10);

/// Bytes one batch may hold; about 8,000 access-log lines.
pub const MAX_BATCH_BYTES: usize = 1 << 20;

/// Keeps the log writer thread alive; dropping it writes what is batched.
#[must_use = "dropping the guard stops the log writer"]
pub struct LogGuard {
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
}

impl LogGuard {
    /// Lines dropped because the batch was full, since the start.
    pub fn dropped_lines(&self) -> usize {
        self.shared.dropped_total.load(Ordering::Relaxed)
    }
}

impl Drop for LogGuard {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        if let Some(writer) = self.writer.take() {
            writer.thread().unpark();
            let _ = writer.join();
        }
    }
}

/// Installs the global subscriber. Returns `None` when one is installed
/// already (a second init in tests keeps the first).
pub fn init(format: LogFormat) -> Option<LogGuard> {
    let (writer, guard) = batched(io::stderr());
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(ansi)
        .with_writer(writer);
    let installed = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    installed.ok().map(|()| guard)
}

/// A [`MakeWriter`] whose lines go into the shared batch.
#[derive(Clone)]
pub struct BatchWriter {
    shared: Arc<Shared>,
}

struct Shared {
    batch: Mutex<Vec<u8>>,
    /// Dropped since the writer last reported it.
    dropped: AtomicUsize,
    dropped_total: AtomicUsize,
    closed: AtomicBool,
    /// The writer thread, woken by the first line into an empty batch.
    writer: thread::Thread,
}

/// The writer side and its guard, writing batches into `sink`.
pub fn batched<W: Write + Send + 'static>(sink: W) -> (BatchWriter, LogGuard) {
    let (ready, thread_of) = std::sync::mpsc::sync_channel(1);
    let handle = thread::Builder::new()
        .name("corral-log".to_owned())
        .spawn(move || {
            let shared: Arc<Shared> = thread_of.recv().expect("the writer's state is sent");
            write_batches(&shared, sink);
        })
        .expect("the log writer thread starts");
    let shared = Arc::new(Shared {
        batch: Mutex::new(Vec::new()),
        dropped: AtomicUsize::new(0),
        dropped_total: AtomicUsize::new(0),
        closed: AtomicBool::new(false),
        writer: handle.thread().clone(),
    });
    ready
        .send(shared.clone())
        .expect("the writer thread waits for its state");
    (
        BatchWriter {
            shared: shared.clone(),
        },
        LogGuard {
            shared,
            writer: Some(handle),
        },
    )
}

/// The writer thread: sleeps until a batch begins, lets it gather for one
/// interval, then writes it whole; after the guard closed, writes the rest.
fn write_batches(shared: &Shared, mut sink: impl Write) {
    let mut out = Vec::new();
    loop {
        let closed = shared.closed.load(Ordering::Acquire);
        if !closed {
            thread::park();
            if !shared.closed.load(Ordering::Acquire) {
                thread::sleep(BATCH_INTERVAL);
            }
        }
        {
            let mut batch = shared.batch.lock().unwrap_or_else(PoisonError::into_inner);
            mem::swap(&mut *batch, &mut out);
        }
        let dropped = shared.dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            let _ = writeln!(
                out,
                "corral: {dropped} log lines were dropped: the log could not be written as fast as it was produced"
            );
        }
        if !out.is_empty() {
            // A failed write (a closed pipe) loses the batch, never blocks a request.
            let _ = sink.write_all(&out).and_then(|()| sink.flush());
            out.clear();
            if out.capacity() > MAX_BATCH_BYTES {
                out.shrink_to(MAX_BATCH_BYTES);
            }
        }
        if closed {
            return;
        }
    }
}

/// One event's line, appended to the batch in one piece.
pub struct BatchLine<'a> {
    shared: &'a Shared,
}

impl Write for BatchLine<'_> {
    fn write(&mut self, line: &[u8]) -> io::Result<usize> {
        let was_empty = {
            let mut batch = self
                .shared
                .batch
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if batch.len() + line.len() > MAX_BATCH_BYTES {
                drop(batch);
                self.shared.dropped.fetch_add(1, Ordering::Relaxed);
                self.shared.dropped_total.fetch_add(1, Ordering::Relaxed);
                return Ok(line.len());
            }
            let was_empty = batch.is_empty();
            batch.extend_from_slice(line);
            was_empty
        };
        if was_empty {
            self.shared.writer.unpark();
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for BatchWriter {
    type Writer = BatchLine<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        BatchLine {
            shared: &self.shared,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink the test can read after the writer thread is gone.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn every_line_is_written_in_order_by_the_time_the_guard_is_dropped() {
        let sink = Sink::default();
        let (writer, guard) = batched(sink.clone());
        let mut expected = String::new();
        for i in 0..1000 {
            let line = format!("line {i}\n");
            writer.make_writer().write_all(line.as_bytes()).unwrap();
            expected.push_str(&line);
        }
        drop(guard);
        assert_eq!(
            String::from_utf8(sink.0.lock().unwrap().clone()).unwrap(),
            expected
        );
    }

    /// A sink that blocks every write until the test opens it.
    #[derive(Clone, Default)]
    struct Gated {
        sink: Sink,
        open: Arc<(Mutex<bool>, std::sync::Condvar)>,
    }

    impl Gated {
        fn open(&self) {
            *self.open.0.lock().unwrap() = true;
            self.open.1.notify_all();
        }
    }

    impl Write for Gated {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            let (open, changed) = &*self.open;
            let _open = changed
                .wait_while(open.lock().unwrap(), |open| !*open)
                .unwrap();
            self.sink.write(bytes)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_beyond_the_bound_are_dropped_counted_and_reported_never_waited_for() {
        let gated = Gated::default();
        let (writer, guard) = batched(gated.clone());
        let mut line = vec![b'x'; 1023];
        line.push(b'\n');
        // The writer drains at most one batch before it blocks on the closed
        // sink, so a bounded number of lines fills the batch past its bound.
        let most = 3 * MAX_BATCH_BYTES / line.len();
        let mut sent = 0;
        while guard.dropped_lines() < 3 {
            assert!(sent < most, "the batch never filled");
            writer.make_writer().write_all(&line).unwrap();
            sent += 1;
        }
        let dropped = guard.dropped_lines();
        gated.open();
        drop(guard);
        let written = String::from_utf8(gated.sink.0.lock().unwrap().clone()).unwrap();
        let reported: usize = written
            .lines()
            .filter_map(|line| {
                line.strip_prefix("corral: ")?
                    .split(' ')
                    .next()?
                    .parse::<usize>()
                    .ok()
            })
            .sum();
        assert_eq!(reported, dropped, "every dropped line is reported");
        let kept = written.lines().filter(|line| line.starts_with('x')).count();
        assert_eq!(kept, sent - dropped, "only the dropped lines are missing");
    }
}
