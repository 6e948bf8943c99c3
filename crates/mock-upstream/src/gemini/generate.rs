//! `generateContent` and `streamGenerateContent`: one answer per request and call number,
//! whole or streamed, with the usage a cost test needs to see.
//!
//! The stream is the answer cut into chunks of a few words, each a whole
//! `GenerateContentResponse` with the same `responseId` and a running `usageMetadata`; the last
//! carries the last words, `finishReason: "STOP"` and the usage of the non-stream answer, as
//! Google streams. With `alt=sse` every chunk is an SSE event `data: {json}\r\n\r\n` (no event
//! names, no `[DONE]`); without it the chunks are the elements of one JSON array streamed as
//! `[{json}\r\n,{json}\r\n]`, Google's other framing. Either way the first chunk carries
//! content, so a truncated stream ends before the `finishReason`, and the last chunk is the
//! final event a held stream end keeps back.
//!
//! Usage follows Google's rules for the figures a bill is made of: `totalTokenCount` is prompt
//! plus candidates plus thoughts; `cachedContentTokenCount` is part of `promptTokenCount`.

use bytes::Bytes;
use serde_json::{Value, json};

use super::super::openai::{Answer, PadChunk, SseEvents, approx_tokens, word_pieces};
use super::{field, texts};

/// Words per streamed chunk: Google sends a few tokens at a time, not one.
const WORDS_PER_CHUNK: usize = 4;
/// How much of the prompt the answer quotes.
const QUOTE_CHARS: usize = 40;
/// Most thought tokens billed, whatever the budget: enough to tell thoughts apart in a bill.
const MAX_THOUGHTS: u64 = 40;

/// `generateContent`: the whole answer.
pub(super) fn generate_content(model: &str, request: &Value, call: u64) -> Answer {
    let generation = Generation::of(model, request, call);
    let tokens = approx_tokens(generation.answer.chars().count());
    Answer::Json(generation.response(&generation.answer, tokens, true))
}

/// `streamGenerateContent`: the same answer in chunks, as SSE events or as a JSON array.
pub(super) fn stream_generate_content(
    model: &str,
    request: &Value,
    call: u64,
    sse: bool,
) -> Answer {
    let generation = Generation::of(model, request, call);
    let pieces = word_pieces(&generation.answer);
    let chunks: Vec<String> = pieces
        .chunks(WORDS_PER_CHUNK)
        .map(<[&str]>::concat)
        .collect();
    let last = chunks.len().saturating_sub(1);
    let mut sent_chars = 0;
    let mut first_tokens = 1;
    let mut events = Vec::with_capacity(chunks.len());
    for (index, text) in chunks.iter().enumerate() {
        sent_chars += text.chars().count();
        let tokens = approx_tokens(sent_chars);
        if index == 0 {
            first_tokens = tokens;
        }
        let chunk = generation.response(text, tokens, index == last);
        events.push(frame(&chunk, sse, index == 0, index == last));
    }
    // Padding chunks go in after the first chunk: middle elements, billed as that chunk was.
    let template = generation.response(PadChunk::MARK, first_tokens, false);
    let padding = PadChunk::around_mark(&frame(&template, sse, false, false));
    Answer::Stream(SseEvents {
        events,
        content_type: if sse {
            SseEvents::EVENT_STREAM
        } else {
            "application/json; charset=UTF-8"
        },
        first_content: 0,
        padding,
    })
}

/// One chunk as it goes on the wire: an SSE event, or an element of the streamed array (the
/// first opens it, the last closes it).
fn frame(chunk: &Value, sse: bool, first: bool, last: bool) -> Bytes {
    if sse {
        return Bytes::from(format!("data: {chunk}\r\n\r\n"));
    }
    let open = if first { "[" } else { "," };
    let close = if last { "]" } else { "" };
    Bytes::from(format!("{open}{chunk}\r\n{close}"))
}

/// What one call answers, whole or streamed.
struct Generation<'a> {
    model: &'a str,
    id: String,
    answer: String,
    usage: Usage,
}

impl<'a> Generation<'a> {
    fn of(model: &'a str, request: &Value, call: u64) -> Self {
        let text = texts(request);
        let answer = format!(
            "mock gemini answer {call} to: {}",
            text.chars().take(QUOTE_CHARS).collect::<String>()
        );
        Self {
            model,
            id: format!("mock-{call}"),
            answer,
            usage: Usage::of(request, &text),
        }
    }

    /// A `GenerateContentResponse` carrying `text`, billed `candidates` tokens so far; only a
    /// finished one has a `finishReason`.
    fn response(&self, text: &str, candidates: u64, finished: bool) -> Value {
        let mut candidate = json!({
            "content": {"role": "model", "parts": [{"text": text}]},
            "index": 0,
        });
        if finished {
            candidate["finishReason"] = json!("STOP");
        }
        json!({
            "candidates": [candidate],
            "usageMetadata": self.usage.metadata(candidates),
            "modelVersion": self.model,
            "responseId": self.id,
        })
    }
}

/// The token counts of a call but its candidates'.
#[derive(Debug, Clone, Copy)]
struct Usage {
    prompt: u64,
    /// Of `prompt`, read from the cached content the request names: half of it, at least one.
    cached: Option<u64>,
    /// Thinking under a positive `thinkingBudget`: the budget, at most [`MAX_THOUGHTS`].
    thoughts: Option<u64>,
}

impl Usage {
    fn of(request: &Value, text: &str) -> Self {
        let prompt = approx_tokens(text.chars().count());
        let cached = field(request, "cachedContent", "cached_content")
            .and_then(Value::as_str)
            .filter(|name| !name.is_empty())
            .map(|_| (prompt / 2).max(1));
        let thoughts = field(request, "generationConfig", "generation_config")
            .and_then(|config| field(config, "thinkingConfig", "thinking_config"))
            .and_then(|thinking| field(thinking, "thinkingBudget", "thinking_budget"))
            .and_then(Value::as_u64)
            .filter(|budget| *budget > 0)
            .map(|budget| budget.min(MAX_THOUGHTS));
        Self {
            prompt,
            cached,
            thoughts,
        }
    }

    /// `usageMetadata` with `candidates` output tokens.
    fn metadata(&self, candidates: u64) -> Value {
        let mut usage = json!({
            "promptTokenCount": self.prompt,
            "candidatesTokenCount": candidates,
            "totalTokenCount": self.prompt + candidates + self.thoughts.unwrap_or(0),
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": self.prompt}],
        });
        if let Some(thoughts) = self.thoughts {
            usage["thoughtsTokenCount"] = json!(thoughts);
        }
        if let Some(cached) = self.cached {
            usage["cachedContentTokenCount"] = json!(cached);
            usage["cacheTokensDetails"] = json!([{"modality": "TEXT", "tokenCount": cached}]);
        }
        usage
    }
}
