//! Google's Gemini CLI headless (`gemini -p`) against corral, pointed there as its users point
//! it at a gateway: `GOOGLE_GEMINI_BASE_URL` (corral's root; the CLI's SDK adds
//! `/v1beta/models/...`) and the key in `GEMINI_API_KEY`, which it sends as `x-goog-api-key`.
//! corral relays it to its one upstream, `api: gemini` at the mock's `/v1beta`.
//!
//! The CLI is one of the agent clients of `tests/agents` (installed as `agents.rs` says), run by
//! their Node 22. What a headless run of the pinned version (0.61.0) needs to be
//! non-interactive and to stay on loopback:
//! - `security.auth.selectedType: "gemini-api-key"` in `~/.gemini/settings.json`. With
//!   `GOOGLE_GEMINI_BASE_URL` set and no type chosen, the CLI infers its `gateway` type, which
//!   its own headless check then refuses ("Invalid auth method selected.", exit 41).
//! - `privacy.usageStatisticsEnabled: false`: otherwise it sends usage statistics to Google
//!   (Clearcut, at play.googleapis.com) from every run. Telemetry (off by default), auto-update
//!   and IDE integration are switched off too, so no default change reaches out either.
//! - `GEMINI_CLI_TRUST_WORKSPACE=true`: a folder not trusted is refused headless (exit 55).
//! - `GEMINI_CLI_NO_RELAUNCH=true`: otherwise it runs itself again in a child Node with a
//!   larger heap, which the kill of a run past its time would leave behind.
//!
//! With these and an explicit `--model` (without one it first asks a classifier model, by a
//! `:generateContent` call, which model to use), a one-turn task is one request:
//! `POST /v1beta/models/{model}:streamGenerateContent?alt=sse`. The CLI reads the stream's
//! `data:` events (`candidates[0].content.parts[].text`, `usageMetadata` if present) and
//! needs a `finishReason` on some chunk: a stream without one, or without answer text, it
//! retries (up to four requests, exiting 0 all the same), hence the count of streams below.

use std::{path::Path, time::Duration};

use corral::config::{Api, Config};
use serde_json::json;

use crate::{
    agents::{
        assert_run_answered,
        install::NodeClients,
        run::{clean_command, run},
        tap::{Exchange, Tap},
    },
    harness::TestGateway,
};

/// One client run against loopback: seconds when healthy; finite, so a CLI stuck on something
/// it cannot reach (an auth dialog, a host it may not reach) fails the test.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);

/// The model asked for, one the mock serves; explicit, so no routing call precedes the turn.
const MODEL: &str = "gemini-2.5-flash";

/// What the CLI is asked; the mock answers any task with text, so the run is one turn.
const TASK: &str = "Say hi";

/// The user's Gemini key: corral has none of its own for the upstream, so it is passed on.
const KEY: &str = "AIza-gemini-cli-user";

/// The CLI without a relaunch, with its scratch working directory trusted.
const GEMINI_QUIET: [(&str, &str); 2] = [
    ("GEMINI_CLI_NO_RELAUNCH", "true"),
    ("GEMINI_CLI_TRUST_WORKSPACE", "true"),
];

/// corral's one upstream: `api: gemini` at the mock's `/v1beta`, for `gemini-*`.
fn gemini_only(config: &mut Config) {
    let upstream = &mut config.upstreams[0];
    upstream.name = "gemini".into();
    upstream.api = Api::Gemini;
    upstream.base_url = format!("{}beta", upstream.base_url.trim_end_matches('/'));
    upstream.models = vec!["gemini-*".into()];
    upstream.api_key = None;
}

/// `~/.gemini/settings.json` under `home`: the API-key auth type, and no usage statistics,
/// telemetry, auto-update or IDE integration.
fn write_settings(home: &Path) {
    let dir = home.join(".gemini");
    std::fs::create_dir_all(&dir).expect("creating ~/.gemini");
    let settings = json!({
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "privacy": {"usageStatisticsEnabled": false},
        "telemetry": {"enabled": false},
        "general": {"enableAutoUpdate": false, "enableAutoUpdateNotification": false},
        "ide": {"enabled": false},
    });
    std::fs::write(dir.join("settings.json"), settings.to_string())
        .expect("writing ~/.gemini/settings.json");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_cli_headless_run_completes_through_corral() {
    let clients = NodeClients::get().await;
    let gemini = clients.gemini();
    let gateway = TestGateway::start(gemini_only).await;
    let tap = Tap::start(&gateway.url).await;
    let scratch = tempfile::tempdir().expect("a temporary directory");
    let home = scratch.path().join("home");
    let work = scratch.path().join("work");
    for dir in [&home, &work] {
        std::fs::create_dir_all(dir).expect("creating a scratch directory");
    }
    write_settings(&home);

    let mut command = clean_command(clients.node(), &home);
    command
        .arg(&gemini)
        .args(["-p", TASK, "--model", MODEL])
        .current_dir(&work)
        .env("GOOGLE_GEMINI_BASE_URL", &tap.url)
        .env("GEMINI_API_KEY", KEY)
        .envs(GEMINI_QUIET);
    let finished = run(command, CLIENT_TIMEOUT, "gemini -p").await;

    let exchanges = tap.exchanges();
    let sent: Vec<String> = exchanges.iter().map(Exchange::summary).collect();
    let context = format!(
        "requests: {sent:#?}\nprovider saw: {:?}\nstdout: {}\nstderr: {}",
        gateway.provider.received(),
        finished.stdout,
        finished.stderr
    );
    eprintln!("gemini -p sent: {sent:#?}");
    assert_run_answered(
        "the Gemini CLI",
        &exchanges,
        &sent,
        &finished,
        "mock gemini answer",
        &context,
    );

    // One turn, one stream: a second would be the CLI retrying a stream it found incomplete.
    let streams = tap.to(&format!("/v1beta/models/{MODEL}:streamGenerateContent"));
    assert_eq!(streams.len(), 1, "{context}");
    let prefix = format!("/v1beta/models/{MODEL}:");
    for exchange in &exchanges {
        assert!(
            exchange.target.starts_with(&prefix),
            "only the model's own methods: {}; {context}",
            exchange.summary()
        );
        assert_eq!(exchange.header("x-goog-api-key"), Some(KEY), "{context}");
    }
    // The turn went upstream once, the caller's key in Gemini's header and nowhere else.
    let (keys, leaked) = crate::gemini::keys_seen(&gateway);
    assert_eq!(
        keys,
        [KEY],
        "one call, the key in x-goog-api-key; {context}"
    );
    assert!(!leaked, "no authorization, no key in the query; {context}");
    crate::gemini::assert_only_gemini_reached(&gateway.provider);
}
