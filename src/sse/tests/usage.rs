//! The usage chunk: forced upstream, hidden from callers who did not ask.

use bytes::Bytes;
use serde_json::{Value, json};

use super::{event, json_of};
use crate::{
    sse::{CallerUsage, DONE_EVENT, UsageFree, without_usage},
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

/// What a usage-free view reads as: the JSON a rewrite holds, compared as
/// JSON (the members' reading keeps the provider's order, the tree sorts).
fn view_json(view: &UsageFree) -> Option<Value> {
    match view {
        UsageFree::Same => Some(json!("same")),
        UsageFree::Skip => None,
        UsageFree::Rewritten(event) => json_of(event),
    }
}

#[test]
fn reading_the_members_as_written_decides_as_the_tree_does() {
    let cases = [
        // OpenAI's own: compact, its order, `"usage": null` on every chunk.
        r#"data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"a"}}],"usage":null}"#,
        r#"data: {"id":"c1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}"#,
        r#"data: {"id":"c1","choices":[{"index":0,"delta":{}}],"usage":{"prompt_tokens":3}}"#,
        r#"data: {"usage":{"prompt_tokens":3},"id":"c1"}"#,
        r#"data: {"choices":{},"usage":{"prompt_tokens":3}}"#,
        r#"data: {"choices":[ ],"usage":{"prompt_tokens":3}}"#,
        r#"data: {"choices":[[]],"usage":{"prompt_tokens":3}}"#,
        r#"data: {"choices":[],"prompt_filter_results":[]}"#,
        // White space between members, and a nested `usage` that is not the chunk's.
        r#"data: { "id" : "c1", "choices" : [ {"usage": 1} ], "usage" : null }"#,
        r#"data: {"choices":[{"delta":{"content":"\"usage\": null"}}]}"#,
    ];
    for case in cases {
        let event = Bytes::from(format!("{case}\n\n"));
        let by_members =
            UsageFree::by_members(&event).unwrap_or_else(|| panic!("read by its members: {case}"));
        let by_tree = UsageFree::by_tree(&event);
        assert_eq!(view_json(&by_members), view_json(&by_tree), "{case}");
        assert_eq!(
            view_json(&UsageFree::of(&event)),
            view_json(&by_tree),
            "{case}"
        );
    }
    // What only the tree can read goes to the tree, with the same outcome.
    let for_the_tree = [
        r#"data: {"us\u0061ge":null,"choices":[]}"#,
        r#"data: {"usage":null,"usage":{"prompt_tokens":3},"choices":[]}"#,
        "data: {\"usage\":null,\n\"choices\":[]}",
        "data: [1]",
    ];
    for case in for_the_tree {
        let event = Bytes::from(format!("{case}\n\n"));
        assert_eq!(UsageFree::by_members(&event), None, "{case}");
        assert_eq!(
            view_json(&UsageFree::of(&event)),
            view_json(&UsageFree::by_tree(&event)),
            "{case}"
        );
    }
    let escaped = Bytes::from_static(b"data: {\"us\\u0061ge\":null,\"choices\":[{}]}\n\n");
    assert_eq!(
        view_json(&UsageFree::of(&escaped)),
        Some(json!({"choices": [{}]})),
        "an escaped key is still the usage member"
    );
}
