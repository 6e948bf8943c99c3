//! Real agent clients against corral (in-process, in front of the mock provider): Claude Code
//! headless, Codex CLI's `codex exec`, the OpenAI Agents SDK and the Vercel AI SDK, each as its
//! users run it, with its telemetry and update checks off and nothing reachable but loopback.
//! What the SDK tests send by hand, these clients send on their own: per-session ids, cache
//! keys, betas and tool shapes that decide whether N runs of one task are one upstream call.
//!
//! The clients come from `tests/agents` (an npm lock and a pinned Python requirements file),
//! installed once per lock content into a cache outside the repository (`install.rs`). A tap in
//! front of corral records every request a client sent and the status it got (`tap.rs`), so a
//! failing test names the refused request, or the request-body fields in which two runs of one
//! task differed. Concurrent runs are made to meet in corral by holding the mock until every
//! run's request waits on a flight, never by timing.

pub(crate) mod install;
pub(crate) mod run;
pub(crate) mod tap;

use std::{collections::BTreeSet, path::PathBuf, time::Duration};

use corral::config::RetryConfig;
use mock_upstream::{FailureMode, MockProvider, MockSettings};
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::{anthropic::messages_gateway, harness::TestGateway};
use install::{NodeClients, PythonClients, agents_dir};
use run::{Finished, clean_command, differences, run};
use tap::{Exchange, Tap};

/// One client run against loopback: seconds when healthy; generous for a loaded machine, and
/// finite, so a client stuck on something it cannot reach fails the test.
pub(crate) const CLIENT_TIMEOUT: Duration = Duration::from_secs(180);

/// Concurrent `codex exec` runs of one task.
const CODEX_RUNS: usize = 5;

/// What Claude Code is asked; the mock answers any task with text, so the run is one turn.
pub(crate) const CLAUDE_TASK: &str = "Say hello in one short sentence.";

/// Claude Code without telemetry, error reports, update checks, feature-flag fetches or other
/// nonessential traffic: the requests left are the ones its users' tasks make.
pub(crate) const CLAUDE_QUIET: [(&str, &str); 7] = [
    ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
    ("DISABLE_AUTOUPDATER", "1"),
    ("DISABLE_UPDATES", "1"),
    ("DISABLE_TELEMETRY", "1"),
    ("DISABLE_ERROR_REPORTING", "1"),
    ("DISABLE_GROWTHBOOK", "1"),
    ("DISABLE_INSTALLATION_CHECKS", "1"),
];

/// A test's own directories: HOME (and every client config dir under it) and a working
/// directory, both removed with the test.
pub(crate) struct Scratch {
    _dir: TempDir,
    pub(crate) home: PathBuf,
    pub(crate) work: PathBuf,
}

impl Scratch {
    pub(crate) fn new() -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let home = dir.path().join("home");
        let work = dir.path().join("work");
        for path in [&home, &work] {
            std::fs::create_dir_all(path).expect("creating a scratch directory");
        }
        Self {
            _dir: dir,
            home,
            work,
        }
    }
}

/// Whether corral answered the request with a success.
pub(crate) fn is_2xx(exchange: &Exchange) -> bool {
    (200..300).contains(&exchange.status)
}

/// A headless agent run that went well: every request it sent (`sent`
/// summarizes `exchanges`) was answered 2xx, it exited 0, and it printed
/// the provider's answer (`answer`).
pub(crate) fn assert_run_answered(
    client: &str,
    exchanges: &[Exchange],
    sent: &[String],
    finished: &run::Finished,
    answer: &str,
    context: &str,
) {
    let refused: Vec<&String> = exchanges
        .iter()
        .zip(sent)
        .filter(|(exchange, _)| !is_2xx(exchange))
        .map(|(_, summary)| summary)
        .collect();
    assert!(
        refused.is_empty(),
        "every request {client} sent is answered 2xx; refused: {refused:#?}\n{context}"
    );
    assert!(
        finished.status.success(),
        "{client} exited {}; {context}",
        finished.status
    );
    assert!(
        finished.stdout.contains(answer),
        "the mock's answer is printed; {context}"
    );
}

/// The fields in which each body differs from the first, by JSON path, with the values of the
/// first pair that differs there: what a keying change has to look at.
pub(crate) fn differing_fields(bodies: &[Value]) -> String {
    let mut paths = BTreeSet::new();
    let mut examples = Vec::new();
    for body in bodies.iter().skip(1) {
        for (path, values) in differences(&bodies[0], body) {
            if paths.insert(path.clone()) {
                examples.push(format!("{path}: {values}"));
            }
        }
    }
    if examples.is_empty() {
        return "(the bodies are identical)".to_owned();
    }
    examples.join("\n  ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_headless_completes_through_corral_and_every_request_is_answered() {
    let clients = NodeClients::get().await;
    let gateway = messages_gateway(|_| {}).await;
    let tap = Tap::start(&gateway.url).await;
    let scratch = Scratch::new();
    let finished = run(
        claude(clients, &scratch, &tap.url),
        CLIENT_TIMEOUT,
        "claude -p",
    )
    .await;

    let exchanges = tap.exchanges();
    let sent: Vec<String> = exchanges.iter().map(Exchange::summary).collect();
    let context = format!(
        "requests: {sent:#?}\nstdout: {}\nstderr: {}",
        finished.stdout, finished.stderr
    );
    eprintln!("claude -p sent: {}", describe(&exchanges));
    assert_run_answered(
        "Claude Code",
        &exchanges,
        &sent,
        &finished,
        "mock reply to ",
        &context,
    );
    let messages = tap.to("/v1/messages");
    assert!(!messages.is_empty(), "{context}");
    for message in &messages {
        let model = message.json()["model"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(model.starts_with("claude-"), "{model}; {context}");
    }
    // Each went upstream (none was answered from elsewhere); identical ones may have shared.
    let calls = gateway.provider.calls_to("/v1/messages");
    assert!(
        (1..=messages.len() as u64).contains(&calls),
        "{calls} upstream calls; {context}"
    );
}

/// `claude -p` of [`CLAUDE_TASK`] against `url` with Claude Code's own default model (no
/// `--model`), its configuration under the scratch HOME.
fn claude(clients: &NodeClients, scratch: &Scratch, url: &str) -> tokio::process::Command {
    let mut command = clean_command(clients.claude(), &scratch.home);
    command
        .args(["-p", CLAUDE_TASK])
        .current_dir(&scratch.work)
        .env("CLAUDE_CONFIG_DIR", scratch.home.join(".claude"))
        .env("ANTHROPIC_BASE_URL", url)
        .env("ANTHROPIC_API_KEY", "sk-ant-claude-code")
        .envs(CLAUDE_QUIET);
    command
}

/// Three terminals of one developer running one task at once: one upstream call. Their
/// requests differ only in the session id inside `metadata.user_id` (and a session header),
/// which corral does not key on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_claude_code_runs_of_one_task_are_one_upstream_call() {
    const RUNS: usize = 3;
    let clients = NodeClients::get().await;
    let gateway = messages_gateway(|_| {}).await;
    let tap = Tap::start(&gateway.url).await;
    let scratch = Scratch::new();
    gateway.provider.hold();
    let runs: Vec<_> = (0..RUNS)
        .map(|_| {
            let command = claude(clients, &scratch, &tap.url);
            tokio::spawn(run(command, CLIENT_TIMEOUT, "claude -p"))
        })
        .collect();
    gateway.wait_for_waiters(RUNS).await;
    gateway.provider.release();
    let mut answers = BTreeSet::new();
    for task in runs {
        let finished = task.await.expect("the run's task").success("claude -p");
        answers.insert(finished.stdout.trim().to_owned());
    }

    let sent = tap.to("/v1/messages");
    let bodies: Vec<Value> = sent.iter().map(Exchange::json).collect();
    let context = format!(
        "answers: {answers:#?}\nrequests: {:#?}\nthe runs' request bodies differ at:\n  {}",
        sent.iter().map(Exchange::summary).collect::<Vec<_>>(),
        differing_fields(&bodies)
    );
    assert_eq!(sent.len(), RUNS, "one request per run; {context}");
    assert!(sent.iter().all(is_2xx), "{context}");
    assert_eq!(
        gateway.provider.calls_to("/v1/messages"),
        1,
        "one upstream call for the three runs; {context}"
    );
    assert_eq!(
        answers.len(),
        1,
        "every run printed the same answer; {context}"
    );
}

/// Issue 38: Claude Code runs of one session through a two-member pool stay
/// on one member (its prompt cache stays warm), whichever member that is:
/// four tasks in one session (`--session-id`, then `--resume`), each call on
/// the member the session picked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_runs_of_one_session_stay_on_one_pool_member() {
    const SESSION: &str = "6f1d3c9e-5a41-4b8e-9c2d-0e7f3a1b2c4d";
    let clients = NodeClients::get().await;
    let members = [
        MockProvider::start(MockSettings::default()).await.unwrap(),
        MockProvider::start(MockSettings::default()).await.unwrap(),
    ];
    let gateway = messages_gateway(|config| {
        let anthropic = config.upstreams.last_mut().expect("the Anthropic upstream");
        anthropic.members = ["a", "b"]
            .iter()
            .zip(&members)
            .map(|(name, mock)| crate::pools::member(name, mock.base_url()))
            .collect();
    })
    .await;
    let tap = Tap::start(&gateway.url).await;
    let scratch = Scratch::new();
    // Four tasks of one session: spread by weight alone, they would land on
    // one member only one time in eight.
    for (task, session) in [
        (
            "Say hello in one short sentence.",
            ["--session-id", SESSION],
        ),
        (
            "Now say goodbye in one short sentence.",
            ["--resume", SESSION],
        ),
        (
            "Now say thanks in one short sentence.",
            ["--resume", SESSION],
        ),
        (
            "Now say welcome in one short sentence.",
            ["--resume", SESSION],
        ),
    ] {
        let mut command = clean_command(clients.claude(), &scratch.home);
        command
            .args(["-p", task])
            .args(session)
            .current_dir(&scratch.work)
            .env("CLAUDE_CONFIG_DIR", scratch.home.join(".claude"))
            .env("ANTHROPIC_BASE_URL", &tap.url)
            .env("ANTHROPIC_API_KEY", "sk-ant-claude-code")
            .envs(CLAUDE_QUIET);
        run(command, CLIENT_TIMEOUT, "claude -p")
            .await
            .success("claude -p");
    }
    let calls = members.each_ref().map(|mock| mock.calls_to("/v1/messages"));
    let context = format!(
        "calls by member {calls:?}; sent: {}",
        describe(&tap.exchanges())
    );
    assert!(
        calls.iter().sum::<u64>() >= 4,
        "every task went upstream; {context}"
    );
    assert!(
        calls.contains(&0),
        "every call of the session on one member; {context}"
    );
    assert_eq!(gateway.provider.calls_to("/v1/messages"), 0, "{context}");
}

/// `codex exec` of `prompt` with the scratch HOME, working directory and
/// `codex_home` (its `config.toml` names corral as the provider).
fn codex_exec(
    clients: &NodeClients,
    scratch: &Scratch,
    codex_home: &std::path::Path,
    prompt: &str,
) -> tokio::process::Command {
    let mut command = clean_command(clients.node(), &scratch.home);
    command
        .arg(clients.codex())
        .args([
            "exec",
            "--strict-config",
            "--skip-git-repo-check",
            "--ephemeral",
            "--color",
            "never",
            prompt,
        ])
        .current_dir(&scratch.work)
        .env("CODEX_HOME", codex_home)
        .env("CORRAL_TEST_KEY", "sk-codex-user");
    command
}

/// The shape of what a client sent, for the test log: path, model, stream, betas.
pub(crate) fn describe(exchanges: &[Exchange]) -> String {
    let lines: Vec<String> = exchanges
        .iter()
        .map(|exchange| {
            let body = exchange.json();
            let keys: Vec<&String> = body
                .as_object()
                .map(|o| o.keys().collect())
                .unwrap_or_default();
            format!(
                "{} model={} stream={} anthropic-beta={} keys={keys:?}",
                exchange.summary(),
                body["model"],
                body["stream"],
                exchange.header("anthropic-beta").unwrap_or("-"),
            )
        })
        .collect();
    lines.join("\n  ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_codex_exec_runs_of_one_task_are_one_upstream_call() {
    let clients = NodeClients::get().await;
    let gateway = TestGateway::start(|_| {}).await;
    let tap = Tap::start(&gateway.url).await;
    let scratch = Scratch::new();
    // One user's CODEX_HOME and one working directory, shared by the runs, as five terminals
    // of one developer would share them.
    let codex_home = scratch.home.join(".codex");
    std::fs::create_dir_all(&codex_home).unwrap();
    let template = std::fs::read_to_string(agents_dir().join("codex.config.toml")).unwrap();
    let config = template.replace("BASE_URL", &format!("{}/v1", tap.url));
    std::fs::write(codex_home.join("config.toml"), config).unwrap();
    let codex = |prompt: &'static str| {
        let command = codex_exec(clients, &scratch, &codex_home, prompt);
        tokio::spawn(run(command, CLIENT_TIMEOUT, "codex exec"))
    };

    // A first run installs Codex's own files (its system skills) in the fresh
    // CODEX_HOME, which the instructions of every later run name: warm it, as
    // a developer's CODEX_HOME is, so the five runs see one home.
    codex("Warm up: say ok.")
        .await
        .expect("the warm-up run's task")
        .success("codex exec (warm-up)");
    let warm_up_turns = tap.to("/v1/responses").len();
    let calls_before = gateway.provider.calls_to("/v1/responses");

    gateway.provider.hold();
    let runs: Vec<_> = (0..CODEX_RUNS)
        .map(|_| codex("Say hello in one short sentence."))
        .collect();
    gateway.wait_for_waiters(CODEX_RUNS).await;
    gateway.provider.release();
    let mut finished: Vec<Finished> = Vec::new();
    for task in runs {
        finished.push(task.await.expect("the run's task").success("codex exec"));
    }

    let turns = tap.to("/v1/responses").split_off(warm_up_turns);
    let sent: Vec<String> = turns.iter().map(Exchange::summary).collect();
    let bodies: Vec<Value> = turns.iter().map(Exchange::json).collect();
    let context = format!(
        "requests: {sent:#?}\nthe runs' request bodies differ at:\n  {}",
        differing_fields(&bodies)
    );
    assert_eq!(turns.len(), CODEX_RUNS, "one turn per run; {context}");
    assert!(turns.iter().all(is_2xx), "{context}");
    let answers: BTreeSet<&str> = finished.iter().map(|run| run.stdout.trim()).collect();
    let context = format!("answers: {answers:#?}\n{context}");
    assert_eq!(
        gateway.provider.calls_to("/v1/responses") - calls_before,
        1,
        "one upstream call for the one turn of five identical runs; {context}"
    );
    assert_eq!(
        answers.len(),
        1,
        "every run printed the same answer; {context}"
    );
    assert!(
        answers
            .iter()
            .all(|answer| answer.starts_with("mock response to ")),
        "{context}"
    );
}

/// Issue 38: `codex exec` through a two-member pool: each run's turns stay on
/// one member (Codex names its session in `prompt_cache_key`), and a
/// WebSocket dial of `/v1/responses`, if the run makes one, is answered 426
/// once (so Codex goes on over HTTP at once, with no reconnect attempts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_exec_runs_stay_on_one_pool_member_over_http() {
    let clients = NodeClients::get().await;
    let members = [
        MockProvider::start(MockSettings::default()).await.unwrap(),
        MockProvider::start(MockSettings::default()).await.unwrap(),
    ];
    let gateway = TestGateway::start(|config| {
        config.upstreams[0].members = ["a", "b"]
            .iter()
            .zip(&members)
            .map(|(name, mock)| crate::pools::member(name, mock.base_url()))
            .collect();
    })
    .await;
    let tap = Tap::start(&gateway.url).await;
    let scratch = Scratch::new();
    let codex_home = scratch.home.join(".codex");
    std::fs::create_dir_all(&codex_home).unwrap();
    let template = std::fs::read_to_string(agents_dir().join("codex.config.toml")).unwrap();
    // A provider that says it takes Responses over a WebSocket, as OpenAI's
    // own does: Codex dials it first.
    let config = template
        .replace("BASE_URL", &format!("{}/v1", tap.url))
        .replace(
            "wire_api = \"responses\"",
            "wire_api = \"responses\"\nsupports_websockets = true",
        )
        + "\n[features]\nresponses_websockets = true\n";
    std::fs::write(codex_home.join("config.toml"), config).unwrap();
    for prompt in [
        "Say hello in one short sentence.",
        "Say goodbye in one short sentence.",
        "Say thanks in one short sentence.",
    ] {
        let before = members
            .each_ref()
            .map(|mock| mock.calls_to("/v1/responses"));
        let command = codex_exec(clients, &scratch, &codex_home, prompt);
        run(command, CLIENT_TIMEOUT, "codex exec")
            .await
            .success("codex exec");
        let after = members
            .each_ref()
            .map(|mock| mock.calls_to("/v1/responses"));
        let turns = [after[0] - before[0], after[1] - before[1]];
        let context = format!(
            "turns by member {turns:?}; sent: {}",
            describe(&tap.exchanges())
        );
        assert!(
            turns.iter().sum::<u64>() >= 1,
            "the run went upstream; {context}"
        );
        assert!(
            turns.contains(&0),
            "the run's turns on one member; {context}"
        );
    }
    let dials: Vec<Exchange> = tap
        .to("/v1/responses")
        .into_iter()
        .filter(|exchange| exchange.method == "GET")
        .collect();
    let context = format!(
        "dials: {:?}",
        dials.iter().map(Exchange::summary).collect::<Vec<_>>()
    );
    assert_eq!(dials.len(), 3, "one dial per run, no reconnects; {context}");
    assert!(
        dials.iter().all(|dial| dial.summary().contains("426")),
        "every dial answered 426; {context}"
    );
    assert_eq!(gateway.provider.calls(), 0, "the pool's members answered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_sdk_runs_for_two_users_share_each_step() {
    let python = PythonClients::get().await;
    // The SDK sends no temperature: its calls are sampled. Stored anyway here, so a second
    // run's step that arrives after the first's finished is served too, not called again.
    let gateway = TestGateway::start(|config| config.cache.sampled = true).await;
    let tap = Tap::start(&gateway.url).await;
    let scratch = Scratch::new();
    let mut command = python.command(&scratch.home);
    command
        .arg(agents_dir().join("agents_sdk.py"))
        .arg(format!("{}/v1", tap.url))
        .current_dir(&scratch.work);

    // Both runs' first steps wait on the held provider before either is answered.
    gateway.provider.hold();
    let script = tokio::spawn(run(command, CLIENT_TIMEOUT, "agents_sdk.py"));
    gateway.wait_for_waiters(2).await;
    gateway.provider.release();
    let finished = script
        .await
        .expect("the script's task")
        .success("agents_sdk.py");
    let results = finished.json();

    let steps = tap.to("/v1/responses");
    let (answers, calls): (Vec<Value>, Vec<Value>) =
        steps.iter().map(Exchange::json).partition(has_tool_output);
    let context = format!(
        "results: {results}\nrequests: {:#?}\nfirst steps differ at:\n  {}\nsecond steps differ at:\n  {}\nstderr: {}",
        steps.iter().map(Exchange::summary).collect::<Vec<_>>(),
        differing_fields(&calls),
        differing_fields(&answers),
        finished.stderr
    );
    assert!(steps.iter().all(is_2xx), "{context}");
    let runs = results["runs"].as_array().expect("two runs");
    assert_eq!(runs.len(), 2, "{context}");
    for run in runs {
        assert_eq!(
            run["items"],
            json!([
                "tool_call_item",
                "tool_call_output_item",
                "message_output_item"
            ]),
            "the tool was called, then the model answered; {context}"
        );
        assert_eq!(run["steps"], 2, "{context}");
    }
    assert_eq!(results["tool_calls"], 2, "each run ran the tool; {context}");
    assert_eq!(
        gateway.provider.calls_to("/v1/responses"),
        2,
        "one upstream call per step; {context}"
    );
    let finals: BTreeSet<String> = runs.iter().map(|run| run["final"].to_string()).collect();
    assert_eq!(finals.len(), 1, "both runs end on one answer; {context}");
    assert!(
        runs[0]["final"]
            .as_str()
            .is_some_and(|text| !text.is_empty())
    );
    let upstream = gateway.provider.requests();
    let first = upstream[0].json().unwrap_or_default();
    assert_eq!(first["tool_choice"], "required", "{context}");
    assert!(
        has_tool_output(&upstream[1].json().unwrap_or_default()),
        "{context}"
    );
}

/// Whether a Responses request carries a tool's output (a run's second step).
fn has_tool_output(body: &Value) -> bool {
    body["input"].as_array().is_some_and(|items| {
        items
            .iter()
            .any(|item| item["type"] == "function_call_output")
    })
}

/// Runs one phase of `tests/agents/ai_sdk.mjs` against `url`, from a working directory whose
/// `node_modules` is the cached install (Node resolves an ES module's imports from where the
/// module is, not from NODE_PATH).
async fn ai_sdk(clients: &NodeClients, url: &str, phase: &str) -> (Value, Finished) {
    let scratch = Scratch::new();
    std::os::unix::fs::symlink(clients.modules(), scratch.work.join("node_modules")).unwrap();
    let script = scratch.work.join("ai_sdk.mjs");
    std::fs::copy(agents_dir().join("ai_sdk.mjs"), &script).unwrap();
    let mut command = clean_command(clients.node(), &scratch.home);
    command
        .arg(&script)
        .args([url, phase])
        .current_dir(&scratch.work);
    let finished = run(command, CLIENT_TIMEOUT, "ai_sdk.mjs")
        .await
        .success(&format!("ai_sdk.mjs {phase}"));
    (finished.json(), finished)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ai_sdk_stream_and_generate_of_one_anthropic_tool_prompt_are_one_call() {
    let clients = NodeClients::get().await;
    let gateway = messages_gateway(|_| {}).await;
    let tap = Tap::start(&gateway.url).await;
    gateway.provider.hold();
    let url = tap.url.clone();
    let script = tokio::spawn(async move { ai_sdk(clients, &url, "anthropic-tools").await });
    gateway.wait_for_waiters(2).await;
    gateway.provider.release();
    let (results, _) = script.await.expect("the script's task");

    let sent = tap.to("/v1/messages");
    let bodies: Vec<Value> = sent.iter().map(Exchange::json).collect();
    let context = format!(
        "results: {results}\nrequests: {:#?}\nthe two bodies differ at:\n  {}",
        sent.iter().map(Exchange::summary).collect::<Vec<_>>(),
        differing_fields(&bodies)
    );
    assert_eq!(sent.len(), 2, "{context}");
    assert!(sent.iter().all(is_2xx), "{context}");
    assert!(
        results["generate"]
            .as_str()
            .is_some_and(|text| !text.is_empty()),
        "{context}"
    );
    assert_eq!(results["stream"], results["generate"], "{context}");
    assert_eq!(
        gateway.provider.calls_to("/v1/messages"),
        1,
        "a streamed and a plain caller of one prompt share one call; {context}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ai_sdk_against_a_rate_limited_provider_makes_few_attempts_and_raises_its_retry_error() {
    let clients = NodeClients::get().await;
    let provider = MockProvider::start(MockSettings {
        failure: Some(FailureMode::always(429).with_retry_after(Duration::from_secs(1))),
        ..MockSettings::default()
    })
    .await
    .expect("mock provider starts");
    // corral's shipped retry policy, not the tests' quick one: the attempts an operator's
    // provider would see.
    let gateway =
        TestGateway::start_with(provider, |config| config.retry = RetryConfig::default()).await;
    let tap = Tap::start(&gateway.url).await;
    let (results, _) = ai_sdk(clients, &tap.url, "openai-429").await;

    let sent = tap.to("/v1/responses");
    let context = format!(
        "results: {results}\nrequests: {:#?}\nprovider saw: {:?}",
        sent.iter().map(Exchange::summary).collect::<Vec<_>>(),
        gateway.provider.received()
    );
    // The SDK's default maxRetries is 2: three attempts, each answered 429, then its RetryError.
    assert_eq!(results["error"], "AI_RetryError", "{context}");
    assert_eq!(results["retry_error"], true, "{context}");
    assert_eq!(results["reason"], "maxRetriesExceeded", "{context}");
    assert_eq!(results["last_status"], 429, "{context}");
    let attempt = json!({"api_call_error": true, "status": 429, "retryable": true});
    assert_eq!(
        results["attempts"],
        json!([attempt, attempt, attempt]),
        "{context}"
    );
    assert_eq!(sent.len(), 3, "{context}");
    assert!(
        sent.iter().all(|exchange| exchange.status == 429),
        "{context}"
    );
    // corral's retries and the SDK's must not multiply: at most 5 provider attempts in all.
    let attempts = gateway.provider.calls();
    assert!(
        (1..=5).contains(&attempts),
        "{attempts} provider attempts for one SDK call; {context}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ai_sdk_openai_provider_generates_and_streams_through_corral() {
    let clients = NodeClients::get().await;
    let gateway = TestGateway::start(|_| {}).await;
    let (results, finished) = ai_sdk(clients, &gateway.url, "openai-plain").await;
    let context = format!("results: {results}\nstderr: {}", finished.stderr);
    assert!(
        results["generate"]
            .as_str()
            .is_some_and(|text| text.starts_with("mock response to ")),
        "{context}"
    );
    assert_eq!(results["stream"], results["generate"], "{context}");
    // The stream of the same deterministic prompt is the stored answer, replayed as events.
    assert_eq!(gateway.provider.calls_to("/v1/responses"), 1, "{context}");
}
