//! `upstreams[]`: the providers corral calls, their wire format, models and bounds.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{RateConfig, Secret};

#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    pub name: String,
    /// Which API this provider speaks. A request is routed only among the
    /// upstreams that speak its API, so a catch-all OpenAI upstream
    /// (`models: ["*"]`) never shadows an Anthropic one for `/v1/messages`.
    #[serde(default)]
    pub api: Api,
    pub base_url: String,
    /// Name of the environment variable holding the provider key. Absent: the
    /// caller's own credential (`Authorization: Bearer` or `x-api-key`) is
    /// forwarded, in the form the provider expects.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Glob patterns over the request's `model`; the first upstream of the
    /// request's API that matches wins.
    #[serde(default = "default_models")]
    pub models: Vec<String>,
    #[schemars(with = "String")]
    #[serde(default = "default_connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Bound on one attempt, from sending the request to the last body byte.
    #[schemars(with = "String")]
    #[serde(default = "default_request_timeout", with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Bound on a deduplicated stream's response head: at least this, and as
    /// long as the stream's first event may take (`coalesce.first_event_timeout`),
    /// since some providers send the head only with the first token. A
    /// non-stream call's head comes with its answer (`request_timeout`), and so
    /// does a pass-through job's (an image or a transcription answers when done).
    #[schemars(with = "String")]
    #[serde(default = "default_first_byte_timeout", with = "humantime_serde")]
    pub first_byte_timeout: Duration,
    /// Cap on this upstream's request rate (real calls only; hits and
    /// coalesced followers spend none of it). Beyond it: 429 + Retry-After.
    #[serde(default)]
    pub rate: Option<RateConfig>,
    /// Cap on concurrent calls to this upstream; beyond it attempts queue.
    #[serde(default)]
    pub max_concurrency: Option<usize>,
    /// Consecutive failed attempts that open this upstream's circuit.
    #[serde(default = "default_breaker_failures")]
    pub breaker_failures: u32,
    /// How long the circuit stays open before one probe is let through.
    #[schemars(with = "String")]
    #[serde(default = "default_breaker_cool_down", with = "humantime_serde")]
    pub breaker_cool_down: Duration,
    /// Resolved at load time from `api_key_env` (or `CORRAL_UPSTREAM_API_KEY`).
    #[serde(skip)]
    pub api_key: Option<Secret<String>>,
}

/// The wire format an upstream speaks, and with it how corral authenticates
/// to it (`upstream/client.rs`) and which endpoints it serves.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize, Serialize, schemars::JsonSchema,
)]
pub enum Api {
    /// OpenAI's API (`/chat/completions`, `/completions`, `/embeddings`, ...),
    /// and every provider compatible with it: `Authorization: Bearer <key>`.
    #[default]
    #[serde(rename = "openai")]
    OpenAi,
    /// Anthropic Messages (`/messages`, `/messages/count_tokens`):
    /// `x-api-key: <key>` and an `anthropic-version` header.
    #[serde(rename = "anthropic")]
    Anthropic,
    /// Gemini's native API (`/models/{model}:generateContent`, ...), its
    /// `base_url` the API root with its version
    /// (`https://generativelanguage.googleapis.com/v1beta`): `x-goog-api-key:
    /// <key>`. Served by the pass-through (`passthrough/gemini.rs`).
    #[serde(rename = "gemini")]
    Gemini,
}

impl UpstreamConfig {
    /// What answers this upstream's requests, as keys name it: the API it
    /// speaks and its base URL, never its name (a label an operator may move
    /// to another provider, or give two upstreams). A changed provider or base
    /// URL is another key, so no answer of the old one is served for it.
    pub fn identity(&self) -> String {
        format!(
            "{}\u{0}{}",
            self.api.as_str(),
            self.base_url.trim_end_matches('/')
        )
    }
}

impl Api {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OpenAi => "openai",
            Self::Anthropic => "anthropic",
            Self::Gemini => "gemini",
        }
    }
}

fn default_models() -> Vec<String> {
    vec!["*".to_owned()]
}
fn default_connect_timeout() -> Duration {
    Duration::from_secs(5)
}
/// The provider SDKs wait 10 minutes: a reasoning model may take that long.
fn default_request_timeout() -> Duration {
    Duration::from_secs(600)
}
fn default_first_byte_timeout() -> Duration {
    Duration::from_secs(60)
}
fn default_breaker_failures() -> u32 {
    5
}
fn default_breaker_cool_down() -> Duration {
    Duration::from_secs(10)
}
