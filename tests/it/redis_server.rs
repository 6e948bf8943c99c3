//! A private `redis-server` per test, on an ephemeral port, ready when its log
//! says so, killed when dropped; and a 3-master Redis Cluster built from three.

#![allow(dead_code)]

use std::{process::Stdio, time::Duration};

use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};

use crate::harness::WAIT;

pub struct RedisServer {
    port: u16,
    child: Option<Child>,
    extra: Vec<String>,
    _dir: TempDir,
}

/// A scratch directory removed on drop (cluster node files live there).
pub struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new() -> Self {
        let path = std::env::temp_dir().join(format!(
            "corral-redis-{}-{:x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::create_dir_all(&path).expect("temp dir");
        Self(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A port nothing listens on right now (bind :0, read it, release it).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl RedisServer {
    pub async fn spawn() -> Self {
        Self::spawn_with(&[]).await
    }

    pub async fn spawn_with(extra: &[&str]) -> Self {
        let dir = TempDir::new();
        let extra: Vec<String> = extra.iter().map(|s| (*s).to_owned()).collect();
        // The port is picked before the server binds it; on the rare collision, pick again.
        for _ in 0..5 {
            let port = free_port();
            if let Some(child) = start(port, &extra, &dir.0).await {
                return Self {
                    port,
                    child: Some(child),
                    extra,
                    _dir: dir,
                };
            }
        }
        panic!("redis-server did not start (is it installed? apt-get install redis-server)");
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .and_then(Child::id)
            .expect("redis is running")
    }

    pub fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .args([format!("-{signal}"), self.pid().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// SIGKILL, reaped.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// Starts an empty server again on the same port.
    pub async fn restart(&mut self) {
        self.kill().await;
        for _ in 0..50 {
            if let Some(child) = start(self.port, &self.extra, &self._dir.0).await {
                self.child = Some(child);
                return;
            }
            // The old socket may linger for a moment after SIGKILL.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("redis-server did not restart on port {}", self.port);
    }

    pub async fn client(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("connect to the test redis")
    }

    /// The keys matching `pattern` (`KEYS`).
    pub async fn keys(&self, pattern: &str) -> Vec<String> {
        let mut conn = self.client().await;
        redis::cmd("KEYS")
            .arg(pattern)
            .query_async(&mut conn)
            .await
            .unwrap()
    }

    /// `calls=` of one command in `INFO commandstats` (0 before its first call).
    pub async fn command_calls(&self, command: &str) -> u64 {
        let mut conn = self.client().await;
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await
            .unwrap();
        info.lines()
            .find_map(|line| line.strip_prefix(&format!("cmdstat_{command}:calls=")))
            .and_then(|rest| rest.split(',').next()?.parse().ok())
            .unwrap_or(0)
    }

    /// Kills every pub/sub client connection (`CLIENT KILL TYPE pubsub`): announcements sent
    /// before their subscribers reconnect reach nobody. Returns how many were killed.
    pub async fn kill_pubsub_clients(&self) -> i64 {
        let mut conn = self.client().await;
        redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("pubsub")
            .query_async(&mut conn)
            .await
            .unwrap()
    }

    /// Every key with its value, as `redis-cli --scan` + `GET` would dump them.
    pub async fn dump(&self) -> Vec<(String, Vec<u8>)> {
        let mut conn = self.client().await;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut conn)
            .await
            .unwrap();
        let mut out = Vec::new();
        for key in keys {
            let value: Option<Vec<u8>> = redis::cmd("GET")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .unwrap_or(None);
            out.push((key, value.unwrap_or_default()));
        }
        out
    }
}

async fn start(port: u16, extra: &[String], dir: &std::path::Path) -> Option<Child> {
    let mut child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .args(["--protected-mode", "no", "--dir"])
        .arg(dir)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .ok()?;
    let stdout = child.stdout.take()?;
    let mut lines = BufReader::new(stdout).lines();
    let ready = tokio::time::timeout(WAIT, async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("Ready to accept connections") {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    if !ready {
        let _ = child.kill().await;
        return None;
    }
    // Keep draining the log so the server never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Some(child)
}

/// Three masters, no replicas, slots spread by `redis-cli --cluster create`.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub async fn spawn() -> Self {
        let mut nodes = Vec::new();
        for i in 0..3 {
            let conf = format!("nodes-{i}.conf");
            nodes.push(
                RedisServer::spawn_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    &conf,
                ])
                .await,
            );
        }
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let output = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .await
            .expect("redis-cli runs");
        assert!(
            output.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        // There is no event for "every node agrees on the slots"; poll it, bounded.
        let deadline = tokio::time::Instant::now() + WAIT;
        for node in &nodes {
            let mut conn = node.client().await;
            loop {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                if info.contains("cluster_state:ok") {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "cluster never became ok"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Self { nodes }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }
}
