//! OpenAI Chat Completions and Completions (and Embeddings' completeness and
//! sampling rules): `data:` stream chunks ending in `data: [DONE]`, usage only
//! when `stream_options.include_usage` asks for it. The stream conversions
//! themselves live in `sse/convert.rs` and `sse/usage.rs`, where they began.

use bytes::Bytes;
use serde_json::{Map, Value};

use super::{Wire, zero_temperature_or_seed};
use crate::{
    error::GatewayError,
    fingerprint::{BodyKeying, Endpoint},
    sse::{self, ConvertError, Format, UpstreamStreamRequest},
    validate::{self, InputLimits},
};

/// The adapter of one OpenAI completion-style endpoint.
#[derive(Debug)]
pub struct ChatWire {
    endpoint: Endpoint,
}

pub static CHAT: ChatWire = ChatWire {
    endpoint: Endpoint::ChatCompletions,
};
pub static COMPLETIONS: ChatWire = ChatWire {
    endpoint: Endpoint::Completions,
};
pub static EMBEDDINGS: ChatWire = ChatWire {
    endpoint: Endpoint::Embeddings,
};

impl Wire for ChatWire {
    fn keying(&self) -> &'static BodyKeying {
        &BodyKeying::OPENAI
    }

    fn check(&self, body: &Map<String, Value>, limits: InputLimits) -> Result<(), GatewayError> {
        validate::check_fields(self.endpoint, body, limits)
    }

    /// Embeddings are deterministic; generation is when temperature is 0 or a seed is set.
    fn is_deterministic(&self, body: &Map<String, Value>) -> bool {
        self.endpoint == Endpoint::Embeddings || zero_temperature_or_seed(body)
    }

    fn stream_format(&self) -> Format {
        &sse::CHAT
    }

    /// Upstream always reports usage, so cost can be accounted; callers who
    /// did not ask for it do not see it.
    fn stream_request(&self, body: &Map<String, Value>) -> UpstreamStreamRequest {
        sse::force_include_usage(body)
    }

    fn assemble(&self, events: &[Bytes]) -> Result<Value, ConvertError> {
        sse::assemble(events)
    }

    fn synthesize(&self, answer: &Value) -> Result<Vec<Bytes>, ConvertError> {
        sse::synthesize(answer)
    }

    /// Complete when it parses and every choice has a `finish_reason`
    /// (embeddings: when it carries data).
    fn is_complete(&self, body: &[u8]) -> bool {
        let Ok(value) = serde_json::from_slice::<Value>(body) else {
            return false;
        };
        if self.endpoint == Endpoint::Embeddings {
            return value
                .get("data")
                .and_then(Value::as_array)
                .is_some_and(|data| !data.is_empty());
        }
        value
            .get("choices")
            .and_then(Value::as_array)
            .is_some_and(|choices| {
                !choices.is_empty()
                    && choices.iter().all(|choice| {
                        choice
                            .get("finish_reason")
                            .is_some_and(|reason| !reason.is_null())
                    })
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completeness_needs_every_finish_reason() {
        let done = br#"{"choices":[{"index":0,"finish_reason":"stop"},{"index":1,"finish_reason":"length"}]}"#;
        let open =
            br#"{"choices":[{"index":0,"finish_reason":"stop"},{"index":1,"finish_reason":null}]}"#;
        assert!(CHAT.is_complete(done));
        assert!(!CHAT.is_complete(open));
        assert!(!CHAT.is_complete(br#"{"choices":[{"finish_reason":"st"#));
        assert!(!CHAT.is_complete(br#"{"choices":[]}"#));
        assert!(EMBEDDINGS.is_complete(br#"{"data":[{"embedding":[0.1]}]}"#));
        assert!(!EMBEDDINGS.is_complete(br#"{"data":[]}"#));
    }
}
