//! OpenAI Chat Completions and Completions (and Embeddings' completeness and
//! sampling rules): `data:` stream chunks ending in `data: [DONE]`, usage only
//! when `stream_options.include_usage` asks for it: the stream format
//! (`stream.rs`) and the conversions between a stream and its answer
//! (`convert.rs`).

mod convert;
mod stream;

pub use convert::{assemble, synthesize};
pub use stream::STREAM;

use std::borrow::Cow;

use bytes::Bytes;
use serde::{Deserialize, de::IgnoredAny};
use serde_json::{Map, Value};

use super::{AnswerFacts, ConvertError, Wire, zero_temperature_or_seed};
use crate::{
    error::GatewayError,
    fingerprint::{BodyKeying, Endpoint},
    sse::{CallerUsage, Format, UpstreamStreamRequest},
    usage::UsageMember,
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
        &STREAM
    }

    /// Upstream always reports usage, so cost can be accounted; callers who
    /// did not ask for it do not see it.
    fn stream_request(&self, body: &Map<String, Value>) -> UpstreamStreamRequest {
        force_include_usage(body)
    }

    fn assemble(&self, events: &[Bytes]) -> Result<Value, ConvertError> {
        assemble(events)
    }

    fn synthesize(&self, answer: &Value) -> Result<Vec<Bytes>, ConvertError> {
        synthesize(answer)
    }

    /// One typed pass for both (no JSON tree: a miss reads every answer).
    /// An answer the typed read refuses (a member of another type than the
    /// API's, a duplicate member) is read as before, member by member, so
    /// both say what `is_complete` and `usage` say.
    fn answer_facts(&self, body: &[u8]) -> AnswerFacts {
        #[derive(Deserialize)]
        struct Answer<'a> {
            #[serde(borrow)]
            choices: Option<Vec<Choice<'a>>>,
            data: Option<Vec<IgnoredAny>>,
            usage: Option<UsageMember>,
        }
        #[derive(Deserialize)]
        struct Choice<'a> {
            #[serde(borrow)]
            finish_reason: Option<Cow<'a, str>>,
        }
        // From text when the answer is UTF-8 (one fast pass), so serde_json
        // does not check each string again.
        let parsed = match std::str::from_utf8(body) {
            Ok(text) => serde_json::from_str::<Answer<'_>>(text),
            Err(_) => serde_json::from_slice::<Answer<'_>>(body),
        };
        let Ok(answer) = parsed else {
            return AnswerFacts {
                complete: self.is_complete(body),
                usage: self.usage(body),
            };
        };
        let complete = if self.endpoint == Endpoint::Embeddings {
            answer.data.is_some_and(|data| !data.is_empty())
        } else {
            answer.choices.is_some_and(|choices| {
                !choices.is_empty()
                    && choices.iter().all(|choice| {
                        choice
                            .finish_reason
                            .as_deref()
                            .is_some_and(|reason| reason != "content_filter")
                    })
            })
        };
        AnswerFacts {
            complete,
            usage: answer.usage.and_then(UsageMember::into_usage),
        }
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
                        // A content filter's stop is the deployment's policy
                        // of the day (Azure's), not the model's answer: it is
                        // relayed, never kept.
                        choice.get("finish_reason").is_some_and(|reason| {
                            !reason.is_null() && reason.as_str() != Some("content_filter")
                        })
                    })
            })
    }
}

/// The body to send upstream for a streamed flight: the caller's body with `stream: true` and
/// `stream_options.include_usage: true`, every other member (other stream options included)
/// unchanged.
///
/// `stream` is forced too because OpenAI rejects `stream_options` on a request that does not
/// stream, and a flight that also serves non-stream callers streams upstream. A
/// `stream_options` that is neither absent, `null` nor an object is left alone: the provider
/// rejects it as it would have without corral, rather than corral quietly repairing it.
pub fn force_include_usage(body: &Map<String, Value>) -> UpstreamStreamRequest {
    let caller_usage = CallerUsage::of(body);
    let mut upstream = body.clone();
    upstream.insert("stream".to_owned(), Value::Bool(true));
    let options = upstream
        .entry("stream_options")
        .or_insert_with(|| Value::Object(Map::new()));
    if options.is_null() {
        *options = Value::Object(Map::new());
    }
    if let Value::Object(options) = options {
        options.insert("include_usage".to_owned(), Value::Bool(true));
    }
    UpstreamStreamRequest {
        body: Bytes::from(Value::Object(upstream).to_string()),
        caller_usage,
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
        let filtered = br#"{"choices":[{"index":0,"message":{"content":""},"finish_reason":"content_filter"}]}"#;
        assert!(!CHAT.is_complete(filtered), "a filtered answer is not kept");
        assert!(EMBEDDINGS.is_complete(br#"{"data":[{"embedding":[0.1]}]}"#));
        assert!(!EMBEDDINGS.is_complete(br#"{"data":[]}"#));
    }

    /// The one-pass read says what the two separate reads say, for answers
    /// it reads itself and for the ones it hands back to them.
    #[test]
    fn answer_facts_agree_with_is_complete_and_usage() {
        let usage = r#""usage":{"prompt_tokens":12,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":4},"completion_tokens_details":{"reasoning_tokens":2}}"#;
        let bodies = [
            format!(
                r#"{{"id":"c","choices":[{{"index":0,"message":{{"role":"assistant","content":"a \"quoted\" answer"}},"finish_reason":"stop"}}],{usage}}}"#
            ),
            format!(r#"{{"choices":[{{"finish_reason":"st\u0061p"}}],{usage}}}"#),
            format!(r#"{{"choices":[{{"finish_reason":null}}],{usage}}}"#),
            format!(r#"{{"choices":[{{"finish_reason":"content_filter"}}],{usage}}}"#),
            format!(r#"{{"choices":[{{"finish_reason":7}}],{usage}}}"#),
            format!(r#"{{"choices":[{{}}],{usage}}}"#),
            format!(r#"{{"choices":[],{usage}}}"#),
            format!(r#"{{"choices":"none",{usage}}}"#),
            format!(r#"{{"choices":[3],{usage}}}"#),
            format!(r#"{{"choices":[{{"finish_reason":"stop"}}],"choices":[],{usage}}}"#),
            format!(r#"{{"data":[{{"embedding":[0.1]}}],{usage}}}"#),
            format!(r#"{{"data":[],{usage}}}"#),
            format!(r#"{{"data":{{}},{usage}}}"#),
            r#"{"choices":[{"finish_reason":"stop"}],"usage":null}"#.to_owned(),
            r#"{"choices":[{"finish_reason":"stop"}],"usage":{"prompt_tokens":"many"}}"#.to_owned(),
            r#"{"choices":[{"finish_reason":"stop"}]"#.to_owned(),
            r#"[1,2]"#.to_owned(),
            String::new(),
        ];
        for wire in [&CHAT, &COMPLETIONS, &EMBEDDINGS] {
            for body in &bodies {
                let body = body.as_bytes();
                assert_eq!(
                    wire.answer_facts(body),
                    AnswerFacts {
                        complete: wire.is_complete(body),
                        usage: wire.usage(body),
                    },
                    "{:?} {}",
                    wire.endpoint,
                    String::from_utf8_lossy(body)
                );
            }
        }
        let first = CHAT.answer_facts(bodies[0].as_bytes());
        assert!(first.complete);
        assert_eq!(first.usage.map(|usage| usage.prompt_tokens), Some(12));
    }
}
