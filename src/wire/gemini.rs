//! Gemini's native API (`POST /v1beta/models/{model}:generateContent` and
//! `:streamGenerateContent?alt=sse`, the same under `/v1/`), sent to
//! `api: gemini` upstreams as `{base_url}/models/{model}:{method}`.
//!
//! Unlike the other APIs, the request's path says what the body does not:
//! the model, and whether the caller streams (the method). Both reach the
//! adapter as a [`GeminiCall`] read off the path; the model is keyed through
//! it (with the path's API version) and the method is delivery, so a
//! `generateContent` and a `streamGenerateContent` caller of one request
//! share one upstream call, like `stream` in the other APIs' bodies. The
//! `alt` query parameter (the stream's framing; `$alt` too, Google's other
//! spelling of a system parameter, its value in any case) is delivery too.
//! A `fields` mask (`fields`, `$fields`) asks for a projection of the answer,
//! which would look like a broken stream and is not the answer to share: such
//! a request goes upstream as it came (`BYPASS`), as does one whose `tools`
//! search a `fileSearch` store, whose content can change under one name.
//!
//! A stream is a sequence of `data: <GenerateContentResponse>` events, with
//! neither event names nor a `[DONE]`: each chunk carries the next piece of
//! some candidates' `content.parts` (by `index`), and the usage so far
//! (`usageMetadata` is a running total, so the last chunk's is the call's).
//! The stream is complete (cacheable) only when its body ends after every
//! candidate it named has carried its `finishReason` (with `candidateCount`
//! above one they finish apart, and a chunk of usage or grounding may follow
//! the last one), or after a chunk that says the prompt was blocked
//! (`promptFeedback.blockReason`, no candidates); an `error` object, or a
//! stream cut before, fails every reader with an error event in Gemini's
//! shape (`{"error":{"code":500,"message":..,"status":"INTERNAL"}}`, the
//! shape the SDKs raise their own `APIError` for). A silent stream's
//! readers are kept alive with blank lines, which both Google SDKs skip
//! (`google-genai` fails on an SSE comment).
//!
//! [`assemble`](Wire::assemble) merges the chunks as the SDKs' readers do
//! (a candidate's consecutive text pieces joined), and
//! [`synthesize`](Wire::synthesize) cuts an answer back into chunks that
//! merge to it.
//!
//! Keyed: every body field (`contents`, whose parts' text is normalized like
//! chat messages, `systemInstruction`, `tools`, `toolConfig`,
//! `generationConfig`, `safetySettings`, `cachedContent`, and any field
//! newer than this adapter). `cachedContent` names content that cannot
//! change (only its expiry can), so it is keyed by its name like any other
//! value. Gemini samples at temperature 1 by default: a request is
//! deterministic only with `generationConfig.temperature: 0` or a
//! `generationConfig.seed`. The API has no label fields.

use std::collections::BTreeMap;

use bytes::Bytes;
use percent_encoding::percent_decode_str;
use serde_json::{Map, Value, json};

use super::{ConvertError, Wire, pieces};
use crate::{
    config::Api,
    error::{ErrorShape, GatewayError},
    fingerprint::{BodyKeying, Endpoint},
    sse::{
        BLANK_LINE, CallerUsage, Format, Frame, Framing, StreamFormat, UpstreamStreamRequest,
        data_event, event_json, read_object,
    },
    usage::Usage,
    validate::{self, InputLimits},
};

/// The generateContent adapter.
#[derive(Debug)]
pub struct GeminiWire;

pub static GEMINI: GeminiWire = GeminiWire;

/// Gemini's stream format.
#[derive(Debug)]
pub struct GeminiStream;

pub static GEMINI_STREAM: GeminiStream = GeminiStream;

/// The model methods corral deduplicates; every other one (`countTokens`,
/// ...) is the pass-through's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GeminiMethod {
    /// `generateContent`.
    Generate,
    /// `streamGenerateContent`.
    StreamGenerate,
    /// `embedContent`: one content's vector.
    Embed,
    /// `batchEmbedContents`: a vector per request of its `requests`.
    BatchEmbed,
}

impl GeminiMethod {
    const ALL: [Self; 4] = [
        Self::Generate,
        Self::StreamGenerate,
        Self::Embed,
        Self::BatchEmbed,
    ];

    /// The method's name in a path (`models/{model}:{name}`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Generate => "generateContent",
            Self::StreamGenerate => "streamGenerateContent",
            Self::Embed => "embedContent",
            Self::BatchEmbed => "batchEmbedContents",
        }
    }

    /// The deduplicated endpoint it is: both generate methods are one (the
    /// method only delivers), both embedding methods another (an item is
    /// shared between them).
    pub fn endpoint(self) -> Endpoint {
        match self {
            Self::Generate | Self::StreamGenerate => Endpoint::GenerateContent,
            Self::Embed | Self::BatchEmbed => Endpoint::EmbedContent,
        }
    }
}

/// What a Gemini path says of a request: which model, which method.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeminiCall {
    /// The model segment as the path spells it (`gemini-2.5-flash`).
    pub model: String,
    pub method: GeminiMethod,
    /// The API version the caller named (`v1beta`, `v1`): keyed, since the
    /// versions may answer one body differently.
    pub version: &'static str,
    /// The path it came on, kept for the memo, spans and messages.
    path: String,
}

impl GeminiCall {
    /// The call `path` names: `/{v1beta|v1}/models/{model}:{method}` for a
    /// deduplicated method; `None` for any other path (the model list,
    /// `countTokens`, tuned models, files: the pass-through's).
    pub fn of_path(path: &str) -> Option<Self> {
        let (version, rest) = if let Some(rest) = path.strip_prefix("/v1beta/models/") {
            ("v1beta", rest)
        } else {
            ("v1", path.strip_prefix("/v1/models/")?)
        };
        let (model, name) = rest.rsplit_once(':')?;
        let method = GeminiMethod::ALL
            .into_iter()
            .find(|method| method.name() == name)?;
        let plain = !model.is_empty()
            && model
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'@'));
        plain.then(|| Self {
            model: model.to_owned(),
            method,
            version,
            path: path.to_owned(),
        })
    }

    /// `streamGenerateContent`.
    pub fn stream(&self) -> bool {
        self.method == GeminiMethod::StreamGenerate
    }

    /// The path the call came on.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The path below its version (`/models/{model}:{method}`): where it
    /// goes below a Gemini upstream's base URL, which names the version.
    pub fn below_version(&self) -> &str {
        &self.path[1 + self.version.len()..]
    }
}

static KEYING: BodyKeying = BodyKeying {
    delivery: &[],
    labels: &[],
    item_labels: &[],
    messages: Some("contents"),
    content: "parts",
    inline_item: None,
};

impl Wire for GeminiWire {
    fn api(&self) -> Api {
        Api::Gemini
    }

    fn error_shape(&self) -> ErrorShape {
        ErrorShape::Gemini
    }

    fn keying(&self) -> &'static BodyKeying {
        &KEYING
    }

    /// `alt` (or `$alt`) is how a stream is framed (`sse`, or a JSON array
    /// without it).
    fn is_delivery_param(&self, name: &str) -> bool {
        names(name, "alt")
    }

    /// A `fields` mask projects the answer: not one to share or store.
    fn dedupable_query(&self, query: Option<&str>) -> bool {
        !query_pairs(query).any(|(name, _)| names(name, "fields"))
    }

    /// A `fileSearch` tool searches stores named by reference, whose
    /// documents change under their names (the Responses `file_search`
    /// likewise bypasses).
    fn dedupable(&self, body: &Map<String, Value>) -> bool {
        let searches_files = match body.get("tools") {
            Some(Value::Array(tools)) => tools.iter().any(|tool| {
                ["fileSearch", "file_search"]
                    .iter()
                    .any(|name| tool.get(name).is_some_and(|search| !search.is_null()))
            }),
            _ => false,
        };
        !searches_files
    }

    /// The conversation's length, which corral normalizes and hashes; the
    /// rest (roles, part kinds, ranges) is Google's to judge.
    fn check(&self, body: &Map<String, Value>, limits: InputLimits) -> Result<(), GatewayError> {
        if let Some(Value::Array(contents)) = body.get("contents") {
            validate::check_message_count(contents, limits)?;
        }
        Ok(())
    }

    /// `generationConfig.temperature: 0`, or a `generationConfig.seed`.
    fn is_deterministic(&self, body: &Map<String, Value>) -> bool {
        let Some(Value::Object(config)) = body.get("generationConfig") else {
            return false;
        };
        let zero = config
            .get("temperature")
            .and_then(Value::as_f64)
            .is_some_and(|t| t == 0.0);
        zero || config.get("seed").is_some_and(|seed| !seed.is_null())
    }

    /// The method, not the body, says whether a call streams.
    fn is_stream(&self, _body: &Map<String, Value>) -> bool {
        false
    }

    fn stream_query(&self) -> Option<&'static str> {
        Some("alt=sse")
    }

    /// Events with `alt=sse` (what the SDKs send; `$alt`, `SSE` alike: the
    /// last `alt` decides); without, Google streams one JSON array.
    fn stream_framing(&self, query: Option<&str>) -> Framing {
        let alt = query_pairs(query)
            .filter(|(name, _)| names(name, "alt"))
            .last()
            .map(|(_, value)| percent_decode_str(value).decode_utf8_lossy());
        match alt {
            Some(alt) if alt.eq_ignore_ascii_case("sse") => Framing::Events,
            _ => Framing::JsonArray,
        }
    }

    fn stream_format(&self) -> Format {
        &GEMINI_STREAM
    }

    /// The body goes as it came: the method streams, and every chunk
    /// carries usage.
    fn stream_request(&self, body: &Map<String, Value>) -> UpstreamStreamRequest {
        UpstreamStreamRequest {
            body: Bytes::from(Value::Object(body.clone()).to_string()),
            caller_usage: CallerUsage::Asked,
        }
    }

    fn assemble(&self, events: &[Bytes]) -> Result<Value, ConvertError> {
        assemble(events)
    }

    fn synthesize(&self, answer: &Value) -> Result<Vec<Bytes>, ConvertError> {
        synthesize(answer)
    }

    fn is_complete(&self, body: &[u8]) -> bool {
        match serde_json::from_slice::<Value>(body) {
            Ok(Value::Object(response)) => completes(&response),
            _ => false,
        }
    }

    fn usage(&self, body: &[u8]) -> Option<Usage> {
        usage_of(body)
    }
}

/// A query's `name=value` pairs, as spelled (a name without `=` has an
/// empty value).
fn query_pairs(query: Option<&str>) -> impl Iterator<Item = (&str, &str)> {
    query
        .unwrap_or_default()
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
}

/// Whether the query parameter spelled `raw` is Google's system parameter
/// `name`: percent-decoded, with or without its `$` (`$alt`, `%24alt`).
fn names(raw: &str, name: &str) -> bool {
    let decoded = percent_decode_str(raw).decode_utf8_lossy();
    decoded.strip_prefix('$').unwrap_or(&decoded) == name
}

/// The `usageMetadata` of a response (or a chunk) body.
fn usage_of(body: &[u8]) -> Option<Usage> {
    let value: Value = serde_json::from_slice(body).ok()?;
    Usage::from_usage_metadata(value.get("usageMetadata")?)
}

/// The embedding methods' adapter (`embedContent`, `batchEmbedContents`):
/// requests go by the item (`dedup/embeddings/`); what an adapter answers
/// for a whole request serves only a `no-store` caller, sent as it came.
#[derive(Debug)]
pub struct GeminiEmbedWire;

pub static GEMINI_EMBED: GeminiEmbedWire = GeminiEmbedWire;

static EMBED_KEYING: BodyKeying = BodyKeying {
    delivery: &[],
    labels: &[],
    item_labels: &[],
    messages: None,
    content: "parts",
    inline_item: None,
};

impl Wire for GeminiEmbedWire {
    fn api(&self) -> Api {
        Api::Gemini
    }

    fn error_shape(&self) -> ErrorShape {
        ErrorShape::Gemini
    }

    fn keying(&self) -> &'static BodyKeying {
        &EMBED_KEYING
    }

    /// The items' own checks are the item reader's (`dedup/embeddings/`).
    fn check(&self, _body: &Map<String, Value>, _limits: InputLimits) -> Result<(), GatewayError> {
        Ok(())
    }

    /// One content, one vector.
    fn is_deterministic(&self, _body: &Map<String, Value>) -> bool {
        true
    }

    fn is_stream(&self, _body: &Map<String, Value>) -> bool {
        false
    }

    fn stream_format(&self) -> Format {
        &GEMINI_STREAM
    }

    fn stream_request(&self, body: &Map<String, Value>) -> UpstreamStreamRequest {
        GEMINI.stream_request(body)
    }

    fn assemble(&self, _events: &[Bytes]) -> Result<Value, ConvertError> {
        Err(ConvertError::UnsupportedObject("embeddings".to_owned()))
    }

    fn synthesize(&self, _answer: &Value) -> Result<Vec<Bytes>, ConvertError> {
        Err(ConvertError::UnsupportedObject("embeddings".to_owned()))
    }

    fn is_complete(&self, body: &[u8]) -> bool {
        serde_json::from_slice::<Value>(body).is_ok_and(|value| {
            value.get("embedding").is_some() || value.get("embeddings").is_some()
        })
    }

    fn usage(&self, body: &[u8]) -> Option<Usage> {
        usage_of(body)
    }
}

/// Whether a response (or a stream's chunks merged, [`assemble`]) is a whole
/// answer: every candidate carries its `finishReason`, or the prompt was
/// blocked.
fn completes(response: &Map<String, Value>) -> bool {
    match response.get("candidates") {
        Some(Value::Array(candidates)) if !candidates.is_empty() => candidates
            .iter()
            .all(|candidate| candidate.get("finishReason").is_some_and(Value::is_string)),
        _ => response
            .get("promptFeedback")
            .and_then(|feedback| feedback.get("blockReason"))
            .is_some_and(Value::is_string),
    }
}

impl StreamFormat for GeminiStream {
    fn read(&self, _name: Option<&str>, data: &str) -> Frame {
        let chunk = match read_object(data) {
            Ok(chunk) => chunk,
            Err(malformed) => return malformed,
        };
        if chunk.get("error").is_some_and(|error| !error.is_null()) {
            return Frame::Failed(data_event(&Value::Object(chunk)));
        }
        let usage = chunk
            .get("usageMetadata")
            .and_then(Usage::from_usage_metadata);
        // Never complete on a chunk: another candidate, or a chunk of usage
        // or grounding, may follow the one that finished (`complete_at_end`).
        Frame::Event {
            event: data_event(&Value::Object(chunk)),
            usage,
        }
    }

    /// A blank line, which `google-genai` and `@google/genai` skip.
    fn keepalive(&self) -> Bytes {
        BLANK_LINE
    }

    /// Complete when the chunks merge into a whole answer: every candidate
    /// named finished, or the prompt was blocked.
    fn complete_at_end(&self, events: &[Bytes]) -> bool {
        assemble(events).is_ok()
    }

    fn may_complete_at_end(&self) -> bool {
        true
    }

    fn done_event(&self) -> Option<Bytes> {
        None
    }

    /// Gemini's error shape, `code` an integer: what the SDKs raise their
    /// own `APIError` for.
    fn error_event(&self, message: &str, _position: usize) -> Bytes {
        data_event(&json!({"error": {"code": 500, "message": message, "status": "INTERNAL"}}))
    }

    fn event_usage(&self, event: &[u8]) -> Option<Usage> {
        usage_of(event_json(event)?)
    }
}

/// The response a complete stream amounts to: per candidate (by `index`, in
/// its order), its parts in order with consecutive text pieces of one kind
/// joined, and every other member as the latest chunk that had it said; the
/// response's own members (`usageMetadata`, `modelVersion`, `responseId`,
/// `promptFeedback`) likewise. `Empty` unless the merged answer is whole
/// ([`completes`]).
fn assemble(events: &[Bytes]) -> Result<Value, ConvertError> {
    let mut response = Map::new();
    let mut candidates: BTreeMap<u64, Map<String, Value>> = BTreeMap::new();
    for (index, event) in events.iter().enumerate() {
        let Some(Ok(Value::Object(chunk))) = event_json(event).map(serde_json::from_slice) else {
            return Err(ConvertError::NotJson { index });
        };
        if chunk.get("error").is_some_and(|error| !error.is_null()) {
            return Err(ConvertError::ErrorEvent { index });
        }
        for (name, value) in chunk {
            if name != "candidates" {
                response.insert(name, value);
                continue;
            }
            let Value::Array(pieces) = value else {
                return Err(ConvertError::Malformed("candidates"));
            };
            for piece in pieces {
                let Value::Object(piece) = piece else {
                    return Err(ConvertError::Malformed("candidates[]"));
                };
                let at = match piece.get("index") {
                    None | Some(Value::Null) => 0,
                    Some(index) => index
                        .as_u64()
                        .ok_or(ConvertError::Malformed("candidates[].index"))?,
                };
                merge_candidate(candidates.entry(at).or_default(), piece)?;
            }
        }
    }
    if !candidates.is_empty() {
        let candidates = candidates.into_values().map(Value::Object).collect();
        response.insert("candidates".to_owned(), Value::Array(candidates));
    }
    if !completes(&response) {
        return Err(ConvertError::Empty);
    }
    Ok(Value::Object(response))
}

/// One chunk's piece of a candidate laid over what came before.
fn merge_candidate(
    into: &mut Map<String, Value>,
    piece: Map<String, Value>,
) -> Result<(), ConvertError> {
    for (name, value) in piece {
        if name != "content" {
            into.insert(name, value);
            continue;
        }
        let Value::Object(mut content) = value else {
            return Err(ConvertError::Malformed("candidates[].content"));
        };
        let parts = match content.remove("parts") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(parts)) => parts,
            Some(_) => return Err(ConvertError::Malformed("candidates[].content.parts")),
        };
        let merged = into
            .entry("content")
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .ok_or(ConvertError::Malformed("candidates[].content"))?;
        for (name, value) in content {
            merged.insert(name, value);
        }
        let merged_parts = merged
            .entry("parts")
            .or_insert_with(|| json!([]))
            .as_array_mut()
            .ok_or(ConvertError::Malformed("candidates[].content.parts"))?;
        for part in parts {
            append_part(merged_parts, part);
        }
    }
    Ok(())
}

/// `part` after `parts`: joined to the last one when both are plain text of
/// one kind (answer or thought), else as a part of its own.
fn append_part(parts: &mut Vec<Value>, part: Value) {
    if let (Some(Value::Object(last)), Value::Object(next)) = (parts.last_mut(), &part)
        && let (Some(kind), Some(Value::String(more))) = (plain_text(last), next.get("text"))
        && plain_text(next) == Some(kind)
        && let Some(Value::String(text)) = last.get_mut("text")
    {
        text.push_str(more);
        return;
    }
    parts.push(part);
}

/// For a part that is text and nothing else (a thought marked so): whether
/// it is a thought.
fn plain_text(part: &Map<String, Value>) -> Option<bool> {
    if !part.get("text").is_some_and(Value::is_string) {
        return None;
    }
    let thought = match part.get("thought") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(thought)) => *thought,
        Some(_) => return None,
    };
    let others = part.len() - 1 - usize::from(part.contains_key("thought"));
    (others == 0).then_some(thought)
}

/// A stream of chunks that [`assemble`] merges back into `answer`: each
/// candidate's text cut into pieces, one chunk each, and a last chunk that
/// carries every candidate's last piece with its `finishReason` (and its
/// other members), and the response's own members.
fn synthesize(answer: &Value) -> Result<Vec<Bytes>, ConvertError> {
    let Value::Object(answer) = answer else {
        return Err(ConvertError::Malformed("response"));
    };
    let mut head = answer.clone();
    let candidates = match head.remove("candidates") {
        None | Some(Value::Null) => return Ok(vec![data_event(&Value::Object(head))]),
        Some(Value::Array(candidates)) => candidates,
        Some(_) => return Err(ConvertError::Malformed("candidates")),
    };
    // What identifies the answer goes in every chunk, as Gemini sends it.
    let mut ids = Map::new();
    for name in ["modelVersion", "responseId"] {
        if let Some(value) = head.get(name) {
            ids.insert(name.to_owned(), value.clone());
        }
    }
    let mut events = Vec::new();
    let mut last_pieces = Vec::new();
    for (at, candidate) in candidates.into_iter().enumerate() {
        let Value::Object(mut candidate) = candidate else {
            return Err(ConvertError::Malformed("candidates[]"));
        };
        let index = candidate.get("index").cloned().unwrap_or(json!(at));
        let mut content = match candidate.remove("content") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(content)) => content,
            Some(_) => return Err(ConvertError::Malformed("candidates[].content")),
        };
        let parts = match content.remove("parts") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(parts)) => parts,
            Some(_) => return Err(ConvertError::Malformed("candidates[].content.parts")),
        };
        let mut cut: Vec<Value> = Vec::new();
        for part in parts {
            match part.as_object().and_then(plain_text) {
                Some(_) => {
                    let text = part["text"].as_str().unwrap_or_default();
                    for piece in pieces(text) {
                        // The part as it was (its `thought` mark kept), with a piece of its text.
                        let mut piece_part = part.clone();
                        piece_part["text"] = json!(piece);
                        cut.push(piece_part);
                    }
                }
                None => cut.push(part),
            }
        }
        let last = cut.pop();
        for part in cut {
            let mut piece_content = content.clone();
            piece_content.insert("parts".to_owned(), json!([part]));
            let mut chunk = ids.clone();
            chunk.insert(
                "candidates".to_owned(),
                json!([{"content": piece_content, "index": index}]),
            );
            events.push(data_event(&Value::Object(chunk)));
        }
        content.insert("parts".to_owned(), Value::Array(last.into_iter().collect()));
        candidate.insert("content".to_owned(), Value::Object(content));
        candidate.insert("index".to_owned(), index);
        last_pieces.push(Value::Object(candidate));
    }
    head.insert("candidates".to_owned(), Value::Array(last_pieces));
    events.push(data_event(&Value::Object(head)));
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(value: Value) -> Bytes {
        data_event(&value)
    }

    fn answer() -> Value {
        json!({
            "candidates": [{
                "content": {"role": "model", "parts": [
                    {"text": "thinking it over ".repeat(5), "thought": true},
                    {"text": "a long answer ".repeat(12)},
                    {"functionCall": {"name": "lookup", "args": {"q": "x"}}},
                ]},
                "finishReason": "STOP",
                "index": 0,
                "safetyRatings": [],
            }],
            "usageMetadata": {"promptTokenCount": 12, "candidatesTokenCount": 40,
                              "thoughtsTokenCount": 9, "totalTokenCount": 61},
            "modelVersion": "gemini-2.5-flash",
            "responseId": "r-1",
        })
    }

    #[test]
    fn a_path_names_the_model_the_method_and_the_version() {
        let call = GeminiCall::of_path("/v1beta/models/gemini-2.5-flash:streamGenerateContent");
        assert_eq!(
            call,
            Some(GeminiCall {
                model: "gemini-2.5-flash".to_owned(),
                method: GeminiMethod::StreamGenerate,
                version: "v1beta",
                path: "/v1beta/models/gemini-2.5-flash:streamGenerateContent".to_owned(),
            })
        );
        let call = GeminiCall::of_path("/v1/models/gemini-2.5-pro:generateContent").unwrap();
        assert_eq!((call.stream(), call.version), (false, "v1"));
        assert_eq!(
            call.below_version(),
            "/models/gemini-2.5-pro:generateContent"
        );
        let call = GeminiCall::of_path("/v1beta/models/gemini-embedding-001:batchEmbedContents");
        assert_eq!(call.unwrap().method.endpoint(), Endpoint::EmbedContent);
        for other in [
            "/v1beta/models/gemini-2.5-flash:countTokens",
            "/v1beta/models/gemini-2.5-flash",
            "/v1beta/models/:generateContent",
            "/v1beta/models/a/b:generateContent",
            "/v1beta/models/a%2F..:generateContent",
            "/v1beta/tunedModels/x:generateContent",
            "/v1/chat/completions",
        ] {
            assert_eq!(GeminiCall::of_path(other), None, "{other}");
        }
    }

    #[test]
    fn a_synthesized_stream_assembles_to_its_answer() {
        let answer = answer();
        let events = synthesize(&answer).unwrap();
        assert!(events.len() > 3, "the text is cut into pieces");
        let frames: Vec<Frame> = events
            .iter()
            .map(|event| {
                let data = std::str::from_utf8(event_json(event).unwrap()).unwrap();
                GEMINI_STREAM.read(None, data)
            })
            .collect();
        assert!(matches!(
            frames.last(),
            Some(Frame::Event { usage: Some(_), .. })
        ));
        assert!(
            frames
                .iter()
                .all(|frame| matches!(frame, Frame::Event { .. })),
            "a stream completes when it ends, never on a chunk"
        );
        assert!(GEMINI_STREAM.complete_at_end(&events));
        assert!(!GEMINI_STREAM.complete_at_end(&events[..events.len() - 1]));
        assert_eq!(assemble(&events).unwrap(), answer);
    }

    /// Issue 37 R4: with `candidateCount: 2` the candidates finish apart, and
    /// a chunk of usage alone may follow the last: complete only at the end,
    /// after every candidate finished, with every chunk in the answer.
    #[test]
    fn candidates_finish_apart_and_a_trailing_usage_chunk_belongs_to_the_answer() {
        let piece = |index: u64, text: &str, finish: bool| {
            let mut candidate = json!({"content": {"role": "model", "parts": [{"text": text}]},
                "index": index});
            if finish {
                candidate["finishReason"] = json!("STOP");
            }
            candidate
        };
        let events = [
            event(json!({"candidates": [piece(0, "Hel", false), piece(1, "Bon", false)]})),
            // The first candidate is done; the second is not.
            event(json!({"candidates": [piece(0, "lo", true)]})),
            event(json!({"candidates": [piece(1, "jour", true)]})),
            event(
                json!({"usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 4,
                "totalTokenCount": 7}, "modelVersion": "gemini-2.5-flash"}),
            ),
        ];
        for (ended_after, complete) in [(1, false), (2, false), (3, true), (4, true)] {
            assert_eq!(
                GEMINI_STREAM.complete_at_end(&events[..ended_after]),
                complete,
                "ended after {ended_after} chunks"
            );
        }
        let assembled = assemble(&events).unwrap();
        assert_eq!(
            assembled["candidates"],
            json!([
                {"content": {"role": "model", "parts": [{"text": "Hello"}]}, "index": 0,
                 "finishReason": "STOP"},
                {"content": {"role": "model", "parts": [{"text": "Bonjour"}]}, "index": 1,
                 "finishReason": "STOP"},
            ])
        );
        assert_eq!(assembled["usageMetadata"]["totalTokenCount"], 7);
        assert_eq!(
            GEMINI_STREAM
                .stream_usage(&events)
                .map(|usage| usage.total()),
            Some(7)
        );
        // A candidate that comes first with a later index is kept in order.
        let swapped = [events[2].clone(), events[0].clone(), events[1].clone()];
        let assembled = assemble(&swapped).unwrap();
        assert_eq!(assembled["candidates"][0]["index"], 0);
        assert_eq!(
            assembled["candidates"][1]["content"]["parts"][0]["text"],
            "jourBon"
        );
    }

    /// Issue 37 R1: `google-genai` fails on an SSE comment; a blank line is
    /// what both Google SDKs skip.
    #[test]
    fn a_silent_gemini_stream_is_kept_alive_with_a_blank_line() {
        assert_eq!(GEMINI_STREAM.keepalive(), Bytes::from_static(b"\n"));
        assert_ne!(GEMINI_STREAM.keepalive(), crate::sse::KEEPALIVE);
    }

    /// Issue 37 W1 and K1: `$alt` and `SSE` are `alt=sse`; a `fields` mask or
    /// a `fileSearch` tool is not shared.
    #[test]
    fn alt_is_read_as_google_reads_it_and_projections_and_file_searches_bypass() {
        for query in [
            "alt=sse",
            "$alt=sse",
            "%24alt=sse",
            "alt=SSE",
            "key=k&$alt=Sse",
        ] {
            assert_eq!(
                GEMINI.stream_framing(Some(query)),
                Framing::Events,
                "{query}"
            );
        }
        for query in ["", "alt=json", "salt=sse", "alt=sse&alt=json", "alt"] {
            assert_eq!(
                GEMINI.stream_framing(Some(query)),
                Framing::JsonArray,
                "{query}"
            );
        }
        for name in ["alt", "$alt", "%24alt"] {
            assert!(GEMINI.is_delivery_param(name), "{name}");
        }
        assert!(!GEMINI.is_delivery_param("salt"));
        assert!(GEMINI.dedupable_query(Some("alt=sse")));
        assert!(GEMINI.dedupable_query(None));
        for query in [
            "fields=candidates",
            "alt=sse&$fields=usageMetadata",
            "%24fields=x",
        ] {
            assert!(!GEMINI.dedupable_query(Some(query)), "{query}");
        }
        let body = |value: Value| value.as_object().unwrap().clone();
        assert!(GEMINI.dedupable(&body(json!({"tools": [{"googleSearch": {}}]}))));
        assert!(
            !GEMINI.dedupable(&body(json!({"tools": [{"googleSearch": {}},
            {"fileSearch": {"fileSearchStoreNames": ["fileSearchStores/s"]}}]})))
        );
        assert!(!GEMINI.dedupable(&body(json!({"tools": [{"file_search": {}}]}))));
    }

    #[test]
    fn a_stream_without_its_finish_reason_is_not_an_answer() {
        let first = event(json!({"candidates": [{"content": {"role": "model",
            "parts": [{"text": "Hel"}]}, "index": 0}],
            "usageMetadata": {"promptTokenCount": 3, "totalTokenCount": 3}}));
        assert_eq!(
            assemble(std::slice::from_ref(&first)),
            Err(ConvertError::Empty)
        );
        let last = event(json!({"candidates": [{"content": {"role": "model",
            "parts": [{"text": "lo"}]}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 2,
                              "totalTokenCount": 5}}));
        let assembled = assemble(&[first, last]).unwrap();
        assert_eq!(
            assembled["candidates"][0]["content"]["parts"],
            json!([{"text": "Hello"}])
        );
        assert_eq!(assembled["usageMetadata"]["candidatesTokenCount"], 2);
        assert!(GEMINI.is_complete(assembled.to_string().as_bytes()));
        let cut = json!({"candidates": [{"content": {"parts": [{"text": "Hel"}]}}]});
        assert!(!GEMINI.is_complete(cut.to_string().as_bytes()));
    }

    #[test]
    fn a_blocked_prompt_is_a_complete_answer_of_one_chunk() {
        let blocked = json!({"promptFeedback": {"blockReason": "SAFETY"},
            "usageMetadata": {"promptTokenCount": 4, "totalTokenCount": 4}});
        assert!(GEMINI.is_complete(blocked.to_string().as_bytes()));
        let events = synthesize(&blocked).unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(assemble(&events).unwrap(), blocked);
    }

    #[test]
    fn an_error_chunk_fails_the_stream_and_the_broken_stream_event_is_googles_shape() {
        let frame = GEMINI_STREAM.read(
            None,
            r#"{"error":{"code":429,"message":"quota","status":"RESOURCE_EXHAUSTED"}}"#,
        );
        assert!(matches!(frame, Frame::Failed(_)));
        let event = GEMINI_STREAM.error_event("cut", 3);
        let value: Value = serde_json::from_slice(event_json(&event).unwrap()).unwrap();
        assert_eq!(value["error"]["code"], 500);
        assert_eq!(value["error"]["status"], "INTERNAL");
        assert_eq!(
            GEMINI_STREAM.read(None, "[1]"),
            Frame::Malformed("event data is JSON but not an object".to_owned())
        );
    }

    #[test]
    fn usage_counts_thoughts_as_reasoning_and_cached_content_inside_the_prompt() {
        let body = json!({"usageMetadata": {"promptTokenCount": 100, "cachedContentTokenCount": 60,
            "candidatesTokenCount": 20, "thoughtsTokenCount": 30, "toolUsePromptTokenCount": 5,
            "totalTokenCount": 155}});
        let usage = GEMINI.usage(body.to_string().as_bytes()).unwrap();
        assert_eq!(
            usage,
            Usage {
                prompt_tokens: 105,
                completion_tokens: 50,
                cached_tokens: 60,
                cache_write_tokens: 0,
                reasoning_tokens: 30,
                audio_input_tokens: 0,
                audio_output_tokens: 0,
            }
        );
    }

    #[test]
    fn only_temperature_zero_or_a_seed_is_deterministic() {
        let body = |value: Value| value.as_object().unwrap().clone();
        assert!(!GEMINI.is_deterministic(&body(json!({"contents": []}))));
        assert!(GEMINI.is_deterministic(&body(json!({"generationConfig": {"temperature": 0}}))));
        assert!(GEMINI.is_deterministic(&body(json!({"generationConfig": {"seed": 7}}))));
        assert!(!GEMINI.is_deterministic(&body(json!({"temperature": 0}))));
    }
}
