//! Padding and the end hold, over real loopback HTTP. Every wait is for an event (a stream
//! arriving at its end, a task finishing), bounded by a deadline that only a failing test meets.

use serde_json::{Value, json};

use super::super::test_support::{DEADLINE, client, post_to, start, streamed_content, with};
use super::StreamsAtEnd;

/// The whole body of a streamed chat about `text`, read to its end.
async fn stream_body(mock: &crate::MockProvider, text: &str) -> String {
    post_to(mock, "/chat/completions", &streamed_chat(text))
        .send()
        .await
        .expect("a stream")
        .text()
        .await
        .expect("its body")
}

fn streamed_chat(text: &str) -> Value {
    json!({
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": text}],
        "stream": true,
        "stream_options": {"include_usage": true},
    })
}

/// The JSON chunks of a chat SSE body and whether it ended with `[DONE]`, checking the framing.
fn chunks(body: &str) -> (Vec<Value>, bool) {
    assert!(body.ends_with("\n\n"), "SSE body must end an event");
    let mut done = false;
    let chunks = body
        .split_terminator("\n\n")
        .filter_map(|event| {
            let data = event.strip_prefix("data: ").expect("a data event");
            assert!(!done, "nothing after [DONE]");
            if data == "[DONE]" {
                done = true;
                return None;
            }
            Some(serde_json::from_str(data).expect("a JSON chunk"))
        })
        .collect();
    (chunks, done)
}

#[tokio::test]
async fn a_padded_stream_is_at_least_its_size_in_ordinary_content_chunks() {
    let mock = start().await;
    let plain = stream_body(&mock, "pad me").await;
    let (plain_chunks, _) = chunks(&plain);

    let size = 300_000;
    mock.set_stream_padding(size);
    let padded = stream_body(&mock, "pad me").await;
    assert!(padded.len() >= size, "{} bytes", padded.len());
    assert!(
        padded.len() < size + 1_000,
        "padded past one chunk: {}",
        padded.len()
    );
    let (padded_chunks, done) = chunks(&padded);
    assert!(done, "the stream still ends with [DONE]");
    assert!(padded_chunks.len() > 1_000, "one word per chunk");
    // Every padding chunk is an ordinary content chunk of the stream's first choice.
    for chunk in &padded_chunks {
        assert_eq!(chunk["id"], "chatcmpl-mock-2");
        assert_eq!(chunk["object"], "chat.completion.chunk");
    }
    let usage = padded_chunks.last().expect("a usage chunk");
    assert_eq!(usage["choices"], json!([]));
    assert!(usage["usage"]["total_tokens"].is_u64());
    // The padding goes in after the first word: the text still starts and ends as it did.
    let (plain_text, padded_text) = (
        streamed_content(&plain_chunks),
        streamed_content(&padded_chunks),
    );
    let first_word = plain_chunks[1]["choices"][0]["delta"]["content"]
        .as_str()
        .expect("the first word");
    let rest = &plain_text[first_word.len()..];
    assert!(padded_text.starts_with(first_word), "{padded_text:.80}");
    assert!(padded_text.ends_with(rest));
    assert!(padded_text.contains(" the quick brown fox"));

    // Other formats are not padded, and 0 turns it off.
    mock.set_stream_padding(0);
    let again = stream_body(&mock, "pad me").await;
    assert_eq!(streamed_content(&chunks(&again).0), plain_text);
}

#[tokio::test]
async fn held_streams_send_all_but_their_end_and_are_counted_until_released() {
    let mock = start().await;
    mock.set_stream_padding(100_000);
    mock.hold_stream_ends();
    let readers: Vec<_> = (0..3)
        .map(|i| {
            let request = post_to(&mock, "/chat/completions", &streamed_chat(&format!("s{i}")));
            tokio::spawn(async move {
                request
                    .send()
                    .await
                    .expect("stream")
                    .text()
                    .await
                    .expect("body")
            })
        })
        .collect();
    assert!(mock.wait_for_streams_at_end(3, DEADLINE).await);
    let at_end = mock.streams_at_end();
    assert_eq!(at_end.streams, 3);
    assert!(at_end.bytes >= 300_000, "{at_end:?}");
    assert!(readers.iter().all(|reader| !reader.is_finished()));

    mock.release_stream_ends();
    let mut sent = 0;
    for reader in readers {
        let body = tokio::time::timeout(DEADLINE, reader)
            .await
            .expect("released")
            .expect("reader");
        let (_, done) = chunks(&body);
        assert!(done);
        sent += (body.len() - "data: [DONE]\n\n".len()) as u64;
    }
    assert_eq!(sent, at_end.bytes, "what was counted is what was sent");
    assert_eq!(mock.streams_at_end(), StreamsAtEnd::default());

    // Released: streams no longer wait; a new hold holds again; a reset lets go.
    let body = stream_body(&mock, "free").await;
    assert!(chunks(&body).1);
    mock.hold_stream_ends();
    let held = {
        let request = post_to(&mock, "/chat/completions", &streamed_chat("held"));
        tokio::spawn(async move { request.send().await.expect("stream").text().await })
    };
    assert!(mock.wait_for_streams_at_end(1, DEADLINE).await);
    mock.reset();
    let body = tokio::time::timeout(DEADLINE, held)
        .await
        .expect("reset releases")
        .expect("reader")
        .expect("body");
    assert!(chunks(&body).1);
    assert!(body.len() >= 100_000, "made before the reset, padded");
}

#[tokio::test]
async fn padding_and_the_end_hold_are_steered_over_http() {
    let mock = start().await;
    let http = client();
    let admin = |path: &str| format!("http://{}/__mock/{path}", mock.addr());

    let padding = http
        .post(admin("stream_padding"))
        .json(&json!({"bytes": 50_000}))
        .send()
        .await
        .expect("padding");
    assert_eq!(padding.status(), 204);
    let hold = http
        .post(admin("stream_ends"))
        .json(&json!({"held": true}))
        .send()
        .await
        .expect("hold");
    assert_eq!(hold.status(), 204);
    let stream = {
        let request = post_to(&mock, "/chat/completions", &streamed_chat("over http"));
        tokio::spawn(async move { request.send().await.expect("stream").text().await })
    };
    let ends: Value = http
        .get(admin("stream_ends?wait_for=1&timeout_ms=10000"))
        .send()
        .await
        .expect("long poll")
        .json()
        .await
        .expect("JSON");
    assert_eq!(ends["reached"], true);
    assert_eq!(ends["held"], true);
    assert_eq!(ends["waiting"], 1);
    assert!(
        ends["waiting_bytes"].as_u64().expect("bytes") >= 50_000,
        "{ends}"
    );
    let release = http
        .post(admin("stream_ends"))
        .json(&json!({"held": false}))
        .send()
        .await
        .expect("release");
    assert_eq!(release.status(), 204);
    let body = tokio::time::timeout(DEADLINE, stream)
        .await
        .expect("released")
        .expect("reader")
        .expect("body");
    assert!(body.len() >= 50_000 && chunks(&body).1);

    let typo = http
        .post(admin("stream_ends"))
        .json(&with(json!({"held": true}), "hold", json!(true)))
        .send()
        .await
        .expect("typo");
    assert_eq!(typo.status(), 400);
    let ends: Value = http
        .get(admin("stream_ends"))
        .send()
        .await
        .expect("read")
        .json()
        .await
        .expect("JSON");
    assert_eq!(ends["held"], false, "a refused body changes nothing");
}
