//! Child services of the suite (mock, corral, baseline, redis-server, a peer):
//! started on port 0 where the program allows it, ready when their own ready
//! line says so (never after a sleep), logged to a file, and killed when the
//! handle is dropped.

use std::{
    future::Future,
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
        command: Command,
        log: &Path,
        deadline: Duration,
        ready: impl Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Self> {
        Self::spawn_until(
            name,
            command,
            log,
            deadline,
            "printed no ready line",
            |mut lines| async move {
                while let Some(line) = lines.recv().await {
                    if let Some(found) = ready(&line) {
                        return Some(found);
                    }
                }
                None
            },
        )
        .await
    }

    /// As [`Service::spawn`], for a program whose ready line depends on its
    /// log level (LiteLLM's uvicorn says nothing at `ERROR`): ready when
    /// `base_url` + `health_path` answers 2xx, probed every 250 ms until
    /// `deadline`. `ready` is then `base_url`.
    pub async fn spawn_until_healthy(
        name: &str,
        command: Command,
        log: &Path,
        deadline: Duration,
        base_url: String,
        health_path: &str,
    ) -> anyhow::Result<Self> {
        const PROBE_EVERY: Duration = Duration::from_millis(250);
        let client = reqwest::Client::builder()
            .timeout(PROBE_EVERY * 4)
            .no_proxy()
            .build()?;
        let health = format!("{base_url}{health_path}");
        let not_ready = format!("did not answer {health}");
        Self::spawn_until(
            name,
            command,
            log,
            deadline,
            &not_ready,
            |mut lines| async move {
                let mut probes = tokio::time::interval(PROBE_EVERY);
                loop {
                    tokio::select! {
                        // Both output streams closed: the process is gone.
                        line = lines.recv() => { line?; }
                        _ = probes.tick() => {
                            let answered = client.get(&health).send().await;
                            if answered.is_ok_and(|response| response.status().is_success()) {
                                return Some(base_url);
                            }
                        }
                    }
                }
            },
        )
        .await
    }

    /// Spawns `command` with its output copied to `log`, then waits up to
    /// `deadline` for `until` (given the output's lines) to say what the
    /// service is ready as; `None` means the process went away first.
    async fn spawn_until<F>(
        name: &str,
        command: Command,
        log: &Path,
        deadline: Duration,
        not_ready: &str,
        until: impl FnOnce(mpsc::UnboundedReceiver<String>) -> F,
    ) -> anyhow::Result<Self>
    where
        F: Future<Output = Option<String>>,
    {
        let (mut child, lines) = start(name, command, log)?;
        match tokio::time::timeout(deadline, until(lines)).await {
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
                "{name} {not_ready} within {deadline:?}; see {}",
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

/// Spawns `command` (killed on drop) with its stdout and stderr copied to
/// `log`; the receiver yields every line and ends when both streams close.
fn start(
    name: &str,
    mut command: Command,
    log: &Path,
) -> anyhow::Result<(Child, mpsc::UnboundedReceiver<String>)> {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command
        .spawn()
        .with_context(|| format!("starting {name} ({command:?})"))?;
    let file = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let file = Arc::new(Mutex::new(file));
    let (lines_tx, lines) = mpsc::unbounded_channel();
    if let Some(stdout) = child.stdout.take() {
        tokio::spawn(copy_lines(stdout, file.clone(), lines_tx.clone()));
    }
    if let Some(stderr) = child.stderr.take() {
        tokio::spawn(copy_lines(stderr, file.clone(), lines_tx));
    }
    Ok((child, lines))
}

/// Copies every line to the log and forwards it, until nobody listens (the
/// service is ready); from then on copies the output in whole chunks. A line
/// at a time (a `write(2)` and a `String` each) would make the suite's own
/// process the cost of a service's access log: on two shared cores it took
/// 10-16 % of corral's hit throughput away, which the hit scenario then
/// reported as the log's cost.
async fn copy_lines(
    stream: impl AsyncRead + Unpin,
    file: Arc<Mutex<std::fs::File>>,
    lines_tx: mpsc::UnboundedSender<String>,
) {
    use std::io::Write as _;
    let write = |bytes: &[u8]| {
        let mut file = file.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = file.write_all(bytes);
    };
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    while !lines_tx.is_closed() {
        line.clear();
        match reader.read_line(&mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                write(line.as_bytes());
                let _ = lines_tx.send(line.trim_end_matches(['\r', '\n']).to_owned());
            }
        }
    }
    loop {
        let chunk = match reader.fill_buf().await {
            Ok([]) | Err(_) => return,
            Ok(chunk) => chunk,
        };
        write(chunk);
        let read = chunk.len();
        reader.consume(read);
    }
}

/// `bench-baseline --proxy-to <origin>` (the binary `bin`), a bare pooled
/// reverse proxy; ready once it prints the address it listens on, within
/// `deadline`. Its output goes to `log`.
pub async fn start_proxy_baseline(
    bin: &Path,
    origin: &str,
    log: &Path,
    deadline: Duration,
) -> anyhow::Result<Service> {
    let mut command = Command::new(bin);
    command
        .args(["--listen", "127.0.0.1:0", "--proxy-to"])
        .arg(origin);
    Service::spawn(
        "bench-baseline-proxy",
        command,
        log,
        deadline,
        url_after("bench-baseline listening on "),
    )
    .await
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
