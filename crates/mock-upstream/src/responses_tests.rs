//! `POST /v1/responses` over loopback HTTP: deterministic answers, the named event stream, and
//! the truncation knob cutting it before `response.completed`.

use serde_json::{Value, json};

use crate::MockProvider;
use crate::test_support::{body_until_cut, named_events, post_to, start};

async fn post(mock: &MockProvider, body: &Value) -> reqwest::Response {
    post_to(mock, "/responses", body)
        .send()
        .await
        .expect("sending the request")
}

fn request(text: &str) -> Value {
    json!({
        "model": "gpt-4o-mini",
        "instructions": "Be terse.",
        "input": [{"role": "user", "content": text}],
    })
}

fn output_text(response: &Value) -> &str {
    response["output"][0]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
}

#[tokio::test]
async fn answers_depend_on_what_shapes_them_and_only_that() {
    let mock = start().await;
    let answer = |body: Value| {
        let mock = &mock;
        async move { post(mock, &body).await.json::<Value>().await.unwrap() }
    };
    let first = answer(request("hello")).await;
    assert_eq!(first["object"], "response");
    assert_eq!(first["status"], "completed");
    assert_eq!(first["output"][0]["type"], "message");
    assert!(output_text(&first).ends_with("hello"), "{first}");
    let usage = &first["usage"];
    assert!(usage["input_tokens"].as_u64().unwrap() > 0);
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(usage["input_tokens"].as_u64().unwrap() + usage["output_tokens"].as_u64().unwrap())
    );
    let again = answer(request("hello")).await;
    assert_eq!(output_text(&again), output_text(&first));
    assert_ne!(again["id"], first["id"], "each call is its own response");
    let mut chained = request("hello");
    chained["previous_response_id"] = json!("resp_a");
    let a = answer(chained.clone()).await;
    chained["previous_response_id"] = json!("resp_b");
    let b = answer(chained).await;
    assert_ne!(output_text(&a), output_text(&first));
    assert_ne!(output_text(&a), output_text(&b));
    let mut background = request("hello");
    background["background"] = json!(true);
    assert_eq!(answer(background).await["status"], "queued");
    let bad = post(&mock, &json!({"model": "gpt-4o-mini"})).await;
    assert_eq!(bad.status(), 400);
    assert_eq!(mock.calls(), 6);
}

#[tokio::test]
async fn a_stream_is_named_numbered_and_ends_with_the_whole_response() {
    let mock = start().await;
    let plain: Value = post(&mock, &request("stream me"))
        .await
        .json()
        .await
        .unwrap();
    let mut streamed = request("stream me");
    streamed["stream"] = json!(true);
    let response = post(&mock, &streamed).await;
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let events = named_events(&response.text().await.unwrap());
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ]
    );
    assert_eq!(
        names[names.len() - 4..],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    for (n, (_, data)) in events.iter().enumerate() {
        assert_eq!(data["sequence_number"], n);
    }
    let deltas: String = events
        .iter()
        .filter(|(name, _)| name == "response.output_text.delta")
        .map(|(_, data)| data["delta"].as_str().unwrap())
        .collect();
    let completed = &events.last().unwrap().1["response"];
    assert_eq!(deltas, output_text(completed));
    assert_eq!(output_text(completed), output_text(&plain));
    assert_eq!(completed["usage"], plain["usage"]);
    assert!(events[0].1["response"]["usage"].is_null());
}

#[tokio::test]
async fn a_truncated_stream_is_cut_before_response_completed() {
    let mock = start().await;
    mock.set_truncate_streams(true);
    let mut streamed = request("cut me short");
    streamed["stream"] = json!(true);
    let response = post(&mock, &streamed).await;
    let body = body_until_cut(response).await;
    let events = named_events(std::str::from_utf8(&body).unwrap());
    assert_eq!(events.last().unwrap().0, "response.output_text.delta");
    assert!(events.iter().all(|(name, _)| name != "response.completed"));
}

/// A request with a strict function tool (as the Agents SDK sends one) and `tool_choice`.
fn with_tool(text: &str, tool_choice: Value) -> Value {
    let mut body = request(text);
    body["tools"] = json!([
        {"type": "web_search"},
        {
            "type": "function",
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "days", "unit"],
                "additionalProperties": false,
            },
            "strict": true,
        },
        {"type": "function", "name": "other", "parameters": {"type": "object", "properties": {}}},
    ]);
    body["tool_choice"] = tool_choice;
    body
}

#[tokio::test]
async fn a_forced_tool_choice_is_answered_with_a_function_call() {
    let mock = start().await;
    let answer = |body: Value| {
        let mock = &mock;
        async move { post(mock, &body).await.json::<Value>().await.unwrap() }
    };
    let called = answer(with_tool("weather?", json!("required"))).await;
    let item = &called["output"][0];
    assert_eq!(item["type"], "function_call", "{called}");
    assert_eq!(item["name"], "get_weather");
    assert_eq!(item["status"], "completed");
    assert!(item["call_id"].as_str().unwrap().starts_with("call_"));
    let arguments: Value = serde_json::from_str(item["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(
        arguments,
        json!({"city": "mock", "days": 1, "unit": "celsius"})
    );
    assert_eq!(called["tool_choice"], "required");
    let again = answer(with_tool("weather?", json!("required"))).await;
    assert_eq!(
        again["output"][0]["call_id"], item["call_id"],
        "a pure function of the request"
    );
    assert_ne!(again["output"][0]["id"], item["id"]);

    let named = answer(with_tool(
        "weather?",
        json!({"type": "function", "name": "other"}),
    ))
    .await;
    assert_eq!(named["output"][0]["name"], "other");
    assert_eq!(named["output"][0]["arguments"], "{}");

    // Under "auto", and once the tool's output is in the input, the model answers.
    let auto = answer(with_tool("weather?", json!("auto"))).await;
    assert_eq!(auto["output"][0]["type"], "message");
    let mut after = with_tool("weather?", json!("auto"));
    after["input"].as_array_mut().unwrap().extend([
        item.clone(),
        json!({"type": "function_call_output", "call_id": item["call_id"], "output": "sunny"}),
    ]);
    assert!(output_text(&answer(after).await).ends_with("weather?"));

    let unknown = post(
        &mock,
        &with_tool("x", json!({"type": "function", "name": "nope"})),
    )
    .await;
    assert_eq!(unknown.status(), 400);
}

#[tokio::test]
async fn a_streamed_function_call_accumulates_to_the_same_item() {
    let mock = start().await;
    let plain: Value = post(&mock, &with_tool("weather?", json!("required")))
        .await
        .json()
        .await
        .unwrap();
    let mut streamed = with_tool("weather?", json!("required"));
    streamed["stream"] = json!(true);
    let events = named_events(&post(&mock, &streamed).await.text().await.unwrap());
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let added = &events[2].1["item"];
    assert_eq!(added["arguments"], "");
    assert_eq!(added["status"], "in_progress");
    assert_eq!(events[3].1["item_id"], added["id"]);
    let arguments = &plain["output"][0]["arguments"];
    assert_eq!(&events[3].1["delta"], arguments);
    assert_eq!(&events[4].1["arguments"], arguments);
    let completed = &events[6].1["response"];
    assert_eq!(
        completed["output"][0]["call_id"],
        plain["output"][0]["call_id"]
    );
    assert_eq!(&completed["output"][0]["arguments"], arguments);
    assert_eq!(completed["usage"], plain["usage"]);
}
