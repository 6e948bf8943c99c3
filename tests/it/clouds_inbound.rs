//! Apps written for Claude on the clouds, unchanged: corral serves Bedrock's
//! InvokeModel paths (answering a stream in AWS's event-stream framing) and
//! Vertex AI's `rawPredict` paths as Messages requests, whatever member of
//! the pool answers them; a cloud's model id maps back to the public name.

use corral::{
    Config,
    config::{Affinity, Api, ProviderKind, Secret},
    tenant::key_hash,
};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{
    harness::TestGateway,
    metrics::{model_tokens, scrape},
    pools::{member, pooled},
    sdk::Python,
};

const GATEWAY_KEY: &str = "gw-cloud-callers";
const PUBLIC: &str = "claude-sonnet-4-5";
const BEDROCK_ID: &str = "us.anthropic.claude-sonnet-4-5-20250929-v1:0";
const VERTEX_ID: &str = "claude-sonnet-4-5@20250929";

/// The first upstream an Anthropic pool: an Anthropic member that takes the
/// calls, and Bedrock and Vertex members (tried only if it cannot) whose
/// `deployments` name the model as their clouds do.
fn anthropic_pool(config: &mut Config, mock: &mock_upstream::MockProvider) {
    let anthropic_base = mock.base_url();
    config.auth.key_hashes = vec![key_hash(GATEWAY_KEY.as_bytes())];
    let upstream = &mut config.upstreams[0];
    upstream.api = Api::Anthropic;
    upstream.models = vec!["claude-*".to_owned()];
    let mut first = member("anthropic", anthropic_base);
    first.api_key = Some(Secret::new("sk-ant-member".to_owned()));
    let mut bedrock = member(
        "bedrock",
        "https://bedrock-runtime.us-east-1.amazonaws.com".to_owned(),
    );
    bedrock.provider = Some(ProviderKind::Bedrock);
    bedrock.api_key = None;
    bedrock.region = Some("us-east-1".to_owned());
    bedrock.aws = Some(crate::bedrock::aws_keys("AKIDEXAMPLE", "not-a-real-secret"));
    bedrock.deployments = [(PUBLIC.to_owned(), BEDROCK_ID.to_owned())].into();
    bedrock.priority = 1;
    let mut vertex = member(
        "vertex",
        "https://us-east5-aiplatform.googleapis.com/v1/projects/p/locations/us-east5".to_owned(),
    );
    vertex.provider = Some(ProviderKind::Vertex);
    vertex.api_key = None;
    vertex.service_account = Some(Secret::new(mock.service_account_json()));
    vertex.deployments = [(PUBLIC.to_owned(), VERTEX_ID.to_owned())].into();
    vertex.priority = 2;
    pooled(config, vec![first, bedrock, vertex], Affinity::None);
}

fn bedrock_body(text: &str) -> Value {
    json!({
        "anthropic_version": "bedrock-2023-05-31",
        "anthropic_beta": ["context-1m-2025-08-07"],
        "max_tokens": 64,
        "temperature": 0,
        "messages": [{"role": "user", "content": text}],
    })
}

const KEY_HEADER: (&str, &str) = ("x-api-key", GATEWAY_KEY);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bedrock_path_is_a_messages_request_for_the_public_model() {
    let mock = mock_upstream::MockProvider::start(mock_upstream::MockSettings::default())
        .await
        .unwrap();
    let gateway =
        TestGateway::start_with(mock.clone(), |config| anthropic_pool(config, &mock)).await;
    let path = format!("/model/{}/invoke", BEDROCK_ID.replace(':', "%3A"));
    let reply = gateway
        .post_with(&path, &bedrock_body("hello bedrock"), &[KEY_HEADER])
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    assert_eq!(reply.json()["type"], "message");
    let sent = &mock.requests()[0];
    assert_eq!(sent.path, "/v1/messages");
    let body = sent.json().unwrap();
    assert_eq!(
        body["model"], PUBLIC,
        "the public name goes to the Anthropic member"
    );
    assert!(
        body.get("anthropic_version").is_none() && body.get("anthropic_beta").is_none(),
        "{body}"
    );
    assert_eq!(sent.header("anthropic-beta"), Some("context-1m-2025-08-07"));
    assert_eq!(sent.header("x-api-key"), Some("sk-ant-member"));
    // The same request on Anthropic's own path is the same key: a HIT.
    let mut messages = bedrock_body("hello bedrock");
    messages["model"] = json!(PUBLIC);
    messages
        .as_object_mut()
        .unwrap()
        .remove("anthropic_version");
    messages.as_object_mut().unwrap().remove("anthropic_beta");
    let same = gateway
        .post_with(
            "/v1/messages",
            &messages,
            &[KEY_HEADER, ("anthropic-beta", "context-1m-2025-08-07")],
        )
        .await;
    assert_eq!(same.cache(), "HIT", "{:?}", same.body);
    assert_eq!(mock.calls(), 1);

    // A stream: AWS's event-stream frames, each a chunk of one Messages event.
    let stream = format!(
        "/model/{}/invoke-with-response-stream",
        BEDROCK_ID.replace(':', "%3A")
    );
    let reply = gateway
        .post_with(&stream, &bedrock_body("stream bedrock"), &[KEY_HEADER])
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.header("content-type"),
        Some("application/vnd.amazon.eventstream")
    );
    let events = chunk_events(&reply.body);
    assert!(
        !events.is_empty(),
        "{} bytes: {:?}",
        reply.body.len(),
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(
        events.first().map(|e| e["type"].clone()),
        Some(json!("message_start")),
        "{events:?}"
    );
    assert_eq!(
        events.last().map(|e| e["type"].clone()),
        Some(json!("message_stop"))
    );

    // Counted under the public name.
    let m = scrape(&gateway).await;
    assert!(model_tokens(&m, PUBLIC, "input", "upstream") > 0.0);
    assert_eq!(model_tokens(&m, BEDROCK_ID, "input", "upstream"), 0.0);
}

/// The JSON events inside AWS event-stream `chunk` frames.
fn chunk_events(mut bytes: &[u8]) -> Vec<Value> {
    use base64::Engine as _;
    let mut events = Vec::new();
    while bytes.len() >= 12 {
        let total = u32::from_be_bytes(bytes[0..4].try_into().unwrap()) as usize;
        let headers = u32::from_be_bytes(bytes[4..8].try_into().unwrap()) as usize;
        let payload = &bytes[12 + headers..total - 4];
        let wrapped: Value = serde_json::from_slice(payload).unwrap();
        let json = base64::engine::general_purpose::STANDARD
            .decode(wrapped["bytes"].as_str().unwrap())
            .unwrap();
        events.push(serde_json::from_slice(&json).unwrap());
        bytes = &bytes[total..];
    }
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_and_anthropic_cloud_clients_are_served_and_fifty_make_one_call() {
    let python = Python::with_anthropic_clouds().await;
    let mock = mock_upstream::MockProvider::start(mock_upstream::MockSettings::default())
        .await
        .unwrap();
    let gateway =
        TestGateway::start_with(mock.clone(), |config| anthropic_pool(config, &mock)).await;
    let run = |mode: &'static str| {
        let (python, url) = (&python, gateway.url.clone());
        async move {
            python
                .run_script_with("cloud_clients.py", &url, &[mode, GATEWAY_KEY])
                .await
        }
    };

    for mode in ["bedrock_sdk", "boto3", "vertex_sdk"] {
        let (results, stderr) = run(mode).await;
        let context = format!("{mode}: {results}\nstderr: {stderr}");
        for field in ["text", "stream_text"] {
            assert!(
                !results[field].as_str().unwrap_or_default().is_empty(),
                "{field}; {context}"
            );
        }
        if let Some(events) = results["stream_events"].as_array() {
            assert_eq!(events.last(), Some(&json!("message_stop")), "{context}");
        }
    }
    for request in mock.requests() {
        assert_eq!(request.path, "/v1/messages");
        assert_eq!(request.json().unwrap()["model"], PUBLIC);
    }

    // A SigV4 signature alone identifies nobody: 401 in AWS's shape.
    let (results, stderr) = run("sigv4_only").await;
    assert_eq!(results["status"], 401, "{results} {stderr}");
    assert_eq!(results["error_type"], "AccessDeniedException", "{results}");

    // 50 identical callers of each client: one call each.
    for (mode, prompt) in [
        ("boto3_herd", "A boto3 herd."),
        ("bedrock_sdk_herd", "An AnthropicBedrock herd."),
        ("vertex_sdk_herd", "An AnthropicVertex herd."),
    ] {
        let before = mock.calls();
        mock.hold();
        let url = gateway.url.clone();
        let herd = tokio::spawn(async move {
            Python::with_anthropic_clouds()
                .await
                .run_script_with("cloud_clients.py", &url, &[mode, GATEWAY_KEY, "50", prompt])
                .await
        });
        gateway.wait_for_waiters(50).await;
        mock.release();
        let (results, stderr) = herd.await.unwrap();
        let answers = results["herd"]
            .as_array()
            .unwrap_or_else(|| panic!("{mode}: {stderr}"));
        assert_eq!(answers.len(), 50, "{mode}");
        assert!(answers.iter().all(|answer| *answer == answers[0]), "{mode}");
        assert_eq!(mock.calls(), before + 1, "{mode}");
        gateway.wait_idle().await;
    }
}
