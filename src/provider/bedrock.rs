//! AWS Bedrock: Anthropic's Messages through InvokeModel. A Messages call
//! becomes `POST {base_url}/model/{model id}/invoke` (or
//! `/invoke-with-response-stream` for a stream), its body without `model`
//! and `stream`, with Bedrock's `anthropic_version` and the caller's
//! `anthropic-beta` header as `anthropic_beta`. Auth is SigV4 over the exact
//! bytes sent (the account's AWS keys, a session token with temporary ones)
//! or a Bedrock API key as a bearer token; a caller's credential never goes
//! to AWS.
//!
//! Bedrock's answers are made Anthropic's before anything else reads them
//! ([`Adapter::answer`]): its event stream becomes Anthropic SSE
//! (`eventstream`), and its errors (`x-amzn-ErrorType`, `{"message"}`)
//! Anthropic's error body, so Anthropic's retry rules, cooldowns and callers
//! work unchanged. Only `/messages` is served: Bedrock counts tokens through
//! another API (CountTokens), out of scope here.

use std::{fmt, time::SystemTime};

use aws_credential_types::Credentials;
use aws_sigv4::{
    http_request::{SignableBody, SignableRequest, SigningSettings, sign},
    sign::v4,
};
use aws_smithy_runtime_api::client::identity::Identity;
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, header};
use bytes::{Bytes, BytesMut};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::{Map, Value};

use super::{Account, Adapter, Call, Prepared, eventstream, sensitive};
use crate::{config::Member, error::GatewayError};

/// The Messages version Bedrock takes, in the body (it has no header).
pub const BEDROCK_ANTHROPIC_VERSION: &str = "bedrock-2023-05-31";

/// The service name requests are signed for.
const SIGNING_NAME: &str = "bedrock";

const ANTHROPIC_BETA: HeaderName = HeaderName::from_static("anthropic-beta");

/// The header naming Bedrock's error (`ThrottlingException:http://...`).
const AMZN_ERROR_TYPE: HeaderName = HeaderName::from_static("x-amzn-errortype");

const EVENT_STREAM: &str = "application/vnd.amazon.eventstream";
const JSON: &str = "application/json";

/// How much of an error body is read to re-shape it: Bedrock's are a
/// sentence of JSON.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// What AWS SDKs leave as it is in a path label (a model id, an ARN): RFC
/// 3986's unreserved characters; `:` and `/` are encoded.
const PATH_LABEL: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

pub(super) struct Bedrock {
    account: Account,
    /// The account's AWS keys; `None`: a Bedrock API key (`account.api_key`).
    signer: Option<Signer>,
}

/// SigV4 with an account's AWS keys, in its region.
struct Signer {
    identity: Identity,
    region: String,
}

impl fmt::Debug for Bedrock {
    /// The keys stay out: only how the account authenticates.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bedrock")
            .field("account", &self.account)
            .field("sigv4_region", &self.signer.as_ref().map(|s| &s.region))
            .finish()
    }
}

impl Bedrock {
    pub(super) fn new(account: Account, member: &Member) -> anyhow::Result<Self> {
        let signer = match &member.aws {
            Some(aws) => {
                let region = member.region.clone().ok_or_else(|| {
                    anyhow::anyhow!("the Bedrock account `{}` names no region", member.name)
                })?;
                let credentials = Credentials::new(
                    aws.access_key_id.expose(),
                    aws.secret_access_key.expose(),
                    aws.session_token
                        .as_ref()
                        .map(|token| token.expose().clone()),
                    None,
                    "corral configuration",
                );
                Some(Signer {
                    identity: credentials.into(),
                    region,
                })
            }
            None => None,
        };
        if signer.is_none() && account.api_key.is_none() {
            anyhow::bail!(
                "the Bedrock account `{}` has neither aws credentials nor an API key",
                member.name
            );
        }
        Ok(Self { account, signer })
    }

    /// The request for `call`, signed (with AWS keys) at `now`.
    fn prepare_at(&self, call: &Call<'_>, now: SystemTime) -> Result<Prepared, GatewayError> {
        if call.path != "/messages" || *call.method != Method::POST {
            return Err(GatewayError::invalid(format!(
                "a Bedrock account serves Anthropic's POST /messages only, not {} {} \
                 (Bedrock counts tokens through its own CountTokens API, which corral does not call)",
                call.method, call.path
            )));
        }
        let model = call
            .model
            .ok_or_else(|| GatewayError::invalid("a Bedrock call names its model"))?;
        let id = self.account.deployment(call).unwrap_or(model);
        let (body, streams) = invoke_body(call.body, &betas(call.headers))?;
        let action = if streams {
            "invoke-with-response-stream"
        } else {
            "invoke"
        };
        let path = format!("/model/{}/{action}", utf8_percent_encode(id, PATH_LABEL));
        // Bedrock takes no query: an Anthropic SDK's `?beta=true` says
        // nothing it reads.
        let url = self.account.url(&path, None)?;
        let mut headers = vec![(header::CONTENT_TYPE, HeaderValue::from_static(JSON))];
        match &self.signer {
            Some(signer) => headers.extend(signer.sign(&url, &body, now)?),
            None => headers.extend(
                self.account
                    .bearer_value()?
                    .map(|bearer| (header::AUTHORIZATION, bearer)),
            ),
        }
        Ok(Prepared { url, headers, body })
    }
}

impl Adapter for Bedrock {
    fn account(&self) -> &Account {
        &self.account
    }

    fn has_own_credential(&self) -> bool {
        self.signer.is_some() || self.account.api_key.is_some()
    }

    /// None of the caller's headers: what Bedrock reads of them is in the
    /// body (`anthropic_beta`, `anthropic_version`), and the rest could
    /// contradict what was signed (`content-type`) or ask InvokeModel for
    /// another answer (`accept`).
    fn forwards(&self, _name: &HeaderName) -> bool {
        false
    }

    fn prepare(
        &self,
        call: &Call<'_>,
        _token: Option<&HeaderValue>,
    ) -> Result<Prepared, GatewayError> {
        self.prepare_at(call, SystemTime::now())
    }

    fn answer(&self, response: reqwest::Response) -> reqwest::Response {
        let status = response.status();
        if status.is_client_error() || status.is_server_error() {
            return anthropic_error_response(response);
        }
        let event_stream = response
            .headers()
            .get(header::CONTENT_TYPE)
            .is_some_and(|value| value.as_bytes().starts_with(EVENT_STREAM.as_bytes()));
        if status.is_success() && event_stream {
            return rebuilt(response, "text/event-stream", |response| {
                reqwest::Body::wrap_stream(eventstream::anthropic_sse(response.bytes_stream()))
            });
        }
        response
    }
}

impl Signer {
    /// The SigV4 headers (`authorization`, `x-amz-date`, and
    /// `x-amz-security-token` with temporary keys) for a POST of `body` to
    /// `url` with the JSON content type, at `time`. `host` is signed as
    /// reqwest sends it: the URL's host, and its port unless the scheme's own.
    fn sign(
        &self,
        url: &reqwest::Url,
        body: &[u8],
        time: SystemTime,
    ) -> Result<Vec<(HeaderName, HeaderValue)>, GatewayError> {
        let failed = |err: &dyn fmt::Display| {
            GatewayError::Internal(anyhow::anyhow!("signing a Bedrock request: {err}"))
        };
        let host = match (url.host_str(), url.port()) {
            (Some(host), Some(port)) => format!("{host}:{port}"),
            (Some(host), None) => host.to_owned(),
            (None, _) => return Err(failed(&"the URL has no host")),
        };
        let signed_headers = [("host", host.as_str()), ("content-type", JSON)];
        let request = SignableRequest::new(
            "POST",
            url.as_str(),
            signed_headers.into_iter(),
            SignableBody::Bytes(body),
        )
        .map_err(|err| failed(&err))?;
        let params = v4::SigningParams::builder()
            .identity(&self.identity)
            .region(&self.region)
            .name(SIGNING_NAME)
            .time(time)
            .settings(SigningSettings::default())
            .build()
            .map_err(|err| failed(&err))?
            .into();
        let (instructions, _signature) = sign(request, &params)
            .map_err(|err| failed(&err))?
            .into_parts();
        instructions
            .headers()
            .map(|(name, value)| {
                let name = HeaderName::from_bytes(name.as_bytes()).map_err(|err| failed(&err))?;
                Ok((name, sensitive(value.as_bytes())?))
            })
            .collect()
    }
}

/// The caller's `anthropic-beta` values (comma-separated, in one header or
/// several).
fn betas(headers: &[(HeaderName, HeaderValue)]) -> Vec<String> {
    headers
        .iter()
        .filter(|(name, _)| *name == ANTHROPIC_BETA)
        .filter_map(|(_, value)| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(str::trim)
        .filter(|beta| !beta.is_empty())
        .map(str::to_owned)
        .collect()
}

/// InvokeModel's body: the Messages body without `model` and `stream`
/// (they are in the path), with Bedrock's `anthropic_version`, and `betas`
/// added to its `anthropic_beta`; and whether it asked for a stream.
fn invoke_body(body: &Bytes, betas: &[String]) -> Result<(Bytes, bool), GatewayError> {
    let mut object: Map<String, Value> = serde_json::from_slice(body)
        .map_err(|_| GatewayError::invalid("a Messages request body is a JSON object"))?;
    object.remove("model");
    let streams = object.remove("stream").and_then(|stream| stream.as_bool()) == Some(true);
    object.insert(
        "anthropic_version".to_owned(),
        Value::String(BEDROCK_ANTHROPIC_VERSION.to_owned()),
    );
    if !betas.is_empty() {
        let mut all: Vec<Value> = match object.remove("anthropic_beta") {
            Some(Value::Array(listed)) => listed,
            _ => Vec::new(),
        };
        for beta in betas {
            if !all.iter().any(|listed| listed.as_str() == Some(beta)) {
                all.push(Value::String(beta.clone()));
            }
        }
        object.insert("anthropic_beta".to_owned(), Value::Array(all));
    }
    let bytes = serde_json::to_vec(&object)
        .map_err(|err| GatewayError::Internal(anyhow::anyhow!("a Bedrock body: {err}")))?;
    Ok((Bytes::from(bytes), streams))
}

/// Anthropic's `error.type` for Bedrock's error `name` (an HTTP error's
/// `ThrottlingException`, a stream's `throttlingException`); an unknown one
/// by its `status`, `api_error` without.
pub(super) fn anthropic_error_type(name: &str, status: Option<StatusCode>) -> &'static str {
    let name = name.to_ascii_lowercase();
    match name.strip_suffix("exception").unwrap_or(&name) {
        "throttling" | "servicequotaexceeded" => "rate_limit_error",
        "modelnotready" | "serviceunavailable" => "overloaded_error",
        "validation" => "invalid_request_error",
        "accessdenied" => "permission_error",
        "unrecognizedclient"
        | "invalidsignature"
        | "incompletesignature"
        | "missingauthenticationtoken"
        | "expiredtoken" => "authentication_error",
        "resourcenotfound" => "not_found_error",
        "modeltimeout" => "timeout_error",
        "internalserver" | "modelerror" | "modelstreamerror" => "api_error",
        _ => match status.map(|status| status.as_u16()) {
            Some(400) => "invalid_request_error",
            Some(401) => "authentication_error",
            Some(403) => "permission_error",
            Some(404) => "not_found_error",
            Some(408) => "timeout_error",
            Some(413) => "request_too_large",
            Some(429) => "rate_limit_error",
            Some(503 | 529) => "overloaded_error",
            _ => "api_error",
        },
    }
}

/// Bedrock's error `body` (`{"message": ..}`, its name in `x-amzn-ErrorType`
/// or the body's `__type`) as Anthropic's error body.
fn anthropic_error_body(status: StatusCode, error_type: Option<&str>, body: &[u8]) -> Bytes {
    let parsed = serde_json::from_slice::<Map<String, Value>>(body).ok();
    let field = |names: &[&str]| {
        let parsed = parsed.as_ref()?;
        names
            .iter()
            .find_map(|name| parsed.get(*name)?.as_str())
            .map(str::to_owned)
    };
    let name = error_type
        .map(str::to_owned)
        .or_else(|| field(&["__type", "code"]))
        .map(|name| aws_error_name(&name).to_owned())
        .unwrap_or_default();
    let message = field(&["message", "Message"]).unwrap_or_else(|| {
        let text = String::from_utf8_lossy(body);
        let text = text.trim();
        if text.is_empty() {
            format!("Bedrock answered {status}")
        } else {
            text.chars().take(1000).collect()
        }
    });
    let error = serde_json::json!({
        "type": "error",
        "error": {"type": anthropic_error_type(&name, Some(status)), "message": message},
    });
    Bytes::from(error.to_string())
}

/// An AWS error's bare name: `ThrottlingException` of
/// `ThrottlingException:http://internal...` or `com.amazon...#ThrottlingException`.
fn aws_error_name(raw: &str) -> &str {
    let name = raw.split(':').next().unwrap_or(raw);
    name.rsplit('#').next().unwrap_or(name).trim()
}

/// `response` with Anthropic's error body for Bedrock's, read when the
/// body is (at most `MAX_ERROR_BODY` of it); its status and headers
/// (`x-amzn-ErrorType`, `Retry-After`) kept.
fn anthropic_error_response(response: reqwest::Response) -> reqwest::Response {
    let status = response.status();
    let error_type = response
        .headers()
        .get(AMZN_ERROR_TYPE)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    rebuilt(response, JSON, move |mut response| {
        let body = futures::stream::once(async move {
            let mut read = BytesMut::new();
            while read.len() < MAX_ERROR_BODY {
                match response.chunk().await? {
                    Some(chunk) => read.extend_from_slice(&chunk),
                    None => break,
                }
            }
            read.truncate(MAX_ERROR_BODY);
            Ok::<_, reqwest::Error>(anthropic_error_body(status, error_type.as_deref(), &read))
        });
        reqwest::Body::wrap_stream(body)
    })
}

/// `response`'s status and headers with the body `body` makes of it, of
/// `content_type` (its length unknown until read).
fn rebuilt(
    response: reqwest::Response,
    content_type: &'static str,
    body: impl FnOnce(reqwest::Response) -> reqwest::Body,
) -> reqwest::Response {
    let status = response.status();
    let version = response.version();
    let mut headers = response.headers().clone();
    headers.remove(header::CONTENT_LENGTH);
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    let mut answer = http::Response::new(body(response));
    *answer.status_mut() = status;
    *answer.version_mut() = version;
    *answer.headers_mut() = headers;
    reqwest::Response::from(answer)
}

#[cfg(test)]
mod tests;
