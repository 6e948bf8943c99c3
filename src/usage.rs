//! Tokens as the providers bill them: the one `usage` vocabulary every layer
//! speaks (cache entries, the stream relay, metrics, the ledger).
//!
//! Providers report usage in different shapes, and the difference is money:
//! - OpenAI (Chat Completions, and the OpenAI-compatible APIs of Google, Mistral,
//!   xAI...): `prompt_tokens` counts *every* input token; the part read from the
//!   provider's prompt cache, `prompt_tokens_details.cached_tokens`, is inside it
//!   and billed at the cached-input price. `completion_tokens` counts every
//!   output token; `completion_tokens_details.reasoning_tokens` is inside it.
//! - DeepSeek: `prompt_cache_hit_tokens` instead of `prompt_tokens_details`, also
//!   inside `prompt_tokens`.
//! - Anthropic (Messages): `input_tokens` counts only the uncached input;
//!   `cache_read_input_tokens` and `cache_creation_input_tokens` come *on top* of it.
//! - OpenAI Responses: `input_tokens` with `input_tokens_details.cached_tokens`
//!   inside it (the OpenAI rule under Anthropic's names).
//!
//! [`Usage`] holds the counts in one shape (totals, with the cached, cache-write
//! and reasoning parts inside them), and [`Usage::billed`] splits them into the
//! disjoint [`TokenKind`]s that are each billed at one price.

use serde::{Deserialize, Serialize};

/// Tokens one answer cost. `prompt_tokens` and `completion_tokens` are totals;
/// the other counts are parts of them. Stored with cache entries: an entry
/// written before the parts existed reads as "no prompt caching, no reasoning".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Every input token, however it is billed.
    pub prompt_tokens: u64,
    /// Output tokens, reasoning included.
    pub completion_tokens: u64,
    /// Of `prompt_tokens`: read from the provider's prompt cache.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cached_tokens: u64,
    /// Of `prompt_tokens`: written into the provider's prompt cache (Anthropic).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_write_tokens: u64,
    /// Of `completion_tokens`: reasoning ("thinking") tokens, billed as output.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reasoning_tokens: u64,
    /// Of `prompt_tokens`: audio input (OpenAI `prompt_tokens_details.audio_tokens`,
    /// Gemini's `AUDIO` modality), at the model's audio price where it has one.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub audio_input_tokens: u64,
    /// Of `completion_tokens`: audio output, likewise.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub audio_output_tokens: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The disjoint kinds tokens are billed as; an answer's kinds add up to all its
/// tokens, so summing `corral_tokens_total` over `kind` counts nothing twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TokenKind {
    /// Input at the full input price (neither read from nor written to a prompt cache).
    Input,
    /// Input read from the provider's prompt cache, at the cached-input price.
    CachedInput,
    /// Input written into the provider's prompt cache, at the cache-write price.
    CacheWrite,
    /// Output that is not reasoning, at the output price.
    Output,
    /// Reasoning output, at the output price (reported apart, billed alike).
    Reasoning,
}

impl TokenKind {
    pub const ALL: [TokenKind; 5] = [
        Self::Input,
        Self::CachedInput,
        Self::CacheWrite,
        Self::Output,
        Self::Reasoning,
    ];

    /// The `kind` label of `corral_tokens_total`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Input => "input",
            Self::CachedInput => "cached_input",
            Self::CacheWrite => "cache_write",
            Self::Output => "output",
            Self::Reasoning => "reasoning",
        }
    }

    pub fn from_label(label: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.label() == label)
    }

    /// OpenTelemetry GenAI `gen_ai.token.type`: every input kind is `input`
    /// (the convention counts cached input inside input), every output kind `output`.
    pub fn gen_ai_type(self) -> &'static str {
        match self {
            Self::Input | Self::CachedInput | Self::CacheWrite => "input",
            Self::Output | Self::Reasoning => "output",
        }
    }
}

/// `Usage` split into its billed kinds, in [`TokenKind::ALL`] order.
pub type Billed = [(TokenKind, u64); 5];

impl Usage {
    /// The counts per billed kind. A provider that reports more cached or
    /// reasoning tokens than the total it contains them in is trusted for the
    /// total: the parts are cut to fit, so no kind goes negative.
    pub fn billed(&self) -> Billed {
        let cached = self.cached_tokens.min(self.prompt_tokens);
        let cache_write = self.cache_write_tokens.min(self.prompt_tokens - cached);
        let reasoning = self.reasoning_tokens.min(self.completion_tokens);
        [
            (TokenKind::Input, self.prompt_tokens - cached - cache_write),
            (TokenKind::CachedInput, cached),
            (TokenKind::CacheWrite, cache_write),
            (TokenKind::Output, self.completion_tokens - reasoning),
            (TokenKind::Reasoning, reasoning),
        ]
    }

    /// Every token of the answer.
    pub fn total(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }

    /// Reads the top-level `usage` of a response body (or of one stream
    /// chunk), in any of the shapes the module documents; `None` when there is
    /// none or it has no input count. Embeddings report input only.
    pub fn from_body(body: &[u8]) -> Option<Self> {
        #[derive(Deserialize)]
        struct Envelope {
            usage: Option<Raw>,
        }
        let raw = serde_json::from_slice::<Envelope>(body).ok()?.usage?;
        raw.into_usage()
    }

    /// Gemini's `usageMetadata` (a response's, or a stream chunk's running
    /// total): `promptTokenCount` holds the cached part
    /// (`cachedContentTokenCount`); tool-use prompt tokens are input on top of
    /// it; thinking (`thoughtsTokenCount`) is output on top of
    /// `candidatesTokenCount`, billed at the output price as reasoning.
    /// `None` without a prompt count. Counts that are not whole numbers in
    /// `u64` read as absent, and sums saturate.
    pub fn from_usage_metadata(metadata: &serde_json::Value) -> Option<Self> {
        let count = |name: &str| metadata.get(name).and_then(serde_json::Value::as_u64);
        let prompt = count("promptTokenCount")?;
        let thoughts = count("thoughtsTokenCount").unwrap_or(0);
        Some(Self {
            prompt_tokens: prompt.saturating_add(count("toolUsePromptTokenCount").unwrap_or(0)),
            completion_tokens: count("candidatesTokenCount")
                .unwrap_or(0)
                .saturating_add(thoughts),
            cached_tokens: count("cachedContentTokenCount").unwrap_or(0),
            cache_write_tokens: 0,
            reasoning_tokens: thoughts,
            audio_input_tokens: audio_of(metadata.get("promptTokensDetails")),
            audio_output_tokens: audio_of(metadata.get("candidatesTokensDetails")),
        })
    }
}

/// Bytes of text per token an estimate assumes: OpenAI's rule of thumb for
/// English ("a token is about four characters"). Coarse on purpose: it bills
/// something sane where a provider reported nothing, never a figure to audit.
pub const BYTES_PER_TOKEN: usize = 4;

/// Why a call was billed an estimate rather than the usage its provider
/// reported: the `reason` label of `corral_usage_estimated_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Estimated {
    /// The stream broke (cut, stalled, malformed, too large) before its usage came.
    Broken,
    /// Every caller left, or the gateway cut the stream at shutdown, before its usage came.
    Abandoned,
    /// The answer was complete but carried no usage (Gemini's embeddings never do).
    Unreported,
}

impl Estimated {
    pub fn label(self) -> &'static str {
        match self {
            Self::Broken => "broken",
            Self::Abandoned => "abandoned",
            Self::Unreported => "unreported",
        }
    }
}

impl Usage {
    /// What is known of a call whose usage is not: its request's size and the
    /// text it relayed, at [`BYTES_PER_TOKEN`], rounded up. The request's
    /// bytes include its JSON, so the input is over- rather than
    /// under-counted; the output counts only generated text ([`text_bytes`]).
    pub fn estimate(request_bytes: usize, output_text_bytes: usize) -> Self {
        let tokens = |bytes: usize| bytes.div_ceil(BYTES_PER_TOKEN) as u64;
        Self {
            prompt_tokens: tokens(request_bytes),
            completion_tokens: tokens(output_text_bytes),
            ..Self::default()
        }
    }

    /// `self` (what a broken stream reported, Anthropic's input counts say)
    /// with at least `output_tokens` of output: the text relayed after the
    /// last report was generated, and billed, all the same.
    pub fn with_output_at_least(mut self, output_tokens: u64) -> Self {
        self.completion_tokens = self.completion_tokens.max(output_tokens);
        self
    }
}

/// Keys whose string values are generated text in every API's answers and
/// stream events: chat's `content`, `arguments` and `refusal`, Responses'
/// `delta`s, Anthropic's `text`, `partial_json` and `thinking`, Gemini's `text`.
const TEXT_KEYS: [&str; 7] = [
    "content",
    "text",
    "delta",
    "arguments",
    "partial_json",
    "thinking",
    "refusal",
];

/// Keys that hold a copy of text already counted elsewhere in a stream: a
/// Responses lifecycle event's whole `response`, an output `item`, a content `part`.
const REPEATING_KEYS: [&str; 3] = ["response", "item", "part"];

/// The bytes of generated text in one answer or one stream event (a JSON
/// value), for [`Usage::estimate`]. A named event whose `type` ends in
/// `.done` repeats the deltas before it and counts nothing.
pub fn text_bytes(value: &serde_json::Value) -> usize {
    use serde_json::Value;
    if value
        .get("type")
        .and_then(Value::as_str)
        .is_some_and(|kind| kind.ends_with(".done"))
    {
        return 0;
    }
    // Iterative, so no answer's depth can exhaust the stack.
    let mut pending = vec![value];
    let mut bytes = 0_usize;
    while let Some(value) = pending.pop() {
        match value {
            Value::Array(items) => pending.extend(items),
            Value::Object(members) => {
                for (key, member) in members {
                    match member {
                        Value::String(text) if TEXT_KEYS.contains(&key.as_str()) => {
                            bytes = bytes.saturating_add(text.len());
                        }
                        Value::Array(_) | Value::Object(_)
                            if !REPEATING_KEYS.contains(&key.as_str()) =>
                        {
                            pending.push(member);
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    bytes
}

/// The `AUDIO` modality's count in a Gemini `*TokensDetails` list.
fn audio_of(details: Option<&serde_json::Value>) -> u64 {
    details
        .and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
        .filter(|detail| {
            detail.get("modality").and_then(serde_json::Value::as_str) == Some("AUDIO")
        })
        .filter_map(|detail| detail.get("tokenCount").and_then(serde_json::Value::as_u64))
        .fold(0, u64::saturating_add)
}

/// An answer's `usage` member, read by serde inside a larger answer (an
/// adapter that reads other members of the answer in the same pass).
#[derive(Deserialize)]
#[serde(transparent)]
pub struct UsageMember(Raw);

impl UsageMember {
    pub fn into_usage(self) -> Option<Usage> {
        self.0.into_usage()
    }
}

/// Every count any supported shape may carry; absent and `null` read as absent.
#[derive(Deserialize)]
struct Raw {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    prompt_tokens_details: Option<Details>,
    completion_tokens_details: Option<Details>,
    /// DeepSeek.
    prompt_cache_hit_tokens: Option<u64>,
    /// Anthropic, and OpenAI Responses.
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    /// OpenAI Responses: present means `input_tokens` includes cached input.
    input_tokens_details: Option<Details>,
    output_tokens_details: Option<Details>,
    /// Anthropic: not included in `input_tokens`.
    cache_read_input_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct Details {
    cached_tokens: Option<u64>,
    audio_tokens: Option<u64>,
    reasoning_tokens: Option<u64>,
    /// Anthropic's name for reasoning output, where reported.
    thinking_tokens: Option<u64>,
}

impl Details {
    fn reasoning(&self) -> Option<u64> {
        self.reasoning_tokens.or(self.thinking_tokens)
    }
}

impl Raw {
    fn into_usage(self) -> Option<Usage> {
        let reasoning =
            |details: &Option<Details>| details.as_ref().and_then(Details::reasoning).unwrap_or(0);
        let cached_in = |details: &Option<Details>| details.as_ref().and_then(|d| d.cached_tokens);
        let audio =
            |details: &Option<Details>| details.as_ref().and_then(|d| d.audio_tokens).unwrap_or(0);
        if let Some(prompt_tokens) = self.prompt_tokens {
            // OpenAI Chat Completions and compatible: parts inside the totals.
            return Some(Usage {
                prompt_tokens,
                completion_tokens: self.completion_tokens.unwrap_or(0),
                cached_tokens: cached_in(&self.prompt_tokens_details)
                    .or(self.prompt_cache_hit_tokens)
                    .unwrap_or(0),
                cache_write_tokens: 0,
                reasoning_tokens: reasoning(&self.completion_tokens_details),
                audio_input_tokens: audio(&self.prompt_tokens_details),
                audio_output_tokens: audio(&self.completion_tokens_details),
            });
        }
        let input_tokens = self.input_tokens?;
        let completion_tokens = self.output_tokens.unwrap_or(0);
        let reasoning_tokens = reasoning(&self.output_tokens_details);
        if self.input_tokens_details.is_some() {
            // OpenAI Responses: cached input inside `input_tokens`.
            return Some(Usage {
                prompt_tokens: input_tokens,
                completion_tokens,
                cached_tokens: cached_in(&self.input_tokens_details).unwrap_or(0),
                cache_write_tokens: 0,
                reasoning_tokens,
                audio_input_tokens: audio(&self.input_tokens_details),
                audio_output_tokens: audio(&self.output_tokens_details),
            });
        }
        // Anthropic: cache reads and writes come on top of `input_tokens`.
        let cached_tokens = self.cache_read_input_tokens.unwrap_or(0);
        let cache_write_tokens = self.cache_creation_input_tokens.unwrap_or(0);
        Some(Usage {
            prompt_tokens: input_tokens
                .saturating_add(cached_tokens)
                .saturating_add(cache_write_tokens),
            completion_tokens,
            cached_tokens,
            cache_write_tokens,
            reasoning_tokens,
            audio_input_tokens: 0,
            audio_output_tokens: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn billed(body: &str) -> Vec<(&'static str, u64)> {
        Usage::from_body(body.as_bytes())
            .unwrap_or_else(|| panic!("no usage in {body}"))
            .billed()
            .iter()
            .map(|(kind, n)| (kind.label(), *n))
            .collect()
    }

    #[test]
    fn openai_cached_and_reasoning_tokens_are_parts_of_the_totals() {
        let body = r#"{"usage":{"prompt_tokens":1000,"completion_tokens":100,"total_tokens":1100,
            "prompt_tokens_details":{"cached_tokens":800,"audio_tokens":0},
            "completion_tokens_details":{"reasoning_tokens":60,"audio_tokens":0}}}"#;
        assert_eq!(
            billed(body),
            [
                ("input", 200),
                ("cached_input", 800),
                ("cache_write", 0),
                ("output", 40),
                ("reasoning", 60)
            ]
        );
        let usage = Usage::from_body(body.as_bytes()).unwrap();
        assert_eq!(usage.total(), 1100);
        let audio = r#"{"usage":{"prompt_tokens":50,"completion_tokens":40,
            "prompt_tokens_details":{"audio_tokens":30},"completion_tokens_details":{"audio_tokens":20}}}"#;
        let audio = Usage::from_body(audio.as_bytes()).unwrap();
        assert_eq!(
            (audio.audio_input_tokens, audio.audio_output_tokens),
            (30, 20)
        );
        let gemini = serde_json::json!({"promptTokenCount": 9,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 4}, {"modality": "AUDIO", "tokenCount": 5}]});
        assert_eq!(
            Usage::from_usage_metadata(&gemini)
                .unwrap()
                .audio_input_tokens,
            5
        );
    }

    #[test]
    fn anthropic_cache_reads_and_writes_come_on_top_of_input_tokens() {
        let body = r#"{"id":"msg_01","type":"message","role":"assistant","model":"claude-sonnet-4-5",
            "content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn",
            "usage":{"input_tokens":100,"cache_creation_input_tokens":300,
                     "cache_read_input_tokens":2000,"output_tokens":50,
                     "service_tier":"standard"}}"#;
        let usage = Usage::from_body(body.as_bytes()).unwrap();
        assert_eq!(usage.prompt_tokens, 2400, "every input token");
        assert_eq!(
            billed(body),
            [
                ("input", 100),
                ("cached_input", 2000),
                ("cache_write", 300),
                ("output", 50),
                ("reasoning", 0)
            ]
        );
        // Anthropic sends null for caches it did not touch.
        let plain = r#"{"usage":{"input_tokens":7,"cache_creation_input_tokens":null,
            "cache_read_input_tokens":null,"output_tokens":3}}"#;
        assert_eq!(billed(plain)[0], ("input", 7));
        assert_eq!(Usage::from_body(plain.as_bytes()).unwrap().total(), 10);
    }

    #[test]
    fn responses_api_and_deepseek_shapes() {
        let responses = r#"{"usage":{"input_tokens":500,"input_tokens_details":{"cached_tokens":400},
            "output_tokens":90,"output_tokens_details":{"reasoning_tokens":30},"total_tokens":590}}"#;
        assert_eq!(
            billed(responses),
            [
                ("input", 100),
                ("cached_input", 400),
                ("cache_write", 0),
                ("output", 60),
                ("reasoning", 30)
            ]
        );
        let deepseek = r#"{"usage":{"prompt_tokens":64,"completion_tokens":10,
            "prompt_cache_hit_tokens":48,"prompt_cache_miss_tokens":16}}"#;
        assert_eq!(billed(deepseek)[..2], [("input", 16), ("cached_input", 48)]);
    }

    #[test]
    fn embeddings_missing_and_inconsistent_usage() {
        assert_eq!(
            billed(r#"{"usage":{"prompt_tokens":8,"total_tokens":8}}"#),
            [
                ("input", 8),
                ("cached_input", 0),
                ("cache_write", 0),
                ("output", 0),
                ("reasoning", 0)
            ]
        );
        assert_eq!(Usage::from_body(br#"{"usage":null}"#), None);
        assert_eq!(Usage::from_body(br#"{"choices":[]}"#), None);
        assert_eq!(
            Usage::from_body(br#"{"usage":{"completion_tokens":3}}"#),
            None
        );
        assert_eq!(Usage::from_body(b"not json"), None);
        // Parts larger than their totals are cut to fit: no kind goes negative.
        let odd = r#"{"usage":{"prompt_tokens":10,"completion_tokens":5,
            "prompt_tokens_details":{"cached_tokens":50},
            "completion_tokens_details":{"reasoning_tokens":9}}}"#;
        let kinds = billed(odd);
        assert_eq!(kinds.iter().map(|(_, n)| n).sum::<u64>(), 15);
        assert_eq!(kinds[1], ("cached_input", 10));
        assert_eq!(kinds[4], ("reasoning", 5));
    }

    #[test]
    fn entries_stored_before_the_parts_existed_still_read() {
        let old: Usage =
            serde_json::from_str(r#"{"prompt_tokens":3,"completion_tokens":5}"#).unwrap();
        assert_eq!(old.billed()[0], (TokenKind::Input, 3));
        let text = serde_json::to_string(&old).unwrap();
        assert_eq!(text, r#"{"prompt_tokens":3,"completion_tokens":5}"#);
    }

    #[test]
    fn an_estimate_is_four_bytes_a_token_of_the_request_and_the_relayed_text() {
        let usage = Usage::estimate(401, 8);
        assert_eq!((usage.prompt_tokens, usage.completion_tokens), (101, 2));
        assert_eq!(Usage::estimate(0, 0).total(), 0);
        let broken = Usage {
            prompt_tokens: 50,
            completion_tokens: 1,
            ..Usage::default()
        };
        assert_eq!(broken.with_output_at_least(9).completion_tokens, 9);
        assert_eq!(broken.with_output_at_least(0).completion_tokens, 1);
    }

    #[test]
    fn text_bytes_counts_generated_text_in_every_apis_shape() {
        let of = |json: &str| text_bytes(&serde_json::from_str(json).unwrap());
        // Chat: a stream chunk's delta, an answer's message, tool arguments.
        assert_eq!(
            of(r#"{"choices":[{"delta":{"role":"assistant","content":"Hello"}}]}"#),
            5
        );
        assert_eq!(
            of(
                r#"{"choices":[{"message":{"content":"Hi","tool_calls":[{"function":{"name":"f","arguments":"{}"}}]}}]}"#
            ),
            4
        );
        // Responses: deltas count; done events and the completed response repeat them.
        assert_eq!(
            of(r#"{"type":"response.output_text.delta","delta":"abc"}"#),
            3
        );
        assert_eq!(
            of(r#"{"type":"response.output_text.done","text":"abc"}"#),
            0
        );
        assert_eq!(
            of(
                r#"{"type":"response.completed","response":{"output":[{"content":[{"text":"abc"}]}]}}"#
            ),
            0
        );
        // Anthropic and Gemini.
        assert_eq!(
            of(r#"{"type":"content_block_delta","delta":{"type":"text_delta","text":"four"}}"#),
            4
        );
        assert_eq!(
            of(r#"{"candidates":[{"content":{"parts":[{"text":"twelve bytes"}]}}]}"#),
            12
        );
        assert_eq!(of(r#"{"model":"gpt-4o","usage":{"prompt_tokens":3}}"#), 0);
    }
}
