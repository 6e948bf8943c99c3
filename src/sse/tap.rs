//! [`StreamTap`]: a stream relayed as it came (a `no-store` stream, which is
//! never logged or shared) and read as it passes, by its API's own
//! [`StreamFormat`], so that its usage is known when it ends and the call is
//! billed like any other.
//!
//! The caller receives the provider's bytes unchanged, unless it did not ask
//! for usage that corral asked for on its behalf (chat's `include_usage`):
//! then it receives the events as a coalesced stream's reader who did not ask
//! does (in corral's framing, [`UsageFree`]), without the usage chunk.
//!
//! What the tap keeps is bounded: the events that report usage (the first and
//! the last three, which is what every format's `stream_usage` reads), a count
//! of the generated text relayed, and the SSE parser's partial event; past
//! `max_bytes` read it stops reading (and a caller who needed events rewritten
//! gets the format's error event), so a long stream costs no more than the
//! coalesced path's log bound would allow.

use std::{convert::Infallible, pin::Pin};

use bytes::Bytes;
use futures::{FutureExt as _, StreamExt as _, channel::mpsc};
use sse_stream::SseByteStream;

use super::{
    format::{Format, Frame},
    usage::{CallerUsage, UsageFree},
};
use crate::usage::{Usage, text_bytes};

/// Events that report usage kept beside the first one (every format's
/// `stream_usage` reads no further back than the last three).
const LAST_USAGE_EVENTS: usize = 3;

type Parser = Pin<Box<SseByteStream<mpsc::UnboundedReceiver<Result<Bytes, Infallible>>>>>;

/// How a tapped stream ended, as far as its events tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TapEnd {
    /// Still open (or its completing event has not been seen).
    Open,
    /// The format's completing event arrived.
    Completed,
    /// The provider's error event, a malformed event, or more than `max_bytes`.
    Broken,
}

/// Reads a passing stream; see the module documentation.
pub struct StreamTap {
    format: Format,
    caller_usage: CallerUsage,
    /// The caller receives events in corral's framing, not the chunks as they came.
    rewrite: bool,
    /// Feeds the parser; `None` once reading stopped.
    input: Option<mpsc::UnboundedSender<Result<Bytes, Infallible>>>,
    parser: Parser,
    read: usize,
    max_bytes: usize,
    /// The first event that reported usage, then the last few.
    first_usage: Option<Bytes>,
    last_usage: Vec<Bytes>,
    /// The usage the last frame that reported any reported.
    reported: Option<Usage>,
    text_bytes: usize,
    /// Every event, for a format that completes by ending
    /// (`StreamFormat::may_complete_at_end`: Gemini's); bounded by `max_bytes`
    /// like everything the tap reads.
    events: Vec<Bytes>,
    end: TapEnd,
}

impl std::fmt::Debug for StreamTap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamTap")
            .field("format", &self.format)
            .field("read", &self.read)
            .field("end", &self.end)
            .finish_non_exhaustive()
    }
}

impl StreamTap {
    /// A tap reading `format`'s events, reading at most `max_bytes`. With
    /// `rewrite`, the caller receives the events in corral's framing (without
    /// usage when `caller_usage` says it did not ask), one by one; without, the
    /// chunks as they came.
    pub fn new(format: Format, caller_usage: CallerUsage, rewrite: bool, max_bytes: usize) -> Self {
        let (input, output) = mpsc::unbounded();
        Self {
            format,
            caller_usage,
            rewrite,
            input: Some(input),
            parser: Box::pin(SseByteStream::new(output)),
            read: 0,
            max_bytes,
            first_usage: None,
            last_usage: Vec::with_capacity(LAST_USAGE_EVENTS),
            reported: None,
            text_bytes: 0,
            events: Vec::new(),
            end: TapEnd::Open,
        }
    }

    /// Reads `chunk` and returns what the caller receives for it: the chunk,
    /// or (rewriting) the events it completed, none or several.
    pub fn pass(&mut self, chunk: Bytes) -> Vec<Bytes> {
        let rewrite = self.rewrite;
        if self.end != TapEnd::Open || self.input.is_none() {
            // Read to its end, or past the bound: a caller who gets rewritten
            // events has had its last one; the others get the bytes as they come.
            return if rewrite { Vec::new() } else { vec![chunk] };
        }
        self.read = self.read.saturating_add(chunk.len());
        if self.read > self.max_bytes {
            self.input = None;
            self.end = TapEnd::Broken;
            return vec![if rewrite {
                self.format.error_event(
                    &format!(
                        "the upstream stream exceeded the gateway's limit of {} bytes",
                        self.max_bytes
                    ),
                    0,
                )
            } else {
                chunk
            }];
        }
        if let Some(input) = &self.input {
            // An unbounded channel whose receiver lives in `self`: cannot fail.
            let _ = input.unbounded_send(Ok(chunk.clone()));
        }
        let mut out = Vec::new();
        while self.end == TapEnd::Open {
            // The parser's input is ready: it answers at once, or is pending for more.
            let Some(Some(Ok(sse))) = self.parser.next().now_or_never() else {
                break;
            };
            let Some(data) = sse.data else {
                continue;
            };
            self.read_event(sse.event.as_deref(), &data, rewrite.then_some(&mut out));
        }
        if rewrite { out } else { vec![chunk] }
    }

    /// The provider's stream ended: complete, for a format that completes by
    /// ending, when its events make a whole answer (Gemini's, once every
    /// candidate finished), as the coalesced relay decides it.
    pub fn ended(&mut self) {
        if self.end == TapEnd::Open && self.format.complete_at_end(&self.events) {
            self.end = TapEnd::Completed;
        }
        self.events = Vec::new();
    }

    /// The last event a rewritten stream that ended without its completing
    /// event receives (`None`: it has had one, or is relayed as it came).
    pub fn broken_end(&self) -> Option<Bytes> {
        (self.rewrite && self.end == TapEnd::Open).then(|| {
            self.format
                .error_event("the upstream stream ended before its completing event", 0)
        })
    }

    /// One event: its usage and text noted, and (for a caller whose events are
    /// rewritten) what that caller receives of it appended to `out`.
    fn read_event(&mut self, name: Option<&str>, data: &str, mut out: Option<&mut Vec<Bytes>>) {
        let (event, usage) = match self.format.read(name, data) {
            Frame::Event { event, usage } => (Some(event), usage),
            Frame::Skip => return,
            Frame::Complete { event, usage } => {
                self.end = TapEnd::Completed;
                (event, usage)
            }
            Frame::Failed(event) => {
                self.end = TapEnd::Broken;
                if let Some(out) = out {
                    out.push(event);
                }
                return;
            }
            Frame::Malformed(detail) => {
                tracing::warn!(%detail, "a no-store stream sent a malformed event");
                self.end = TapEnd::Broken;
                if let Some(out) = out {
                    out.push(
                        self.format
                            .error_event("the upstream stream sent a malformed event", 0),
                    );
                }
                return;
            }
        };
        if usage.is_some() {
            self.reported = usage;
        }
        if let Ok(value) = serde_json::from_str::<serde_json::Value>(data) {
            self.text_bytes = self.text_bytes.saturating_add(text_bytes(&value));
        }
        if let Some(event) = event {
            if self.format.event_usage(&event).is_some() {
                self.keep_usage_event(event.clone());
            }
            if self.format.may_complete_at_end() {
                self.events.push(event.clone());
            }
            if let Some(out) = out.as_deref_mut() {
                let shown = match self.caller_usage {
                    CallerUsage::Asked => UsageFree::Same,
                    CallerUsage::NotAsked => self.format.usage_free(&event),
                };
                match shown {
                    UsageFree::Same => out.push(event),
                    UsageFree::Skip => {}
                    UsageFree::Rewritten(event) => out.push(event),
                }
            }
        }
        if self.end == TapEnd::Completed {
            if let (Some(out), Some(done)) = (out, self.format.done_event()) {
                out.push(done);
            }
            self.input = None;
        }
    }

    fn keep_usage_event(&mut self, event: Bytes) {
        if self.first_usage.is_none() {
            self.first_usage = Some(event);
            return;
        }
        if self.last_usage.len() == LAST_USAGE_EVENTS {
            self.last_usage.remove(0);
        }
        self.last_usage.push(event);
    }

    /// The stream's usage as its events reported it (Anthropic's merged over
    /// `message_start` and `message_delta`), if any did.
    pub fn usage(&self) -> Option<Usage> {
        let kept: Vec<Bytes> = self
            .first_usage
            .iter()
            .chain(&self.last_usage)
            .cloned()
            .collect();
        self.format.stream_usage(&kept).or(self.reported)
    }

    /// Bytes of generated text relayed so far (for an estimate).
    pub fn text_bytes(&self) -> usize {
        self.text_bytes
    }

    pub fn end(&self) -> TapEnd {
        self.end
    }
}
