//! The mock's answers to the OpenAI endpoints, as pure functions of the request body.
//!
//! Everything a test compares is derived from the request alone: the assistant content embeds a
//! digest of the canonical messages, token counts follow from text lengths, embeddings from a
//! hash of the input. Only `id` (the call number) and `created` (the clock) vary between two
//! identical calls, which is what lets a test tell a refreshed answer from a cached one.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::StatusCode;
use bytes::Bytes;
use serde_json::{Map, Value, json};
use sha2::{Digest as _, Sha256};

/// `created` of the listed models; fixed so `/v1/models` is byte-for-byte stable.
const MODELS_CREATED: u64 = 1_715_367_049;
/// Models listed by `/v1/models`.
const MODELS: [&str; 3] = ["gpt-4o-mini", "gpt-4o", "text-embedding-3-small"];
/// How much of the user's text the reply quotes.
const QUOTE_CHARS: usize = 60;
/// Most choices a request may ask for, as in OpenAI.
const MAX_N: u64 = 128;
/// Embedding size when the request names none.
const DEFAULT_DIMENSIONS: usize = 8;
/// Largest `dimensions` accepted, roughly OpenAI's largest model.
const MAX_DIMENSIONS: u64 = 4096;

/// A successful answer, before the HTTP layer applies stream delays and truncation.
#[derive(Debug)]
pub(super) enum Answer {
    Json(Value),
    Stream(SseEvents),
    /// An error the provider sends as its verdict on the request's content (Azure's content
    /// filter): billed and answered like any call, but with this status and body.
    Blocked {
        status: StatusCode,
        body: Value,
    },
}

/// The complete list of events of a streamed answer, each already framed as its API frames it
/// (`data: ...\n\n` for OpenAI; one element of a streamed JSON array for Gemini without SSE).
#[derive(Debug)]
pub(super) struct SseEvents {
    pub(super) events: Vec<Bytes>,
    /// The response's `content-type`: [`SseEvents::EVENT_STREAM`] but for a stream that is not
    /// SSE (Gemini's streamed JSON array).
    pub(super) content_type: &'static str,
    /// Index of the first event that carries content; a truncated stream ends right after it.
    pub(super) first_content: usize,
    /// How this stream's content chunks are made, for padding it to a size; `None` for a
    /// format the mock does not pad.
    pub(super) padding: Option<PadChunk>,
}

/// A content chunk of the stream's first choice, cut where its text goes: padding chunks are
/// `before + word + after`, byte for byte the chunks the stream's own words come in, inserted
/// right after its first content chunk.
#[derive(Debug, Clone)]
pub(super) struct PadChunk {
    pub(super) before: String,
    pub(super) after: String,
}

impl SseEvents {
    /// The content type of a server-sent-events stream.
    pub(super) const EVENT_STREAM: &'static str = "text/event-stream";
}

impl PadChunk {
    /// Placeholder for the text while the template is serialized; never in an answer.
    pub(super) const MARK: &'static str = "__mock_padding_text__";

    /// `event` (one framed chunk whose text is [`Self::MARK`]) cut around the mark.
    pub(super) fn around_mark(event: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(event).ok()?;
        let (before, after) = text.split_once(Self::MARK)?;
        Some(Self {
            before: before.to_owned(),
            after: after.to_owned(),
        })
    }

    /// The chunk carrying `text` (plain words: nothing to escape in JSON).
    pub(super) fn with(&self, text: &str, into: &mut Vec<u8>) {
        into.extend_from_slice(self.before.as_bytes());
        into.extend_from_slice(text.as_bytes());
        into.extend_from_slice(self.after.as_bytes());
    }
}

/// A request the real API would reject with 400 `invalid_request_error`.
#[derive(Debug)]
pub(super) struct InvalidRequest(pub(super) String);

impl InvalidRequest {
    pub(super) fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// `POST /v1/chat/completions`.
pub(super) fn chat_completions(body: &[u8], call: u64) -> Result<Answer, InvalidRequest> {
    let request = parse_object(body)?;
    let model = model(&request)?;
    let messages = request
        .get("messages")
        .ok_or_else(|| InvalidRequest::new("Missing required parameter: 'messages'."))?;
    let list = messages
        .as_array()
        .ok_or_else(|| InvalidRequest::new("Invalid type for 'messages': expected an array."))?;
    let n = choice_count(&request)?;
    let stream = flag(&request, "stream")?;
    let include_usage = include_usage(&request)?;
    // OpenAI takes stream options only on a request that streams.
    if !stream
        && request
            .get("stream_options")
            .is_some_and(|options| !options.is_null())
    {
        return Err(InvalidRequest::new(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
        ));
    }
    // OpenAI streams audio output only as pcm16.
    if stream
        && let Some(format) = request
            .get("audio")
            .and_then(|audio| audio.get("format"))
            .and_then(Value::as_str)
        && format != "pcm16"
    {
        return Err(InvalidRequest::new(format!(
            "Audio output format '{format}' is not supported with stream=true; use 'pcm16'."
        )));
    }

    let base = chat_content(messages, list);
    let contents: Vec<String> = (0..n).map(|i| variant(&base, i)).collect();
    let prompt_chars: usize = list.iter().map(|m| message_text(m).chars().count()).sum();
    let usage = usage(
        approx_tokens(prompt_chars),
        contents.iter().map(|c| word_count(c)).sum(),
    );
    let id = format!("chatcmpl-mock-{call}");
    let created = now_secs();

    if !stream {
        let choices: Vec<Value> = contents
            .iter()
            .enumerate()
            .map(|(index, content)| {
                json!({
                    "index": index,
                    "message": {"role": "assistant", "content": content},
                    "logprobs": null,
                    "finish_reason": "stop",
                })
            })
            .collect();
        return Ok(Answer::Json(json!({
            "id": id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "system_fingerprint": "fp_mock",
            "choices": choices,
            "usage": usage,
        })));
    }

    let chunk = |choices: Value| {
        let mut chunk = json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": "fp_mock",
            "choices": choices,
        });
        // OpenAI announces the usage field on every chunk once usage is requested.
        if include_usage {
            chunk["usage"] = Value::Null;
        }
        chunk
    };
    let delta = |index: usize, delta: Value, finish_reason: Value| json!([{"index": index, "delta": delta, "logprobs": null, "finish_reason": finish_reason}]);
    let mut events = Vec::new();
    for (index, content) in contents.iter().enumerate() {
        events.push(sse(&chunk(delta(
            index,
            json!({"role": "assistant", "content": ""}),
            Value::Null,
        ))));
        for piece in word_pieces(content) {
            events.push(sse(&chunk(delta(
                index,
                json!({"content": piece}),
                Value::Null,
            ))));
        }
        events.push(sse(&chunk(delta(index, json!({}), json!("stop")))));
    }
    if include_usage {
        let mut last = chunk(json!([]));
        last["usage"] = usage;
        events.push(sse(&last));
    }
    events.push(Bytes::from_static(b"data: [DONE]\n\n"));
    let padding = PadChunk::around_mark(&sse(&chunk(delta(
        0,
        json!({"content": PadChunk::MARK}),
        Value::Null,
    ))));
    Ok(Answer::Stream(SseEvents {
        events,
        content_type: SseEvents::EVENT_STREAM,
        first_content: 1,
        padding,
    }))
}

/// `POST /v1/completions`, the legacy text endpoint: one choice per prompt and per `n`.
pub(super) fn completions(body: &[u8], call: u64) -> Result<Answer, InvalidRequest> {
    let request = parse_object(body)?;
    let model = model(&request)?;
    let prompts = match request.get("prompt") {
        // OpenAI treats a missing prompt as an empty document.
        None | Some(Value::Null) => vec![String::new()],
        Some(prompt) => non_empty(strings_or_list(prompt, "prompt")?, "prompt")?,
    };
    let n = choice_count(&request)?;
    let stream = flag(&request, "stream")?;
    let include_usage = include_usage(&request)?;

    let mut texts = Vec::new();
    for prompt in &prompts {
        let digest = short_digest(&canonical_json(&Value::String(prompt.clone())));
        let quote: String = prompt.chars().take(QUOTE_CHARS).collect();
        let base = format!("mock completion for {digest}: {quote}")
            .trim_end()
            .to_owned();
        texts.extend((0..n).map(|i| variant(&base, i)));
    }
    let prompt_chars: usize = prompts.iter().map(|p| p.chars().count()).sum();
    let usage = usage(
        approx_tokens(prompt_chars),
        texts.iter().map(|t| word_count(t)).sum(),
    );
    let id = format!("cmpl-mock-{call}");
    let created = now_secs();

    if !stream {
        let choices: Vec<Value> = texts
            .iter()
            .enumerate()
            .map(|(index, text)| {
                json!({"text": text, "index": index, "logprobs": null, "finish_reason": "stop"})
            })
            .collect();
        return Ok(Answer::Json(json!({
            "id": id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "system_fingerprint": "fp_mock",
            "choices": choices,
            "usage": usage,
        })));
    }

    let chunk = |choices: Value| {
        json!({
            "id": id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "system_fingerprint": "fp_mock",
            "choices": choices,
        })
    };
    let mut events = Vec::new();
    for (index, text) in texts.iter().enumerate() {
        for piece in word_pieces(text) {
            events.push(sse(&chunk(json!([{
                "text": piece, "index": index, "logprobs": null, "finish_reason": null,
            }]))));
        }
        events.push(sse(&chunk(json!([{
            "text": "", "index": index, "logprobs": null, "finish_reason": "stop",
        }]))));
    }
    if include_usage {
        let mut last = chunk(json!([]));
        last["usage"] = usage;
        events.push(sse(&last));
    }
    events.push(Bytes::from_static(b"data: [DONE]\n\n"));
    Ok(Answer::Stream(SseEvents {
        events,
        content_type: SseEvents::EVENT_STREAM,
        first_content: 0,
        padding: None,
    }))
}

/// A requested vector size: absent (or `null`) is the mock's default (8, so
/// answers stay small unless a test asks for more); anything but an integer
/// in `1..=max` is refused with `refusal`'s message.
pub(super) fn dimensions(
    value: Option<&Value>,
    max: u64,
    refusal: impl FnOnce() -> String,
) -> Result<usize, InvalidRequest> {
    match value {
        None | Some(Value::Null) => Ok(DEFAULT_DIMENSIONS),
        Some(value) => value
            .as_u64()
            .filter(|d| (1..=max).contains(d))
            .and_then(|d| usize::try_from(d).ok())
            .ok_or_else(|| InvalidRequest::new(refusal())),
    }
}

/// `POST /v1/embeddings`: one vector per input, derived from the SHA-256 of the input text.
pub(super) fn embeddings(body: &[u8]) -> Result<Answer, InvalidRequest> {
    let request = parse_object(body)?;
    let model = model(&request)?;
    let inputs = match request.get("input") {
        None | Some(Value::Null) => {
            return Err(InvalidRequest::new("Missing required parameter: 'input'."));
        }
        Some(input) => non_empty(strings_or_list(input, "input")?, "input")?,
    };
    let dimensions = dimensions(request.get("dimensions"), MAX_DIMENSIONS, || {
        format!("'dimensions' must be an integer between 1 and {MAX_DIMENSIONS}.")
    })?;
    let base64 = match request.get("encoding_format") {
        None | Some(Value::Null) => false,
        Some(Value::String(format)) if format == "float" => false,
        Some(Value::String(format)) if format == "base64" => true,
        Some(_) => {
            return Err(InvalidRequest::new(
                "'encoding_format' must be \"float\" or \"base64\".",
            ));
        }
    };

    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(index, input)| {
            let vector = embedding_vector(&model, input, dimensions);
            let embedding = if base64 {
                let bytes: Vec<u8> = vector.iter().flat_map(|v| v.to_le_bytes()).collect();
                Value::String(base64_encode(&bytes))
            } else {
                // As OpenAI prints them: each f32 as the shortest decimal that
                // reads back as that f32 (`-0.0078`), which a float caller
                // parses to the f32 a base64 caller decodes.
                json!(vector.iter().map(|v| shortest(*v)).collect::<Vec<f64>>())
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    // Billed per input: token ids count as themselves, text by its length.
    let tokens: u64 = match request.get("input") {
        Some(Value::Array(list)) if !list.is_empty() && list.iter().all(Value::is_number) => {
            list.len() as u64
        }
        Some(Value::Array(list)) => list.iter().map(input_tokens).sum(),
        Some(input) => input_tokens(input),
        None => 0,
    };
    Ok(Answer::Json(json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })))
}

/// What one embeddings input is billed: its token ids, or its text's approximate tokens.
fn input_tokens(input: &Value) -> u64 {
    match input {
        Value::Array(tokens) => tokens.len() as u64,
        Value::String(text) => approx_tokens(text.chars().count()),
        other => approx_tokens(canonical_json(other).chars().count()),
    }
}

/// The inputs an embeddings request asks for, as the mock keys them (text, or
/// canonical JSON of token ids): what a successful call embedded.
pub(super) fn embedding_inputs(body: &[u8]) -> Vec<String> {
    parse_object(body)
        .ok()
        .and_then(|request| request.get("input").cloned())
        .and_then(|input| strings_or_list(&input, "input").ok())
        .unwrap_or_default()
}

/// `GET /v1/models`: `listed`, or the default models.
pub(super) fn models(listed: Option<&[String]>) -> Value {
    let ids: Vec<&str> = match listed {
        Some(listed) => listed.iter().map(String::as_str).collect(),
        None => MODELS.to_vec(),
    };
    let data: Vec<Value> = ids
        .iter()
        .map(|id| json!({"id": id, "object": "model", "created": MODELS_CREATED, "owned_by": "mock"}))
        .collect();
    json!({"object": "list", "data": data})
}

/// One model of [`models`]' list, by id.
pub(super) fn listed_model(listed: Option<&[String]>, id: &str) -> Option<Value> {
    models(listed)["data"]
        .as_array()?
        .iter()
        .find(|model| model["id"] == id)
        .cloned()
}

/// `POST /v1/images/generations` (OpenAI's `ImagesResponse`): `n` images (1 to 10, default
/// 1), each a few deterministic bytes as `b64_json` with the prompt as `revised_prompt`.
pub(super) fn image_generation(body: &[u8]) -> Result<Answer, InvalidRequest> {
    let request = parse_object(body)?;
    let prompt = request
        .get("prompt")
        .and_then(Value::as_str)
        .ok_or_else(|| InvalidRequest::new("Missing required parameter: 'prompt'."))?;
    let n = match request.get("n") {
        None | Some(Value::Null) => 1,
        Some(n) => n
            .as_u64()
            .filter(|n| (1..=10).contains(n))
            .ok_or_else(|| InvalidRequest::new("Invalid 'n': expected an integer from 1 to 10."))?,
    };
    let digest = short_digest(prompt);
    let data: Vec<Value> = (0..n)
        .map(|i| {
            json!({
                "b64_json": base64_encode(format!("mock image {i} of {digest}").as_bytes()),
                "revised_prompt": prompt,
            })
        })
        .collect();
    Ok(Answer::Json(json!({"created": now_secs(), "data": data})))
}

/// `POST /v1/audio/transcriptions`: the body is multipart (the audio file and the form
/// fields); the "transcript" only tells how many bytes arrived.
pub(super) fn transcription(body: &[u8]) -> Answer {
    Answer::Json(json!({"text": format!("mock transcript of a {}-byte upload", body.len())}))
}

pub(super) fn parse_object(body: &[u8]) -> Result<Map<String, Value>, InvalidRequest> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(InvalidRequest::new(
            "The request body must be a JSON object.",
        )),
        Err(error) => Err(InvalidRequest::new(format!(
            "We could not parse the JSON body of your request: {error}."
        ))),
    }
}

pub(super) fn model(request: &Map<String, Value>) -> Result<String, InvalidRequest> {
    match request.get("model") {
        Some(Value::String(model)) if !model.is_empty() => Ok(model.clone()),
        _ => Err(InvalidRequest::new("You must provide a model parameter.")),
    }
}

/// A boolean parameter; absent and `null` mean false.
pub(super) fn flag(request: &Map<String, Value>, name: &str) -> Result<bool, InvalidRequest> {
    match request.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(on)) => Ok(*on),
        Some(_) => Err(InvalidRequest::new(format!(
            "Invalid type for '{name}': expected a boolean."
        ))),
    }
}

fn include_usage(request: &Map<String, Value>) -> Result<bool, InvalidRequest> {
    match request.get("stream_options") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Object(options)) => match options.get("include_usage") {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(on)) => Ok(*on),
            Some(_) => Err(InvalidRequest::new(
                "Invalid type for 'stream_options.include_usage': expected a boolean.",
            )),
        },
        Some(_) => Err(InvalidRequest::new(
            "Invalid type for 'stream_options': expected an object.",
        )),
    }
}

fn choice_count(request: &Map<String, Value>) -> Result<usize, InvalidRequest> {
    match request.get("n") {
        None | Some(Value::Null) => Ok(1),
        Some(value) => value
            .as_u64()
            .filter(|n| (1..=MAX_N).contains(n))
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| {
                InvalidRequest::new(format!("'n' must be an integer between 1 and {MAX_N}."))
            }),
    }
}

/// A string or a list of inputs (`prompt`, `input`); non-string list items (token arrays) are
/// taken as their canonical JSON text.
fn strings_or_list(value: &Value, name: &str) -> Result<Vec<String>, InvalidRequest> {
    match value {
        Value::String(text) => Ok(vec![text.clone()]),
        Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_number) => {
            // A single input given as token ids.
            Ok(vec![canonical_json(value)])
        }
        Value::Array(items) => Ok(items
            .iter()
            .map(|item| match item {
                Value::String(text) => text.clone(),
                other => canonical_json(other),
            })
            .collect()),
        _ => Err(InvalidRequest::new(format!(
            "Invalid type for '{name}': expected a string or an array."
        ))),
    }
}

fn non_empty(items: Vec<String>, name: &str) -> Result<Vec<String>, InvalidRequest> {
    if items.is_empty() {
        Err(InvalidRequest::new(format!("'{name}' must not be empty.")))
    } else {
        Ok(items)
    }
}

/// The reply to a conversation: a digest of all messages, then the last user text quoted.
fn chat_content(messages: &Value, list: &[Value]) -> String {
    quoting_reply(messages, list, message_text)
}

/// The reply of every API's mock: a digest of what shapes the answer (`shaped_by`), then the
/// last user message of `list` quoted (its text as `text` reads it), so a test can see both
/// that the answer is deterministic and which conversation it answers.
pub(super) fn quoting_reply(
    shaped_by: &Value,
    list: &[Value],
    text: impl Fn(&Value) -> String,
) -> String {
    let digest = short_digest(&canonical_json(shaped_by));
    let quote: String = list
        .iter()
        .rev()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
        .map(text)
        .unwrap_or_default()
        .chars()
        .take(QUOTE_CHARS)
        .collect();
    format!("mock reply to {digest}: {quote}")
        .trim_end()
        .to_owned()
}

/// Choice 0 is the plain reply; further choices are marked so that they differ, as real ones do.
fn variant(base: &str, index: usize) -> String {
    if index == 0 {
        base.to_owned()
    } else {
        format!("{base} (choice {index})")
    }
}

/// The text of a message: its string content, or its text parts concatenated.
pub(super) fn message_text(message: &Value) -> String {
    match message.get("content") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

fn usage(prompt_tokens: u64, completion_tokens: u64) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    })
}

/// Roughly four characters per token, as OpenAI's rule of thumb; never zero.
pub(super) fn approx_tokens(chars: usize) -> u64 {
    u64::try_from(chars.div_ceil(4)).unwrap_or(u64::MAX).max(1)
}

pub(super) fn word_count(text: &str) -> u64 {
    u64::try_from(text.split_whitespace().count()).unwrap_or(u64::MAX)
}

/// Split `text` into one piece per word, each keeping the whitespace that follows it (leading
/// whitespace stays with the first word), so the pieces concatenate back to `text` exactly.
pub(super) fn word_pieces(text: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut start = 0;
    let mut seen_word = false;
    let mut after_space = false;
    for (at, ch) in text.char_indices() {
        if ch.is_whitespace() {
            after_space = true;
        } else {
            if seen_word && after_space {
                pieces.push(&text[start..at]);
                start = at;
            }
            seen_word = true;
            after_space = false;
        }
    }
    if start < text.len() {
        pieces.push(&text[start..]);
    }
    pieces
}

/// `value` serialized with object keys sorted at every level.
///
/// Hashing `Value::to_string()` directly would depend on whether some crate in the build turned
/// on serde_json's `preserve_order`, so the digest is computed over this form instead.
pub(super) fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::from(key.as_str()).to_string());
                out.push(':');
                write_canonical(item, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// The first 12 hex digits of the SHA-256 of `text`.
pub(super) fn short_digest(text: &str) -> String {
    let mut digest = hex::encode(Sha256::digest(text.as_bytes()));
    digest.truncate(12);
    digest
}

/// The shortest decimal that reads back as `value` (serde_json prints an f32
/// so), as the f64 that decimal names.
pub(super) fn shortest(value: f32) -> f64 {
    let text = serde_json::to_string(&value).expect("a finite f32 prints");
    text.parse().expect("a printed f32 parses")
}

/// `dimensions` values in `[-1, 1)`, a function of the model and the input: four bytes of
/// SHA-256(model ‖ 0 ‖ block number ‖ input) per value, read as a 24-bit fraction.
///
/// Each value is exact in f32 but its f64 is not a short decimal, so a gateway that prints
/// the f64 rather than the f32's shortest form (or loses precision) shows up in a client.
pub(super) fn embedding_vector(model: &str, input: &str, dimensions: usize) -> Vec<f32> {
    let mut vector = Vec::with_capacity(dimensions);
    let mut block: u32 = 0;
    while vector.len() < dimensions {
        let mut hasher = Sha256::new();
        hasher.update(model.as_bytes());
        hasher.update([0]);
        hasher.update(block.to_be_bytes());
        hasher.update(input.as_bytes());
        let remaining = dimensions - vector.len();
        vector.extend(
            hasher
                .finalize()
                .chunks_exact(4)
                .take(remaining)
                .map(|four| {
                    let bits = u32::from_be_bytes([four[0], four[1], four[2], four[3]]) >> 8;
                    // A 24-bit integer over 2^23, minus one: exact in f32.
                    (bits as f32) / 8_388_608.0 - 1.0
                }),
        );
        block = block.wrapping_add(1);
    }
    vector
}

/// Standard base64 with padding, for `encoding_format: "base64"` (the default of the official
/// Python client), without pulling in a crate for twenty lines.
fn base64_encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for group in bytes.chunks(3) {
        let b = [
            group[0],
            group.get(1).copied().unwrap_or(0),
            group.get(2).copied().unwrap_or(0),
        ];
        let triple = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18u32, 12, 6, 0].into_iter().enumerate() {
            if i <= group.len() {
                out.push(char::from(ALPHABET[((triple >> shift) & 0x3f) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// One chat or completions chunk framed as an SSE `data:` event.
pub(super) fn sse(event: &Value) -> Bytes {
    Bytes::from(format!("data: {event}\n\n"))
}

pub(super) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}
