//! Child services of the suite (mock, corral, baseline, redis-server, a peer):
//! started on port 0 where the program allows it, ready when their own ready
//! line says so (never after a sleep), logged to a file, and killed when the
//! handle is dropped.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use anyhow::{Context as _, bail};
use tokio::{
    io::{AsyncBufReadExt as _, AsyncRead, BufReader},
    process::{Child, Command},
    sync::mpsc,
};

/// A running child process.
pub struct Service {
    pub name: String,
    /// What the ready matcher extracted from the ready line (usually a URL).
    pub ready: String,
    pub log: PathBuf,
    child: Child,
}

impl Service {
    /// Spawns `command`, copies its stdout and stderr to `log`, and waits up
    /// to `deadline` for a line on which `ready` returns `Some`.
    pub async fn spawn(
        name: &str,
        mut command: Command,
        log: &Path,
        deadline: Duration,
        ready: impl Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Self> {
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command
            .spawn()
            .with_context(|| format!("starting {name} ({command:?})"))?;
        let file =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let file = Arc::new(Mutex::new(file));
        let (lines_tx, mut lines) = mpsc::unbounded_channel();
        if let Some(stdout) = child.stdout.take() {
            tokio::spawn(copy_lines(stdout, file.clone(), lines_tx.clone()));
        }
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(copy_lines(stderr, file.clone(), lines_tx));
        }
        let found = tokio::time::timeout(deadline, async {
            while let Some(line) = lines.recv().await {
                if let Some(found) = ready(&line) {
                    return Some(found);
                }
            }
            None
        })
        .await;
        match found {
            Ok(Some(ready)) => Ok(Self {
                name: name.to_owned(),
                ready,
                log: log.to_owned(),
                child,
            }),
            Ok(None) => {
                let status = child.wait().await.ok();
                bail!(
                    "{name} exited before it was ready ({}); see {}",
                    status.map_or("unknown status".into(), |s| s.to_string()),
                    log.display()
                )
            }
            Err(_) => bail!(
                "{name} printed no ready line within {deadline:?}; see {}",
                log.display()
            ),
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Stops the process (SIGKILL) and reaps it.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// Copies every line to the log; forwards lines until nobody listens.
async fn copy_lines(
    stream: impl AsyncRead + Unpin,
    file: Arc<Mutex<std::fs::File>>,
    lines_tx: mpsc::UnboundedSender<String>,
) {
    use std::io::Write as _;
    let mut lines = BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        {
            let mut file = file.lock().unwrap_or_else(PoisonError::into_inner);
            let _ = writeln!(file, "{line}");
        }
        let _ = lines_tx.send(line);
    }
}

/// The URL after `prefix` on a line such as `corral listening on http://…`.
pub fn url_after(prefix: &'static str) -> impl Fn(&str) -> Option<String> {
    move |line: &str| {
        let rest = line.split_once(prefix)?.1.trim();
        let url = rest.split_whitespace().next()?;
        url.starts_with("http://").then(|| url.to_owned())
    }
}

/// A port nothing listens on right now, for programs that cannot bind port 0
/// and report it (redis-server, uvicorn). Racy in principle; callers retry.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_lines_yield_their_url() {
        let corral = url_after("corral listening on ");
        assert_eq!(
            corral("corral listening on http://127.0.0.1:4000").as_deref(),
            Some("http://127.0.0.1:4000")
        );
        assert_eq!(corral("2026 INFO corral listening address=…"), None);
    }
}
