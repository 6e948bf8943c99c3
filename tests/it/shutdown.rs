//! Graceful shutdown: the real binary under SIGTERM with a herd in flight, and
//! an in-process drain that times out. Plus [`CorralProcess`], the real
//! binary as other tests here use it (logs, signals, file descriptors).

use std::{process::Stdio, sync::Arc, time::Duration};

use mock_upstream::MockProvider;
use reqwest::StatusCode;
use serde_json::Value;
use tokio::{
    io::{AsyncBufReadExt, AsyncRead, BufReader},
    process::Child,
    sync::watch,
};

use crate::{
    harness::{Reply, WAIT, chat, collect, redis_at, start_switchable},
    redis_server::RedisServer,
};

const PATH: &str = "/v1/chat/completions";

/// The `corral` binary on the config file at `path`, with `env` added to the
/// test's environment; stdout and stderr piped, killed when dropped.
pub fn corral_command(path: &std::path::Path, env: &[(&str, &str)]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_corral"));
    command
        .arg("--config")
        .arg(path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (name, value) in env {
        command.env(name, value);
    }
    command
}

/// The `corral` binary, started on a config file in a scratch directory.
pub struct CorralProcess {
    pub child: Child,
    pub url: String,
    pub pid: u32,
    /// stdout and stderr, line by line, as the process wrote them.
    logs: watch::Receiver<String>,
    dir: std::path::PathBuf,
}

impl CorralProcess {
    /// Starts it and returns once it printed `corral listening on http://ADDR`.
    pub async fn start(yaml: &str, env: &[(&str, &str)]) -> Self {
        let dir = std::env::temp_dir().join(format!("corral-bin-{:x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.yaml");
        std::fs::write(&path, yaml).unwrap();
        let mut child = corral_command(&path, env)
            .env("RUST_LOG", "debug")
            .spawn()
            .expect("the corral binary starts");
        let pid = child.id().expect("running");
        let (sender, logs) = watch::channel(String::new());
        let sender = Arc::new(sender);
        drain_lines(child.stdout.take().unwrap(), sender.clone());
        drain_lines(child.stderr.take().unwrap(), sender);
        let mut process = Self {
            child,
            url: String::new(),
            pid,
            logs,
            dir,
        };
        let line = process.wait_for_log("corral listening on http://").await;
        process.url = line
            .lines()
            .next()
            .and_then(|line| line.strip_prefix("corral listening on "))
            .unwrap()
            .trim()
            .to_owned();
        process
    }

    /// Waits (bounded) until a line containing `needle` was written; returns the text from it on.
    pub async fn wait_for_log(&self, needle: &str) -> String {
        let mut logs = self.logs.clone();
        let found = tokio::time::timeout(WAIT, logs.wait_for(|logs| logs.contains(needle)))
            .await
            .unwrap_or_else(|_| panic!("corral never logged {needle:?}:\n{}", self.logs()))
            .map(|logs| logs[logs.find(needle).unwrap()..].to_owned());
        found
            .unwrap_or_else(|_| panic!("corral exited before logging {needle:?}:\n{}", self.logs()))
    }

    pub fn logs(&self) -> String {
        self.logs.borrow().clone()
    }

    /// Waits (bounded) until the process reports Redis up and subscribed
    /// (another process: only its `/readyz` shows it).
    pub async fn wait_redis_connected(&self) {
        let client = reqwest::Client::new();
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let ready: Value = client
                .get(format!("{}/readyz", self.url))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if ready["redis"]["status"] == "up" && ready["redis"]["subscribed"] == true {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "never connected: {ready}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .args([format!("-{signal}"), self.pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Open file descriptors of the process, from /proc.
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid))
            .expect("/proc is readable")
            .count()
    }

    /// Waits (bounded) for the process to exit; its exit code.
    pub async fn exit_code(&mut self) -> Option<i32> {
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("corral exits")
            .expect("wait works");
        status.code()
    }
}

impl Drop for CorralProcess {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn drain_lines(pipe: impl AsyncRead + Unpin + Send + 'static, logs: Arc<watch::Sender<String>>) {
    tokio::spawn(async move {
        let mut lines = BufReader::new(pipe).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            logs.send_modify(|logs| {
                logs.push_str(&line);
                logs.push('\n');
            });
        }
    });
}

/// A `/readyz` field of the binary.
async fn ready_field(client: &reqwest::Client, url: &str, field: &str) -> u64 {
    let ready: Value = client
        .get(format!("{url}/readyz"))
        .send()
        .await
        .expect("readyz answers")
        .json()
        .await
        .unwrap();
    ready[field].as_u64().unwrap_or(0)
}

fn lock_keys(dump: &[(String, Vec<u8>)]) -> Vec<String> {
    dump.iter()
        .filter(|(key, _)| key.contains(":lock:"))
        .map(|(key, _)| key.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_200_coalesced_requests_answers_all_releases_the_lock_and_exits_0() {
    let redis = RedisServer::spawn().await;
    let provider = MockProvider::start(Default::default()).await.unwrap();
    let yaml = format!(
        "listen: 127.0.0.1:0\nupstreams:\n  - {{name: mock, base_url: '{}'}}\nredis:\n  url: '{}'\n  op_timeout: 2s\nshutdown:\n  drain_timeout: 20s\n",
        provider.base_url(),
        redis.url()
    );
    let mut corral = CorralProcess::start(&yaml, &[]).await;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(512)
        .timeout(WAIT)
        .build()
        .unwrap();
    // Connected to Redis before the herd, so the owner takes the cluster lock.
    corral.wait_redis_connected().await;

    provider.hold();
    let body = chat("shutdown with a herd in flight");
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let (client, url, body) = (client.clone(), corral.url.clone(), body.clone());
            tokio::spawn(async move {
                client
                    .post(format!("{url}{PATH}"))
                    .json(&body)
                    .send()
                    .await
                    .map(|response| response.status())
            })
        })
        .collect();
    assert!(provider.wait_for_calls(1, WAIT).await);
    // Another process: its waiter count is only visible through /readyz.
    let deadline = tokio::time::Instant::now() + WAIT;
    while ready_field(&client, &corral.url, "waiters").await < 200 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the herd never gathered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        lock_keys(&redis.dump().await).len(),
        1,
        "the owner holds the cluster lock"
    );

    corral.signal("TERM");
    corral.wait_for_log("shutting down").await;
    provider.release();
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.unwrap().expect("every request gets a response"));
    }
    assert!(
        statuses.iter().all(|s| *s == StatusCode::OK),
        "{statuses:?}"
    );
    assert_eq!(corral.exit_code().await, Some(0), "{}", corral.logs());
    assert_eq!(provider.calls(), 1);
    let dump = redis.dump().await;
    assert!(
        lock_keys(&dump).is_empty(),
        "the lock was released: {dump:?}"
    );
    assert!(
        dump.iter().any(|(key, _)| key.contains(":resp:")),
        "the answer was stored before exit"
    );
}

/// Sends requests to an in-process corral started here.
#[derive(Clone)]
pub struct Caller {
    pub url: String,
    client: reqwest::Client,
}

impl Caller {
    pub fn new(url: String) -> Self {
        let client = reqwest::Client::builder().timeout(WAIT).build().unwrap();
        Self { url, client }
    }

    pub async fn post(&self, path: &str, body: &Value) -> Reply {
        let response = self
            .client
            .post(format!("{}{path}", self.url))
            .json(body)
            .send()
            .await
            .expect("request reaches corral");
        Reply {
            status: response.status(),
            headers: response.headers().clone(),
            body: response.bytes().await.expect("body arrives"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_of_a_flight_cut_by_the_drain_timeout_get_503_and_the_lock_is_released() {
    let redis = RedisServer::spawn().await;
    let provider = MockProvider::start(Default::default()).await.unwrap();
    let (url, state, stop, server) = start_switchable(&provider, |config| {
        config.redis = Some(redis_at(&redis.url()));
        config.shutdown.drain_timeout = Duration::from_millis(500);
    })
    .await;
    let handle = Caller::new(url);
    tokio::time::timeout(WAIT, state.cluster().unwrap().connected())
        .await
        .unwrap();
    provider.hold();
    let body = chat("never finishes");
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let (handle, body) = (handle.clone(), body.clone());
            tokio::spawn(async move { handle.post(PATH, &body).await })
        })
        .collect();
    let mut waiters = state.dedup().coalescer().flights().waiters();
    tokio::time::timeout(WAIT, waiters.wait_for(|n| *n >= 20))
        .await
        .unwrap()
        .unwrap();
    // The upstream call starts after the owner took the cluster lock.
    assert!(provider.wait_for_calls(1, WAIT).await);
    assert_eq!(lock_keys(&redis.dump().await).len(), 1);

    stop.cancel();
    let replies = collect(tasks).await;
    for reply in &replies {
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(reply.json()["error"]["code"], "shutting_down");
        assert!(reply.header("retry-after").is_some());
    }
    tokio::time::timeout(WAIT, server)
        .await
        .expect("serve returns after the cut")
        .unwrap()
        .unwrap();
    let dump = redis.dump().await;
    assert!(
        lock_keys(&dump).is_empty(),
        "the lock was released: {dump:?}"
    );
    assert!(
        !dump.iter().any(|(key, _)| key.contains(":flight:")),
        "a cut flight records nothing for other instances to share"
    );
    provider.release();
}

#[tokio::test]
async fn idle_keep_alive_connections_do_not_hold_up_shutdown() {
    let provider = MockProvider::start(Default::default()).await.unwrap();
    let (url, _state, stop, server) = start_switchable(&provider, |config| {
        config.shutdown.drain_timeout = Duration::from_secs(20);
    })
    .await;
    let handle = Caller::new(url);
    // The client keeps this connection open and idle (keep-alive pool).
    let client = reqwest::Client::new();
    let ok = client
        .get(format!("{}/healthz", handle.url))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    let started = std::time::Instant::now();
    stop.cancel();
    tokio::time::timeout(WAIT, server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "an idle connection is closed at once, not waited for ({:?})",
        started.elapsed()
    );
}
