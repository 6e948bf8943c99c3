//! Gemini's native surface over real loopback HTTP: the shapes `google-genai` parses
//! (`GenerateContentResponse` whole and streamed in both framings, `usageMetadata`,
//! `EmbedContentResponse`), the way its `_iter_response_stream` reads a stream (`data: ` lines
//! up to a blank line), and the same knobs as the other surfaces' streams.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::test_support::{DEADLINE, body_until_cut, client, start};
use crate::{FailureMode, MockProvider, MockSettings, Scripted};

const GENERATE: &str = "/v1beta/models/gemini-2.5-flash:generateContent";
const STREAM_SSE: &str = "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse";
const STREAM_ARRAY: &str = "/v1beta/models/gemini-2.5-flash:streamGenerateContent";
const EMBED: &str = "/v1beta/models/gemini-embedding-001:embedContent";
const BATCH_EMBED: &str = "/v1beta/models/gemini-embedding-001:batchEmbedContents";

fn request(text: &str) -> Value {
    json!({
        "contents": [{"role": "user", "parts": [{"text": text}]}],
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
    })
}

/// A POST of `body` to `path` below the mock's root (`/v1beta/...`, `/v1/...`).
async fn post(mock: &MockProvider, path: &str, body: &Value) -> reqwest::Response {
    client()
        .post(format!("http://{}{path}", mock.addr()))
        .header("x-goog-api-key", "AIza-test")
        .json(body)
        .timeout(DEADLINE)
        .send()
        .await
        .expect("sending the request")
}

async fn post_json(mock: &MockProvider, path: &str, body: &Value) -> (u16, Value) {
    let response = post(mock, path, body).await;
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON body"))
}

/// The chunks of an SSE body as Google frames it: `data: {json}\r\n\r\n` each, no event
/// names, no `[DONE]`.
fn sse_chunks(body: &str) -> Vec<Value> {
    assert!(body.ends_with("\r\n\r\n"), "a whole last event: {body:?}");
    body.split_terminator("\r\n\r\n")
        .map(|event| {
            let data = event
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not a data event: {event:?}"));
            serde_json::from_str(data).expect("a JSON chunk")
        })
        .collect()
}

fn text_of(chunk: &Value) -> &str {
    chunk["candidates"][0]["content"]["parts"][0]["text"]
        .as_str()
        .expect("a text part")
}

fn assembled(chunks: &[Value]) -> String {
    chunks.iter().map(text_of).collect()
}

fn usage_figure(usage: &Value, name: &str) -> u64 {
    usage[name]
        .as_u64()
        .unwrap_or_else(|| panic!("{name} in {usage}"))
}

#[tokio::test]
async fn an_sse_stream_assembles_to_the_answer_of_the_same_call() {
    let mock = start().await;
    let body = request("Tell me about the weather in Lisbon today");
    let (status, whole) = post_json(&mock, GENERATE, &body).await;
    assert_eq!(status, 200);
    let answer = whole["candidates"][0]["content"]["parts"][0]["text"]
        .as_str()
        .expect("an answer");
    assert!(
        answer.starts_with("mock gemini answer 1 to: Tell me"),
        "{answer}"
    );
    assert_eq!(whole["candidates"][0]["finishReason"], "STOP");
    assert_eq!(whole["candidates"][0]["content"]["role"], "model");
    assert_eq!(whole["modelVersion"], "gemini-2.5-flash");
    assert_eq!(whole["responseId"], "mock-1");

    // The same call number again: the stream must carry exactly that answer.
    mock.reset();
    let response = post(&mock, STREAM_SSE, &body).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let text = response.text().await.expect("a body");
    assert!(
        !text.contains("event:") && !text.contains("[DONE]"),
        "{text}"
    );
    let chunks = sse_chunks(&text);
    assert!(chunks.len() >= 3, "several chunks: {}", chunks.len());
    assert_eq!(assembled(&chunks), answer);

    let usage = &whole["usageMetadata"];
    let prompt = usage_figure(usage, "promptTokenCount");
    let mut candidates_before = 0;
    for (i, chunk) in chunks.iter().enumerate() {
        let candidate = &chunk["candidates"][0];
        assert_eq!(candidate["content"]["role"], "model");
        assert_eq!(candidate["index"], 0);
        assert_eq!(chunk["responseId"], "mock-1");
        assert_eq!(chunk["modelVersion"], "gemini-2.5-flash");
        let running = &chunk["usageMetadata"];
        assert_eq!(usage_figure(running, "promptTokenCount"), prompt);
        let candidates = usage_figure(running, "candidatesTokenCount");
        assert!(candidates >= candidates_before, "a running count");
        candidates_before = candidates;
        assert_eq!(
            usage_figure(running, "totalTokenCount"),
            prompt + candidates
        );
        let last = i + 1 == chunks.len();
        assert_eq!(candidate.get("finishReason").is_some(), last, "{chunk}");
    }
    let last = chunks.last().expect("a last chunk");
    assert_eq!(last["candidates"][0]["finishReason"], "STOP");
    assert_eq!(last["usageMetadata"], *usage, "the whole answer's usage");
    assert_eq!(mock.calls_to(":streamGenerateContent"), 1);
    assert_eq!(mock.requests()[0].query.as_deref(), Some("alt=sse"));
}

#[tokio::test]
async fn without_alt_sse_the_chunks_are_a_streamed_json_array() {
    let mock = start().await;
    let body = request("Stream me as an array please, in several pieces");
    let sse = post(&mock, STREAM_SSE, &body).await.text().await.unwrap();
    mock.reset();
    let response = post(&mock, STREAM_ARRAY, &body).await;
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"].to_str().unwrap();
    assert!(
        content_type.starts_with("application/json"),
        "{content_type}"
    );
    let text = response.text().await.expect("a body");
    assert!(text.starts_with("[{") && text.ends_with("}\r\n]"), "{text}");
    assert!(text.contains("}\r\n,{"), "{text}");
    let array: Vec<Value> = serde_json::from_str(&text).expect("one JSON array");
    assert_eq!(array, sse_chunks(&sse), "the same chunks either way");
}

#[tokio::test]
async fn a_truncated_stream_ends_before_its_finish_reason() {
    let mock = start().await;
    mock.set_truncate_streams(true);
    let body = request("cut me short, somewhere in the middle of it");
    let response = post(&mock, STREAM_SSE, &body).await;
    assert_eq!(response.status(), 200);
    let cut = body_until_cut(response).await;
    let chunks = sse_chunks(std::str::from_utf8(&cut).unwrap());
    assert_eq!(chunks.len(), 1, "the first content chunk only");
    assert!(text_of(&chunks[0]).starts_with("mock gemini answer 1"));
    assert!(chunks[0]["candidates"][0].get("finishReason").is_none());

    let cut = body_until_cut(post(&mock, STREAM_ARRAY, &body).await).await;
    let cut = std::str::from_utf8(&cut).unwrap();
    assert!(
        cut.starts_with("[{") && cut.ends_with("}\r\n"),
        "the array never closes: {cut}"
    );
    assert_eq!(cut.matches("\r\n").count(), 1, "one element: {cut}");
    assert!(!cut.contains("finishReason"), "{cut}");
}

#[tokio::test]
async fn thoughts_and_cached_content_are_billed_as_google_bills_them() {
    let mock = start().await;
    let plain = request("What does a thought cost, and what does a cache save?");
    let (_, whole) = post_json(&mock, GENERATE, &plain).await;
    let usage = &whole["usageMetadata"];
    assert!(usage.get("thoughtsTokenCount").is_none(), "{usage}");
    assert!(usage.get("cachedContentTokenCount").is_none(), "{usage}");
    let prompt = usage_figure(usage, "promptTokenCount");
    let candidates = usage_figure(usage, "candidatesTokenCount");
    assert_eq!(usage_figure(usage, "totalTokenCount"), prompt + candidates);

    let mut thinking = plain.clone();
    thinking["generationConfig"] = json!({"thinkingConfig": {"thinkingBudget": 1024}});
    thinking["cachedContent"] = json!("cachedContents/abc123");
    for (budget, thoughts) in [(1024, 40), (8, 8)] {
        thinking["generationConfig"]["thinkingConfig"]["thinkingBudget"] = json!(budget);
        let (_, whole) = post_json(&mock, GENERATE, &thinking).await;
        let usage = &whole["usageMetadata"];
        assert_eq!(usage_figure(usage, "thoughtsTokenCount"), thoughts);
        assert_eq!(usage_figure(usage, "promptTokenCount"), prompt);
        assert_eq!(
            usage_figure(usage, "cachedContentTokenCount"),
            (prompt / 2).max(1),
            "part of the prompt"
        );
        assert_eq!(
            usage_figure(usage, "totalTokenCount"),
            prompt + usage_figure(usage, "candidatesTokenCount") + thoughts
        );
    }

    // The stream's last chunk bills the same; no budget (or 0, or dynamic -1) is no thoughts.
    mock.reset();
    let (_, whole) = post_json(&mock, GENERATE, &thinking).await;
    mock.reset();
    let text = post(&mock, STREAM_SSE, &thinking)
        .await
        .text()
        .await
        .unwrap();
    let chunks = sse_chunks(&text);
    assert_eq!(
        chunks.last().unwrap()["usageMetadata"],
        whole["usageMetadata"]
    );
    assert!(
        chunks
            .iter()
            .all(|c| c["usageMetadata"]["thoughtsTokenCount"] == 8)
    );
    for budget in [json!(0), json!(-1)] {
        thinking["generationConfig"]["thinkingConfig"]["thinkingBudget"] = budget;
        let (_, whole) = post_json(&mock, GENERATE, &thinking).await;
        assert!(whole["usageMetadata"].get("thoughtsTokenCount").is_none());
    }
    // Google's JSON parser takes proto names too.
    let snake = json!({
        "contents": plain["contents"],
        "system_instruction": plain["systemInstruction"],
        "generation_config": {"thinking_config": {"thinking_budget": 16}},
        "cached_content": "cachedContents/abc123",
    });
    let (_, whole) = post_json(&mock, GENERATE, &snake).await;
    assert_eq!(whole["usageMetadata"]["thoughtsTokenCount"], 16);
    assert!(whole["usageMetadata"]["cachedContentTokenCount"].is_u64());
}

#[tokio::test]
async fn embeddings_have_googles_shapes_and_are_counted() {
    let mock = start().await;
    let content = |text: &str| json!({"parts": [{"text": text}]});
    let (status, one) = post_json(&mock, EMBED, &json!({"content": content("alpha")})).await;
    assert_eq!(status, 200);
    let values = one["embedding"]["values"].as_array().expect("values");
    assert_eq!(values.len(), 8, "the mock's default size");
    assert!(
        values
            .iter()
            .all(|v| v.as_f64().is_some_and(|v| (-1.0..1.0).contains(&v)))
    );
    let (_, again) = post_json(&mock, EMBED, &json!({"content": content("alpha")})).await;
    assert_eq!(again, one, "deterministic per text");

    let query = json!({
        "content": content("alpha"),
        "taskType": "RETRIEVAL_QUERY",
        "outputDimensionality": 16,
    });
    let (_, asked) = post_json(&mock, EMBED, &query).await;
    assert_eq!(asked["embedding"]["values"].as_array().unwrap().len(), 16);
    assert_ne!(
        asked["embedding"]["values"][0], one["embedding"]["values"][0],
        "task types differ"
    );

    let model = "models/gemini-embedding-001";
    let batch = json!({"requests": [
        {"model": model, "content": content("alpha")},
        {
            "model": model,
            "content": content("beta"),
            "taskType": "RETRIEVAL_QUERY",
            "outputDimensionality": 16,
        },
    ]});
    let (status, both) = post_json(&mock, BATCH_EMBED, &batch).await;
    assert_eq!(status, 200);
    let embeddings = both["embeddings"].as_array().expect("embeddings");
    assert_eq!(embeddings.len(), 2);
    assert_eq!(
        embeddings[0], one["embedding"],
        "the same vector either way"
    );
    assert_eq!(embeddings[1]["values"].as_array().unwrap().len(), 16);

    assert_eq!(mock.embedded_inputs(), 5);
    let counts = mock.embedded_counts();
    assert_eq!(counts.get("alpha"), Some(&4));
    assert_eq!(counts.get("beta"), Some(&1));

    // Refused requests, in Google's error shape, embed nothing.
    let too_big = json!({"content": content("gamma"), "outputDimensionality": 4000});
    let (status, refused) = post_json(&mock, EMBED, &too_big).await;
    assert_eq!(status, 400);
    assert_eq!(refused["error"]["status"], "INVALID_ARGUMENT");
    assert_eq!(refused["error"]["code"], 400);
    let (status, _) = post_json(&mock, BATCH_EMBED, &json!({"requests": []})).await;
    assert_eq!(status, 400);
    let (status, _) = post_json(&mock, EMBED, &json!({"taskType": "CLUSTERING"})).await;
    assert_eq!(status, 400);
    assert_eq!(mock.embedded_inputs(), 5);
    assert_eq!(mock.calls_to(":embedContent"), 5);
    assert_eq!(mock.calls_to(":batchEmbedContents"), 2);
}

#[tokio::test]
async fn the_model_list_names_the_stream_and_embedding_methods() {
    let mock = start().await;
    let list: Value = client()
        .get(format!("http://{}/v1beta/models", mock.addr()))
        .send()
        .await
        .expect("the list")
        .json()
        .await
        .expect("JSON");
    let methods = |name: &str| -> Vec<String> {
        let model = list["models"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {list}"));
        serde_json::from_value(model["supportedGenerationMethods"].clone()).unwrap()
    };
    let flash = methods("models/gemini-2.5-flash");
    assert!(flash.iter().any(|m| m == "generateContent"));
    assert!(flash.iter().any(|m| m == "streamGenerateContent"));
    let embedding = methods("models/gemini-embedding-001");
    assert!(embedding.iter().any(|m| m == "embedContent"));
    assert!(embedding.iter().any(|m| m == "batchEmbedContents"));
    assert_eq!(mock.calls(), 0, "the list is not billable");
}

#[tokio::test]
async fn the_methods_are_answered_under_v1_beside_openais_routes() {
    let mock = start().await;
    let (status, whole) = post_json(
        &mock,
        "/v1/models/gemini-2.5-flash:generateContent",
        &request("the 3.x default"),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(whole["candidates"][0]["finishReason"], "STOP");
    let text = post(
        &mock,
        "/v1/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
        &request("streamed under v1"),
    )
    .await
    .text()
    .await
    .unwrap();
    assert!(assembled(&sse_chunks(&text)).starts_with("mock gemini answer 2"));
    let (status, embedded) = post_json(
        &mock,
        "/v1/models/gemini-embedding-001:embedContent",
        &json!({"content": {"parts": [{"text": "v1"}]}}),
    )
    .await;
    assert_eq!(status, 200);
    assert!(embedded["embedding"]["values"].is_array());

    // OpenAI's routes stay OpenAI's; a POST that is no Gemini method is no route, and free.
    let (status, openai) = post_json(&mock, "/v1/models/gpt-4o", &json!({})).await;
    assert_eq!(status, 404);
    assert_eq!(openai["error"]["type"], "invalid_request_error");
    let list: Value = client()
        .get(format!("{}/models", mock.base_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["object"], "list");
    assert_eq!(mock.calls(), 3);
}

#[tokio::test]
async fn failures_and_scripts_answer_a_stream_in_geminis_shape() {
    let mock = start().await;
    mock.set_failure(Some(
        FailureMode::always(429).with_retry_after(Duration::from_millis(1500)),
    ));
    let response = post(&mock, STREAM_SSE, &request("fail me")).await;
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["retry-after"], "2");
    let error: Value = response.json().await.expect("JSON");
    assert_eq!(error["error"]["code"], 429);
    assert_eq!(error["error"]["status"], "RESOURCE_EXHAUSTED");
    assert!(error["error"]["message"].is_string());
    assert_eq!(
        error["error"]["details"][0]["@type"],
        "type.googleapis.com/google.rpc.RetryInfo"
    );
    assert_eq!(error["error"]["details"][0]["retryDelay"], "2s");
    mock.set_failure(Some(FailureMode::always(503)));
    let (status, error) = post_json(&mock, GENERATE, &request("overloaded")).await;
    assert_eq!(
        (status, &error["error"]["status"]),
        (503, &json!("UNAVAILABLE"))
    );
    mock.set_failure(None);

    mock.push_script(Scripted::json(
        400,
        r#"{"error":{"code":400,"status":"FAILED_PRECONDITION"}}"#,
    ));
    let (status, scripted) = post_json(&mock, STREAM_SSE, &request("scripted")).await;
    assert_eq!(status, 400);
    assert_eq!(scripted["error"]["status"], "FAILED_PRECONDITION");
    assert_eq!(mock.calls(), 3, "every one counted");
}

#[tokio::test]
async fn held_calls_and_held_stream_ends_keep_a_gemini_stream_waiting() {
    let mock = start().await;
    mock.hold();
    mock.hold_stream_ends();
    let reader = {
        let mock = mock.clone();
        tokio::spawn(async move {
            post(&mock, STREAM_SSE, &request("keep me open for a while"))
                .await
                .text()
                .await
                .expect("a body")
        })
    };
    assert!(mock.wait_for_calls(1, DEADLINE).await);
    assert_eq!(mock.streams_at_end().streams, 0, "held before it answers");
    mock.release();
    assert!(mock.wait_for_streams_at_end(1, DEADLINE).await);
    let at_end = mock.streams_at_end();
    assert!(at_end.bytes > 0 && !reader.is_finished());
    mock.release_stream_ends();
    let body = tokio::time::timeout(DEADLINE, reader)
        .await
        .expect("released")
        .expect("the reader");
    let chunks = sse_chunks(&body);
    let last = chunks.last().unwrap();
    let last_bytes = format!("data: {last}\r\n\r\n").len() as u64;
    assert_eq!(
        body.len() as u64 - last_bytes,
        at_end.bytes,
        "all but the last chunk"
    );
    assert_eq!(last["candidates"][0]["finishReason"], "STOP");
}

#[tokio::test]
async fn a_padded_gemini_stream_is_more_one_word_chunks_of_the_candidate() {
    let mock = start().await;
    let body = request("pad me");
    let plain = post(&mock, STREAM_SSE, &body).await.text().await.unwrap();
    let plain_text = assembled(&sse_chunks(&plain));
    mock.reset();
    mock.set_stream_padding(20_000);
    for path in [STREAM_SSE, STREAM_ARRAY] {
        let padded = post(&mock, path, &body).await.text().await.unwrap();
        assert!(padded.len() >= 20_000, "{} bytes", padded.len());
        let chunks = if path == STREAM_SSE {
            sse_chunks(&padded)
        } else {
            serde_json::from_str(&padded).expect("still one JSON array")
        };
        assert!(chunks.len() > 50, "one word per padding chunk");
        let text = assembled(&chunks);
        let first = text_of(&chunks[0]);
        assert!(text.starts_with(first) && text.contains(" the quick brown fox"));
        assert!(
            text.ends_with(&plain_text[first.len()..]),
            "the answer goes on after"
        );
        let last = chunks.last().unwrap();
        assert_eq!(last["candidates"][0]["finishReason"], "STOP");
        assert!(
            chunks
                .iter()
                .all(|c| c["responseId"] == chunks[0]["responseId"])
        );
    }
}

#[tokio::test]
async fn stream_delays_pace_a_gemini_stream() {
    let delay = Duration::from_millis(40);
    let mock = MockProvider::start(MockSettings {
        stream_chunk_delay: delay,
        stream_first_event_delay: delay,
        ..MockSettings::default()
    })
    .await
    .expect("a mock");
    let started = Instant::now();
    let body = post(&mock, STREAM_SSE, &request("pace me slowly please"))
        .await
        .text()
        .await
        .unwrap();
    let chunks = sse_chunks(&body).len() as u32;
    assert!(
        started.elapsed() >= delay * chunks,
        "one delay before each chunk"
    );
}
