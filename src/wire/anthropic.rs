//! Anthropic Messages (`POST /v1/messages`): a placeholder until its adapter
//! lands. No route reaches it yet; if one did, every request would be refused
//! with a 400 before anything went upstream.

use bytes::Bytes;
use serde_json::{Map, Value};

use super::Wire;
use crate::{
    error::GatewayError,
    fingerprint::BodyKeying,
    sse::{self, ConvertError, Format, UpstreamStreamRequest},
    validate::InputLimits,
};

#[derive(Debug)]
pub struct MessagesWire;

pub static MESSAGES: MessagesWire = MessagesWire;

impl Wire for MessagesWire {
    fn keying(&self) -> &'static BodyKeying {
        &BodyKeying::OPENAI
    }

    fn check(&self, _body: &Map<String, Value>, _limits: InputLimits) -> Result<(), GatewayError> {
        Err(GatewayError::invalid(
            "the Anthropic Messages API is not supported yet",
        ))
    }

    fn is_deterministic(&self, _body: &Map<String, Value>) -> bool {
        false
    }

    fn stream_format(&self) -> Format {
        &sse::CHAT
    }

    fn stream_request(&self, body: &Map<String, Value>) -> UpstreamStreamRequest {
        sse::force_include_usage(body)
    }

    fn assemble(&self, _events: &[Bytes]) -> Result<Value, ConvertError> {
        Err(ConvertError::Empty)
    }

    fn synthesize(&self, _answer: &Value) -> Result<Vec<Bytes>, ConvertError> {
        Err(ConvertError::Empty)
    }

    fn is_complete(&self, _body: &[u8]) -> bool {
        false
    }
}
