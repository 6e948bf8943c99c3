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
//! With `generationConfig.candidateCount` above one, each candidate is an answer of its own
//! (the first is the one-candidate answer, each further one says a little more), and the stream
//! sends one candidate's piece per chunk, the candidates taking turns: the first finishes while
//! the others still speak, as a gateway that takes the first chunk with a `finishReason` for the
//! end would not see.
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
/// Most candidates one call answers with, Google's own bound on `candidateCount`.
const MAX_CANDIDATES: u64 = 8;

/// `generateContent`: the whole answer.
pub(super) fn generate_content(model: &str, request: &Value, call: u64) -> Answer {
    let generation = Generation::of(model, request, call);
    if generation.candidates > 1 {
        let answers = generation.answers();
        let tokens = answers
            .iter()
            .map(|text| approx_tokens(text.chars().count()))
            .sum();
        let candidates = answers
            .iter()
            .enumerate()
            .map(|(index, text)| candidate(index, text, true))
            .collect();
        return Answer::Json(generation.response_of(candidates, tokens));
    }
    let tokens = approx_tokens(generation.answer.chars().count());
    Answer::Json(generation.response(&generation.answer, tokens, true))
}

/// The stream of a call with several candidates: one candidate's piece per chunk, the
/// candidates taking turns, each finishing on its own last piece.
fn several_candidates(generation: &Generation<'_>, sse: bool) -> Vec<Bytes> {
    let answers = generation.answers();
    let chunks: Vec<Vec<String>> = answers
        .iter()
        .map(|text| {
            word_pieces(text)
                .chunks(WORDS_PER_CHUNK)
                .map(<[&str]>::concat)
                .collect()
        })
        .collect();
    let rounds = chunks.iter().map(Vec::len).max().unwrap_or(0);
    let mut sent_chars = vec![0; answers.len()];
    let mut pieces = Vec::new();
    for round in 0..rounds {
        for (index, candidate_chunks) in chunks.iter().enumerate() {
            let Some(text) = candidate_chunks.get(round) else {
                continue;
            };
            sent_chars[index] += text.chars().count();
            let tokens = sent_chars.iter().map(|chars| approx_tokens(*chars)).sum();
            let finished = round + 1 == candidate_chunks.len();
            pieces.push(generation.response_of(vec![candidate(index, text, finished)], tokens));
        }
    }
    let last = pieces.len().saturating_sub(1);
    pieces
        .iter()
        .enumerate()
        .map(|(at, chunk)| frame(chunk, sse, at == 0, at == last))
        .collect()
}

/// `streamGenerateContent`: the same answer in chunks, as SSE events or as a JSON array.
pub(super) fn stream_generate_content(
    model: &str,
    request: &Value,
    call: u64,
    sse: bool,
) -> Answer {
    let generation = Generation::of(model, request, call);
    if generation.candidates > 1 {
        return Answer::Stream(SseEvents {
            events: several_candidates(&generation, sse),
            content_type: if sse {
                SseEvents::EVENT_STREAM
            } else {
                "application/json; charset=UTF-8"
            },
            first_content: 0,
            padding: None,
        });
    }
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
    /// `generationConfig.candidateCount`, within `1..=MAX_CANDIDATES`.
    candidates: usize,
}

impl<'a> Generation<'a> {
    fn of(model: &'a str, request: &Value, call: u64) -> Self {
        let text = texts(request);
        let answer = format!(
            "mock gemini answer {call} to: {}",
            text.chars().take(QUOTE_CHARS).collect::<String>()
        );
        let candidates = field(request, "generationConfig", "generation_config")
            .and_then(|config| field(config, "candidateCount", "candidate_count"))
            .and_then(Value::as_u64)
            .map_or(1, |count| count.clamp(1, MAX_CANDIDATES));
        Self {
            model,
            id: format!("mock-{call}"),
            answer,
            usage: Usage::of(request, &text),
            candidates: usize::try_from(candidates).unwrap_or(1),
        }
    }

    /// Each candidate's answer: the first is the one-candidate answer, each further one says
    /// a little more.
    fn answers(&self) -> Vec<String> {
        (0..self.candidates)
            .map(|index| match index {
                0 => self.answer.clone(),
                _ => format!(
                    "{} (candidate {index}, who says{})",
                    self.answer,
                    " a little more".repeat(index)
                ),
            })
            .collect()
    }

    /// A `GenerateContentResponse` of `candidates`, billed `tokens` output tokens so far.
    fn response_of(&self, candidates: Vec<Value>, tokens: u64) -> Value {
        json!({
            "candidates": candidates,
            "usageMetadata": self.usage.metadata(tokens),
            "modelVersion": self.model,
            "responseId": self.id,
        })
    }

    /// A `GenerateContentResponse` carrying `text`, billed `candidates` tokens so far; only a
    /// finished one has a `finishReason`.
    fn response(&self, text: &str, candidates: u64, finished: bool) -> Value {
        self.response_of(vec![candidate(0, text, finished)], candidates)
    }
}

/// Candidate `index` carrying `text`; only a finished one has a `finishReason`.
fn candidate(index: usize, text: &str, finished: bool) -> Value {
    let mut candidate = json!({
        "content": {"role": "model", "parts": [{"text": text}]},
        "index": index,
    });
    if finished {
        candidate["finishReason"] = json!("STOP");
    }
    candidate
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
