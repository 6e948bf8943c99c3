//! Logging setup: text by default, JSON with `log.format: json`; the level
//! comes from `RUST_LOG` (default `info`).
//!
//! Lines are formatted on the request's thread, straight into that thread's
//! own bounded in-memory batch; a writer thread writes the batches to stderr
//! at most every [`BATCH_INTERVAL`]. A request never waits on a `write(2)` to
//! a pipe or a slow log collector, it never waits on another thread's lock
//! (one shared batch made the two worker threads take turns, and its cache
//! lines travel between cores with every line), and it never wakes another
//! thread either: only the first line into an empty batch wakes the writer,
//! so under load the log costs a wake-up and a system call per thread and
//! interval, not per line. Lines of one thread keep their order; lines of
//! two threads written in the same interval may not (each carries its time).
//!
//! Why not `tracing-appender`'s non-blocking writer, which this replaced: its
//! channel wakes the writer thread for every line that finds it idle, and with
//! a line per request that is a futex wake, a context switch and a `write(2)`
//! per request. On the cached-hit benchmark (BENCHMARKS.md) that made the
//! access log cost 17-26 % of corral's throughput on two cores; batched on a
//! timer it is within the noise. The price is that a line reaches stderr up to
//! one interval late.
//!
//! Each batch is bounded ([`MAX_BATCH_BYTES`]), and so is their number
//! ([`MAX_BATCHES`]: threads beyond it share); lines beyond it are dropped
//! rather than slowing requests, and counted (`LogGuard::dropped_lines`, and
//! one line saying how many when the writer catches up). Dropping the guard
//! writes what is still batched, so the binary keeps it for its whole life and
//! exits through it (a SIGKILL loses at most the last interval's lines).

use std::{
    io::{self, Write},
    sync::{
        Arc, Mutex, OnceLock, PoisonError,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    thread::{self, JoinHandle},
    time::Duration,
};

use tracing_subscriber::{
    EnvFilter, Layer, Registry, filter::Targets, fmt, fmt::MakeWriter, layer::SubscriberExt as _,
    util::SubscriberInitExt as _,
};

use crate::config::LogFormat;

mod fields;

pub use fields::PlainFields;

/// How long the writer lets lines gather after the first one of a batch.
pub const BATCH_INTERVAL: Duration = Duration::from_millis(10);

/// Bytes one thread's batch may hold; about 2,000 access-log lines, in one
/// interval: 200,000 lines a second from one thread.
pub const MAX_BATCH_BYTES: usize = 256 << 10;

/// Batches at most, so the log holds at most 4 MiB; threads beyond these
/// (tokio's blocking pool can have hundreds) share one of them.
pub const MAX_BATCHES: usize = 16;

/// Keeps the log writer thread alive; dropping it writes what is batched.
#[must_use = "dropping the guard stops the log writer"]
pub struct LogGuard {
    shared: Arc<Batches>,
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
    let access = AccessLog {
        writer: writer.clone(),
        format,
    };
    let levels = Levels::of(std::env::var("RUST_LOG").ok().as_deref()).into_layer();
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let lines = fmt::layer()
        .with_target(false)
        .with_ansi(ansi)
        .with_writer(writer);
    let subscriber = tracing_subscriber::registry().with(levels);
    let installed = match format {
        LogFormat::Text => subscriber.with(lines.fmt_fields(PlainFields)).try_init(),
        LogFormat::Json => subscriber.with(lines.json().flatten_event(true)).try_init(),
    };
    let guard = installed.ok().map(|()| guard)?;
    let _ = ACCESS_LOG.set(access);
    Some(guard)
}

/// Which lines `RUST_LOG` lets through (`info` when it is unset or not a
/// filter).
#[derive(Debug)]
enum Levels {
    /// Targets and levels only (`info`, `corral=debug,hyper=warn`): decided
    /// once per call site.
    Static(Box<Targets>),
    /// A directive on spans or fields (`[request]=debug`), which `EnvFilter`
    /// alone reads. It also looks every span up on each enter and exit (a
    /// lock and a map lookup per poll of every instrumented future, a visible
    /// part of a miss's CPU: BENCHMARKS.md, issue 41), so it is used only
    /// when the directives need it.
    Dynamic(Box<EnvFilter>),
}

impl Levels {
    fn of(directives: Option<&str>) -> Self {
        let Some(directives) = directives else {
            return Self::Static(Box::new(Targets::new().with_default(tracing::Level::INFO)));
        };
        let Ok(filter) = EnvFilter::try_new(directives) else {
            return Self::Dynamic(Box::new(EnvFilter::new("info")));
        };
        // `Targets` would read a span directive's brackets as part of a
        // target; an empty filter stays `EnvFilter`'s to read, as before.
        match directives.contains('[') || directives.trim().is_empty() {
            false => directives
                .parse::<Targets>()
                .map_or(Self::Dynamic(Box::new(filter)), |targets| {
                    Self::Static(Box::new(targets))
                }),
            true => Self::Dynamic(Box::new(filter)),
        }
    }

    fn into_layer(self) -> Box<dyn Layer<Registry> + Send + Sync> {
        match self {
            Self::Static(targets) => targets,
            Self::Dynamic(filter) => filter,
        }
    }
}

/// The access log, once `init` installed the subscriber; `None` before (a
/// library user's own subscriber, tests), where the line goes through
/// `tracing` instead.
pub fn access_log() -> Option<&'static AccessLog> {
    ACCESS_LOG.get()
}

static ACCESS_LOG: OnceLock<AccessLog> = OnceLock::new();

/// One line per request, formatted here and appended to the log's batch.
///
/// Why not a `tracing` event like every other line: the fmt layer formats
/// each field through `Debug`/`Display` visitors, the span's fields and an
/// ANSI-aware timestamp, which made the line cost about as much CPU as a
/// cached hit's own work (BENCHMARKS.md, "The hit path near the bare hop").
/// The line has the layout the fmt layer gives every other line (text: the
/// `request` span's fields, then the event's; JSON: `span` and `spans` as
/// the JSON formatter writes them), so one parser reads both.
#[derive(Clone)]
pub struct AccessLog {
    writer: BatchWriter,
    format: LogFormat,
}

/// The longest text a log field, span field or trace attribute takes from a
/// request (its path, its model): a caller's 64 KiB path or 7 MB `model`,
/// in every line and in every span an export queue holds, would otherwise
/// cost far more than the request did. Real paths and model names are short.
pub const LONGEST_FIELD: usize = 256;

/// `text` cut to [`LONGEST_FIELD`] bytes on a character boundary (borrowed:
/// a real path is never copied for it).
pub fn clipped(text: &str) -> &str {
    let mut end = text.len().min(LONGEST_FIELD);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// What one access-log line says.
#[derive(Debug, Clone, Copy)]
pub struct AccessLine<'a> {
    pub request_id: &'a str,
    pub method: &'a str,
    pub path: &'a str,
    pub status: u16,
    pub cache: &'a str,
    pub fingerprint: &'a str,
    pub latency: Duration,
}

impl AccessLog {
    /// Formats the line straight into this thread's batch.
    pub fn write(&self, line: &AccessLine<'_>) {
        self.writer.shared.append(|batch| match self.format {
            LogFormat::Text => text_line(batch, line),
            LogFormat::Json => json_line(batch, line),
        });
    }
}

/// Milliseconds with three decimals, from whole microseconds (no float formatting).
fn write_latency_ms(out: &mut Vec<u8>, latency: Duration) {
    let micros = latency.as_micros();
    let mut digits = itoa::Buffer::new();
    out.extend_from_slice(digits.format(micros / 1000).as_bytes());
    out.push(b'.');
    let fraction = (micros % 1000) as u16;
    out.extend_from_slice(&[
        b'0' + (fraction / 100) as u8,
        b'0' + (fraction / 10 % 10) as u8,
        b'0' + (fraction % 10) as u8,
    ]);
}

/// RFC 3339 UTC with microseconds, as the fmt layer writes it. The part up
/// to the second is formatted once a second per thread, not once a line.
fn timestamp(out: &mut Vec<u8>) {
    thread_local! {
        static SECOND: std::cell::Cell<(u64, [u8; 19])> = const { std::cell::Cell::new((u64::MAX, [0; 19])) };
    }
    let now = std::time::SystemTime::now();
    let since_epoch = now
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let second = since_epoch.as_secs();
    let (cached, mut prefix) = SECOND.get();
    if cached != second {
        let mut text = Vec::with_capacity(32);
        let _ = write!(text, "{}", humantime::format_rfc3339_seconds(now));
        // `2026-12-03T18:33:55Z`: the 19 bytes before the `Z`.
        if let Some(head) = text.get(..19) {
            prefix.copy_from_slice(head);
        }
        SECOND.set((second, prefix));
    }
    out.extend_from_slice(&prefix);
    out.push(b'.');
    let micros = since_epoch.subsec_micros();
    let mut digits = [b'0'; 6];
    let mut rest = micros;
    for digit in digits.iter_mut().rev() {
        *digit = b'0' + (rest % 10) as u8;
        rest /= 10;
    }
    out.extend_from_slice(&digits);
    out.push(b'Z');
}

fn text_line(out: &mut Vec<u8>, line: &AccessLine<'_>) {
    timestamp(out);
    out.extend_from_slice(b"  INFO request{request_id=");
    out.extend_from_slice(line.request_id.as_bytes());
    out.extend_from_slice(b" method=");
    out.extend_from_slice(line.method.as_bytes());
    out.extend_from_slice(b" path=");
    out.extend_from_slice(line.path.as_bytes());
    out.extend_from_slice(b"}: request status=");
    out.extend_from_slice(itoa::Buffer::new().format(line.status).as_bytes());
    out.extend_from_slice(b" cache=\"");
    out.extend_from_slice(line.cache.as_bytes());
    out.extend_from_slice(b"\" fingerprint=\"");
    out.extend_from_slice(line.fingerprint.as_bytes());
    out.extend_from_slice(b"\" latency_ms=");
    write_latency_ms(out, line.latency);
    out.push(b'\n');
}

fn json_line(out: &mut Vec<u8>, line: &AccessLine<'_>) {
    let string = |out: &mut Vec<u8>, text: &str| {
        let _ = serde_json::to_writer(&mut *out, text);
    };
    let fields = |out: &mut Vec<u8>, pairs: &[(&str, &str)]| {
        for (name, value) in pairs {
            out.push(b',');
            string(out, name);
            out.push(b':');
            string(out, value);
        }
    };
    out.extend_from_slice(b"{\"timestamp\":\"");
    timestamp(out);
    out.extend_from_slice(b"\",\"level\":\"INFO\",\"message\":\"request\",\"status\":");
    out.extend_from_slice(itoa::Buffer::new().format(line.status).as_bytes());
    fields(
        out,
        &[("cache", line.cache), ("fingerprint", line.fingerprint)],
    );
    out.extend_from_slice(b",\"latency_ms\":");
    write_latency_ms(out, line.latency);
    const SPAN: &[u8] = b",\"span\":";
    let span_at = out.len() + SPAN.len();
    out.extend_from_slice(SPAN);
    out.extend_from_slice(b"{\"name\":\"request\"");
    fields(
        out,
        &[
            ("method", line.method),
            ("path", line.path),
            ("request_id", line.request_id),
        ],
    );
    out.push(b'}');
    // `spans`: the same object, as the only entry of the span list.
    let span = out[span_at..].to_vec();
    out.extend_from_slice(b",\"spans\":[");
    out.extend_from_slice(&span);
    out.extend_from_slice(b"]}\n");
}

/// A [`MakeWriter`] whose lines go into the shared batch.
#[derive(Clone)]
pub struct BatchWriter {
    shared: Arc<Batches>,
}

struct Batches {
    /// One per thread that logged, up to [`MAX_BATCHES`].
    batches: Mutex<Vec<Arc<Batch>>>,
    /// Threads that have asked for a batch, to spread the ones beyond
    /// [`MAX_BATCHES`] over the batches there are.
    threads_joined: AtomicUsize,
    /// Lines dropped since the start; the writer reports what is new.
    dropped: AtomicUsize,
    closed: AtomicBool,
    /// The writer thread, woken by the first line into an empty batch.
    writer: OnceLock<thread::Thread>,
}

/// One thread's lines since the writer last took them. Locked by its thread
/// for each line and by the writer once an interval, so the lock is all but
/// never contended.
#[derive(Default)]
struct Batch {
    lines: Mutex<Vec<u8>>,
}

impl Batch {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        self.lines.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

thread_local! {
    /// This thread's batch of each log it wrote to (the process has one; tests
    /// make more). The `Weak` keeps the log's address from being reused while
    /// the entry lives, so the address names the log.
    static BATCHES: std::cell::RefCell<Vec<(std::sync::Weak<Batches>, Arc<Batch>)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

impl Batches {
    /// Appends what `format` writes to this thread's batch, in one piece, or
    /// drops it (counted) if the batch would outgrow its bound.
    fn append(self: &Arc<Self>, format: impl FnOnce(&mut Vec<u8>)) {
        // The batch is used where the thread keeps it, not cloned out: a line
        // costs no reference count. `format` only writes bytes (it logs
        // nothing), so the thread-local is not borrowed twice.
        let was_empty = BATCHES.with_borrow_mut(|mine| {
            let at = match mine
                .iter()
                .position(|(log, _)| std::ptr::eq(log.as_ptr(), Arc::as_ptr(self)))
            {
                Some(at) => at,
                None => {
                    mine.retain(|(log, _)| log.strong_count() > 0);
                    mine.push((Arc::downgrade(self), self.batch_for_new_thread()));
                    mine.len() - 1
                }
            };
            let mut lines = mine[at].1.lock();
            let start = lines.len();
            format(&mut lines);
            if lines.len() > MAX_BATCH_BYTES {
                lines.truncate(start);
                self.dropped.fetch_add(1, Ordering::Relaxed);
                return false;
            }
            start == 0
        });
        if was_empty && let Some(writer) = self.writer.get() {
            writer.unpark();
        }
    }

    /// A batch of its own for a thread, or, with [`MAX_BATCHES`] made, one
    /// to share.
    fn batch_for_new_thread(&self) -> Arc<Batch> {
        let mut batches = self.batches.lock().unwrap_or_else(PoisonError::into_inner);
        let joined = self.threads_joined.fetch_add(1, Ordering::Relaxed);
        if batches.len() >= MAX_BATCHES {
            return batches[joined % batches.len()].clone();
        }
        let batch = Arc::new(Batch::default());
        batches.push(batch.clone());
        batch
    }

    fn all_empty(&self) -> bool {
        let batches = self.batches.lock().unwrap_or_else(PoisonError::into_inner);
        batches.iter().all(|batch| batch.lock().is_empty())
    }

    /// Moves every batch's lines to the end of `out` (each batch is locked
    /// only to swap its lines with `spare`), and lets go of the batches of
    /// threads that have ended.
    fn take_all(&self, out: &mut Vec<u8>, spare: &mut Vec<u8>) {
        let mut batches = self.batches.lock().unwrap_or_else(PoisonError::into_inner);
        for batch in batches.iter() {
            std::mem::swap(&mut *batch.lock(), spare);
            out.extend_from_slice(spare);
            spare.clear();
            if spare.capacity() > MAX_BATCH_BYTES {
                spare.shrink_to(MAX_BATCH_BYTES);
            }
        }
        // Held by no thread and empty (just taken): its thread has ended.
        batches.retain(|batch| Arc::strong_count(batch) > 1);
    }
}

/// The writer side and its guard, writing batches into `sink`.
pub fn batched<W: Write + Send + 'static>(sink: W) -> (BatchWriter, LogGuard) {
    let shared = Arc::new(Batches {
        batches: Mutex::new(Vec::new()),
        threads_joined: AtomicUsize::new(0),
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
fn write_batches(shared: &Batches, mut sink: impl Write) {
    let mut out = Vec::new();
    let mut spare = Vec::new();
    let mut reported_drops = 0;
    loop {
        let closed = shared.closed.load(Ordering::Acquire);
        if !closed {
            if shared.all_empty() {
                thread::park();
            }
            if !shared.closed.load(Ordering::Acquire) {
                thread::sleep(BATCH_INTERVAL);
            }
        }
        shared.take_all(&mut out, &mut spare);
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
            if out.capacity() > MAX_BATCHES * MAX_BATCH_BYTES {
                out.shrink_to(MAX_BATCH_BYTES);
            }
        }
        if closed {
            return;
        }
    }
}

/// One event's line, appended to this thread's batch in one piece.
pub struct BatchLine<'a> {
    shared: &'a Arc<Batches>,
}

impl Write for BatchLine<'_> {
    fn write(&mut self, line: &[u8]) -> io::Result<usize> {
        self.shared.append(|batch| batch.extend_from_slice(line));
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
    use tracing::Level;

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
    fn lines_of_many_threads_are_all_written_each_threads_in_order() {
        let sink = Sink::default();
        let (writer, guard) = batched(sink.clone());
        let threads = MAX_BATCHES + 4;
        std::thread::scope(|scope| {
            for thread in 0..threads {
                let writer = writer.clone();
                scope.spawn(move || {
                    for i in 0..200 {
                        let line = format!("thread {thread} line {i}\n");
                        writer.make_writer().write_all(line.as_bytes()).unwrap();
                    }
                });
            }
        });
        let batches = writer.shared.batches.lock().unwrap().len();
        assert!(batches <= MAX_BATCHES, "{batches} batches");
        drop(guard);
        let text = sink.text();
        for thread in 0..threads {
            let prefix = format!("thread {thread} line ");
            let seen: Vec<usize> = text
                .lines()
                .filter_map(|line| line.strip_prefix(&prefix)?.parse().ok())
                .collect();
            assert_eq!(seen, (0..200).collect::<Vec<_>>(), "thread {thread}");
        }
    }

    #[test]
    fn the_batches_of_ended_threads_are_let_go() {
        let sink = Sink::default();
        let (writer, guard) = batched(sink.clone());
        for thread in 0..3 {
            let writer = writer.clone();
            std::thread::spawn(move || {
                let line = format!("thread {thread}\n");
                writer.make_writer().write_all(line.as_bytes()).unwrap();
            })
            .join()
            .unwrap();
        }
        // The writer may have taken some lines already; take the rest here.
        let (mut out, mut spare) = (Vec::new(), Vec::new());
        writer.shared.take_all(&mut out, &mut spare);
        assert_eq!(writer.shared.batches.lock().unwrap().len(), 0);
        drop(guard);
        let text = sink.text() + std::str::from_utf8(&out).unwrap();
        for thread in 0..3 {
            assert!(text.contains(&format!("thread {thread}\n")), "{text}");
        }
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

    fn line() -> AccessLine<'static> {
        AccessLine {
            request_id: "req-\"7\"",
            method: "POST",
            path: "/v1/chat/completions",
            status: 200,
            cache: "HIT",
            fingerprint: "0123456789ab",
            latency: Duration::from_micros(1_234_567),
        }
    }

    #[test]
    fn a_text_access_line_reads_as_the_fmt_layers_lines_do() {
        let mut out = Vec::new();
        text_line(&mut out, &line());
        let text = String::from_utf8(out).unwrap();
        let (stamp, rest) = text.split_once("  ").unwrap();
        assert!(
            humantime::parse_rfc3339(stamp).is_ok() && stamp.len() == 27,
            "{stamp}"
        );
        assert_eq!(
            rest,
            "INFO request{request_id=req-\"7\" method=POST path=/v1/chat/completions}: \
             request status=200 cache=\"HIT\" fingerprint=\"0123456789ab\" latency_ms=1234.567\n"
        );
    }

    #[test]
    fn a_json_access_line_is_one_object_with_its_span() {
        let mut out = Vec::new();
        json_line(&mut out, &line());
        assert_eq!(out.last(), Some(&b'\n'));
        let value: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(value["level"], "INFO");
        assert_eq!(value["message"], "request");
        assert_eq!(value["status"], 200);
        assert_eq!(value["cache"], "HIT");
        assert_eq!(value["latency_ms"], 1234.567);
        assert_eq!(value["span"]["request_id"], "req-\"7\"");
        assert_eq!(value["span"]["path"], "/v1/chat/completions");
        assert_eq!(value["spans"][0], value["span"]);
        assert!(humantime::parse_rfc3339(value["timestamp"].as_str().unwrap()).is_ok());
    }

    #[test]
    fn latency_keeps_three_decimals_of_a_millisecond() {
        for (micros, text) in [
            (0, "0.000"),
            (7, "0.007"),
            (1_000, "1.000"),
            (61_050, "61.050"),
        ] {
            let mut out = Vec::new();
            write_latency_ms(&mut out, Duration::from_micros(micros));
            assert_eq!(String::from_utf8(out).unwrap(), text);
        }
    }

    /// Targets and levels get the filter that decides once per call site,
    /// with `EnvFilter`'s meaning; span directives and bad filters keep
    /// `EnvFilter` (the latter at `info`, as before).
    #[test]
    fn rust_log_picks_the_filter_its_directives_need() {
        let enables =
            |directives: Option<&str>, target: &str, level: Level| match Levels::of(directives) {
                Levels::Static(targets) => targets.would_enable(target, &level),
                Levels::Dynamic(filter) => panic!("{directives:?} needs no EnvFilter: {filter}"),
            };
        assert!(enables(None, "corral::dedup", Level::INFO));
        assert!(!enables(None, "corral::dedup", Level::DEBUG));
        assert!(enables(
            Some("info,corral=debug"),
            "corral::dedup",
            Level::DEBUG
        ));
        assert!(!enables(
            Some("info,corral=debug"),
            "hyper::proto",
            Level::DEBUG
        ));
        assert!(enables(Some("warn"), "corral", Level::WARN));
        assert!(!enables(Some("warn"), "corral", Level::INFO));
        assert!(!enables(Some("corral=debug"), "hyper", Level::ERROR));
        for dynamic in [
            "[request]=debug",
            "corral[request{path}]=debug",
            "",
            "not=a=filter",
        ] {
            assert!(
                matches!(Levels::of(Some(dynamic)), Levels::Dynamic(_)),
                "{dynamic:?}"
            );
        }
    }
}
