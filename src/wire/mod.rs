//! One adapter per API wire format. The coalescer, the cache, the stream log,
//! the cluster relay and the metrics handle bytes, events and [`Usage`]; what a
//! body or an event of one API *means* is decided here, behind [`Wire`]:
//!
//! - `chat.rs`: OpenAI Chat Completions, Completions (and Embeddings, whose
//!   requests leave for `embeddings/` before any stream or completeness rule);
//! - `responses.rs`: OpenAI Responses (`POST /v1/responses`);
//! - `anthropic.rs`: Anthropic Messages (`POST /v1/messages`);
//! - `gemini.rs`: Gemini's `generateContent`, `streamGenerateContent`,
//!   `embedContent` and `batchEmbedContents`
//!   (`POST /v1beta/models/{model}:{method}`), whose path names the model
//!   and the method;
//! - `path_call.rs`: what a path names besides its endpoint, for the APIs
//!   that put the model there (Gemini's, Azure OpenAI's deployments): one
//!   [`PathCall`] for the layers above.
//!
//! Adding an API is one more adapter: a file here implementing [`Wire`] (and
//! [`StreamFormat`](crate::sse::StreamFormat) for its events), an
//! [`Endpoint`] variant, its arm in [`of`], and its route.

mod anthropic;
pub mod chat;
mod echo;
pub mod gemini;
mod path_call;
mod responses;

use bytes::Bytes;
use serde_json::{Map, Value};

use crate::{
    config::Api,
    error::{ErrorShape, GatewayError},
    fingerprint::{BodyKeying, Endpoint},
    sse::{Format, Framing, UpstreamStreamRequest},
    usage::Usage,
    validate::InputLimits,
};

pub use anthropic::{MESSAGES, MESSAGES_STREAM};
pub use chat::{CHAT, COMPLETIONS, EMBEDDINGS};
pub use echo::{Echo, EchoedField};
pub use gemini::{GEMINI, GEMINI_EMBED, GEMINI_STREAM, GeminiCall, GeminiMethod};
pub use path_call::{PathApi, PathCall};
pub use responses::{RESPONSES, RESPONSES_STREAM};

/// The adapter of `endpoint`'s wire format.
pub fn of(endpoint: Endpoint) -> &'static dyn Wire {
    match endpoint {
        Endpoint::ChatCompletions => &CHAT,
        Endpoint::Completions => &COMPLETIONS,
        Endpoint::Embeddings => &EMBEDDINGS,
        Endpoint::Responses => &RESPONSES,
        Endpoint::Messages => &MESSAGES,
        Endpoint::GenerateContent => &GEMINI,
        Endpoint::EmbedContent => &GEMINI_EMBED,
    }
}

/// What the deduplicated path asks of one API's wire format.
pub trait Wire: Send + Sync + std::fmt::Debug + 'static {
    /// The API of the upstreams that serve it: a request is routed only
    /// among the upstreams that speak it.
    fn api(&self) -> Api {
        Api::OpenAi
    }

    /// The shape of its error bodies (what its SDKs parse).
    fn error_shape(&self) -> ErrorShape {
        ErrorShape::OpenAi
    }

    /// Which body fields are keyed (every one but the delivery fields), and
    /// which holds the conversation whose text is normalized.
    fn keying(&self) -> &'static BodyKeying;

    /// Type and size checks of the parsed body; every client mistake is a 400
    /// here, before anything goes upstream.
    fn check(&self, body: &Map<String, Value>, limits: InputLimits) -> Result<(), GatewayError>;

    /// Whether the request asks for a reproducible answer (temperature 0, or a
    /// seed). Others are sampled: coalesced, and stored only under `cache.sampled`.
    fn is_deterministic(&self, body: &Map<String, Value>) -> bool;

    /// Whether the request may be coalesced and cached at all; one that may
    /// not goes upstream as it came (`BYPASS`), e.g. a Responses `background` job.
    fn dedupable(&self, _body: &Map<String, Value>) -> bool {
        true
    }

    /// The caller's own values of the label fields the provider echoes in
    /// its answer, when the format has any (`echo.rs`): every caller of a
    /// shared answer receives its own. `None`: nothing is echoed, or the
    /// label fields are keyed (`cache.ignore_label_fields: false`), so every
    /// caller of an answer sent the same.
    fn echo(&self, _body: &Map<String, Value>) -> Option<Echo> {
        None
    }

    /// Whether the caller asked for a stream, when the body says (a format
    /// whose path says, Gemini's, answers `false`: the path's word is taken).
    fn is_stream(&self, body: &Map<String, Value>) -> bool {
        matches!(body.get("stream"), Some(Value::Bool(true)))
    }

    /// Whether the query parameter `name` (as the query spells it) only
    /// delivers the answer (Gemini's `alt`, a stream's framing): never keyed,
    /// and not sent with a shared call.
    fn is_delivery_param(&self, _name: &str) -> bool {
        false
    }

    /// Whether a request with this query may be coalesced and cached at all,
    /// like [`dedupable`](Self::dedupable) for the body: one whose query asks
    /// for a projection of the answer (Gemini's `fields` mask) goes upstream
    /// as it came (`BYPASS`).
    fn dedupable_query(&self, _query: Option<&str>) -> bool {
        true
    }

    /// The query a streamed upstream call adds (Gemini's `alt=sse`: events,
    /// not a JSON array).
    fn stream_query(&self) -> Option<&'static str> {
        None
    }

    /// How a caller whose query is `query` receives a stream: events, or
    /// (Gemini without `alt=sse`) one JSON array.
    fn stream_framing(&self, _query: Option<&str>) -> Framing {
        Framing::Events
    }

    /// The API's stream events: completing, failing and error events.
    fn stream_format(&self) -> Format;

    /// The body of a streamed flight's upstream request (which always streams,
    /// and asks for usage where the API needs asking), and whether the caller
    /// asked for usage itself.
    fn stream_request(&self, body: &Map<String, Value>) -> UpstreamStreamRequest;

    /// The non-stream answer a completed stream's events amount to.
    fn assemble(&self, events: &[Bytes]) -> Result<Value, ConvertError>;

    /// A valid stream of events equivalent to a non-stream answer.
    fn synthesize(&self, answer: &Value) -> Result<Vec<Bytes>, ConvertError>;

    /// Whether a non-stream answer is complete, so it may be stored.
    fn is_complete(&self, body: &[u8]) -> bool;

    /// The token counts of a non-stream answer.
    fn usage(&self, body: &[u8]) -> Option<Usage> {
        Usage::from_body(body)
    }

    /// What a flight reads of a non-stream answer: whether it is complete
    /// ([`is_complete`](Self::is_complete)) and its usage
    /// ([`usage`](Self::usage)). An adapter may read both in one pass over
    /// the body (every miss reads them).
    fn answer_facts(&self, body: &[u8]) -> AnswerFacts {
        AnswerFacts {
            complete: self.is_complete(body),
            usage: self.usage(body),
        }
    }
}

/// See [`Wire::answer_facts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnswerFacts {
    pub complete: bool,
    pub usage: Option<Usage>,
}

/// `temperature` 0 or a non-null `seed`: the request deserves the same answer twice.
fn zero_temperature_or_seed(body: &Map<String, Value>) -> bool {
    let zero_temperature = body
        .get("temperature")
        .and_then(Value::as_f64)
        .is_some_and(|t| t == 0.0);
    let seeded = body.get("seed").is_some_and(|seed| !seed.is_null());
    zero_temperature || seeded
}

/// Why a stream could not be assembled, or an answer not synthesized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConvertError {
    #[error("event {index} is not a JSON data event")]
    NotJson { index: usize },
    #[error("event {index} is an error event")]
    ErrorEvent { index: usize },
    #[error("the stream has no completion chunk")]
    Empty,
    #[error("event {index} is a {found:?} chunk in a {expected:?} stream")]
    MixedObjects {
        index: usize,
        expected: String,
        found: String,
    },
    #[error("unsupported object {0:?}")]
    UnsupportedObject(String),
    #[error("malformed {0}")]
    Malformed(&'static str),
}

/// Longest piece of text (in characters) one synthesized delta carries.
pub const PIECE_CHARS: usize = 64;

/// `text` cut into pieces of at most [`PIECE_CHARS`] characters, on character boundaries:
/// the deltas every API's synthesized stream carries its text in.
pub fn pieces(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let end = rest
            .char_indices()
            .nth(PIECE_CHARS)
            .map_or(rest.len(), |(at, _)| at);
        let (piece, tail) = rest.split_at(end);
        rest = tail;
        Some(piece)
    })
}
