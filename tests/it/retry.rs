//! The upstream retry policy, observed at the mock provider.

use std::time::Duration;

use mock_upstream::{FailureMode, Scripted};
use reqwest::StatusCode;

use corral::breaker::BreakerState;

use crate::harness::{Reply, TestGateway, WAIT, capture_logs, chat};

const PATH: &str = "/v1/chat/completions";

fn error_body(code: &str) -> String {
    format!(r#"{{"error":{{"message":"scripted","type":"{code}","param":null,"code":"{code}"}}}}"#)
}

#[tokio::test]
async fn transient_failures_are_retried_until_success() {
    let gateway = TestGateway::start(|config| config.retry.max_attempts = 3).await;
    gateway
        .provider
        .push_script(Scripted::json(503, error_body("overloaded")));
    gateway
        .provider
        .push_script(Scripted::json(503, error_body("overloaded")));
    let reply = gateway.post(PATH, &chat("eventually")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(gateway.provider.calls(), 3);
    assert_eq!(reply.cache(), "MISS");
}

#[tokio::test]
async fn retry_after_is_honoured() {
    let gateway = TestGateway::start(|config| {
        config.retry.base_delay = Duration::from_millis(1);
        config.retry.max_delay = Duration::from_millis(5);
    })
    .await;
    let mut limited = Scripted::json(429, error_body("rate_limit_exceeded"));
    limited.headers.push(("retry-after".into(), "1".into()));
    gateway.provider.push_script(limited);
    let reply = gateway.post(PATH, &chat("patience")).await;
    assert_eq!(reply.status, StatusCode::OK);
    let requests = gateway.provider.requests();
    assert_eq!(requests.len(), 2);
    let gap = requests[1].at.duration_since(requests[0].at);
    // The backoff alone would wait at most 5 ms; the provider asked for 1 s.
    assert!(gap >= Duration::from_millis(950), "waited only {gap:?}");
    assert!(gap < Duration::from_secs(10), "waited {gap:?}");
}

#[tokio::test]
async fn client_errors_and_exhausted_quota_are_not_retried() {
    let gateway = TestGateway::start(|config| config.retry.max_attempts = 5).await;
    gateway
        .provider
        .push_script(Scripted::json(400, error_body("invalid_request_error")));
    let reply = gateway.post(PATH, &chat("bad")).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        reply.json()["error"]["code"],
        "invalid_request_error",
        "the provider's body is relayed"
    );
    assert_eq!(gateway.provider.calls(), 1);

    gateway
        .provider
        .push_script(Scripted::json(429, error_body("insufficient_quota")));
    let reply = gateway.post(PATH, &chat("broke")).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(gateway.provider.calls(), 2);

    let mut told_not_to = Scripted::json(503, error_body("overloaded"));
    told_not_to
        .headers
        .push(("x-should-retry".into(), "false".into()));
    gateway.provider.push_script(told_not_to);
    let reply = gateway.post(PATH, &chat("do not retry")).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(gateway.provider.calls(), 3);
}

#[tokio::test]
async fn attempts_stop_at_max_attempts() {
    let gateway = TestGateway::start(|config| config.retry.max_attempts = 3).await;
    gateway.provider.set_failure(Some(FailureMode::always(503)));
    let reply = gateway.post(PATH, &chat("never")).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(gateway.provider.calls(), 3);
}

/// A 429 asking to wait `retry_after` seconds.
fn limited(retry_after: &str) -> Scripted {
    let mut limited = Scripted::json(429, error_body("rate_limit_exceeded"));
    limited
        .headers
        .push(("retry-after".into(), retry_after.into()));
    limited
}

/// Sends `body` until the provider sees a call more (at most every 50 ms,
/// bounded), and returns the replies up to and including that one.
async fn repeat_until_a_call(gateway: &TestGateway, body: &serde_json::Value) -> Vec<Reply> {
    let before = gateway.provider.calls();
    let mut replies = Vec::new();
    for _ in 0..400 {
        replies.push(gateway.post(PATH, body).await);
        if gateway.provider.calls() > before {
            return replies;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no repeat called the provider in 20 s");
}

/// No client's retries multiply corral's attempts: after a flight exhausted
/// its attempts on a transient failure, a repeat inside the provider's
/// `Retry-After` gets that error without a call, and a repeat after it makes
/// one attempt, not `max_attempts`, until a call succeeds. One instance, no
/// Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_call_is_remembered_so_repeats_never_multiply_attempts() {
    let gateway = TestGateway::start(|config| config.retry.max_attempts = 3).await;
    // The first flight's attempts are answered at once; the last asks for 2 s.
    for retry_after in ["0", "0", "2"] {
        gateway.provider.push_script(limited(retry_after));
    }
    let body = chat("always limited");
    let first = gateway.post(PATH, &body).await;
    assert_eq!(first.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(gateway.provider.calls(), 3, "the flight's three attempts");

    // Within the 2 s: the same error, no call; then one attempt.
    gateway.provider.push_script(limited("2"));
    let replies = repeat_until_a_call(&gateway, &body).await;
    assert!(replies.len() >= 2, "the immediate repeat made no call");
    for reply in &replies {
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(reply.body, first.body, "the provider's error, as it came");
        assert_eq!(reply.header("x-should-retry"), Some("false"));
    }
    assert_eq!(
        gateway.provider.calls(),
        4,
        "one attempt after the quiet time"
    );

    // The provider recovers: the next call after the quiet time is one
    // attempt, and it answers.
    let replies = repeat_until_a_call(&gateway, &body).await;
    let last = replies.last().unwrap();
    assert_eq!(last.status, StatusCode::OK);
    assert_eq!(last.cache(), "MISS");
    assert_eq!(gateway.provider.calls(), 5);
    // And the key is clear again: a new failure gets the full attempts.
    gateway.wait_idle().await;
    gateway.provider.set_failure(Some(FailureMode::always(503)));
    let fresh = gateway.post(PATH, &chat("a new prompt")).await;
    assert_eq!(fresh.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(gateway.provider.calls(), 8);
}

/// Nothing a provider sends can panic a task or drop a connection: a
/// `Retry-After` of 1e20 seconds (or `retry-after-ms` of 1e23) is bounded, the
/// flight gives up waiting (the hint is past `retry.deadline`) and relays the
/// provider's answer, and so does the pass-through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absurd_retry_after_is_bounded_and_relayed_not_a_panic() {
    let gateway = TestGateway::start(|_| {}).await;
    for (header, value) in [("retry-after", "1e20"), ("retry-after-ms", "1e23")] {
        let mut overloaded = Scripted::json(503, error_body("overloaded"));
        overloaded.headers.push((header.into(), value.into()));
        gateway.provider.push_script(overloaded);
        let before = gateway.provider.calls();
        let reply = gateway.post(PATH, &chat(&format!("absurd {header}"))).await;
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{header}");
        assert_eq!(reply.json()["error"]["code"], "overloaded", "{header}");
        assert_eq!(
            gateway.provider.calls(),
            before + 1,
            "{header}: one attempt, no re-elected owners"
        );
    }
    let mut limited = Scripted::json(429, error_body("rate_limit_exceeded"));
    limited.headers.push(("retry-after".into(), "1e20".into()));
    gateway.provider.push_script(limited);
    let passed = transcribe(&gateway).await;
    assert_eq!(passed.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(passed.json()["error"]["code"], "rate_limit_exceeded");
}

/// A request the provider has is not sent again: an attempt that timed out
/// after the request went out (the provider hangs after reading it) is one
/// attempt and a 504, whatever `max_attempts` says, since the provider may
/// be generating it and bills it. A connect error (nothing went out) is
/// retried: the unreachable upstream sees as many connection attempts as
/// `max_attempts` allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_provider_has_is_never_sent_twice() {
    let gateway = TestGateway::start(|config| {
        config.upstreams[0].request_timeout = Duration::from_secs(2);
        config.upstreams[0].breaker_failures = 2;
        config.retry.max_attempts = 3;
    })
    .await;
    gateway.provider.hold();
    let reply = gateway.post(PATH, &chat("a provider that hangs")).await;
    gateway.provider.release();
    assert_eq!(reply.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(reply.json()["error"]["code"], "upstream_timeout");
    assert_eq!(
        gateway.provider.received(),
        ["POST /v1/chat/completions"],
        "one attempt"
    );
    // The breaker counted one failure: below its threshold of two, closed;
    // the next such call is the second, and opens it.
    assert_eq!(gateway.state.upstream().circuit(0), BreakerState::Closed);
    gateway.provider.hold();
    let again = gateway
        .post(PATH, &chat("a provider that still hangs"))
        .await;
    gateway.provider.release();
    assert_eq!(again.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(gateway.state.upstream().circuit(0), BreakerState::Open);

    // Nothing listens on the port: every attempt is a connect error, retried.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = listener.local_addr().unwrap();
    drop(listener);
    let unreachable = TestGateway::start(move |config| {
        config.upstreams[0].base_url = format!("http://{closed}/v1");
        config.retry.max_attempts = 3;
        config.retry.base_delay = Duration::from_millis(1);
        config.retry.max_delay = Duration::from_millis(5);
    })
    .await;
    let reply = unreachable.post(PATH, &chat("anyone?")).await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY);
    let metrics = unreachable.get("/metrics").await;
    let text = String::from_utf8_lossy(&metrics.body);
    let retries: Vec<&str> = text
        .lines()
        .filter(|line| line.starts_with("corral_upstream_retries_total"))
        .collect();
    assert!(
        retries.iter().any(|line| line.ends_with(" 2")),
        "two retries after the first connection attempt: {retries:?}"
    );
}

/// A pass-through POST (an image generation, an upload) that ends in a
/// retryable status is not sent again: it may have been made, and billed.
/// (A connect error is retried for any method: the test above.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_through_post_is_not_retried_on_a_5xx() {
    let gateway = TestGateway::start(|config| {
        config.retry.base_delay = Duration::from_millis(1);
        config.retry.max_delay = Duration::from_millis(5);
    })
    .await;
    gateway
        .provider
        .push_script(Scripted::json(500, error_body("server_error")));
    let image = serde_json::json!({"model": "gpt-image-1", "prompt": "a corral at dawn"});
    let reply = gateway.post("/v1/images/generations", &image).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR, "relayed");
    assert_eq!(reply.json()["error"]["type"], "server_error");
    assert_eq!(
        gateway.provider.calls(),
        1,
        "one call: the provider may be drawing it"
    );
    // The next one is drawn, and relayed as the provider sent it.
    let drawn = gateway.post("/v1/images/generations", &image).await;
    assert_eq!(drawn.status, StatusCode::OK);
    assert_eq!(
        drawn.json()["data"][0]["revised_prompt"],
        "a corral at dawn"
    );
    // A multipart upload (a transcription) is not resent either.
    gateway
        .provider
        .push_script(Scripted::json(500, error_body("server_error")));
    let reply = transcribe(&gateway).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR, "relayed");
    assert_eq!(gateway.provider.calls(), 3);
}

/// The breaker counts calls, not attempts: a call of three failed attempts
/// is one failure (with a threshold of two the circuit stays closed), the
/// second such call opens it, and a call that failed once and then answered
/// is a success that resets the count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_counts_calls_not_attempts() {
    let gateway = TestGateway::start(|config| {
        config.retry.max_attempts = 3;
        config.retry.base_delay = Duration::from_millis(1);
        config.retry.max_delay = Duration::from_millis(5);
        config.upstreams[0].breaker_failures = 2;
    })
    .await;
    let circuit = || gateway.state.upstream().circuit(0);
    // Failed once, then answered: a success.
    gateway
        .provider
        .push_script(Scripted::json(503, error_body("overloaded")));
    assert_eq!(
        gateway.post(PATH, &chat("recovered")).await.status,
        StatusCode::OK
    );
    gateway.provider.set_failure(Some(FailureMode::always(503)));
    let first = gateway.post(PATH, &chat("first failing call")).await;
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(gateway.provider.calls(), 5, "2 + 3 attempts");
    assert_eq!(circuit(), BreakerState::Closed, "one call, one failure");
    let second = gateway.post(PATH, &chat("second failing call")).await;
    assert_eq!(second.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(circuit(), BreakerState::Open, "two calls, two failures");
}

/// A pass-through `POST /v1/audio/transcriptions` (a multipart form naming
/// its model), the pass-through POST the mock answers and scripts.
async fn transcribe(gateway: &TestGateway) -> Reply {
    let boundary = "corral-pass-through";
    let upload = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n--{boundary}--\r\n"
    );
    let content_type = format!("multipart/form-data; boundary={boundary}");
    gateway
        .post_raw(
            "/v1/audio/transcriptions",
            upload,
            &[("content-type", content_type.as_str())],
        )
        .await
}

/// The provider's port refuses the first connection (a socket bound there
/// but not listening yet), then listens: `GET /v1/models` is answered, and
/// only the retry reached the provider. One thread runs the gateway and the
/// test, so the gateway's retry event (seen through a thread-local
/// subscriber) is what tells the test to start listening.
#[tokio::test(flavor = "current_thread")]
async fn a_model_list_is_retried_after_a_connect_error() {
    let port = tokio::net::TcpSocket::new_v4().unwrap();
    port.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let address = port.local_addr().unwrap();
    let provider = mock_upstream::MockProvider::start(Default::default())
        .await
        .unwrap();
    let provider_address = provider.addr();
    let gateway = TestGateway::start_with(provider, |config| {
        config.upstreams[0].base_url = format!("http://{address}/v1");
        config.retry.max_attempts = 5;
        config.retry.base_delay = Duration::from_millis(200);
        config.retry.max_delay = Duration::from_millis(400);
    })
    .await;
    let (_subscriber, mut retried) = capture_logs(&["retrying upstream"]);

    let (client, url) = (gateway.client.clone(), format!("{}/v1/models", gateway.url));
    let listing = tokio::spawn(async move {
        let response = client
            .get(url)
            .send()
            .await
            .expect("request reaches corral");
        let status = response.status();
        (status, response.bytes().await.expect("body arrives"))
    });
    let event = tokio::time::timeout(WAIT, retried.recv())
        .await
        .expect("the gateway retries within the wait")
        .expect("the subscriber is alive");
    assert!(event.contains("Connection refused"), "{event}");

    // Listen now; every connection is relayed to the mock provider.
    let listener = port.listen(16).unwrap();
    let relay = tokio::spawn(async move {
        let mut relayed = 0usize;
        while let Ok((mut inbound, _)) = listener.accept().await {
            relayed += 1;
            let mut outbound = tokio::net::TcpStream::connect(provider_address)
                .await
                .unwrap();
            tokio::spawn(async move {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            });
            if relayed == 1 {
                return relayed;
            }
        }
        relayed
    });
    let (status, body) = tokio::time::timeout(WAIT, listing)
        .await
        .expect("answered within the wait")
        .unwrap();
    assert_eq!(status, StatusCode::OK, "{body:?}");
    let list: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let ids: Vec<String> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|model| model["id"].as_str().unwrap().to_owned())
        .collect();
    assert!(ids.contains(&"gpt-4o-mini".to_owned()), "{ids:?}");
    assert_eq!(
        relay.await.unwrap(),
        1,
        "the refused attempt never connected"
    );
}

/// A flight that fails answers every caller that waited on it, and logs its
/// failure once, not once a caller.
#[tokio::test(flavor = "current_thread")]
async fn a_failed_flight_is_logged_once_whatever_its_callers() {
    let gateway = TestGateway::start(|config| config.retry.max_attempts = 1).await;
    gateway.provider.set_failure(Some(FailureMode::always(500)));
    let (_subscriber, mut logged) = capture_logs(&["flight failed", "request failed"]);
    let replies = gateway.herd(PATH, &chat("fail for everyone"), 5, &[]).await;
    assert!(
        replies
            .iter()
            .all(|reply| reply.status == StatusCode::INTERNAL_SERVER_ERROR)
    );
    assert_eq!(gateway.provider.calls(), 1);
    drop(_subscriber);
    let mut lines = Vec::new();
    while let Ok(line) = logged.try_recv() {
        lines.push(line);
    }
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains("flight failed"), "{lines:#?}");
}
