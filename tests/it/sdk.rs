//! The official OpenAI Python SDK, pointed at corral, completes a chat call, a
//! repeat served from the cache, a streamed chat and an embeddings call, and
//! raises `BadRequestError` for a request corral rejects.
//!
//! `cargo test` is the whole test command, so on a fresh machine this test
//! installs the `openai` package itself, once, into the target directory. It
//! fails rather than skips without python3: a skipped test would read as a
//! passing one.

use std::{
    io::ErrorKind,
    path::{Path, PathBuf},
    process::{Output, Stdio},
    time::Duration,
};

use serde_json::Value;
use tokio::process::Command;

use crate::harness::TestGateway;

/// pip resolves and downloads a dozen packages; a slow index must not hang the run.
const INSTALL_TIMEOUT: Duration = Duration::from_secs(180);
/// Five calls against loopback, each with a 20 s SDK timeout of its own.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(60);
/// A Python SDK the tests drive corral with: its module, the versions the
/// scripts work with (at least `from`, below `until`, as major.minor), and the
/// directory (under the target directory) it is installed into when the
/// system lacks it.
struct Sdk {
    /// The pip package (the module's name when `None`).
    package: Option<&'static str>,
    module: &'static str,
    from: (u32, u32),
    until: (u32, u32),
    deps: &'static str,
    /// Other modules the scripts import from the same install (an extra's,
    /// or one of `with`'s).
    also: &'static [&'static str],
    /// Other pip requirements installed into the same directory, for scripts
    /// that need two SDKs in one python.
    with: &'static [&'static str],
}

impl Sdk {
    /// The pip requirements: the package in its supported versions, and `with`.
    fn requirements(&self) -> Vec<String> {
        let Self {
            package,
            module,
            from: (from_major, from_minor),
            until: (until_major, until_minor),
            with,
            ..
        } = self;
        let package = package.unwrap_or(module);
        let own = format!("{package}>={from_major}.{from_minor},<{until_major}.{until_minor}");
        std::iter::once(own)
            .chain(with.iter().map(|requirement| (*requirement).to_owned()))
            .collect()
    }

    /// Python that exits 0 only if an importable package is a supported version.
    fn import_check(&self) -> String {
        let Self {
            module,
            from,
            until,
            also,
            ..
        } = self;
        let also = also
            .iter()
            .map(|module| format!("import {module}"))
            .collect::<Vec<_>>()
            .join("; ");
        format!(
            "import sys, {module}\n\
             major, minor = (int(part) for part in {module}.__version__.split('.')[:2])\n\
             {also}\n\
             sys.exit(0 if {from:?} <= (major, minor) < {until:?} else 1)"
        )
    }
}

/// The OpenAI SDK's v1 interface (`OpenAI`, `with_raw_response`), which the scripts use.
const OPENAI: Sdk = Sdk {
    package: None,
    module: "openai",
    from: (1, 40),
    until: (4, 0),
    deps: "pydeps",
    also: &[],
    with: &[],
};

/// The Anthropic SDK with `messages.stream` and `with_raw_response`.
const ANTHROPIC: Sdk = Sdk {
    package: None,
    module: "anthropic",
    from: (0, 40),
    until: (3, 0),
    deps: "pydeps-anthropic",
    also: &[],
    with: &[],
};

/// The Anthropic SDK with its cloud clients (`AnthropicBedrock`,
/// `AnthropicVertex`) and what they import: boto3 and google-auth; with
/// `google-genai` beside it, as the mock's Vertex SDK check drives both
/// Vertex clients from one python.
const ANTHROPIC_CLOUDS: Sdk = Sdk {
    package: Some("anthropic[bedrock,vertex]"),
    module: "anthropic",
    from: (0, 40),
    until: (3, 0),
    deps: "pydeps-anthropic-clouds",
    also: &["boto3", "botocore", "google.auth", "google.genai"],
    with: &["google-genai>=1.0,<4.0"],
};

/// Google's `google-genai` (`genai.Client`, `types.HttpOptions`, `errors.APIError`).
const GOOGLE_GENAI: Sdk = Sdk {
    package: Some("google-genai"),
    module: "google.genai",
    from: (1, 0),
    until: (4, 0),
    deps: "pydeps-google-genai",
    also: &[],
    with: &[],
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_python_sdk_works_through_corral() {
    let python = Python::with_openai().await;
    let gateway = TestGateway::start(|_| {}).await;
    let (results, stderr) = run_sdk_script(&python, &gateway, "openai_check.py").await;
    let context = format!("results: {results}\nstderr: {stderr}");

    let chat = results["chat_content"].as_str().unwrap_or_default();
    assert!(!chat.is_empty(), "chat content is empty; {context}");
    assert_eq!(results["repeat_cache"], "HIT", "{context}");
    assert_eq!(results["repeat_content"], chat, "{context}");
    assert_eq!(results["stream_content"], chat, "{context}");
    assert!(
        results["embedding_len"].as_u64().is_some_and(|n| n > 0),
        "{context}"
    );
    assert_eq!(results["bad_request_error"], "BadRequestError", "{context}");
    assert_eq!(results["bad_request_status"], 400, "{context}");

    // The non-stream repeat is sent the moment the SDK read the stream's last
    // event; the flight may still be storing the assembled answer then. It is
    // either served from the cache (HIT) or joins the finishing flight
    // (COALESCED): both are the same answer with no upstream call, which the
    // call count below pins. Which one depends only on scheduling.
    assert!(
        matches!(
            results["live_repeat_cache"].as_str(),
            Some("HIT" | "COALESCED")
        ),
        "{context}"
    );
    assert_eq!(
        results["live_repeat_content"], results["live_stream_content"],
        "{context}"
    );
    assert!(
        results["live_usage_total"].as_u64().is_some_and(|n| n > 0),
        "usage was asked for and received; {context}"
    );
    assert!(
        !results["live_stream_content"]
            .as_str()
            .unwrap_or_default()
            .is_empty(),
        "{context}"
    );

    // The repeat and the first stream were served from the cache (the stream
    // replayed as SSE), the non-stream repeat of the live stream too, and the
    // rejected request never left corral: chat, live stream, embeddings upstream.
    let paths: Vec<String> = gateway
        .provider
        .requests()
        .into_iter()
        .map(|request| request.path)
        .collect();
    assert_eq!(
        paths,
        [
            "/v1/chat/completions",
            "/v1/chat/completions",
            "/v1/embeddings"
        ],
        "{context}"
    );
    let streamed = gateway.provider.requests()[1].json().unwrap_or_default();
    assert_eq!(streamed["stream"], true, "the second upstream call streams");
    assert_eq!(
        streamed["stream_options"]["include_usage"], true,
        "upstream is always asked for usage"
    );
}

/// The SDK's default (base64 on the wire, decoded by the SDK) and float callers
/// of the same inputs share corral's entries and decode the very same floats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdks_base64_and_float_callers_share_embeddings() {
    let python = Python::with_openai().await;
    let gateway = TestGateway::start(|_| {}).await;
    let (results, stderr) = run_sdk_script(&python, &gateway, "embeddings_check.py").await;
    let context = format!("results: {results}\nstderr: {stderr}");
    assert_eq!(results["failures"], serde_json::json!([]), "{context}");
    let items = |hit: u64, miss: u64| format!("hit={hit}, stale=0, coalesced=0, miss={miss}");
    assert_eq!(results["default_items"], items(0, 3), "{context}");
    assert_eq!(results["float_items"], items(3, 0), "{context}");
    assert_eq!(results["same_floats"], true, "{context}");
    assert_eq!(results["later_float_items"], items(0, 1), "{context}");
    assert_eq!(results["later_default_items"], items(1, 0), "{context}");
    assert_eq!(results["later_same_floats"], true, "{context}");
    assert_eq!(results["mixed_items"], items(2, 1), "{context}");
    assert_eq!(results["mixed_in_order"], true, "{context}");
    assert_eq!(
        gateway.provider.embedded_inputs(),
        5,
        "each input once; {context}"
    );
    // Upstream saw what each caller that paid asked for: the SDK's base64, then floats.
    let formats: Vec<Value> = gateway
        .provider
        .requests()
        .iter()
        .map(|request| request.json().unwrap_or_default()["encoding_format"].clone())
        .collect();
    assert_eq!(formats, ["base64", "float", "base64"], "{context}");
}

/// The non-stream repeat a phased SDK script sends right after its streams was served from the
/// cache, or from the flight still storing what it streamed: no upstream call either way.
pub(crate) fn assert_repeat_after_stream_served(results: &Value, context: &str) {
    assert!(
        matches!(
            results["after_stream_cache"].as_str(),
            Some("HIT" | "COALESCED")
        ),
        "{context}"
    );
}

/// Runs `tests/sdk/<script>` against the gateway; its last stdout line is JSON.
async fn run_sdk_script(python: &Python, gateway: &TestGateway, script: &str) -> (Value, String) {
    python.run_script(script, &gateway.url).await
}

/// The SDK with `timeout=1.0, max_retries=2` against a provider that takes
/// 1.5 s: the first attempt times out while its flight runs on, and the SDK's
/// retry (arriving while the flight still runs, or after it finished) gets
/// that flight's answer. One call was paid for, and the sampled call succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdks_retry_over_a_slow_provider_is_not_billed_twice() {
    let python = Python::with_openai().await;
    let gateway = TestGateway::start(|_| {}).await;
    gateway.provider.set_latency(Duration::from_millis(1500));
    let (results, stderr) = python
        .run_script("openai_slow_retry.py", &gateway.url)
        .await;
    let context = format!("results: {results}\nstderr: {stderr}");
    assert!(
        !results["content"].as_str().unwrap_or_default().is_empty(),
        "{context}"
    );
    // The test means something only if the SDK did give up on an attempt.
    if let Some(retries) = results["retries_taken"].as_u64() {
        assert!(retries >= 1, "the SDK never retried; {context}");
    }
    assert_eq!(gateway.provider.calls(), 1, "{context}");
    // The answer the SDK returned came from the first attempt's flight: joined
    // while it ran, or from the retry window after it finished.
    assert!(
        ["COALESCED", "HIT"].contains(&results["cache"].as_str().unwrap_or_default()),
        "{context}"
    );
}

/// As above, with the flight made to finish between the SDK's timeout and its
/// retry (the provider is held until the first attempt has left, then let
/// go): the retry arrives after the flight finished, and the retry window,
/// not a second call, answers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdks_retry_after_the_flight_finished_is_answered_from_the_window() {
    let python = Python::with_openai().await;
    let gateway = TestGateway::start(|_| {}).await;
    gateway.provider.hold();
    let url = gateway.url.clone();
    let script = tokio::spawn(async move { python.run_script("openai_slow_retry.py", &url).await });
    gateway.wait_for_calls(1).await;
    gateway.wait_for_waiters(1).await;
    // The SDK gave up on its first attempt (timeout=1.0); it backs off before retrying.
    gateway.wait_for_waiters_at_most(0).await;
    gateway.provider.release();
    gateway.wait_idle().await;
    let (results, stderr) = script.await.expect("the script task ends");
    let context = format!("results: {results}\nstderr: {stderr}");
    assert!(
        !results["content"].as_str().unwrap_or_default().is_empty(),
        "{context}"
    );
    assert_eq!(gateway.provider.calls(), 1, "{context}");
    // On a machine so loaded that the flight outlived the SDK's back-off, the
    // retry joined it instead: still one call, the property under test.
    if results["cache"] == "HIT" {
        assert_eq!(
            results["cache_status"], "corral; hit; detail=retry",
            "{context}"
        );
    } else {
        assert_eq!(results["cache"], "COALESCED", "{context}");
    }
}

/// The SDK's `client.responses` against corral's `POST /v1/responses`, one
/// phase of `responses_check.py` at a time. Each herd is made deterministic by
/// holding the mock until every caller waits on the one flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_python_sdks_responses_calls_are_deduplicated() {
    // Installed (once) before any herd is timed.
    let _sdk = Python::with_openai().await;
    let gateway = TestGateway::start(|_| {}).await;
    let url = gateway.url.clone();
    let phase = |phase: &'static str| {
        let url = url.clone();
        tokio::spawn(async move {
            Python::with_openai()
                .await
                .run_script_with("responses_check.py", &url, &[phase])
                .await
        })
    };
    let checked = |(results, stderr): (Value, String)| {
        let context = format!("results: {results}\nstderr: {stderr}");
        assert_eq!(results["failures"], serde_json::json!([]), "{context}");
        (results, context)
    };

    // 200 identical non-stream calls: one upstream call, then a HIT.
    let (results, context) = checked(gateway.held_for_waiters(200, || phase("herd")).await);
    assert_eq!(results["herd_misses"], 1, "{context}");
    assert_eq!(results["herd_texts"], 1, "{context}");
    assert_eq!(results["repeat_cache"], "HIT", "{context}");
    assert_eq!(gateway.provider.calls(), 1, "{context}");

    // 100 identical streams: one upstream stream, every sequence complete and equal.
    let (results, context) = checked(gateway.held_for_waiters(100, || phase("stream")).await);
    assert_eq!(results["stream_sequences"], 1, "{context}");
    assert_eq!(results["stream_misses"], 1, "{context}");
    assert_eq!(
        results["stream_types"],
        serde_json::json!(["response.created", "response.completed"]),
        "{context}"
    );
    assert_repeat_after_stream_served(&results, &context);
    assert_eq!(gateway.provider.calls(), 2, "{context}");

    // A stream cut before response.completed: every caller ends with the error
    // event, nothing is cached, and the next identical call goes upstream.
    gateway.provider.set_truncate_streams(true);
    let (results, context) = checked(gateway.held_for_waiters(20, || phase("cut")).await);
    assert_eq!(results["cut_sequences"], 1, "{context}");
    assert_eq!(gateway.provider.calls(), 3, "{context}");
    gateway.wait_idle().await;
    gateway.provider.set_truncate_streams(false);
    let (results, context) = checked(phase("again").await.unwrap());
    assert_eq!(results["again_cache"], "MISS", "{context}");
    assert_eq!(gateway.provider.calls(), 4, "{context}");

    // previous_response_id A vs B: two calls; A again: a HIT.
    let (_, context) = checked(phase("chain").await.unwrap());
    assert_eq!(gateway.provider.calls(), 6, "{context}");
    let chained: Vec<Value> = gateway.provider.requests()[4..]
        .iter()
        .map(|request| request.json().unwrap_or_default()["previous_response_id"].clone())
        .collect();
    assert_eq!(chained, ["resp_a", "resp_b"], "{context}");
}

/// Where an SDK was found, per test process (`Python::found`).
type Found = tokio::sync::OnceCell<Option<PathBuf>>;

/// A python3 that can import a suitable `openai`, possibly from `pythonpath`.
pub(crate) struct Python {
    pythonpath: Option<PathBuf>,
}

impl Python {
    /// The system's `openai` if it has one; else the one installed under the
    /// target directory by an earlier run; else installs it there now. Found
    /// once per test process: two SDK tests must not install side by side.
    pub(crate) async fn with_openai() -> Self {
        static FOUND: Found = Found::const_new();
        Self::found(&FOUND, &OPENAI).await
    }

    /// As `with_openai`, for the `anthropic` package (in a directory of its own).
    pub(crate) async fn with_anthropic() -> Self {
        static FOUND: Found = Found::const_new();
        Self::found(&FOUND, &ANTHROPIC).await
    }

    /// As `with_openai`, for the `anthropic` package with its Bedrock and
    /// Vertex clients (boto3 and google-auth with them).
    pub(crate) async fn with_anthropic_clouds() -> Self {
        static FOUND: Found = Found::const_new();
        Self::found(&FOUND, &ANTHROPIC_CLOUDS).await
    }

    /// As `with_openai`, for Google's `google-genai` package.
    pub(crate) async fn with_google_genai() -> Self {
        static FOUND: Found = Found::const_new();
        Self::found(&FOUND, &GOOGLE_GENAI).await
    }

    /// The SDK's python, found (or installed) once per test process.
    async fn found(cell: &'static Found, sdk: &'static Sdk) -> Self {
        let pythonpath = cell
            .get_or_init(|| async { Self::find_or_install(sdk).await.pythonpath })
            .await
            .clone();
        Self { pythonpath }
    }

    async fn find_or_install(sdk: &Sdk) -> Self {
        let system = Self { pythonpath: None };
        if system.imports(sdk).await {
            return system;
        }
        let deps = Path::new(env!("CARGO_TARGET_TMPDIR")).join(sdk.deps);
        let installed = Self {
            pythonpath: Some(deps.clone()),
        };
        if deps.is_dir() && installed.imports(sdk).await {
            return installed;
        }
        let requirements = sdk.requirements();
        pip_install_all(&requirements, &deps).await;
        assert!(
            installed.imports(sdk).await,
            "installed {} into {} but python3 cannot import it",
            requirements.join(" "),
            deps.display()
        );
        installed
    }

    /// Runs `tests/sdk/<script> <base_url>/v1`; asserts it exited 0 and
    /// returns its last stdout line as JSON, and its stderr.
    pub(crate) async fn run_script(&self, script: &str, base_url: &str) -> (Value, String) {
        self.run_script_with(script, base_url, &[]).await
    }

    /// As `run_script`, with more arguments after the base URL.
    pub(crate) async fn run_script_with(
        &self,
        script: &str,
        base_url: &str,
        args: &[&str],
    ) -> (Value, String) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/sdk")
            .join(script);
        let mut command = self.isolated_command();
        command
            .arg(&script)
            .arg(format!("{base_url}/v1"))
            .args(args);
        let output = run(command, SCRIPT_TIMEOUT, "the SDK script").await;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(
            output.status.success(),
            "the SDK script {} failed ({}):\nstdout: {stdout}\nstderr: {stderr}",
            script.display(),
            output.status
        );
        let results: Value = stdout
            .lines()
            .rev()
            .find(|line| !line.trim().is_empty())
            .and_then(|line| serde_json::from_str(line).ok())
            .unwrap_or_else(|| panic!("no JSON line on stdout: {stdout}\nstderr: {stderr}"));
        (results, stderr)
    }

    /// `python3` as the SDK scripts run it: no proxy for loopback, and none
    /// of the machine's keys, base URLs or AWS configuration.
    pub(crate) fn isolated_command(&self) -> Command {
        let mut command = self.command();
        command
            // The SDK (httpx) honours proxy variables; loopback must not go through one.
            .env("NO_PROXY", "127.0.0.1,localhost")
            .env("no_proxy", "127.0.0.1,localhost")
            // The SDKs read keys and a base URL from these; the scripts choose their own.
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("ANTHROPIC_AUTH_TOKEN")
            .env_remove("ANTHROPIC_BASE_URL")
            .env_remove("GOOGLE_API_KEY")
            .env_remove("GEMINI_API_KEY")
            .env_remove("GOOGLE_GEMINI_BASE_URL")
            .env_remove("GOOGLE_GENAI_USE_VERTEXAI")
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .env_remove("AWS_SESSION_TOKEN")
            .env_remove("AWS_PROFILE")
            .env_remove("AWS_BEARER_TOKEN_BEDROCK")
            .env_remove("ANTHROPIC_BEDROCK_BASE_URL")
            .env_remove("ANTHROPIC_VERTEX_BASE_URL")
            // google-auth would otherwise look for the machine's own credentials.
            .env_remove("GOOGLE_APPLICATION_CREDENTIALS")
            .env_remove("GOOGLE_CLOUD_PROJECT")
            // boto3 reads no machine's config or credentials files.
            .env("AWS_CONFIG_FILE", "/dev/null")
            .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
            .env("AWS_EC2_METADATA_DISABLED", "true");
        command
    }

    /// Runs one of the mock's SDK checks (`crates/mock-upstream/tests/<script>`,
    /// given `args`) within `timeout` and asserts every check passed.
    pub(crate) async fn run_mock_check(
        &self,
        script: &str,
        args: &[&std::ffi::OsStr],
        timeout: Duration,
    ) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("crates/mock-upstream/tests")
            .join(script);
        let mut command = self.isolated_command();
        command.arg(&script).args(args);
        let output = run(command, timeout, "the mock's SDK check").await;
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && stdout.contains(" passed, 0 failed"),
            "{}: stdout: {stdout}\nstderr: {}",
            script.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    pub(crate) fn command(&self) -> Command {
        let mut command = Command::new("python3");
        if let Some(path) = &self.pythonpath {
            command.env("PYTHONPATH", path);
        }
        command
    }

    async fn imports(&self, sdk: &Sdk) -> bool {
        let mut command = self.command();
        command.args(["-c", &sdk.import_check()]);
        run(command, SCRIPT_TIMEOUT, "the SDK import check")
            .await
            .status
            .success()
    }
}

/// Installs `requirement` into a fresh staging directory and moves it into
/// place as `deps` only once pip succeeded. pip `--target` skips packages
/// already present in its target, so a run killed mid-install must not leave a
/// half-filled `deps` that later runs would keep failing on.
pub(crate) async fn pip_install(requirement: &str, deps: &Path) {
    pip_install_all(&[requirement.to_owned()], deps).await;
}

/// As [`pip_install`], for several requirements resolved together.
async fn pip_install_all(requirements: &[String], deps: &Path) {
    let requirement = requirements.join(" ");
    let staging = deps.with_extension(format!("partial-{}", std::process::id()));
    remove_dir(&staging);
    let mut command = Command::new("python3");
    command
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-input",
            "--target",
        ])
        .arg(&staging)
        .args(requirements);
    let output = run(command, INSTALL_TIMEOUT, "pip install").await;
    assert!(
        output.status.success(),
        "`python3 -m pip install {requirement}` failed ({}); this test needs pip \
         and access to PyPI (e.g. apt-get install python3-pip):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    remove_dir(deps);
    std::fs::rename(&staging, deps)
        .unwrap_or_else(|err| panic!("moving {} to {}: {err}", staging.display(), deps.display()));
}

fn remove_dir(dir: &Path) {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(err) if err.kind() == ErrorKind::NotFound => {}
        Err(err) => panic!("removing {}: {err}", dir.display()),
    }
}

/// Runs `command` to completion within `timeout`, killing it on expiry (the
/// dropped child is killed by `kill_on_drop`).
pub(crate) async fn run(mut command: Command, timeout: Duration, what: &str) -> Output {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = command.spawn().unwrap_or_else(|err| {
        if err.kind() == ErrorKind::NotFound {
            panic!(
                "python3 is not on PATH; this test needs Python 3 with pip \
                 (e.g. apt-get install python3 python3-pip)"
            )
        }
        panic!("starting {what}: {err}")
    });
    tokio::time::timeout(timeout, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {timeout:?}"))
        .unwrap_or_else(|err| panic!("waiting for {what}: {err}"))
}
