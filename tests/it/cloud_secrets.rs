//! The clouds' credentials stay secret: the corral binary at debug level,
//! with a Bedrock account signing with temporary AWS credentials and a
//! Vertex AI account holding a service account's key, Redis and both kinds
//! of calls, writes no AWS secret, session token, service-account key or
//! access token to its logs, `/metrics`, `/stats` or Redis.

use mock_upstream::{AwsCredentials, MockProvider, MockSettings};
use reqwest::StatusCode;
use serde_json::json;

use crate::{logs::Corral, redis_server::RedisServer};

const AWS_ID: &str = "AKIACLOUDSECRETS0001";
const AWS_SECRET: &str = "aws-SECRETCANARY-wJalrXUtnFEMIK7MDENG";
const AWS_TOKEN: &str = "aws-SESSIONCANARY-IQoJb3JpZ2luX2VjEJr";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_aws_secret_session_token_service_account_key_or_token_leaves_corral() {
    let redis = RedisServer::spawn().await;
    let mock = MockProvider::start(MockSettings::default()).await.unwrap();
    mock.set_aws_credentials(AwsCredentials::new(AWS_ID, AWS_SECRET).with_session_token(AWS_TOKEN));
    let service_account = mock.service_account_json();
    let root = mock.origin();
    let yaml = format!(
        "listen: 127.0.0.1:0
upstreams:
  - name: bedrock
    api: anthropic
    models: [claude-sonnet-4-5]
    provider: bedrock
    base_url: '{root}'
    region: us-east-1
    aws: {{access_key_id_env: AWS_ID, secret_access_key_env: AWS_SECRET, session_token_env: AWS_TOKEN}}
    deployments: {{claude-sonnet-4-5: 'us.anthropic.claude-sonnet-4-5-20250929-v1:0'}}
  - name: vertex
    api: anthropic
    models: [claude-opus-4-1]
    provider: vertex
    base_url: '{root}/v1/projects/mock-project/locations/us-east5'
    credentials_env: SA_JSON
    deployments: {{claude-opus-4-1: 'claude-opus-4-1@20250805'}}
redis:
  url: '{redis}'
",
        redis = redis.url(),
    );
    let corral = Corral::start_with(
        &yaml,
        &mock,
        &[
            ("AWS_ID", AWS_ID),
            ("AWS_SECRET", AWS_SECRET),
            ("AWS_TOKEN", AWS_TOKEN),
            ("SA_JSON", &service_account),
            ("CORRAL_UPSTREAM_BASE_URL", &root),
        ],
    )
    .await;
    let client = reqwest::Client::new();
    for model in ["claude-sonnet-4-5", "claude-opus-4-1"] {
        for stream in [false, true] {
            let reply = client
                .post(format!("{}/v1/messages", corral.url))
                .json(&json!({
                    "model": model, "max_tokens": 32, "stream": stream,
                    "messages": [{"role": "user", "content": format!("secrets {model} {stream}")}],
                }))
                .send()
                .await
                .unwrap();
            assert_eq!(reply.status(), StatusCode::OK, "{model} {stream}");
            reply.bytes().await.unwrap();
        }
    }
    assert_eq!(
        mock.sigv4_verified(),
        2,
        "the Bedrock calls were signed, and checked"
    );
    let tokens: Vec<String> = mock
        .requests()
        .iter()
        .filter_map(|request| request.header("authorization"))
        .filter_map(|value| value.strip_prefix("Bearer "))
        .map(str::to_owned)
        .collect();
    assert_eq!(tokens.len(), 2, "the Vertex calls carried an access token");
    let exposed = corral.exposed(&redis).await;
    assert!(
        exposed.metrics.contains("claude-opus-4-1"),
        "the scrape has the calls"
    );
    // The private key's PEM body, a line of it (the line breaks are escaped in the JSON).
    let key: serde_json::Value = serde_json::from_str(&service_account).unwrap();
    let pem = key["private_key"].as_str().unwrap();
    let key_line = pem.lines().nth(3).unwrap().to_owned();
    let mut secrets = vec![AWS_SECRET.to_owned(), AWS_TOKEN.to_owned(), key_line];
    secrets.extend(tokens);
    exposed.assert_holds_none(&secrets);
}
