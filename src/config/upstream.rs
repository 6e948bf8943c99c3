//! `upstreams[]`: the providers corral calls, their wire format, models and bounds.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

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
    /// The provider's base URL. A pool's (`members`) is its members' default.
    #[serde(default)]
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
    /// Resolved at load time from `credentials_file` or `credentials_env`.
    #[serde(skip)]
    pub service_account: Option<Secret<String>>,
    /// Equivalent accounts that serve this upstream's models (keys,
    /// organisations, deployments): a **pool**. Absent: a pool of one, this
    /// upstream's own `base_url` and key. Members share one cache and one
    /// flight: a request's key names the pool, never the member.
    #[serde(default)]
    pub members: Vec<MemberConfig>,
    /// Which member a call goes to first: `session` keeps a conversation on
    /// one member (the provider's prompt cache stays warm), `none` spreads
    /// calls by weight alone.
    #[serde(default)]
    pub affinity: Affinity,
    /// How long a member pauses after a 429, 529 or overload that names no
    /// time of its own.
    #[schemars(with = "String")]
    #[serde(default = "default_cooldown", with = "humantime_serde")]
    pub cooldown: Duration,
    /// Models that answer, in this order, when this upstream cannot: every
    /// member cooling, open, or failed for the call before its first byte.
    /// Each is a model name routed like a request naming it (to another
    /// upstream of this one's API); its answer says that model and is
    /// cached under the key a request naming it has. Not chained: a
    /// fallback's own `fallback` is not followed.
    #[serde(default)]
    pub fallback: Vec<String>,
    /// The provider an upstream of its own is at (`azure`: OpenAI's wire
    /// behind Azure's paths and auth); its `api`'s own provider when absent.
    /// A pool's members name theirs.
    #[serde(default)]
    pub provider: Option<ProviderKind>,
    /// Azure: the API version its paths take (`?api-version=`), which also
    /// says the shape: set, `{base_url}/deployments/{deployment}/...`; absent,
    /// the v1 API (`{base_url}/chat/completions`, the deployment in `model`).
    #[serde(default)]
    pub api_version: Option<String>,
    /// Public model name -> the provider's name for it (an Azure deployment).
    /// A model not listed is sent by its own name. Members add to these.
    #[serde(default)]
    pub deployments: BTreeMap<String, String>,
    /// Azure: an Entra ID application's client-credentials grant instead of
    /// an `api-key` (`api_key_env` and `entra` together are refused).
    #[serde(default)]
    pub entra: Option<EntraConfig>,
    /// Bedrock: the AWS region its requests are signed for (SigV4).
    #[serde(default)]
    pub region: Option<String>,
    /// Bedrock: the AWS credentials it signs with (instead of a Bedrock API
    /// key in `api_key_env`).
    #[serde(default)]
    pub aws: Option<AwsConfig>,
    /// Vertex AI: the service account's JSON key file.
    #[serde(default)]
    pub credentials_file: Option<std::path::PathBuf>,
    /// Vertex AI: the variable holding the service account's JSON key itself.
    #[serde(default)]
    pub credentials_env: Option<String>,
}

/// AWS credentials, each read from the variable it names.
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AwsConfig {
    pub access_key_id_env: String,
    pub secret_access_key_env: String,
    #[serde(default)]
    pub session_token_env: Option<String>,
    /// Resolved at load time.
    #[serde(skip)]
    pub credentials: Option<AwsCredentials>,
}

/// An AWS identity's keys (a session token with temporary ones).
#[derive(Debug, Clone)]
pub struct AwsCredentials {
    pub access_key_id: Secret<String>,
    pub secret_access_key: Secret<String>,
    pub session_token: Option<Secret<String>>,
}

/// Where an account is: whose paths, auth and quirks a request to it takes.
/// Each speaks one wire format ([`Api`]), its pool's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize, schemars::JsonSchema)]
pub enum ProviderKind {
    #[serde(rename = "openai")]
    OpenAi,
    #[serde(rename = "anthropic")]
    Anthropic,
    #[serde(rename = "gemini")]
    Gemini,
    /// Azure OpenAI: OpenAI's wire at an Azure resource (`api-key` or an
    /// Entra ID token; deployments instead of model names).
    #[serde(rename = "azure")]
    Azure,
    /// AWS Bedrock: Anthropic's Messages through InvokeModel (SigV4 or a
    /// Bedrock API key; model ids instead of names).
    #[serde(rename = "bedrock")]
    Bedrock,
    /// Google Vertex AI: Anthropic's Messages (`rawPredict`) or Gemini's
    /// native API, with a service account's token.
    #[serde(rename = "vertex")]
    Vertex,
}

impl ProviderKind {
    /// Whether it speaks `api` (a member speaks its pool's wire format).
    pub fn speaks(self, api: Api) -> bool {
        match self {
            Self::OpenAi | Self::Azure => api == Api::OpenAi,
            Self::Anthropic | Self::Bedrock => api == Api::Anthropic,
            Self::Gemini => api == Api::Gemini,
            Self::Vertex => matches!(api, Api::Anthropic | Api::Gemini),
        }
    }

    /// The provider an API is spoken by when no member names one.
    pub fn of_api(api: Api) -> Self {
        match api {
            Api::OpenAi => Self::OpenAi,
            Api::Anthropic => Self::Anthropic,
            Api::Gemini => Self::Gemini,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::OpenAi => "openai",
            Self::Anthropic => "anthropic",
            Self::Gemini => "gemini",
            Self::Azure => "azure",
            Self::Bedrock => "bedrock",
            Self::Vertex => "vertex",
        }
    }
}

/// An Entra ID application whose client-credentials grant authenticates an
/// Azure account (`Authorization: Bearer <token>`, the token cached and
/// refreshed before it expires).
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EntraConfig {
    pub tenant_id: String,
    pub client_id: String,
    /// The variable holding the client secret.
    pub client_secret_env: String,
    /// The identity platform's host.
    #[serde(default = "default_entra_authority")]
    pub authority: String,
    /// Resolved at load time from `client_secret_env`.
    #[serde(skip)]
    pub client_secret: Option<Secret<String>>,
}

fn default_entra_authority() -> String {
    "https://login.microsoftonline.com".to_owned()
}

/// How a pool picks the member a call goes to first.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Affinity {
    /// By the request's session (`prompt_cache_key`, a session header, the
    /// conversation's opening), weighted: one session, one member.
    #[default]
    Session,
    /// By weight alone.
    None,
}

/// One account of a pool. Every bound left out is the pool's.
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemberConfig {
    /// Unique in its pool; what `x-corral-member` and the metrics name.
    pub name: String,
    /// Absent: the pool's `base_url`.
    #[serde(default)]
    pub base_url: Option<String>,
    /// The variable holding this account's key. Absent: the pool's key.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// The provider this account is at (`azure` in an OpenAI pool); the
    /// pool's when absent. It speaks its pool's wire format.
    #[serde(default)]
    pub provider: Option<ProviderKind>,
    /// As the pool's `api_version` (Azure), for this account.
    #[serde(default)]
    pub api_version: Option<String>,
    /// Added to the pool's `deployments`: this account's names for the
    /// pool's models.
    #[serde(default)]
    pub deployments: BTreeMap<String, String>,
    /// As the pool's `entra`, for this account.
    #[serde(default)]
    pub entra: Option<EntraConfig>,
    /// As the pool's `region` (Bedrock), for this account.
    #[serde(default)]
    pub region: Option<String>,
    /// As the pool's `aws` (Bedrock), for this account.
    #[serde(default)]
    pub aws: Option<AwsConfig>,
    /// As the pool's `credentials_file` (Vertex AI), for this account.
    #[serde(default)]
    pub credentials_file: Option<std::path::PathBuf>,
    /// As the pool's `credentials_env` (Vertex AI), for this account.
    #[serde(default)]
    pub credentials_env: Option<String>,
    /// Resolved at load time from `credentials_file` or `credentials_env`.
    #[serde(skip)]
    pub service_account: Option<Secret<String>>,
    /// Share of the calls, relative to the other members of its priority.
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// A higher number is used only while every lower one is cooling or open.
    #[serde(default)]
    pub priority: u32,
    /// Members naming one quota bucket cool down together (keys of one
    /// organisation share its rate limit).
    #[serde(default)]
    pub quota: Option<String>,
    #[schemars(with = "Option<String>")]
    #[serde(default, with = "humantime_serde")]
    pub connect_timeout: Option<Duration>,
    #[schemars(with = "Option<String>")]
    #[serde(default, with = "humantime_serde")]
    pub request_timeout: Option<Duration>,
    #[schemars(with = "Option<String>")]
    #[serde(default, with = "humantime_serde")]
    pub first_byte_timeout: Option<Duration>,
    #[serde(default)]
    pub rate: Option<RateConfig>,
    #[serde(default)]
    pub max_concurrency: Option<usize>,
    #[serde(default)]
    pub breaker_failures: Option<u32>,
    #[schemars(with = "Option<String>")]
    #[serde(default, with = "humantime_serde")]
    pub breaker_cool_down: Option<Duration>,
    /// Resolved at load time from `api_key_env`.
    #[serde(skip)]
    pub api_key: Option<Secret<String>>,
}

/// A member as the client calls it: every setting resolved against its pool's.
#[derive(Debug, Clone)]
pub struct Member {
    pub name: String,
    pub api: Api,
    pub provider: ProviderKind,
    pub base_url: String,
    pub api_key: Option<Secret<String>>,
    pub api_version: Option<String>,
    /// Public model name -> this account's name for it.
    pub deployments: Arc<BTreeMap<String, String>>,
    pub entra: Option<EntraConfig>,
    pub region: Option<String>,
    pub aws: Option<AwsCredentials>,
    /// A Vertex AI service account's JSON key.
    pub service_account: Option<Secret<String>>,
    pub weight: u32,
    pub priority: u32,
    pub quota: Option<String>,
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    pub first_byte_timeout: Duration,
    pub rate: Option<RateConfig>,
    pub max_concurrency: Option<usize>,
    pub breaker_failures: u32,
    pub breaker_cool_down: Duration,
}

impl Member {
    /// Whether corral authenticates to this account itself (a key, an Entra
    /// application), rather than with the caller's credential.
    pub fn has_own_credential(&self) -> bool {
        self.api_key.is_some()
            || self.entra.is_some()
            || self.aws.is_some()
            || self.service_account.is_some()
    }

    /// This account's name for the public model `model`.
    pub fn deployment<'m>(&'m self, model: &'m str) -> &'m str {
        self.deployments.get(model).map_or(model, String::as_str)
    }
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
    ///
    /// A pool (`members`) is one key: its API and its name, whatever members
    /// it has, since they are declared equivalent (adding, removing or
    /// cooling one keeps every entry). Pointing a pool at another provider is
    /// giving it another name (or purging it).
    pub fn identity(&self) -> String {
        if self.members.is_empty() {
            format!(
                "{}\u{0}{}",
                self.api.as_str(),
                self.base_url.trim_end_matches('/')
            )
        } else {
            format!("{}\u{0}pool\u{0}{}", self.api.as_str(), self.name)
        }
    }

    /// The accounts that serve this upstream, every setting resolved: its
    /// members, or a pool of one (this upstream itself, by its own name).
    pub fn effective_members(&self) -> Vec<Member> {
        if self.members.is_empty() {
            return vec![Member {
                name: self.name.clone(),
                api: self.api,
                provider: self.provider.unwrap_or(ProviderKind::of_api(self.api)),
                base_url: self.base_url.clone(),
                api_key: self.api_key.clone(),
                api_version: self.api_version.clone(),
                deployments: Arc::new(self.deployments.clone()),
                entra: self.entra.clone(),
                region: self.region.clone(),
                aws: self.aws.as_ref().and_then(|aws| aws.credentials.clone()),
                service_account: self.service_account.clone(),
                weight: 1,
                priority: 0,
                quota: None,
                connect_timeout: self.connect_timeout,
                request_timeout: self.request_timeout,
                first_byte_timeout: self.first_byte_timeout,
                rate: self.rate,
                max_concurrency: self.max_concurrency,
                breaker_failures: self.breaker_failures,
                breaker_cool_down: self.breaker_cool_down,
            }];
        }
        self.members
            .iter()
            .map(|member| Member {
                name: member.name.clone(),
                api: self.api,
                provider: member
                    .provider
                    .or(self.provider)
                    .unwrap_or(ProviderKind::of_api(self.api)),
                base_url: member
                    .base_url
                    .clone()
                    .unwrap_or_else(|| self.base_url.clone()),
                // An account's credential is its own: a member with an Entra
                // application takes no pool key.
                api_key: member.api_key.clone().or_else(|| {
                    member
                        .entra
                        .is_none()
                        .then(|| self.api_key.clone())
                        .flatten()
                }),
                api_version: member
                    .api_version
                    .clone()
                    .or_else(|| self.api_version.clone()),
                deployments: Arc::new(
                    self.deployments
                        .iter()
                        .chain(&member.deployments)
                        .map(|(model, name)| (model.clone(), name.clone()))
                        .collect(),
                ),
                entra: member.entra.clone().or_else(|| {
                    member
                        .api_key
                        .is_none()
                        .then(|| self.entra.clone())
                        .flatten()
                }),
                region: member.region.clone().or_else(|| self.region.clone()),
                aws: member
                    .aws
                    .as_ref()
                    .or(self.aws.as_ref().filter(|_| member.api_key.is_none()))
                    .and_then(|aws| aws.credentials.clone()),
                service_account: member
                    .service_account
                    .clone()
                    .or_else(|| self.service_account.clone()),
                weight: member.weight,
                priority: member.priority,
                quota: member.quota.clone(),
                connect_timeout: member.connect_timeout.unwrap_or(self.connect_timeout),
                request_timeout: member.request_timeout.unwrap_or(self.request_timeout),
                first_byte_timeout: member.first_byte_timeout.unwrap_or(self.first_byte_timeout),
                rate: member.rate.or(self.rate),
                max_concurrency: member.max_concurrency.or(self.max_concurrency),
                breaker_failures: member.breaker_failures.unwrap_or(self.breaker_failures),
                breaker_cool_down: member.breaker_cool_down.unwrap_or(self.breaker_cool_down),
            })
            .collect()
    }

    /// Whether corral calls this upstream with keys of its own (every member
    /// has one), which every tenant then shares.
    pub fn has_own_keys(&self) -> bool {
        self.effective_members()
            .iter()
            .all(Member::has_own_credential)
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
fn default_cooldown() -> Duration {
    Duration::from_secs(5)
}
fn default_weight() -> u32 {
    1
}
fn default_breaker_failures() -> u32 {
    5
}
fn default_breaker_cool_down() -> Duration {
    Duration::from_secs(10)
}
