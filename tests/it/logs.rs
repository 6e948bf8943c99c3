//! Logs of the real `corral` binary, run as a child process at `RUST_LOG=debug`:
//! a caller's API key, the provider's key and the prompt text never appear,
//! while request ids, cache statuses, fingerprint prefixes and upstream
//! attempts do. `log.format: json` writes one JSON object per line.

use std::{path::Path, process::Stdio};

use mock_upstream::{MockProvider, MockSettings};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, BufReader},
    process::{Child, Command},
    task::JoinHandle,
};

use crate::harness::WAIT;

const CALLER_KEY: &str = "sk-caller-LOGCANARY-4f1d9a77e2";
const PROVIDER_KEY: &str = "sk-provider-LOGCANARY-8c03b5e1aa";
const PROMPT: &str = "purple elephants negotiate the LOGCANARY treaty at dawn";

/// A running `corral` binary and everything it wrote to stderr.
pub(crate) struct Corral {
    child: Child,
    pub(crate) url: String,
    stderr: JoinHandle<String>,
    _dir: tempfile::TempDir,
}

impl Corral {
    /// Starts the binary with a config file and `CORRAL_*` overrides, and waits
    /// for the line it prints once it listens.
    async fn start(provider: &MockProvider, env: &[(&str, &str)]) -> Self {
        Self::start_with(
            "listen: 127.0.0.1:0\nupstreams:\n  - name: mock\n    base_url: http://127.0.0.1:1/v1\ncache:\n  ttl_jitter: 0\n",
            provider,
            env,
        )
        .await
    }

    /// As [`start`](Self::start), with a config file of `yaml` (whose first
    /// upstream's URL the environment sets: the mock's, unless `env` says).
    pub(crate) async fn start_with(
        yaml: &str,
        provider: &MockProvider,
        env: &[(&str, &str)],
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("corral.yaml");
        // The upstream URL comes from the environment, like a deployment's would.
        std::fs::write(&config, yaml).unwrap();
        let mut child = command(&config, provider, env)
            .spawn()
            .expect("the corral binary starts");
        let mut stderr = child.stderr.take().unwrap();
        let stderr = tokio::spawn(async move {
            let mut text = String::new();
            stderr
                .read_to_string(&mut text)
                .await
                .expect("stderr reads");
            text
        });
        let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let url = tokio::time::timeout(WAIT, async {
            while let Some(line) = stdout.next_line().await.expect("stdout reads") {
                if let Some(address) = line.strip_prefix("corral listening on ") {
                    return address.trim().to_owned();
                }
            }
            panic!("corral exited before listening");
        })
        .await
        .expect("corral listens in time");
        Self {
            child,
            url,
            stderr,
            _dir: dir,
        }
    }

    pub(crate) async fn post(
        &self,
        path: &str,
        body: String,
        headers: &[(&str, &str)],
    ) -> reqwest::Response {
        let mut request = reqwest::Client::new()
            .post(format!("{}{path}", self.url))
            .timeout(WAIT)
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {CALLER_KEY}"))
            .body(body);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.send().await.expect("request reaches corral")
    }

    /// Stops the process as an orchestrator does (SIGTERM: drain, then exit,
    /// writing the log lines still queued) and returns its whole stderr.
    pub(crate) async fn logs(mut self) -> String {
        let pid = self.child.id().expect("corral is running");
        let term = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(term.success(), "SIGTERM delivered");
        tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("corral exits")
            .unwrap();
        tokio::time::timeout(WAIT, self.stderr)
            .await
            .expect("stderr closes")
            .unwrap()
    }
}

/// Everything a corral shows outside itself: its reports, what it keeps in
/// Redis, and (once stopped) its logs.
pub(crate) struct Exposed {
    pub(crate) metrics: String,
    pub(crate) stats: String,
    pub(crate) logs: String,
    stored: Vec<u8>,
}

impl Corral {
    /// Reads `/metrics`, `/stats` and a dump of `redis`, then stops the
    /// process for its logs.
    pub(crate) async fn exposed(self, redis: &crate::redis_server::RedisServer) -> Exposed {
        let client = reqwest::Client::new();
        let mut reports = Vec::new();
        for path in ["/metrics", "/stats"] {
            let reply = client
                .get(format!("{}{path}", self.url))
                .timeout(WAIT)
                .send()
                .await
                .expect("the report answers");
            reports.push(reply.text().await.expect("the report reads"));
        }
        let stored = redis
            .dump()
            .await
            .into_iter()
            .flat_map(|(key, value)| key.into_bytes().into_iter().chain(value))
            .collect();
        let logs = self.logs().await;
        let stats = reports.pop().unwrap_or_default();
        let metrics = reports.pop().unwrap_or_default();
        Exposed {
            metrics,
            stats,
            logs,
            stored,
        }
    }
}

impl Exposed {
    /// None of `secrets` in the logs, the reports or Redis.
    pub(crate) fn assert_holds_none(&self, secrets: &[String]) {
        assert!(self.logs.contains("DEBUG"), "debug logs were on");
        for secret in secrets {
            for (place, text) in [
                ("logs", &self.logs),
                ("/metrics", &self.metrics),
                ("/stats", &self.stats),
            ] {
                assert!(!text.contains(secret.as_str()), "a secret in {place}");
            }
            assert!(
                !self
                    .stored
                    .windows(secret.len())
                    .any(|window| window == secret.as_bytes()),
                "a secret in Redis"
            );
        }
    }
}

fn command(config: &Path, provider: &MockProvider, env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_corral"));
    command
        .arg("--config")
        .arg(config)
        // Only what is set here: nothing from the test's own environment leaks in.
        .env_clear()
        .env("RUST_LOG", "debug")
        .env("CORRAL_UPSTREAM_BASE_URL", provider.base_url())
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

fn chat_body(content: &str) -> String {
    json!({
        "model": "gpt-4o-mini",
        "temperature": 0,
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": content}],
    })
    .to_string()
}

/// The traffic every format runs: a miss, a hit, an embedding of the prompt,
/// a request corral rejects and one the provider rejects, all carrying the
/// key and the prompt. Returns the fingerprint of the chat.
async fn traffic(corral: &Corral, provider: &MockProvider, id: &str) -> String {
    let miss = corral
        .post(
            "/v1/chat/completions",
            chat_body(PROMPT),
            &[("x-request-id", id)],
        )
        .await;
    assert_eq!(miss.status(), StatusCode::OK);
    assert_eq!(miss.headers()["x-request-id"], id);
    assert_eq!(miss.headers()["x-corral-cache"], "MISS");
    let fingerprint = miss.headers()["x-corral-fingerprint"]
        .to_str()
        .unwrap()
        .to_owned();
    let hit = corral
        .post("/v1/chat/completions", chat_body(PROMPT), &[])
        .await;
    assert_eq!(hit.headers()["x-corral-cache"], "HIT");
    let embedded = corral
        .post(
            "/v1/embeddings",
            json!({"model": "text-embedding-3-small", "input": PROMPT}).to_string(),
            &[],
        )
        .await;
    assert_eq!(embedded.status(), StatusCode::OK);
    let invalid = corral
        .post(
            "/v1/chat/completions",
            json!({"model": 7, "messages": [{"role": "user", "content": PROMPT}]}).to_string(),
            &[],
        )
        .await;
    assert_eq!(invalid.status(), StatusCode::BAD_REQUEST);
    provider.push_script(mock_upstream::Scripted::json(
        400,
        r#"{"error":{"message":"rejected","type":"invalid_request_error","param":null,"code":null}}"#,
    ));
    let rejected = corral
        .post(
            "/v1/chat/completions",
            chat_body(&format!("{PROMPT} (again)")),
            &[],
        )
        .await;
    assert_eq!(rejected.status(), StatusCode::BAD_REQUEST);
    fingerprint
}

fn assert_redacted(logs: &str) {
    assert!(!logs.trim().is_empty(), "corral logged nothing");
    for secret in [CALLER_KEY, PROVIDER_KEY, "LOGCANARY"] {
        assert!(
            !logs.contains(secret),
            "`{secret}` appears in the logs:\n{logs}"
        );
    }
    for word in ["purple elephants", "negotiate", "treaty"] {
        assert!(
            !logs.contains(word),
            "prompt text `{word}` in the logs:\n{logs}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_logs_at_debug_carry_request_facts_but_no_keys_or_prompts() {
    let provider = MockProvider::start(MockSettings::default()).await.unwrap();
    // No provider key: the caller's own key is forwarded upstream.
    let corral = Corral::start(&provider, &[]).await;
    let fingerprint = traffic(&corral, &provider, "log-text-1").await;
    let logs = corral.logs().await;
    assert_redacted(&logs);
    assert!(
        provider.requests()[0]
            .headers
            .iter()
            .any(|(name, value)| name == "authorization" && value.contains(CALLER_KEY)),
        "the key did travel upstream, so its absence from the logs means something"
    );
    assert!(
        logs.contains("DEBUG"),
        "RUST_LOG=debug took effect:\n{logs}"
    );
    assert!(logs.contains("request_id=log-text-1"), "{logs}");
    assert!(logs.contains(&fingerprint[..12]), "{logs}");
    assert!(
        !logs.contains(&fingerprint),
        "only a prefix of the fingerprint"
    );
    for fact in [
        "cache=\"MISS\"",
        "cache=\"HIT\"",
        "attempts=1",
        "latency_ms=",
        "status=400",
    ] {
        assert!(logs.contains(fact), "`{fact}` missing:\n{logs}");
    }
}

/// Every string anywhere in a JSON value.
fn strings(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(text) => out.push(text.clone()),
        Value::Array(items) => items.iter().for_each(|v| strings(v, out)),
        Value::Object(map) => map.values().for_each(|v| strings(v, out)),
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_per_line_and_redacted() {
    let provider = MockProvider::start(MockSettings::default()).await.unwrap();
    let corral = Corral::start(
        &provider,
        &[
            ("CORRAL_LOG__FORMAT", "json"),
            ("CORRAL_UPSTREAM_API_KEY", PROVIDER_KEY),
        ],
    )
    .await;
    let fingerprint = traffic(&corral, &provider, "log-json-1").await;
    let logs = corral.logs().await;
    assert_redacted(&logs);
    let lines: Vec<Value> = logs
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|err| panic!("not JSON ({err}): {line}"))
        })
        .collect();
    assert!(lines.iter().all(Value::is_object));
    // The summary line of the first request, with its span's request id.
    let summary = lines
        .iter()
        .find(|line| line["message"] == "request" && line["span"]["request_id"] == "log-json-1")
        .unwrap_or_else(|| panic!("no summary line for log-json-1:\n{logs}"));
    assert_eq!(summary["cache"], "MISS");
    assert_eq!(summary["status"], 200);
    assert_eq!(summary["fingerprint"], &fingerprint[..12]);
    assert!(summary["latency_ms"].is_number());
    // The upstream call it started logs its attempts inside the same request.
    // Lines of two threads written in one batch interval may come out of
    // order (telemetry.rs), so another request's call (the embedding's) may
    // be written first: find this one by its request id.
    let call = lines
        .iter()
        .find(|line| {
            let mut texts = Vec::new();
            strings(&line["spans"], &mut texts);
            line["message"] == "upstream call" && texts.iter().any(|t| t == "log-json-1")
        })
        .unwrap_or_else(|| panic!("no upstream call line inside log-json-1:\n{logs}"));
    assert_eq!(call["attempts"], 1);
    assert_eq!(call["ok"], true);
    assert!(
        provider.requests()[0]
            .headers
            .iter()
            .any(|(name, value)| name == "authorization" && value.contains(PROVIDER_KEY)),
        "the provider key was used"
    );
}

/// W3: a caller's long path (a 30 KB file id, a 30 KB Gemini model name) goes
/// into the request span, the access line and the flight's span clipped,
/// like the model name: a line costs the log what a real path does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_path_is_clipped_in_every_log_line() {
    let provider = MockProvider::start(MockSettings::default()).await.unwrap();
    let yaml = format!(
        "listen: 127.0.0.1:0\nupstreams:\n  - name: mock\n    base_url: http://127.0.0.1:1/v1\n  - name: gemini\n    api: gemini\n    base_url: http://{}/v1beta\n    models: [\"gemini-*\"]\n",
        provider.addr()
    );
    let corral = Corral::start_with(&yaml, &provider, &[]).await;
    let long = "q".repeat(30_000);
    let file = corral
        .post(&format!("/v1/files/file-{long}"), String::new(), &[])
        .await;
    let _ = file.bytes().await;
    let gemini = corral
        .post(
            &format!("/v1beta/models/gemini-{long}:generateContent"),
            json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}).to_string(),
            &[("x-goog-api-key", "AIza-log-test")],
        )
        .await;
    let _ = gemini.bytes().await;
    let logs = corral.logs().await;
    let run = "q".repeat(corral::telemetry::LONGEST_FIELD + 1);
    assert!(
        logs.lines()
            .any(|line| line.contains("/v1/files/file-qqqq")),
        "the request is logged, its path clipped:\n{}",
        &logs[..logs.len().min(4000)]
    );
    for line in logs.lines() {
        assert!(
            !line.contains(&run),
            "a line carries more than {} bytes of the path: {}...",
            corral::telemetry::LONGEST_FIELD,
            &line[..line.len().min(300)]
        );
    }
}
