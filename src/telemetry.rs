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
        Arc, Mutex, OnceLock, PoisonError,
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
        self.shared.dropped.load(Ordering::Relaxed)
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
    /// Lines dropped since the start; the writer reports what is new.
    dropped: AtomicUsize,
    closed: AtomicBool,
    /// The writer thread, woken by the first line into an empty batch.
    writer: OnceLock<thread::Thread>,
}

/// The writer side and its guard, writing batches into `sink`.
pub fn batched<W: Write + Send + 'static>(sink: W) -> (BatchWriter, LogGuard) {
    let shared = Arc::new(Shared {
        batch: Mutex::new(Vec::new()),
        dropped: AtomicUsize::new(0),
        closed: AtomicBool::new(false),
        writer: OnceLock::new(),
    });
    let handle = thread::Builder::new()
        .name("corral-log".to_owned())
        .spawn({
            let shared = shared.clone();
            move || write_batches(&shared, sink)
        })
        .expect("the log writer thread starts");
    // Lines logged before this is set wake nobody; the writer finds them
    // anyway, because it looks at the batch before it parks.
    let _ = shared.writer.set(handle.thread().clone());
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
///
/// It parks only while the batch is empty: a wake-up token can be lost (one
/// that arrives before the thread first parks, or one a spurious return used
/// up), and a line that found the batch empty must not wait for the next.
fn write_batches(shared: &Shared, mut sink: impl Write) {
    let mut out = Vec::new();
    let mut reported_drops = 0;
    loop {
        let closed = shared.closed.load(Ordering::Acquire);
        if !closed {
            let idle = shared
                .batch
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_empty();
            if idle {
                thread::park();
            }
            if !shared.closed.load(Ordering::Acquire) {
                thread::sleep(BATCH_INTERVAL);
            }
        }
        {
            let mut batch = shared.batch.lock().unwrap_or_else(PoisonError::into_inner);
            mem::swap(&mut *batch, &mut out);
        }
        let dropped_total = shared.dropped.load(Ordering::Relaxed);
        let dropped = dropped_total - reported_drops;
        reported_drops = dropped_total;
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
                return Ok(line.len());
            }
            let was_empty = batch.is_empty();
            batch.extend_from_slice(line);
            was_empty
        };
        if was_empty && let Some(writer) = self.shared.writer.get() {
            writer.unpark();
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

    /// A sink the test can read, and wait on until it holds some text.
    #[derive(Clone, Default)]
    struct Sink(Arc<(Mutex<Vec<u8>>, std::sync::Condvar)>);

    impl Sink {
        fn text(&self) -> String {
            String::from_utf8(self.0.0.lock().unwrap().clone()).unwrap()
        }

        /// Waits (bounded: 10 s, far above one batch interval) until the
        /// written text contains `needle`; whether it did.
        fn wait_for(&self, needle: &str) -> bool {
            let (written, changed) = &*self.0;
            let (_written, timeout) = changed
                .wait_timeout_while(
                    written.lock().unwrap(),
                    Duration::from_secs(10),
                    |written| !String::from_utf8_lossy(written).contains(needle),
                )
                .unwrap();
            !timeout.timed_out()
        }
    }

    impl Write for Sink {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0.0.lock().unwrap().extend_from_slice(bytes);
            self.0.1.notify_all();
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
        assert_eq!(sink.text(), expected);
    }

    #[test]
    fn a_line_is_written_without_waiting_for_the_guard() {
        let sink = Sink::default();
        let (writer, guard) = batched(sink.clone());
        writer.make_writer().write_all(b"first\n").unwrap();
        assert!(
            sink.wait_for("first\n"),
            "the first batch is written while the guard lives"
        );
        writer.make_writer().write_all(b"second\n").unwrap();
        assert!(sink.wait_for("second\n"), "so is a later one");
        drop(guard);
        assert_eq!(sink.text(), "first\nsecond\n");
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
        let written = gated.sink.text();
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
