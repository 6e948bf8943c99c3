use aws_smithy_eventstream::frame::write_message_to;
use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
use base64::Engine as _;
use bytes::Bytes;
use futures::StreamExt as _;
use serde_json::{Value, json};

use super::*;

/// `message` as the bytes Bedrock sends.
pub(crate) fn encoded(message: &Message) -> Vec<u8> {
    let mut bytes = Vec::new();
    write_message_to(message, &mut bytes).unwrap();
    bytes
}

fn string(name: &'static str, value: &'static str) -> Header {
    Header::new(name, HeaderValue::String(value.into()))
}

/// A `chunk` frame carrying the Anthropic event `event` (as `json` bytes).
pub(crate) fn chunk_frame(json: &str) -> Vec<u8> {
    let bytes = base64::engine::general_purpose::STANDARD.encode(json);
    let payload = json!({"bytes": bytes}).to_string();
    encoded(
        &Message::new(payload.into_bytes())
            .add_header(string(":message-type", "event"))
            .add_header(string(":event-type", "chunk"))
            .add_header(string(":content-type", "application/json")),
    )
}

pub(crate) fn exception_frame(name: &'static str, message: &str) -> Vec<u8> {
    encoded(
        &Message::new(json!({ "message": message }).to_string().into_bytes())
            .add_header(string(":message-type", "exception"))
            .add_header(string(":exception-type", name))
            .add_header(string(":content-type", "application/json")),
    )
}

pub(crate) const EVENTS: [&str; 3] = [
    r#"{"type":"message_start","message":{"id":"msg_1","role":"assistant","content":[],"usage":{"input_tokens":3,"output_tokens":1}}}"#,
    r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}"#,
    r#"{"type":"message_stop","amazon-bedrock-invocationMetrics":{"inputTokenCount":3,"outputTokenCount":2}}"#,
];

/// The SSE text the three `EVENTS` become.
pub(crate) fn events_sse() -> String {
    EVENTS
        .iter()
        .map(|event| {
            let kind = serde_json::from_str::<Value>(event).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_owned();
            format!("event: {kind}\ndata: {event}\n\n")
        })
        .collect()
}

fn read_all(reader: &mut EventStreamReader, bytes: &[u8], chunk: usize) -> String {
    let mut sse = Vec::new();
    for piece in bytes.chunks(chunk) {
        sse.extend_from_slice(&reader.feed(piece));
    }
    sse.extend_from_slice(&reader.finish());
    String::from_utf8(sse).unwrap()
}

/// The `error` object of the one error event in `sse`, which is its last.
fn error_of(sse: &str) -> Value {
    let (_, event) = sse.rsplit_once("event: error\ndata: ").expect(sse);
    assert!(event.ends_with("\n\n"), "{sse}");
    assert_eq!(sse.matches("event: error").count(), 1, "{sse}");
    let body: Value = serde_json::from_str(event.trim_end()).unwrap();
    assert_eq!(body["type"], "error");
    body["error"].clone()
}

#[test]
fn frames_split_anywhere_read_as_anthropic_sse() {
    let stream: Vec<u8> = EVENTS.iter().flat_map(|event| chunk_frame(event)).collect();
    for chunk in (1..=40).chain([stream.len()]) {
        let mut reader = EventStreamReader::default();
        assert_eq!(
            read_all(&mut reader, &stream, chunk),
            events_sse(),
            "{chunk}"
        );
        assert!(!reader.ended());
        assert!(reader.buffer.is_empty());
    }
}

#[test]
fn an_event_spanning_lines_is_sent_on_one() {
    let pretty = "{\n  \"type\": \"ping\"\n}";
    let mut reader = EventStreamReader::default();
    let sse = read_all(&mut reader, &chunk_frame(pretty), 5);
    assert_eq!(sse, "event: ping\ndata: {\"type\":\"ping\"}\n\n");
}

#[test]
fn an_exception_frame_ends_the_stream_with_an_anthropic_error() {
    for (exception, kind) in [
        ("throttlingException", "rate_limit_error"),
        ("serviceUnavailableException", "overloaded_error"),
        ("modelStreamErrorException", "api_error"),
        ("internalServerException", "api_error"),
        ("validationException", "invalid_request_error"),
    ] {
        let mut stream = chunk_frame(EVENTS[0]);
        stream.extend(exception_frame(exception, "slow down"));
        stream.extend(chunk_frame(EVENTS[1]));
        let mut reader = EventStreamReader::default();
        let sse = read_all(&mut reader, &stream, 9);
        assert!(sse.starts_with("event: message_start\n"), "{sse}");
        assert!(!sse.contains("content_block_delta"), "nothing after: {sse}");
        let error = error_of(&sse);
        assert_eq!(error["type"], kind, "{exception}");
        assert_eq!(error["message"], "slow down");
        assert!(reader.ended());
        assert!(reader.feed(&chunk_frame(EVENTS[2])).is_empty());
    }
}

#[test]
fn an_oversized_frame_is_an_error_not_a_buffer() {
    let huge = "x".repeat(MAX_FRAME_BYTES);
    let frame = exception_frame("throttlingException", &huge);
    assert!(frame.len() > MAX_FRAME_BYTES);
    let mut reader = EventStreamReader::default();
    let mut sse = reader.feed(&chunk_frame(EVENTS[0])).to_vec();
    // Its prelude alone says it is too large: nothing more is held.
    sse.extend_from_slice(&reader.feed(&frame[..PRELUDE_BYTES]));
    let sse = String::from_utf8(sse).unwrap();
    assert!(sse.starts_with("event: message_start\n"), "{sse}");
    let error = error_of(&sse);
    assert_eq!(error["type"], "api_error");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("over the bound"),
        "{error}"
    );
    assert!(reader.ended());
    assert!(reader.feed(&frame[PRELUDE_BYTES..]).is_empty());
    assert!(reader.buffer.is_empty(), "the rest is dropped, not held");
    // A length field of 4 GiB, from a corrupt prelude, alike.
    let mut reader = EventStreamReader::default();
    let sse = reader.feed(&[0xff; PRELUDE_BYTES]);
    assert_eq!(
        error_of(std::str::from_utf8(&sse).unwrap())["type"],
        "api_error"
    );
}

#[test]
fn a_corrupt_crc_is_an_error() {
    let frame = chunk_frame(EVENTS[1]);
    // A byte of the payload (the message CRC no longer matches), then one
    // of the prelude's CRC.
    for at in [frame.len() - 10, 9] {
        let mut broken = frame.clone();
        broken[at] ^= 0x01;
        let mut stream = chunk_frame(EVENTS[0]);
        stream.extend(broken);
        stream.extend(chunk_frame(EVENTS[2]));
        let mut reader = EventStreamReader::default();
        let sse = read_all(&mut reader, &stream, 3);
        assert!(sse.starts_with("event: message_start\n"), "{sse}");
        assert!(!sse.contains("message_stop"), "{sse}");
        let error = error_of(&sse);
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .contains("a broken frame"),
            "{error}"
        );
    }
}

#[test]
fn a_body_that_ends_inside_a_frame_says_so() {
    let frame = chunk_frame(EVENTS[0]);
    for cut in [5, PRELUDE_BYTES, frame.len() - 1] {
        let mut reader = EventStreamReader::default();
        assert!(reader.feed(&frame[..cut]).is_empty());
        let sse = reader.finish();
        let error = error_of(std::str::from_utf8(&sse).unwrap());
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .contains("inside a frame"),
            "{cut}"
        );
    }
    let mut whole = EventStreamReader::default();
    whole.feed(&frame);
    assert!(
        whole.finish().is_empty(),
        "a stream that ends between frames"
    );
}

#[test]
fn a_chunk_that_is_no_anthropic_event_is_an_error() {
    let payload = br#"{"bytes":"not base64!"}"#.to_vec();
    let frame = encoded(
        &Message::new(payload)
            .add_header(string(":message-type", "event"))
            .add_header(string(":event-type", "chunk")),
    );
    let mut reader = EventStreamReader::default();
    let sse = reader.feed(&frame);
    let error = error_of(std::str::from_utf8(&sse).unwrap());
    assert!(error["message"].as_str().unwrap().contains("chunk"));
}

#[tokio::test]
async fn the_stream_yields_sse_and_passes_a_broken_body_on() {
    let frames: Vec<u8> = EVENTS[..2].iter().flat_map(|e| chunk_frame(e)).collect();
    let (first, second) = frames.split_at(20);
    let body = futures::stream::iter([
        Ok(Bytes::copy_from_slice(first)),
        Ok(Bytes::copy_from_slice(second)),
        Err(std::io::Error::other("reset")),
    ]);
    let items: Vec<_> = anthropic_sse(body).collect().await;
    assert_eq!(items.len(), 2, "the SSE, then the error");
    let sse = items[0].as_ref().unwrap();
    assert!(sse.starts_with(b"event: message_start\n"));
    assert!(sse.ends_with(b"\"text\":\"Hi\"}}\n\n"));
    assert_eq!(items[1].as_ref().unwrap_err().to_string(), "reset");
}
