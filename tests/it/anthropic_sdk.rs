//! The official Anthropic Python SDK (`anthropic`, pip-installed by the test
//! like the OpenAI one), pointed at corral: `messages.create` and
//! `messages.stream` herds make one upstream call each, two API keys never
//! share, one key in either header is one tenant, a 529 is retried by corral
//! (the SDK's own retries are off), `get_final_message()` equals the
//! non-stream answer, and refusals raise the SDK's own exceptions. Each phase
//! of `tests/sdk/anthropic_check.py` runs while the Rust side holds the mock
//! until every caller waits, so the herds overlap by construction.

use std::time::Duration;

use corral::{config::Secret, tenant::key_hash};
use serde_json::{Value, json};

use crate::{
    anthropic::{messages_gateway, overloaded},
    sdk::{Python, assert_repeat_after_stream_served},
};

/// Runs one phase of the script against `url`; its results, checked for failures.
async fn phase(url: &str, phase: &str) -> (Value, String) {
    let (results, stderr) = Python::with_anthropic()
        .await
        .run_script_with("anthropic_check.py", url, &[phase])
        .await;
    let context = format!("results: {results}\nstderr: {stderr}");
    assert_eq!(results["failures"], json!([]), "{context}");
    (results, context)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anthropic_python_sdk_is_deduplicated_through_corral() {
    // Installed (once) before any herd is timed.
    let _sdk = Python::with_anthropic().await;
    // The 2.x SDK has no temperature parameter: its requests are sampled,
    // coalesced always and stored only under `cache.sampled`, set here so the
    // repeats below can be HITs.
    let gateway = messages_gateway(|config| config.cache.sampled = true).await;
    let url = gateway.url.clone();
    let spawn = |name: &'static str| {
        let url = url.clone();
        tokio::spawn(async move { phase(&url, name).await })
    };

    // 100 identical `messages.create`: one upstream call, then a HIT.
    let (results, context) = gateway.held_for_waiters(100, || spawn("herd")).await;
    assert_eq!(results["herd_misses"], 1, "{context}");
    assert_eq!(results["herd_texts"], 1, "{context}");
    assert_eq!(results["herd_ids"], 1, "{context}");
    assert_eq!(results["repeat_cache"], "HIT", "{context}");
    assert_eq!(gateway.provider.calls(), 1, "{context}");
    let first = &gateway.provider.requests()[0];
    assert_eq!(first.path, "/v1/messages");
    assert_eq!(first.auth_headers(), ["x-api-key"], "{context}");
    assert_eq!(first.header("x-api-key"), Some("sk-ant-caller-a"));
    // The SDK's own API version, forwarded as it sent it.
    assert!(
        first
            .header("anthropic-version")
            .is_some_and(|version| version.starts_with("20")),
        "{:?}",
        first.headers
    );

    // 100 identical `messages.stream`: one upstream stream, every caller's
    // events and final message equal; the non-stream repeat equals it.
    let (results, context) = gateway.held_for_waiters(100, || spawn("stream")).await;
    assert_eq!(results["stream_finals"], 1, "{context}");
    assert_eq!(results["stream_sequences"], 1, "{context}");
    assert_eq!(results["stream_misses"], 1, "{context}");
    assert_eq!(
        results["stream_types"],
        json!(["message_start", "message_stop"]),
        "{context}"
    );
    assert_eq!(results["final_equals_plain"], true, "{context}");
    // The repeat comes right after the last event: from the cache, or from
    // the flight still storing what it streamed. No call either way.
    assert_repeat_after_stream_served(&results, &context);
    assert_eq!(gateway.provider.calls(), 2, "{context}");
    assert_eq!(
        gateway.provider.requests()[1].json().unwrap()["stream"],
        true
    );

    // Two keys, one prompt, at once: two calls (both arrive while held).
    gateway.provider.hold();
    let tenants = spawn("tenants");
    gateway.wait_for_calls(4).await;
    gateway.provider.release();
    let (_, context) = tenants.await.unwrap();
    assert_eq!(gateway.provider.calls(), 4, "{context}");
    let mut keys: Vec<String> = gateway.provider.requests()[2..4]
        .iter()
        .map(|request| request.header("x-api-key").unwrap_or_default().to_owned())
        .collect();
    keys.sort();
    assert_eq!(keys, ["sk-ant-caller-a", "sk-ant-caller-b"], "{context}");

    // One key as x-api-key, then as the SDK's `api_key` (Authorization: Bearer): one tenant.
    let (_, context) = phase(&url, "same_key").await;
    assert_eq!(gateway.provider.calls(), 5, "{context}");

    // A 529 with Retry-After, retried by corral: the SDK (no retries) gets the answer.
    gateway.provider.push_script(overloaded("0.2"));
    let (_, context) = phase(&url, "overload").await;
    let requests = gateway.provider.requests();
    assert_eq!(requests.len(), 7, "the 529 and its retry; {context}");
    assert!(
        requests[6].at - requests[5].at >= Duration::from_millis(200),
        "corral waited what Retry-After asked"
    );
    // The SDK's api_key arrived as a bearer token and left as x-api-key.
    assert_eq!(requests[6].auth_headers(), ["x-api-key"]);
    assert_eq!(requests[6].header("x-api-key"), Some("sk-ant-caller-a"));

    // The provider's refusals, relayed: BadRequestError with Anthropic's error
    // body. corral checked neither role nor range itself: both went upstream.
    let (_, context) = phase(&url, "bad").await;
    assert_eq!(gateway.provider.calls(), 9, "{context}");

    // With gateway keys: a wrong key is an AuthenticationError, a right one in
    // x-api-key passes, and corral's own provider key goes upstream.
    let guarded = messages_gateway(|config| {
        config.cache.sampled = true;
        config.auth.key_hashes = vec![key_hash(b"gw-sdk-key")];
        for upstream in &mut config.upstreams {
            upstream.api_key = Some(Secret::new("sk-ant-corral".into()));
        }
    })
    .await;
    let (_, context) = phase(&guarded.url, "auth").await;
    let sent = guarded.provider.requests();
    assert_eq!(sent.len(), 1, "{context}");
    assert_eq!(sent[0].header("x-api-key"), Some("sk-ant-corral"));
    assert_eq!(sent[0].auth_headers(), ["x-api-key"]);
}
