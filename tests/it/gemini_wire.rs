//! Gemini's wire and streams (issue 37: R1, R4, K1, W1, W2): a silent
//! stream keeps Google's own SDK reading (blank lines, not SSE comments); a
//! stream is complete when it ends after every candidate finished, its
//! trailing chunks kept; `$alt` and `SSE` say `alt=sse`; a `fields` mask and a
//! `fileSearch` tool are answered by the caller's own call; a 429's
//! `RetryInfo` is the provider's wait.

use std::time::Duration;

use corral::config::Config;
use mock_upstream::Scripted;
use serde_json::{Value, json};

use crate::{gemini::with_gemini, harness::TestGateway, sdk::Python};

const KEY: &str = "AIza-GEMINICANARY-7d1e";
const GENERATE: &str = "/v1beta/models/gemini-2.5-flash:generateContent";
const STREAM: &str = "/v1beta/models/gemini-2.5-flash:streamGenerateContent";
/// A generous bound on every wait: the machine may be busy.
const DEADLINE: Duration = Duration::from_secs(60);

/// A deterministic request (stored and replayed) saying `text`.
fn request(text: &str) -> Value {
    json!({
        "contents": [{"role": "user", "parts": [{"text": text}]}],
        "generationConfig": {"temperature": 0},
    })
}

/// `path_and_query` below corral, with the test's Gemini key.
async fn send(gateway: &TestGateway, path_and_query: &str, body: &Value) -> reqwest::Response {
    gateway
        .client
        .post(format!("{}{path_and_query}", gateway.url))
        .header("x-goog-api-key", KEY)
        .json(body)
        .send()
        .await
        .expect("corral answers")
}

/// Status, `x-corral-cache`, content type and body text of an answer.
async fn read(response: reqwest::Response) -> (u16, String, String, String) {
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("-")
            .to_owned()
    };
    let (status, cache, content_type) = (
        response.status().as_u16(),
        header("x-corral-cache"),
        header("content-type"),
    );
    let body = tokio::time::timeout(DEADLINE, response.text())
        .await
        .expect("the body ends")
        .expect("the body reads");
    (status, cache, content_type, body)
}

/// The JSON chunks of an SSE body's `data:` lines.
fn chunks(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .map(|data| serde_json::from_str(data).expect("each event is JSON"))
        .collect()
}

/// Each candidate's text (by `index`) and whether it finished, over `chunks`.
fn candidates(chunks: &[Value]) -> Vec<(String, bool)> {
    let mut merged: Vec<(String, bool)> = Vec::new();
    for chunk in chunks {
        for candidate in chunk["candidates"].as_array().into_iter().flatten() {
            let index = candidate["index"].as_u64().unwrap_or(0) as usize;
            if merged.len() <= index {
                merged.resize(index + 1, (String::new(), false));
            }
            for part in candidate["content"]["parts"]
                .as_array()
                .into_iter()
                .flatten()
            {
                merged[index]
                    .0
                    .push_str(part["text"].as_str().unwrap_or_default());
            }
            merged[index].1 |= candidate["finishReason"].is_string();
        }
    }
    merged
}

fn gemini_with_keepalives(config: &mut Config) {
    with_gemini(config);
    config.coalesce.keepalive_interval = Duration::from_millis(200);
}

/// R1 and the "done when": `google-genai` streams a Gemini answer
/// through corral while the provider says nothing for several keep-alive
/// intervals, with no error; the keep-alives are blank lines (an SSE comment
/// is an `UnknownApiResponseError` to it), and the cached answer's replay
/// carries none.
#[tokio::test]
async fn google_genai_streams_through_a_silence_longer_than_the_keepalive_interval() {
    let python = Python::with_google_genai().await;
    let gateway = TestGateway::start(gemini_with_keepalives).await;
    gateway.provider.hold_stream_starts();
    let url = gateway.url.clone();
    let sdk = tokio::spawn(async move { python.run_script("gemini_keepalive.py", &url).await });
    assert!(
        gateway
            .provider
            .wait_for_streams_at_start(1, DEADLINE)
            .await,
        "the SDK's stream reached the provider"
    );
    // A second silent stream, read raw: its keep-alives are seen as they come,
    // and the SDK's, which started first, has had at least as many.
    let watched = request("watch the silence");
    let mut raw = send(&gateway, &format!("{STREAM}?alt=sse"), &watched).await;
    assert!(
        gateway
            .provider
            .wait_for_streams_at_start(2, DEADLINE)
            .await
    );
    let mut silence = Vec::new();
    for _ in 0..4 {
        let chunk = tokio::time::timeout(DEADLINE, raw.chunk())
            .await
            .expect("a keep-alive comes within the deadline")
            .expect("the stream reads")
            .expect("the stream goes on");
        silence.extend_from_slice(&chunk);
    }
    gateway.provider.release_stream_starts();
    let (results, stderr) = tokio::time::timeout(DEADLINE, sdk)
        .await
        .expect("the SDK script ends")
        .expect("the SDK task runs");
    let context = format!("{results}\nstderr: {stderr}");
    for stream in ["held", "replayed"] {
        let result = &results[stream];
        assert!(result.get("error").is_none(), "{stream}: {context}");
        assert!(
            result["text"]
                .as_str()
                .is_some_and(|text| text.starts_with("mock gemini answer")),
            "{stream}: {context}"
        );
        assert_eq!(result["finish"], "STOP", "{stream}: {context}");
    }
    assert_eq!(results["held"]["text"], results["replayed"]["text"]);
    assert!(
        silence.iter().all(u8::is_ascii_whitespace),
        "a silent Gemini stream is kept alive with blank lines: {:?}",
        String::from_utf8_lossy(&silence)
    );
    // The raw reader gets its whole answer after the silence.
    let mut rest = silence;
    while let Some(chunk) = tokio::time::timeout(DEADLINE, raw.chunk())
        .await
        .expect("the stream ends")
        .expect("the stream reads")
    {
        rest.extend_from_slice(&chunk);
    }
    let streamed = candidates(&chunks(&String::from_utf8_lossy(&rest)));
    assert!(streamed.len() == 1 && streamed[0].1, "{streamed:?}");
    // The SDK's replay was answered from the cache; so is this one, without a
    // keep-alive or anything else between its events.
    assert_eq!(gateway.provider.calls(), 2, "two streams, one replay");
    gateway.wait_idle().await;
    let (status, cache, _, replay) =
        read(send(&gateway, &format!("{STREAM}?alt=sse"), &watched).await).await;
    assert_eq!((status, cache.as_str()), (200, "HIT"));
    let events: String = chunks(&replay)
        .iter()
        .map(|chunk| format!("data: {chunk}\n\n"))
        .collect();
    assert_eq!(replay, events, "a replay is its events and nothing else");
    assert_eq!(candidates(&chunks(&replay)), streamed);
}

/// R4: with `candidateCount: 2` the first candidate finishes (a chunk of its
/// own with its `finishReason`) while the second still speaks; the stream is
/// complete when it ends, every candidate relayed and stored whole.
#[tokio::test]
async fn a_stream_of_two_candidates_completes_only_when_it_ends() {
    let gateway = TestGateway::start(with_gemini).await;
    let mut body = request("two candidates, please");
    body["generationConfig"]["candidateCount"] = json!(2);
    let (status, cache, _, streamed) =
        read(send(&gateway, &format!("{STREAM}?alt=sse"), &body).await).await;
    assert_eq!((status, cache.as_str()), (200, "MISS"));
    let streamed = candidates(&chunks(&streamed));
    assert_eq!(streamed.len(), 2, "{streamed:?}");
    assert!(
        streamed.iter().all(|(_, finished)| *finished),
        "every candidate is relayed to its end: {streamed:?}"
    );
    assert!(streamed[1].0.starts_with(&streamed[0].0) && streamed[1].0.len() > streamed[0].0.len());
    gateway.wait_idle().await;
    let (status, cache, _, whole) = read(send(&gateway, GENERATE, &body).await).await;
    assert_eq!((status, cache.as_str()), (200, "HIT"), "{whole}");
    let whole: Value = serde_json::from_str(&whole).unwrap();
    assert_eq!(candidates(std::slice::from_ref(&whole)), streamed);
    assert_eq!(gateway.provider.calls(), 1);
}

/// R4: a chunk of usage alone after the one that finished the candidate is
/// relayed, and is part of the stored answer.
#[tokio::test]
async fn a_trailing_usage_chunk_is_relayed_and_stored() {
    let gateway = TestGateway::start(with_gemini).await;
    let finished = json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "Hello"}]},
        "finishReason": "STOP", "index": 0}], "modelVersion": "gemini-2.5-flash"});
    let usage = json!({"usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 4,
        "totalTokenCount": 7}, "modelVersion": "gemini-2.5-flash"});
    gateway.provider.push_script(Scripted {
        status: 200,
        headers: vec![("content-type".into(), "text/event-stream".into())],
        body: format!("data: {finished}\r\n\r\ndata: {usage}\r\n\r\n"),
    });
    let body = request("count my tokens");
    let (status, _, _, streamed) =
        read(send(&gateway, &format!("{STREAM}?alt=sse"), &body).await).await;
    assert_eq!(status, 200);
    assert_eq!(chunks(&streamed), [finished, usage], "{streamed}");
    gateway.wait_idle().await;
    let (status, cache, _, whole) = read(send(&gateway, GENERATE, &body).await).await;
    assert_eq!((status, cache.as_str()), (200, "HIT"), "{whole}");
    let whole: Value = serde_json::from_str(&whole).unwrap();
    assert_eq!(whole["usageMetadata"]["totalTokenCount"], 7, "{whole}");
    assert_eq!(
        whole["candidates"][0]["content"]["parts"][0]["text"],
        "Hello"
    );
    assert_eq!(gateway.provider.calls(), 1);
}

/// W1: `$alt` (Google's other spelling of its system parameters, encoded or
/// not) and `SSE` in any case ask for events, which is what the caller gets,
/// and the provider is asked `alt=sse` once.
#[tokio::test]
async fn dollar_alt_and_an_upper_case_sse_are_alt_sse() {
    let gateway = TestGateway::start(with_gemini).await;
    for (n, query) in ["$alt=sse", "%24alt=sse", "alt=SSE"]
        .into_iter()
        .enumerate()
    {
        let body = request(&format!("framing {n}"));
        let (status, _, content_type, streamed) =
            read(send(&gateway, &format!("{STREAM}?{query}"), &body).await).await;
        assert_eq!(status, 200, "{query}");
        assert!(
            content_type.starts_with("text/event-stream"),
            "{query}: {content_type}"
        );
        assert!(streamed.starts_with("data: "), "{query}: {streamed}");
        let streamed = candidates(&chunks(&streamed));
        assert!(
            streamed.len() == 1 && streamed[0].1,
            "{query}: {streamed:?}"
        );
        let sent = gateway.provider.requests().pop().unwrap();
        assert_eq!(sent.query.as_deref(), Some("alt=sse"), "{query}");
    }
}

/// W1: a `fields` mask projects the answer (a projected stream never says it
/// finished): each such request is its own call (`BYPASS`), with its mask,
/// and the unmasked request is not answered from it.
#[tokio::test]
async fn a_fields_mask_is_answered_by_its_own_call_and_never_shared() {
    let gateway = TestGateway::start(with_gemini).await;
    let body = request("only some fields");
    for path in [
        format!("{STREAM}?alt=sse&fields=candidates.content"),
        format!("{STREAM}?alt=sse&fields=candidates.content"),
        format!("{GENERATE}?$fields=usageMetadata"),
        format!("{GENERATE}?$fields=usageMetadata"),
    ] {
        let (status, cache, _, _) = read(send(&gateway, &path, &body).await).await;
        assert_eq!((status, cache.as_str()), (200, "BYPASS"), "{path}");
        let sent = gateway.provider.requests().pop().unwrap();
        assert!(
            sent.query
                .as_deref()
                .is_some_and(|query| query.contains("fields=")),
            "the mask goes to the provider: {:?}",
            sent.query
        );
    }
    assert_eq!(gateway.provider.calls(), 4);
    let (status, cache, _, _) = read(send(&gateway, GENERATE, &body).await).await;
    assert_eq!((status, cache.as_str()), (200, "MISS"));
    assert_eq!(gateway.provider.calls(), 5);
}

/// K1: a `fileSearch` tool searches stores named by reference, whose
/// documents change: never cached, each request its own call.
#[tokio::test]
async fn a_file_search_tool_bypasses_the_cache() {
    let gateway = TestGateway::start(with_gemini).await;
    let mut body = request("what does the handbook say?");
    body["tools"] =
        json!([{"fileSearch": {"fileSearchStoreNames": ["fileSearchStores/handbook"]}}]);
    for _ in 0..2 {
        let (status, cache, _, _) = read(send(&gateway, GENERATE, &body).await).await;
        assert_eq!((status, cache.as_str()), (200, "BYPASS"));
    }
    assert_eq!(gateway.provider.calls(), 2);
}

/// W2: Google's 429 says its wait in the body (`RetryInfo.retryDelay`), not
/// in `Retry-After`: the caller is told it, and a repeat within it is
/// answered from the failure just seen, without a call (no `cache.error_ttl`).
#[tokio::test]
async fn a_gemini_429s_retry_info_is_the_providers_wait() {
    let gateway = TestGateway::start(|config| {
        with_gemini(config);
        config.retry.max_attempts = 1;
        config.cache.error_ttl = Duration::ZERO;
    })
    .await;
    let exhausted = json!({"error": {"code": 429, "message": "Resource has been exhausted.",
    "status": "RESOURCE_EXHAUSTED", "details": [
        {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": []},
        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "30s"},
    ]}});
    gateway
        .provider
        .push_script(Scripted::json(429, exhausted.to_string()));
    let body = request("too many");
    let first = send(&gateway, GENERATE, &body).await;
    assert_eq!(first.status().as_u16(), 429);
    assert_eq!(
        first
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("30")
    );
    let (status, _, _, repeat) = read(send(&gateway, GENERATE, &body).await).await;
    assert_eq!(status, 429, "{repeat}");
    assert_eq!(
        gateway.provider.calls(),
        1,
        "the repeat waited as Google asked"
    );
}
