//! The edges (issue #11): a pass-through confined to the provider's API and
//! to the endpoints its policy allows, one Content-Type on proxied requests,
//! multipart routed by its `model`, one merged model list, tenants that cannot
//! open the shared circuit or poison the negative cache with a key error, no
//! retries multiplied by the SDK's, and a binary that refuses to be an open
//! relay but starts beside Kubernetes' service variables.

use std::{path::Path, time::Duration};

use corral::{breaker::BreakerState, config::Secret, tenant::key_hash};
use mock_upstream::{FailureMode, MockProvider, MockSettings, Scripted};
use reqwest::StatusCode;
use serde_json::Value;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use crate::{
    harness::{TestGateway, WAIT, chat},
    redis_server::RedisServer,
    sdk::{Python, run},
    shutdown::CorralProcess,
};

/// Sends `request_line` as written (no client normalises it) and returns the status.
async fn raw_status(url: &str, method: &str, path: &str) -> u16 {
    let address = url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).await.expect("corral accepts");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    tokio::time::timeout(WAIT, stream.read_to_end(&mut response))
        .await
        .expect("corral answers")
        .expect("the response is readable");
    let text = String::from_utf8_lossy(&response);
    text.split_whitespace()
        .nth(1)
        .and_then(|status| status.parse().ok())
        .unwrap_or_else(|| panic!("no status line for {path}: {text}"))
}

#[tokio::test]
async fn every_traversal_form_is_refused_and_nothing_reaches_the_provider() {
    // corral holds the provider key, so an escape would spend it anywhere.
    let gateway = TestGateway::start(|config| {
        config.upstreams[0].api_key = Some(Secret::new("sk-corral".into()));
    })
    .await;
    for path in [
        "/v1/../admin/x",
        "/v1/%2e%2e/admin/x",
        "/v1/%2E%2E/admin/x",
        "/v1/..%2fadmin",
        "/v1/..%2Fadmin",
        "/v1/%252e%252e/admin",
        "/v1/..%5cadmin",
        "/v1/..\\admin",
        "/v1//evil.example/x",
        "/v1/models/../../admin",
    ] {
        for method in ["GET", "POST", "DELETE"] {
            let status = raw_status(&gateway.url, method, path).await;
            assert_eq!(status, 400, "{method} {path}");
        }
    }
    assert_eq!(
        gateway.provider.received(),
        Vec::<String>::new(),
        "nothing reached the provider"
    );
    // A plain path still goes through (so the count above could have moved).
    assert_eq!(
        raw_status(&gateway.url, "GET", "/v1/models/gpt-4o").await,
        200,
        "the mock received it"
    );
    assert_eq!(gateway.provider.received(), ["GET /v1/models/gpt-4o"]);
}

#[tokio::test]
async fn the_refusal_is_an_openai_error() {
    let gateway = TestGateway::start(|_| {}).await;
    // (reqwest itself would resolve `%2e%2e`; an encoded slash it keeps.)
    let reply = gateway.get("/v1/..%2fadmin").await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.json()["error"]["code"], "invalid_path");
    assert_eq!(reply.json()["error"]["type"], "invalid_request_error");
}

fn with_shared_key(config: &mut corral::Config) {
    config.upstreams[0].api_key = Some(Secret::new("sk-corral".into()));
    config.auth.key_hashes = vec![key_hash(b"gw-1")];
}

async fn post_file(gateway: &TestGateway) -> crate::harness::Reply {
    gateway
        .post_with(
            "/v1/files",
            &serde_json::json!({"purpose": "batch"}),
            &[("authorization", "Bearer gw-1")],
        )
        .await
}

#[tokio::test]
async fn files_are_refused_with_a_shared_key_until_the_policy_allows_them() {
    let gateway = TestGateway::start(with_shared_key).await;
    let refused = post_file(&gateway).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    let error = &refused.json()["error"];
    assert_eq!(error["code"], "passthrough_denied");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("passthrough.allow"),
        "{error}"
    );
    assert_eq!(gateway.provider.received(), Vec::<String>::new());
    // Stateless endpoints pass by default.
    let models = gateway
        .client
        .get(format!("{}/v1/models", gateway.url))
        .bearer_auth("gw-1")
        .send()
        .await
        .unwrap();
    assert_eq!(models.status(), StatusCode::OK);

    let allowed = TestGateway::start(|config| {
        with_shared_key(config);
        config.passthrough.allow = vec![corral::config::PassRule::parse("POST /v1/files").unwrap()];
    })
    .await;
    let reply = post_file(&allowed).await;
    assert_eq!(reply.status, StatusCode::OK, "the mock's own file object");
    assert_eq!(allowed.provider.received(), ["POST /v1/files"]);
}

/// One way in: every `/v1/*` request is the pipeline's, and no router
/// answers for it. A `GET` on a deduplicated endpoint's path (OpenAI lists
/// stored chat completions there) is the pass-through's, under its policy:
/// refused while corral's own key makes the account every tenant's, relayed
/// when the caller's key is its own. Neither is a cached answer.
#[tokio::test]
async fn a_get_on_a_deduplicated_path_is_the_pass_throughs_under_its_policy() {
    let shared = TestGateway::start(with_shared_key).await;
    let refused = shared
        .client
        .get(format!("{}/v1/chat/completions", shared.url))
        .bearer_auth("gw-1")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    assert!(refused.headers().get("x-corral-cache").is_none());
    let error: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(error["error"]["code"], "passthrough_denied", "{error}");
    assert_eq!(shared.provider.received(), Vec::<String>::new());

    let own = TestGateway::start(|_| {}).await;
    let relayed = own.get("/v1/chat/completions").await;
    assert!(relayed.headers.get("x-corral-cache").is_none());
    assert!(relayed.headers.get("x-request-id").is_some());
    assert_eq!(own.provider.received(), ["GET /v1/chat/completions"]);
}

/// Rules match what the provider makes of a path: a percent-encoded
/// `/v1/%66iles` is `/v1/files` to a deny rule, as it is to the provider.
#[tokio::test]
async fn policy_rules_see_the_decoded_path() {
    let gateway = TestGateway::start(|config| {
        config.passthrough.deny = vec![corral::config::PassRule::parse("GET /v1/files*").unwrap()];
    })
    .await;
    for path in [
        "/v1/files",
        "/v1/%66iles",
        "/v1/%66%69les/file-1",
        "/v1/FILES",
    ] {
        let reply = gateway.get(path).await;
        let expected = if path == "/v1/FILES" {
            StatusCode::NOT_FOUND // another path, the mock's own answer
        } else {
            StatusCode::FORBIDDEN
        };
        assert_eq!(reply.status, expected, "{path}");
    }
    assert_eq!(gateway.provider.received(), ["GET /v1/FILES"]);
}

/// Under corral's own provider key the account is every tenant's: a
/// pass-through relays none of its organization, project or rate-limit
/// headers. A caller's own key is its own account: they are relayed.
#[tokio::test]
async fn the_shared_accounts_headers_reach_no_tenant() {
    let shared = TestGateway::start(with_shared_key).await;
    let own = TestGateway::start(|_| {}).await;
    for (gateway, auth, relayed) in [
        (&shared, "Bearer gw-1", false),
        (&own, "Bearer sk-own", true),
    ] {
        for path in ["/v1/models/gpt-4o-mini", "/v1/models/gpt-4o"] {
            let reply = gateway
                .client
                .get(format!("{}{path}", gateway.url))
                .header("authorization", auth)
                .send()
                .await
                .unwrap();
            for name in ["openai-organization", "x-ratelimit-remaining-requests"] {
                assert_eq!(
                    reply.headers().contains_key(name),
                    relayed,
                    "{path} {name} with {auth}"
                );
            }
        }
    }
}

/// A second mock behind a second upstream that serves `models`.
fn add_upstream(config: &mut corral::Config, provider: &MockProvider, models: &[&str]) {
    let mut second = config.upstreams[0].clone();
    second.name = "second".into();
    second.base_url = provider.base_url();
    second.models = models.iter().map(|m| (*m).to_owned()).collect();
    config.upstreams.push(second);
}

async fn mock_listing(models: &[&str]) -> MockProvider {
    MockProvider::start(MockSettings {
        models: Some(models.iter().map(|m| (*m).to_owned()).collect()),
        ..MockSettings::default()
    })
    .await
    .expect("mock starts")
}

#[tokio::test]
async fn a_multipart_upload_keeps_one_content_type_and_goes_where_its_model_routes() {
    let whisper = mock_listing(&["whisper-1"]).await;
    let gateway = TestGateway::start(|config| {
        config.upstreams[0].models = vec!["gpt-*".into()];
        add_upstream(config, &whisper, &["whisper-*"]);
    })
    .await;
    let boundary = "corral-test-boundary-7d1e";
    let content_type = format!("multipart/form-data; boundary={boundary}");
    let audio: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
    let mut body = Vec::new();
    body.extend_from_slice(
        format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\n").as_bytes(),
    );
    body.extend_from_slice(&audio);
    body.extend_from_slice(
        format!("\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n--{boundary}--\r\n").as_bytes(),
    );
    let response = gateway
        .client
        .post(format!("{}/v1/audio/transcriptions", gateway.url))
        .header("content-type", &content_type)
        .bearer_auth("sk-caller")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let answer: Value = response.json().await.unwrap();
    assert!(answer["text"].as_str().unwrap().contains("byte upload"));
    assert_eq!(gateway.provider.received(), Vec::<String>::new());
    let requests = whisper.requests();
    assert_eq!(requests.len(), 1);
    let received = &requests[0];
    assert_eq!(received.path, "/v1/audio/transcriptions");
    let content_types: Vec<&str> = received
        .headers
        .iter()
        .filter(|(name, _)| name == "content-type")
        .map(|(_, value)| value.as_str())
        .collect();
    assert_eq!(content_types, [content_type.as_str()]);
    assert_eq!(received.body, body, "the form arrives byte for byte");
}

#[tokio::test]
async fn the_model_list_merges_every_upstream() {
    let first = mock_listing(&["gpt-4o", "gpt-4o-mini", "claude-3-haiku"]).await;
    let second = mock_listing(&["claude-3-haiku", "claude-3-5-sonnet"]).await;
    let gateway = TestGateway::start_with(first, |config| {
        config.upstreams[0].models = vec!["gpt-*".into()];
        add_upstream(config, &second, &["claude-*"]);
    })
    .await;
    let reply = gateway.get("/v1/models").await;
    assert_eq!(reply.status, StatusCode::OK);
    let list = reply.json();
    assert_eq!(list["object"], "list");
    let mut ids: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|model| model["id"].as_str().unwrap())
        .collect();
    ids.sort_unstable();
    // claude-3-haiku once: corral routes it to the second upstream only.
    assert_eq!(
        ids,
        [
            "claude-3-5-sonnet",
            "claude-3-haiku",
            "gpt-4o",
            "gpt-4o-mini"
        ]
    );
    assert!(
        list["data"]
            .as_array()
            .unwrap()
            .iter()
            .all(|model| model["owned_by"] == "mock")
    );
    // One model's details come from the upstream that routes it.
    gateway.get("/v1/models/claude-3-5-sonnet").await;
    assert_eq!(
        second.received().last().map(String::as_str),
        Some("GET /v1/models/claude-3-5-sonnet")
    );
    assert!(
        !gateway
            .provider
            .received()
            .iter()
            .any(|line| line.contains("claude-3-5-sonnet"))
    );
}

fn error_body(code: &str) -> String {
    format!(r#"{{"error":{{"message":"scripted","type":"{code}","param":null,"code":"{code}"}}}}"#)
}

#[tokio::test]
async fn one_tenants_key_errors_never_open_the_circuit_for_another() {
    let gateway = TestGateway::start(|config| {
        config.upstreams[0].breaker_failures = 5;
        config.retry.max_attempts = 1;
    })
    .await;
    let mut scripted = Vec::new();
    for _ in 0..20 {
        scripted.push((429, "insufficient_quota"));
    }
    for status in [401, 403, 404] {
        for _ in 0..5 {
            scripted.push((status, "scripted"));
        }
    }
    for (i, (status, code)) in scripted.iter().enumerate() {
        gateway
            .provider
            .push_script(Scripted::json(*status, error_body(code)));
        let reply = gateway
            .post_with(
                "/v1/chat/completions",
                &chat(&format!("tenant a, call {i}")),
                &[("authorization", "Bearer sk-tenant-a")],
            )
            .await;
        assert_eq!(reply.status.as_u16(), *status, "call {i}");
    }
    assert_eq!(gateway.state.upstream().circuit(0), BreakerState::Closed);
    let b = gateway
        .post_with(
            "/v1/chat/completions",
            &chat("tenant b"),
            &[("authorization", "Bearer sk-tenant-b")],
        )
        .await;
    assert_eq!(b.status, StatusCode::OK, "{:?}", b.body);
    // What says the provider is sick still opens it.
    for i in 0..5 {
        gateway
            .provider
            .push_script(Scripted::json(503, error_body("overloaded")));
        gateway
            .post("/v1/chat/completions", &chat(&format!("provider down {i}")))
            .await;
    }
    assert_eq!(gateway.state.upstream().circuit(0), BreakerState::Open);
}

#[tokio::test]
async fn a_key_error_is_never_negatively_cached() {
    let redis = RedisServer::spawn().await;
    let gateway = TestGateway::start(|config| {
        config.redis = Some(crate::harness::redis_at(&redis.url()));
        config.cache.error_ttl = Duration::from_secs(60);
        config.retry.max_attempts = 1;
    })
    .await;
    gateway.wait_connected().await;
    let key = [("authorization", "Bearer sk-new-key")];
    for status in [401, 403] {
        let body = chat(&format!("a key that becomes valid ({status})"));
        gateway
            .provider
            .push_script(Scripted::json(status, error_body("invalid_api_key")));
        let refused = gateway.post_with("/v1/chat/completions", &body, &key).await;
        assert_eq!(refused.status.as_u16(), status);
        // The key works now: the next request asks the provider again.
        let calls = gateway.provider.calls();
        let accepted = gateway.post_with("/v1/chat/completions", &body, &key).await;
        assert_eq!(accepted.status, StatusCode::OK, "{status}");
        assert_eq!(gateway.provider.calls(), calls + 1);
    }
    // A provider failure is still remembered for error_ttl.
    let body = chat("the provider is down");
    gateway
        .provider
        .push_script(Scripted::json(500, error_body("server_error")));
    let failed = gateway.post_with("/v1/chat/completions", &body, &key).await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    let calls = gateway.provider.calls();
    let remembered = gateway.post_with("/v1/chat/completions", &body, &key).await;
    assert_eq!(remembered.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(gateway.provider.calls(), calls, "negatively cached");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_retries_multiply_nothing() {
    let python = Python::with_openai().await;
    let provider = MockProvider::start(MockSettings {
        failure: Some(FailureMode::always(429).with_retry_after(Duration::from_secs(1))),
        ..MockSettings::default()
    })
    .await
    .unwrap();
    let max_attempts = 3;
    let gateway =
        TestGateway::start_with(provider, |config| config.retry.max_attempts = max_attempts).await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/openai_retry.py");
    let mut command = python.command();
    command
        .arg(&script)
        .arg(format!("{}/v1", gateway.url))
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost");
    let output = run(command, Duration::from_secs(120), "the SDK retry script").await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let result: Value = stdout
        .lines()
        .rev()
        .find_map(|line| serde_json::from_str(line).ok())
        .unwrap_or_else(|| panic!("no JSON line: {stdout}\n{stderr}"));
    assert_eq!(result["error"], "RateLimitError", "{result}");
    assert_eq!(
        gateway.provider.calls(),
        max_attempts as u64,
        "corral's attempts, not multiplied by the SDK's: {result}"
    );
    assert_eq!(result["x_should_retry"], "false", "{result}");
    assert_eq!(result["retry_after"], "1", "the provider's Retry-After");
}

/// The binary on `yaml` with `env`; it must exit. Its exit code and stderr.
async fn failed_start(yaml: &str, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, yaml).unwrap();
    let mut command = crate::shutdown::corral_command(&path, env);
    command.env("RUST_BACKTRACE", "1");
    let output = tokio::time::timeout(WAIT, command.output())
        .await
        .expect("corral exits instead of serving")
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_binary_refuses_an_open_relay_in_one_line_and_starts_when_told_to() {
    let provider = MockProvider::start(MockSettings::default()).await.unwrap();
    let yaml = format!(
        "listen: 0.0.0.0:0\nupstreams:\n  - {{name: mock, base_url: '{}', api_key_env: PROVIDER_KEY}}\n",
        provider.base_url()
    );
    let (code, stderr) = failed_start(&yaml, &[("PROVIDER_KEY", "sk-corral")]).await;
    assert_eq!(code, Some(1), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one clear line, no backtrace: {stderr}");
    assert!(lines[0].starts_with("corral: "), "{stderr}");
    assert!(lines[0].contains("auth.allow_anonymous"), "{stderr}");
    assert!(lines[0].contains("open relay"), "{stderr}");

    let allowed = format!("{yaml}auth:\n  allow_anonymous: true\n");
    let corral = CorralProcess::start(&allowed, &[("PROVIDER_KEY", "sk-corral")]).await;
    let reply = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", corral.url))
        .json(&chat("anonymous on purpose"))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), StatusCode::OK);
}

#[tokio::test]
async fn the_binary_starts_beside_kubernetes_service_variables() {
    let provider = MockProvider::start(MockSettings::default()).await.unwrap();
    let yaml = format!(
        "listen: 127.0.0.1:0\nupstreams:\n  - {{name: mock, base_url: '{}'}}\n",
        provider.base_url()
    );
    let corral = CorralProcess::start(
        &yaml,
        &[
            ("CORRAL_PORT", "tcp://10.0.0.1:8080"),
            ("CORRAL_PORT_8080_TCP", "tcp://10.0.0.1:8080"),
            ("CORRAL_SERVICE_HOST", "10.0.0.1"),
            ("CORRAL_SERVICE_PORT", "8080"),
            ("CORRAL_BIN", "x"),
            // A documented key still overrides.
            ("CORRAL_CACHE__SOFT_TTL", "42s"),
        ],
    )
    .await;
    let reply = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", corral.url))
        .json(&chat("beside kubernetes"))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), StatusCode::OK);
    for variable in ["CORRAL_PORT", "CORRAL_SERVICE_HOST", "CORRAL_BIN"] {
        let needle = format!("ignoring environment variable {variable}:");
        corral.wait_for_log(&needle).await;
        let logs = corral.logs();
        let line = logs.lines().find(|line| line.contains(&needle)).unwrap();
        assert!(line.contains("WARN"), "{line}");
    }
    assert_eq!(
        corral
            .logs()
            .matches("ignoring environment variable CORRAL_PORT:")
            .count(),
        1,
        "one line per variable"
    );
}

#[tokio::test]
async fn a_provider_redirect_is_relayed_not_followed() {
    let gateway = TestGateway::start(|config| {
        config.upstreams[0].api_key = Some(Secret::new("sk-corral".into()));
        config.retry.max_attempts = 1;
    })
    .await;
    let mut redirect = Scripted::json(307, "{}");
    let elsewhere = format!("{}/models", gateway.provider.base_url());
    redirect.headers.push(("location".into(), elsewhere));
    gateway.provider.push_script(redirect);
    let reply = gateway
        .post("/v1/chat/completions", &chat("go elsewhere"))
        .await;
    assert_eq!(reply.status, StatusCode::TEMPORARY_REDIRECT);
    assert_eq!(
        gateway.provider.received(),
        ["POST /v1/chat/completions"],
        "the key went nowhere else"
    );
}

#[tokio::test]
async fn an_instances_open_circuit_is_not_recorded_for_the_cluster() {
    let redis = RedisServer::spawn().await;
    let fleet = crate::harness::Fleet::start(2, |config| {
        config.redis = Some(crate::harness::redis_at(&redis.url()));
        config.cache.error_ttl = Duration::from_secs(60);
        config.retry.max_attempts = 1;
        config.upstreams[0].breaker_failures = 1;
        config.upstreams[0].breaker_cool_down = Duration::from_secs(600);
    })
    .await;
    let (a, b) = (&fleet.instances[0], &fleet.instances[1]);
    fleet
        .provider
        .push_script(Scripted::json(503, error_body("overloaded")));
    let opened = a
        .post("/v1/chat/completions", &chat("opens a's circuit"))
        .await;
    assert_eq!(opened.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(a.state.upstream().circuit(0), BreakerState::Open);
    let body = chat("asked on a, then on b");
    let refused = a.post("/v1/chat/completions", &body).await;
    assert_eq!(refused.json()["error"]["code"], "upstream_circuit_open");
    // b's circuit is closed: a's local refusal must not answer for it.
    let answered = b.post("/v1/chat/completions", &body).await;
    assert_eq!(answered.status, StatusCode::OK, "{:?}", answered.body);
}
