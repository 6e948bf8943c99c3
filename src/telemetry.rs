//! Logging setup: text by default, JSON with `log.format: json`; the level
//! comes from `RUST_LOG` (default `info`).
//!
//! Lines are formatted on the request's thread but written by a background
//! thread (`tracing-appender`'s non-blocking writer) into a buffered stderr
//! that is flushed whenever the queue runs empty: a request never waits on a
//! `write(2)` to a pipe or a slow log collector, and a burst of access-log
//! lines costs one system call per batch instead of one per line. The queue is
//! bounded (128k lines); beyond it lines are dropped rather than slowing
//! requests (`LogGuard::dropped_lines` counts them). Lines still queued are
//! written when the guard is dropped, so the binary keeps it for its whole
//! life and exits through it (a SIGKILL loses at most the last queued lines).

use std::io::{BufWriter, Stderr};

use tracing_appender::non_blocking::{ErrorCounter, NonBlocking, WorkerGuard};
use tracing_subscriber::{EnvFilter, fmt};

use crate::config::LogFormat;

/// Bytes gathered before a write to stderr when lines arrive faster than the
/// writer thread drains them.
const WRITE_BUFFER_BYTES: usize = 64 * 1024;

/// Keeps the log writer thread alive; dropping it writes what is queued.
#[must_use = "dropping the guard stops the log writer"]
pub struct LogGuard {
    _worker: WorkerGuard,
    dropped: ErrorCounter,
}

impl LogGuard {
    /// Lines dropped because the queue was full.
    pub fn dropped_lines(&self) -> usize {
        self.dropped.dropped_lines()
    }
}

/// Installs the global subscriber. Returns `None` when one is installed
/// already (a second init in tests keeps the first).
pub fn init(format: LogFormat) -> Option<LogGuard> {
    let (writer, worker): (NonBlocking, WorkerGuard) = tracing_appender::non_blocking(
        BufWriter::<Stderr>::with_capacity(WRITE_BUFFER_BYTES, std::io::stderr()),
    );
    let dropped = writer.error_counter();
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
    installed.ok().map(|()| LogGuard {
        _worker: worker,
        dropped,
    })
}
