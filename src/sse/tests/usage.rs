//! The usage chunk: forced upstream, hidden from callers who did not ask.

use bytes::Bytes;
use serde_json::{Value, json};

use super::event;
use crate::{
    sse::{CallerUsage, DONE_EVENT, without_usage},
    wire::chat::force_include_usage,
};

fn map(value: Value) -> serde_json::Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => panic!("test bodies are objects"),
    }
}

fn sent(body: Value) -> (Value, CallerUsage) {
    let request = force_include_usage(&map(body));
    let sent = serde_json::from_slice(&request.body).expect("JSON body");
    (sent, request.caller_usage)
}

#[test]
fn usage_is_forced_and_the_callers_own_choice_is_reported() {
    let base = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});

    let (body, usage) = sent(base.clone());
    assert_eq!(usage, CallerUsage::NotAsked);
    assert_eq!(body["stream"], true, "stream_options needs stream: true");
    assert_eq!(body["stream_options"], json!({"include_usage": true}));
    assert_eq!(body["messages"], base["messages"], "the rest is untouched");

    let mut asked = base.clone();
    asked["stream"] = json!(true);
    asked["stream_options"] = json!({"include_usage": true, "include_obfuscation": false});
    let (body, usage) = sent(asked);
    assert_eq!(usage, CallerUsage::Asked);
    assert_eq!(
        body["stream_options"],
        json!({"include_usage": true, "include_obfuscation": false}),
        "other stream options are kept"
    );

    for declined in [json!(null), json!({}), json!({"include_usage": false})] {
        let mut body = base.clone();
        body["stream_options"] = declined;
        let (body, usage) = sent(body);
        assert_eq!(usage, CallerUsage::NotAsked);
        assert_eq!(body["stream_options"]["include_usage"], true);
    }

    let mut invalid = base;
    invalid["stream_options"] = json!("yes");
    let (body, usage) = sent(invalid);
    assert_eq!(usage, CallerUsage::NotAsked);
    assert_eq!(
        body["stream_options"], "yes",
        "left for the provider to reject"
    );
}

#[test]
fn without_usage_drops_the_usage_member_and_the_usage_only_chunk() {
    let plain = event(r#"{"choices":[{"index":0,"delta":{"content":"a"}}]}"#);
    let same = without_usage(&plain).unwrap();
    assert_eq!(same, plain);
    assert_eq!(
        same.as_ptr(),
        plain.as_ptr(),
        "unchanged events are not copied"
    );

    let with_null = event(r#"{"choices":[{"index":0,"delta":{"content":"a"}}],"usage":null}"#);
    assert_eq!(without_usage(&with_null), Some(plain.clone()));

    let usage_only = event(r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}"#);
    assert_eq!(without_usage(&usage_only), None);

    // Some OpenAI-compatible servers put the counts on the last content chunk: the chunk
    // stays, the counts go.
    let counted =
        event(r#"{"choices":[{"index":0,"delta":{"content":"a"}}],"usage":{"prompt_tokens":3}}"#);
    assert_eq!(without_usage(&counted), Some(plain));

    // A chunk with no choices and no usage (a content-filter notice) is kept.
    let notice = event(r#"{"choices":[],"prompt_filter_results":[]}"#);
    assert_eq!(without_usage(&notice), Some(notice.clone()));

    let done = Bytes::from_static(DONE_EVENT);
    assert_eq!(without_usage(&done), Some(done));
}
