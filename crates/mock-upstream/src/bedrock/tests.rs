//! Bedrock's surface over real HTTP: signed calls answered with the Anthropic content, the
//! stream's event-stream frames read back with AWS's own decoder, the door's refusals, and
//! Bedrock's error shapes for the mock's knobs.

use std::time::SystemTime;

use aws_smithy_eventstream::frame::read_message_from;
use aws_smithy_types::event_stream::Message;
use serde_json::{Value, json};

use crate::sigv4_check::Expected;
use crate::sigv4_check::tests::signature_headers;
use crate::test_support::{DEADLINE, client, start};
use crate::{
    AwsCredentials, BEDROCK_MODEL_NOT_READY_TRIGGER, BEDROCK_TEST_ACCESS_KEY_ID,
    BEDROCK_TEST_API_KEY, BEDROCK_TEST_SECRET_ACCESS_KEY, BEDROCK_THROTTLE_MIDSTREAM_TRIGGER,
    FailureMode, MockProvider,
};

const MODEL: &str = "us.anthropic.claude-sonnet-4-5-20250929-v1:0";
const ENCODED_MODEL: &str = "us.anthropic.claude-sonnet-4-5-20250929-v1%3A0";

const TEST_CREDENTIALS: Expected<'static> = Expected {
    access_key_id: BEDROCK_TEST_ACCESS_KEY_ID,
    secret_access_key: BEDROCK_TEST_SECRET_ACCESS_KEY,
    session_token: None,
    region: "us-east-1",
    service: "bedrock",
};

fn bedrock_body(prompt: &str) -> Value {
    json!({
        "anthropic_version": "bedrock-2023-05-31",
        "max_tokens": 64,
        "system": "You are terse.",
        "messages": [{"role": "user", "content": prompt}],
    })
}

/// POST `body` to `/model/{ENCODED_MODEL}/{operation}`, signed as an AWS SDK signs it.
async fn signed(
    mock: &MockProvider,
    operation: &str,
    body: &Value,
    credentials: &Expected<'_>,
) -> reqwest::Response {
    let body = body.to_string();
    let host = mock.addr().to_string();
    let url = format!(
        "{}/model/{ENCODED_MODEL}/{operation}",
        mock.bedrock_endpoint()
    );
    let base = [
        ("host", host.as_str()),
        ("content-type", "application/json"),
    ];
    let signature = signature_headers(
        "POST",
        &url,
        &base,
        body.as_bytes(),
        credentials,
        SystemTime::now(),
    );
    let mut request = client()
        .post(url)
        .timeout(DEADLINE)
        .header("content-type", "application/json")
        .body(body);
    for (name, value) in signature {
        request = request.header(name, value);
    }
    request.send().await.expect("the mock answers")
}

async fn invoke(mock: &MockProvider, body: &Value) -> reqwest::Response {
    signed(mock, "invoke", body, &TEST_CREDENTIALS).await
}

fn error_type(response: &reqwest::Response) -> &str {
    response
        .headers()
        .get("x-amzn-errortype")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
}

/// Every frame of an event-stream body, read by AWS's decoder (which checks both CRCs).
fn frames(mut body: &[u8]) -> Vec<Message> {
    let mut frames = Vec::new();
    while !body.is_empty() {
        frames.push(read_message_from(&mut body).expect("a valid event-stream frame"));
    }
    frames
}

fn header<'a>(frame: &'a Message, name: &str) -> &'a str {
    frame
        .headers()
        .iter()
        .find(|h| h.name().as_str() == name)
        .and_then(|h| h.value().as_string().ok())
        .map_or("", |value| value.as_str())
}

/// The Messages event a `chunk` frame wraps.
fn chunk_event(frame: &Message) -> Value {
    assert_eq!(header(frame, ":event-type"), "chunk");
    assert_eq!(header(frame, ":message-type"), "event");
    assert_eq!(header(frame, ":content-type"), "application/json");
    let payload: Value = serde_json::from_slice(frame.payload()).expect("a JSON payload");
    assert_eq!(payload["p"], "abcd");
    let bytes = aws_smithy_types::base64::decode(payload["bytes"].as_str().expect("bytes"))
        .expect("base64 bytes");
    serde_json::from_slice(&bytes).expect("a JSON event")
}

#[tokio::test]
async fn invoke_answers_the_anthropic_content_for_the_model_the_path_names() {
    let mock = start().await;
    let response = invoke(&mock, &bedrock_body("Hello Bedrock")).await;
    assert_eq!(response.status(), 200);
    let message: Value = response.json().await.unwrap();
    assert_eq!(message["model"], MODEL, "the decoded model id");
    assert_eq!(message["type"], "message");

    // The Anthropic surface answers the same request with the same content.
    let mut anthropic_body = bedrock_body("Hello Bedrock");
    anthropic_body["model"] = json!(MODEL);
    anthropic_body
        .as_object_mut()
        .unwrap()
        .remove("anthropic_version");
    let direct: Value = client()
        .post(format!("{}/messages", mock.base_url()))
        .header("anthropic-version", "2023-06-01")
        .json(&anthropic_body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(message["content"], direct["content"]);
    assert_eq!(message["usage"], direct["usage"]);

    assert_eq!(mock.calls_to("/invoke"), 1);
    assert_eq!(mock.sigv4_verified(), 1);
    let recorded = &mock.requests()[0];
    assert_eq!(recorded.path, format!("/model/{ENCODED_MODEL}/invoke"));
    assert!(
        recorded
            .header("authorization")
            .unwrap()
            .starts_with("AWS4-HMAC-SHA256 ")
    );
}

#[tokio::test]
async fn bodies_bedrock_refuses_are_validation_exceptions() {
    let mock = start().await;
    let mut with_model = bedrock_body("hi");
    with_model["model"] = json!(MODEL);
    let mut with_stream = bedrock_body("hi");
    with_stream["stream"] = json!(true);
    let mut without_version = bedrock_body("hi");
    without_version
        .as_object_mut()
        .unwrap()
        .remove("anthropic_version");
    let mut anthropic_version = bedrock_body("hi");
    anthropic_version["anthropic_version"] = json!("2023-06-01");
    let cases = [
        (with_model, "extraneous key [model] is not permitted"),
        (with_stream, "extraneous key [stream] is not permitted"),
        (
            without_version,
            "required key [anthropic_version] not found",
        ),
        (anthropic_version, "2023-06-01"),
    ];
    for (body, says) in cases {
        let response = invoke(&mock, &body).await;
        assert_eq!(response.status(), 400, "{body}");
        assert_eq!(error_type(&response), "ValidationException");
        let error: Value = response.json().await.unwrap();
        assert!(error["message"].as_str().unwrap().contains(says), "{error}");
        assert_eq!(
            error.as_object().unwrap().len(),
            1,
            "only a message: {error}"
        );
    }
    // The current `anthropic` SDK's own version passes.
    let mut sdk_version = bedrock_body("hi");
    sdk_version["anthropic_version"] = json!("2026-10-21");
    assert_eq!(invoke(&mock, &sdk_version).await.status(), 200);
}

#[tokio::test]
async fn the_response_stream_is_event_stream_chunks_of_the_messages_events() {
    let mock = start().await;
    let whole: Value = invoke(&mock, &bedrock_body("Stream me"))
        .await
        .json()
        .await
        .unwrap();
    let response = signed(
        &mock,
        "invoke-with-response-stream",
        &bedrock_body("Stream me"),
        &TEST_CREDENTIALS,
    )
    .await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "application/vnd.amazon.eventstream"
    );
    assert_eq!(
        response.headers()["x-amzn-bedrock-content-type"],
        "application/json"
    );
    let body = response.bytes().await.unwrap();
    let events: Vec<Value> = frames(&body).iter().map(chunk_event).collect();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds.first(), Some(&"message_start"));
    assert_eq!(kinds.last(), Some(&"message_stop"));
    assert_eq!(events[0]["message"]["model"], MODEL);
    let text: String = events
        .iter()
        .filter_map(|e| e["delta"]["text"].as_str())
        .collect();
    assert_eq!(text, whole["content"][0]["text"].as_str().unwrap());
    let metrics = &events.last().unwrap()["amazon-bedrock-invocationMetrics"];
    assert_eq!(metrics["inputTokenCount"], whole["usage"]["input_tokens"]);
    assert_eq!(metrics["outputTokenCount"], whole["usage"]["output_tokens"]);
    assert_eq!(mock.calls_to("/invoke-with-response-stream"), 1);
}

#[tokio::test]
async fn the_throttle_trigger_ends_the_stream_with_an_exception_frame() {
    let mock = start().await;
    let prompt = format!("Go {BEDROCK_THROTTLE_MIDSTREAM_TRIGGER}");
    let response = signed(
        &mock,
        "invoke-with-response-stream",
        &bedrock_body(&prompt),
        &TEST_CREDENTIALS,
    )
    .await;
    assert_eq!(response.status(), 200, "the failure comes after the head");
    let body = response.bytes().await.unwrap();
    let frames = frames(&body);
    let (last, chunks) = frames.split_last().unwrap();
    let kinds: Vec<Value> = chunks
        .iter()
        .map(|f| chunk_event(f)["type"].clone())
        .collect();
    assert_eq!(kinds.first().unwrap(), "message_start");
    assert_eq!(kinds.last().unwrap(), "content_block_delta", "{kinds:?}");
    assert_eq!(header(last, ":message-type"), "exception");
    assert_eq!(header(last, ":exception-type"), "throttlingException");
    let payload: Value = serde_json::from_slice(last.payload()).unwrap();
    assert_eq!(
        payload,
        json!({"message": "Too many requests, please wait before trying again."})
    );
}

#[tokio::test]
async fn the_model_not_ready_trigger_is_a_429_of_that_type() {
    let mock = start().await;
    let prompt = format!("Now {BEDROCK_MODEL_NOT_READY_TRIGGER}");
    let response = invoke(&mock, &bedrock_body(&prompt)).await;
    assert_eq!(response.status(), 429);
    assert_eq!(error_type(&response), "ModelNotReadyException");
    let error: Value = response.json().await.unwrap();
    assert_eq!(
        error.as_object().unwrap().len(),
        1,
        "only a message: {error}"
    );
    assert_eq!(mock.calls(), 1, "billed like any call");
}

#[tokio::test]
async fn injected_failures_take_bedrocks_shape() {
    let mock = start().await;
    let cases = [
        (FailureMode::always(429), 429, "ThrottlingException"),
        (
            FailureMode::always(429).with_code("ModelNotReadyException"),
            429,
            "ModelNotReadyException",
        ),
        (FailureMode::always(503), 503, "ServiceUnavailableException"),
        (FailureMode::always(400), 400, "ValidationException"),
        (FailureMode::always(500), 500, "InternalServerException"),
    ];
    for (failure, status, kind) in cases {
        mock.set_failure(Some(failure));
        for operation in ["invoke", "invoke-with-response-stream"] {
            let response = signed(&mock, operation, &bedrock_body("hi"), &TEST_CREDENTIALS).await;
            assert_eq!(response.status(), status, "{kind} on {operation}");
            assert_eq!(error_type(&response), kind);
            let error: Value = response.json().await.unwrap();
            assert!(error["message"].is_string(), "{error}");
        }
    }
    assert_eq!(mock.calls(), 10);
}

#[tokio::test]
async fn the_door_refuses_what_aws_refuses_and_bills_none_of_it() {
    let mock = start().await;
    let body = bedrock_body("hi");
    let url = format!("{}/model/{ENCODED_MODEL}/invoke", mock.bedrock_endpoint());

    let unsigned = client().post(&url).json(&body).send().await.unwrap();
    assert_eq!(unsigned.status(), 403);
    assert_eq!(error_type(&unsigned), "MissingAuthenticationTokenException");

    let wrong_secret = Expected {
        secret_access_key: "not-the-secret",
        ..TEST_CREDENTIALS
    };
    let response = signed(&mock, "invoke", &body, &wrong_secret).await;
    assert_eq!(response.status(), 403);
    assert_eq!(error_type(&response), "InvalidSignatureException");
    let error: Value = response.json().await.unwrap();
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .starts_with("The request signature we calculated does not match"),
        "{error}"
    );

    mock.set_aws_region("eu-west-1");
    let response = invoke(&mock, &body).await;
    assert_eq!(error_type(&response), "InvalidSignatureException");
    let in_region = Expected {
        region: "eu-west-1",
        ..TEST_CREDENTIALS
    };
    assert_eq!(
        signed(&mock, "invoke", &body, &in_region).await.status(),
        200
    );

    let unknown_key = client()
        .post(&url)
        .bearer_auth("ABSKnot-a-key")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(unknown_key.status(), 403);
    assert_eq!(error_type(&unknown_key), "UnrecognizedClientException");

    assert_eq!(mock.calls(), 1, "only the call signed for the region");
    assert_eq!(mock.sigv4_verified(), 1);
    let refused = mock.bedrock_refused();
    assert_eq!(refused.len(), 4);
    assert_eq!(refused[0].json(), Some(body.clone()), "bodies are kept");

    mock.reset();
    assert!(mock.bedrock_refused().is_empty());
    assert_eq!(mock.sigv4_verified(), 0);
    assert_eq!(
        invoke(&mock, &body).await.status(),
        200,
        "the region is reset"
    );
}

#[tokio::test]
async fn api_keys_open_the_door_as_bearers_without_a_signature() {
    let mock = start().await;
    let url = format!("{}/model/{ENCODED_MODEL}/invoke", mock.bedrock_endpoint());
    let by_key = |key: &str| {
        client()
            .post(&url)
            .bearer_auth(key)
            .json(&bedrock_body("hi"))
            .send()
    };
    assert_eq!(by_key(BEDROCK_TEST_API_KEY).await.unwrap().status(), 200);
    assert_eq!(mock.sigv4_verified(), 0, "a key is no signature");

    mock.set_bedrock_api_keys(vec!["ABSKother".to_owned()]);
    assert_eq!(by_key(BEDROCK_TEST_API_KEY).await.unwrap().status(), 403);
    assert_eq!(by_key("ABSKother").await.unwrap().status(), 200);
    mock.set_bedrock_api_keys(Vec::new());
    assert_eq!(by_key("ABSKother").await.unwrap().status(), 403);
    assert_eq!(mock.calls(), 2);
}

#[tokio::test]
async fn temporary_credentials_are_checked_with_their_session_token() {
    let mock = start().await;
    mock.set_aws_credentials(
        AwsCredentials::new(BEDROCK_TEST_ACCESS_KEY_ID, BEDROCK_TEST_SECRET_ACCESS_KEY)
            .with_session_token("token-1"),
    );
    let body = bedrock_body("hi");
    let response = invoke(&mock, &body).await;
    assert_eq!(error_type(&response), "UnrecognizedClientException");
    let temporary = Expected {
        session_token: Some("token-1"),
        ..TEST_CREDENTIALS
    };
    assert_eq!(
        signed(&mock, "invoke", &body, &temporary).await.status(),
        200
    );
    assert_eq!(
        mock.requests()[0].header("x-amz-security-token"),
        Some("token-1")
    );
}

#[tokio::test]
async fn a_held_bedrock_call_is_counted_and_answers_on_release() {
    let mock = start().await;
    mock.hold();
    let held = tokio::spawn({
        let mock = mock.clone();
        async move { invoke(&mock, &bedrock_body("wait")).await.status() }
    });
    assert!(mock.wait_for_calls(1, DEADLINE).await, "counted while held");
    assert_eq!(mock.sigv4_verified(), 1, "checked before it was held");
    assert!(!held.is_finished());
    mock.release();
    let status = tokio::time::timeout(DEADLINE, held).await.unwrap().unwrap();
    assert_eq!(status, 200);
}

#[tokio::test]
async fn an_arn_model_id_is_decoded_whole() {
    let mock = start().await;
    let arn = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-haiku-4-5-v1:0";
    let encoded = arn.replace(':', "%3A").replace('/', "%2F");
    let url = format!("{}/model/{encoded}/invoke", mock.bedrock_endpoint());
    let response = client()
        .post(url)
        .bearer_auth(BEDROCK_TEST_API_KEY)
        .json(&bedrock_body("hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let message: Value = response.json().await.unwrap();
    assert_eq!(message["model"], arn);
}
