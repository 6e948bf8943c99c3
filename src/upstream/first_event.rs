//! A deduplicated stream's first event, read inside its attempt: a stream
//! whose first event is the provider's failure (Anthropic's
//! `overloaded_error`, OpenAI's `response.failed` or error chunk, Gemini's
//! error chunk) has sent no event to any caller yet, so it is a failed
//! attempt like the status it names (a 529, a 429, a 500): retried, or
//! failed over to the next member of the pool, for every caller of the
//! flight at once. Any other first event hands the response on, its body
//! re-yielding every byte read here, so the relay sees the stream whole.

use axum::http::StatusCode;
use bytes::Bytes;
use futures::StreamExt as _;
use serde_json::Value;
use sse_stream::SseByteStream;

use super::transport::placeholder_url;
use crate::sse::{Format, Frame};

/// What the first event of a 2xx stream said.
pub(super) enum FirstEvent {
    /// A stream to relay: the same response, its body whole.
    Relay(reqwest::Response),
    /// The provider failed the stream before its first event: the status its
    /// error names, its JSON (the error body the API would have sent), and
    /// the response whole, to relay when that status is not retried.
    Failed {
        status: StatusCode,
        body: Bytes,
        response: reqwest::Response,
    },
    /// No event before the deadline: the stream's first-event bound, spent
    /// here rather than again by the relay.
    Silent,
}

/// Reads `response`'s body up to its first event (a block with data that
/// `format` does not skip), at most `max_bytes` and until `deadline`. A body
/// that ends, breaks or outgrows the bound first is handed on as it is: the
/// relay reports it as the broken stream it is.
pub(super) async fn read_first_event(
    mut response: reqwest::Response,
    format: Format,
    max_bytes: usize,
    deadline: tokio::time::Instant,
) -> FirstEvent {
    let mut read: Vec<Bytes> = Vec::new();
    let mut held = 0_usize;
    // Where the next unparsed block starts, in the joined bytes read so far.
    let mut scanned = 0_usize;
    let mut joined = Vec::new();
    loop {
        while let Some(end) = block_end(&joined[scanned..]) {
            let block = Bytes::copy_from_slice(&joined[scanned..scanned + end]);
            scanned += end;
            match first_frame(format, block).await {
                Some((Frame::Skip, _)) | None => {}
                Some((Frame::Failed(_), data)) => {
                    let status = failing_status(data.as_bytes());
                    return FirstEvent::Failed {
                        status,
                        body: Bytes::from(data),
                        response: rebuilt(response, read),
                    };
                }
                Some(_) => return FirstEvent::Relay(rebuilt(response, read)),
            }
        }
        if held >= max_bytes {
            return FirstEvent::Relay(rebuilt(response, read));
        }
        match tokio::time::timeout_at(deadline, response.chunk()).await {
            Ok(Ok(Some(chunk))) => {
                held += chunk.len();
                joined.extend_from_slice(&chunk);
                read.push(chunk);
            }
            // Ended or broken: the relay says so to every reader.
            Ok(Ok(None) | Err(_)) => return FirstEvent::Relay(rebuilt(response, read)),
            Err(_) => return FirstEvent::Silent,
        }
    }
}

/// The length of the first whole SSE block in `bytes`, its blank line
/// included (`\n\n`, `\r\n\r\n` or `\r\r`), if one has arrived.
/// Only a line ending can start a blank line, so only those are looked at.
fn block_end(bytes: &[u8]) -> Option<usize> {
    memchr::memchr2_iter(b'\n', b'\r', bytes).find_map(|at| {
        let rest = &bytes[at..];
        if rest.starts_with(b"\r\n\r\n") {
            Some(at + 4)
        } else if rest.starts_with(b"\n\n") || rest.starts_with(b"\r\r") {
            Some(at + 2)
        } else {
            None
        }
    })
}

/// How `format` reads the one block `block`, and its data; `None` for a
/// block with no data (a comment, a lone `event:` or `retry:`).
async fn first_frame(format: Format, block: Bytes) -> Option<(Frame, String)> {
    let mut events = SseByteStream::new(futures::stream::iter([Ok::<_, std::io::Error>(block)]));
    let sse = events.next().await?.ok()?;
    let data = sse.data?;
    Some((format.read(sse.event.as_deref(), &data), data))
}

/// The HTTP status a failing event's error stands for: its numeric `code`
/// (Gemini's), else its `type` or `code` word (Anthropic's, OpenAI's); a
/// failure that names neither is the provider's own (500).
fn failing_status(data: &[u8]) -> StatusCode {
    let value: Value = serde_json::from_slice(data).unwrap_or(Value::Null);
    // Responses' `response.failed` carries it in the response.
    let error = value
        .get("error")
        .or_else(|| value.pointer("/response/error"))
        .unwrap_or(&Value::Null);
    if let Some(code) = error.get("code").and_then(Value::as_u64)
        && let Ok(status) = StatusCode::from_u16(u16::try_from(code).unwrap_or(500))
        && (status.is_client_error() || status.is_server_error())
    {
        return status;
    }
    let word = error
        .get("type")
        .and_then(Value::as_str)
        .into_iter()
        .chain(error.get("code").and_then(Value::as_str))
        .find(|word| *word != "error");
    let code = match word {
        Some("overloaded_error") => 529,
        Some("rate_limit_error" | "rate_limit_exceeded" | "RESOURCE_EXHAUSTED") => 429,
        Some("invalid_request_error" | "invalid_prompt" | "INVALID_ARGUMENT") => 400,
        Some("authentication_error") => 401,
        Some("permission_error" | "PERMISSION_DENIED") => 403,
        Some("not_found_error" | "NOT_FOUND") => 404,
        Some("UNAVAILABLE") => 503,
        _ => 500,
    };
    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// `response` with `read` put back in front of the rest of its body. The
/// head is moved, not copied, and names reqwest's placeholder URL as the
/// direct transport's responses do (parsed once, not per stream).
fn rebuilt(response: reqwest::Response, read: Vec<Bytes>) -> reqwest::Response {
    if read.is_empty() {
        return response;
    }
    let (mut parts, rest) = http::Response::<reqwest::Body>::from(response).into_parts();
    parts.extensions.extend(placeholder_url());
    let body = futures::stream::iter(read.into_iter().map(Ok::<_, reqwest::Error>))
        .chain(http_body_util::BodyDataStream::new(rest));
    reqwest::Response::from(http::Response::from_parts(
        parts,
        reqwest::Body::wrap_stream(body),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_end_at_a_blank_line_of_any_ending() {
        assert_eq!(block_end(b"data: 1\n\ndata: 2"), Some(9));
        assert_eq!(block_end(b"data: 1\r\n\r\n"), Some(11));
        assert_eq!(block_end(b"data: 1\n"), None);
        // Line endings that open no blank line are passed over.
        assert_eq!(block_end(b"data: 1\r\ndata: 2\n\n"), Some(18));
        assert_eq!(block_end(b"a\rb\r\r"), Some(5));
        assert_eq!(block_end(b"data: 1\r\n\r"), None);
    }

    /// The bytes read for the first event come back first, then the rest of
    /// the body; the head is the provider's, and the URL reqwest's
    /// placeholder, never the call's.
    #[tokio::test]
    async fn a_rebuilt_response_keeps_its_head_and_every_byte_in_order() {
        let provider = http::Response::builder()
            .status(201)
            .header("x-request-id", "req-1")
            .body(reqwest::Body::from("tail"))
            .unwrap();
        let read = vec![
            Bytes::from_static(b"first-"),
            Bytes::from_static(b"second-"),
        ];
        let response = rebuilt(reqwest::Response::from(provider), read);
        assert_eq!(response.status(), StatusCode::CREATED);
        assert_eq!(response.headers()["x-request-id"], "req-1");
        assert_eq!(response.url().as_str(), "http://no.url.provided.local/");
        assert_eq!(response.bytes().await.unwrap(), "first-second-tail");
    }

    #[test]
    fn a_failing_event_names_its_status() {
        let anthropic =
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        assert_eq!(failing_status(anthropic).as_u16(), 529);
        let gemini = br#"{"error":{"code":503,"message":"busy","status":"UNAVAILABLE"}}"#;
        assert_eq!(failing_status(gemini).as_u16(), 503);
        let responses = br#"{"type":"response.failed","response":{"error":{"code":"server_error","message":"x"}}}"#;
        assert_eq!(failing_status(responses).as_u16(), 500);
        let prompt =
            br#"{"type":"response.failed","response":{"error":{"code":"invalid_prompt"}}}"#;
        assert_eq!(failing_status(prompt).as_u16(), 400);
        assert_eq!(failing_status(b"not json").as_u16(), 500);
    }
}
