//! A stream whose *first* event is the provider's error (issue 38, item 3):
//! nothing reached a caller yet, so it is a failed attempt like a 529,
//! failed over to the next member for every coalesced caller at once.

use corral::config::Api;
use mock_upstream::{MockProvider, Scripted};
use reqwest::StatusCode;
use serde_json::json;

use crate::{
    harness::{TestGateway, collect, streamed},
    pools::{first_and_spare, member, mocks},
};

const MESSAGES: &str = "/v1/messages";

/// A 200 stream whose first event is Anthropic's `overloaded_error`.
fn overloaded_stream() -> Scripted {
    let error =
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
    Scripted {
        status: 200,
        headers: vec![("content-type".into(), "text/event-stream".into())],
        body: format!("event: error\ndata: {error}\n\n"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_first_event_is_overloaded_fails_over_for_every_caller() {
    let [a, b] = <[MockProvider; 2]>::try_from(mocks(2).await).ok().unwrap();
    let gateway = TestGateway::start(|config| {
        // a first, b only when a cannot answer.
        first_and_spare(config, member("a", a.base_url()), member("b", b.base_url()));
        let pool = &mut config.upstreams[0];
        pool.api = Api::Anthropic;
        pool.models = vec!["claude-*".into()];
    })
    .await;
    a.push_script(overloaded_stream());
    let body = streamed(json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 64,
        "temperature": 0,
        "messages": [{"role": "user", "content": "overloaded first"}],
    }));
    a.hold();
    b.hold();
    let callers: Vec<_> = (0..3)
        .map(|_| gateway.spawn_post(MESSAGES, &body))
        .collect();
    gateway.wait_for_waiters(3).await;
    a.release();
    b.release();
    let replies = collect(callers).await;
    for reply in &replies {
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
        let text = String::from_utf8_lossy(&reply.body);
        assert!(
            !text.contains("overloaded_error"),
            "no caller saw a's error: {text}"
        );
        assert!(text.contains("message_stop"), "b's whole stream: {text}");
    }
    assert_eq!(
        (a.calls(), b.calls()),
        (1, 1),
        "one attempt each, for all callers"
    );
}
