//! Bedrock's streamed answer (`application/vnd.amazon.eventstream`, AWS's
//! binary event-stream framing) read as the Anthropic SSE stream it carries:
//! each `chunk` event holds one Anthropic event, base64 in `{"bytes": ..}`,
//! and becomes `event: <type>` / `data: <json>`; an exception frame
//! (`throttlingException`, `modelStreamErrorException`, ...) becomes
//! Anthropic's `event: error` and ends the stream, so everything past this
//! adapter (the first-event check, the relay, usage) reads the stream as if
//! Anthropic had sent it.
//!
//! Frames are decoded by `aws-smithy-eventstream`. It buffers a whole frame
//! before it checks the prelude's CRC, so a frame's declared length is bounded
//! here first: a corrupt or hostile length cannot make it buffer gigabytes.

use std::error::Error as StdError;

use aws_smithy_eventstream::frame::{DecodedFrame, MessageFrameDecoder};
use aws_smithy_types::event_stream::Message;
use base64::Engine as _;
use bytes::{Buf as _, Bytes, BytesMut};
use futures::{Stream, StreamExt as _};
use serde_json::Value;

use super::bedrock::anthropic_error_type;

/// The largest frame read: an Anthropic event is a few KiB at most (a
/// content block delta, a tool input chunk); a frame larger than this is
/// broken, not an answer.
pub(super) const MAX_FRAME_BYTES: usize = 1 << 20;

/// An event-stream frame's prelude: total length, headers length, CRC.
const PRELUDE_BYTES: usize = 12;

/// The Anthropic SSE text of a Bedrock event stream, fed its bytes as they
/// arrive.
#[derive(Debug, Default)]
pub(super) struct EventStreamReader {
    /// Bytes received and not yet decoded: at most one frame and a chunk.
    buffer: BytesMut,
    decoder: MessageFrameDecoder,
    /// The decoder holds the current frame's prelude (taken out of
    /// `buffer`), whose length was checked.
    inside_frame: bool,
    /// An error event was written: nothing more is read.
    ended: bool,
}

impl EventStreamReader {
    /// The SSE text of every whole frame `chunk` completes (empty while a
    /// frame is still arriving). After an exception or a broken frame: its
    /// error event, and nothing more ever.
    pub(super) fn feed(&mut self, chunk: &[u8]) -> Bytes {
        if self.ended {
            return Bytes::new();
        }
        self.buffer.extend_from_slice(chunk);
        let mut sse = BytesMut::new();
        while !self.ended {
            if !self.inside_frame && self.buffer.len() >= PRELUDE_BYTES {
                let declared = (&self.buffer[..4]).get_u32();
                if usize::try_from(declared).map_or(true, |length| length > MAX_FRAME_BYTES) {
                    self.fail(
                        &mut sse,
                        &format!(
                            "a frame of {declared} bytes, over the bound of {MAX_FRAME_BYTES}"
                        ),
                    );
                    break;
                }
                // The decoder takes the prelude out of `buffer` now.
                self.inside_frame = true;
            }
            match self.decoder.decode_frame(&mut self.buffer) {
                Ok(DecodedFrame::Complete(message)) => {
                    self.inside_frame = false;
                    self.write_message(&message, &mut sse);
                }
                Ok(DecodedFrame::Incomplete) => break,
                Err(err) => {
                    self.fail(&mut sse, &format!("a broken frame: {err}"));
                    break;
                }
            }
        }
        sse.freeze()
    }

    /// At the end of the body: an error event when it ended inside a frame
    /// (what was cut off is lost), else nothing.
    pub(super) fn finish(&mut self) -> Bytes {
        if self.ended || (!self.inside_frame && self.buffer.is_empty()) {
            return Bytes::new();
        }
        let mut sse = BytesMut::new();
        self.fail(&mut sse, "the stream ended inside a frame");
        sse.freeze()
    }

    pub(super) fn ended(&self) -> bool {
        self.ended
    }

    /// One decoded frame as SSE: a chunk's event, or the error that ends
    /// the stream.
    fn write_message(&mut self, message: &Message, sse: &mut BytesMut) {
        match header(message, ":message-type") {
            Some("event") if header(message, ":event-type") == Some("chunk") => {
                match chunk_event(message.payload()) {
                    Some((kind, data)) => {
                        sse.extend_from_slice(b"event: ");
                        sse.extend_from_slice(kind.as_bytes());
                        sse.extend_from_slice(b"\ndata: ");
                        sse.extend_from_slice(&data);
                        sse.extend_from_slice(b"\n\n");
                    }
                    None => self.fail(sse, "a chunk that is not an Anthropic event"),
                }
            }
            // Events of kinds Bedrock may add later carry nothing Anthropic's
            // stream has.
            Some("event") => {}
            Some("exception") => {
                let name = header(message, ":exception-type").unwrap_or("exception");
                let said = serde_json::from_slice::<Value>(message.payload())
                    .ok()
                    .and_then(|body| body.get("message")?.as_str().map(str::to_owned));
                let text = said.unwrap_or_else(|| format!("Bedrock's {name}"));
                self.end_with(sse, anthropic_error_type(name, None), &text);
            }
            Some("error") => {
                let code = header(message, ":error-code").unwrap_or("error");
                let said = header(message, ":error-message").unwrap_or_default();
                self.end_with(sse, "api_error", &format!("Bedrock's {code}: {said}"));
            }
            _ => self.fail(sse, "a frame of no known message type"),
        }
    }

    /// The stream is broken: an `api_error` naming how, and its end.
    fn fail(&mut self, sse: &mut BytesMut, how: &str) {
        let message = format!("Bedrock's event stream broke: {how}");
        self.end_with(sse, "api_error", &message);
    }

    fn end_with(&mut self, sse: &mut BytesMut, kind: &str, message: &str) {
        sse.extend_from_slice(&error_event(kind, message));
        self.ended = true;
        self.buffer = BytesMut::new();
    }
}

/// Anthropic's SSE error event.
pub(super) fn error_event(kind: &str, message: &str) -> Bytes {
    let data = serde_json::json!({
        "type": "error",
        "error": {"type": kind, "message": message},
    });
    Bytes::from(format!("event: error\ndata: {data}\n\n"))
}

/// A `chunk` payload's Anthropic event: its `type` and its JSON on one line
/// (as Bedrock sent it, or re-written when it spans lines, which an SSE data
/// line cannot).
fn chunk_event(payload: &[u8]) -> Option<(String, Bytes)> {
    #[derive(serde::Deserialize)]
    struct Chunk {
        bytes: String,
    }
    let chunk: Chunk = serde_json::from_slice(payload).ok()?;
    let json = base64::engine::general_purpose::STANDARD
        .decode(chunk.bytes)
        .ok()?;
    let event: Value = serde_json::from_slice(&json).ok()?;
    let kind = event.get("type")?.as_str()?.to_owned();
    let data = if json.iter().any(|&byte| byte == b'\n' || byte == b'\r') {
        Bytes::from(event.to_string())
    } else {
        Bytes::from(json)
    };
    Some((kind, data))
}

/// A string header of `message`.
fn header<'m>(message: &'m Message, name: &str) -> Option<&'m str> {
    message
        .headers()
        .iter()
        .find(|header| header.name().as_str() == name)
        .and_then(|header| header.value().as_string().ok())
        .map(|value| value.as_str())
}

/// `body` (an event stream's bytes) as Anthropic SSE. A body that breaks
/// passes its error on (the relay reports a broken stream); one that ends
/// inside a frame, or carries a broken one, ends with an error event.
pub(super) fn anthropic_sse<S, E>(body: S) -> impl Stream<Item = Result<Bytes, E>> + Send + 'static
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: StdError + Send + 'static,
{
    let state = (Box::pin(body), EventStreamReader::default(), false);
    futures::stream::unfold(state, |(mut body, mut reader, done)| async move {
        if done {
            return None;
        }
        loop {
            match body.next().await {
                Some(Ok(chunk)) => {
                    let sse = reader.feed(&chunk);
                    let ended = reader.ended();
                    if !sse.is_empty() || ended {
                        return Some((Ok(sse), (body, reader, ended)));
                    }
                }
                Some(Err(err)) => return Some((Err(err), (body, reader, true))),
                None => {
                    let sse = reader.finish();
                    return (!sse.is_empty()).then_some((Ok(sse), (body, reader, true)));
                }
            }
        }
    })
}

#[cfg(test)]
pub(super) mod tests;
