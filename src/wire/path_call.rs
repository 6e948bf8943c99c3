//! What a request's path names besides its endpoint, for the APIs that put
//! the model in the path: Gemini's (`/v1beta/models/{model}:{method}`),
//! Azure OpenAI's (`/openai/deployments/{deployment}/chat/completions`, whose
//! deployment name is the model corral routes by), and the clouds' paths for
//! Anthropic's Messages: Bedrock's InvokeModel (`/model/{id}/invoke`) and
//! Vertex AI's (`/v1/projects/{p}/locations/{l}/publishers/anthropic/models/{m}:rawPredict`),
//! whose model id maps back to its public name (`Routes::public_name`). Every other layer sees
//! one [`PathCall`]: its endpoint, the model it names, its delivery, what of
//! it is keyed, the error shape its clients parse, and where it goes below
//! an upstream's base URL.

use std::borrow::Cow;

use super::gemini::{GeminiCall, GeminiMethod};
use crate::{error::ErrorShape, fingerprint::Endpoint};

/// A deduplicated request whose path says more than its endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathCall {
    /// The model the path names; `None` when the body names it (Azure's v1
    /// paths and `/openai/responses`).
    pub model: Option<String>,
    pub via: PathApi,
    /// The path it came on, kept for the memo, spans and messages.
    path: String,
}

/// Whose paths a [`PathCall`] came on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathApi {
    /// Gemini's native API: the method delivers (`streamGenerateContent`),
    /// and the API version the caller named is keyed (the versions may
    /// answer one body differently).
    Gemini {
        method: GeminiMethod,
        version: &'static str,
    },
    /// Azure OpenAI's paths for an OpenAI endpoint: the body delivers
    /// (`stream`), and `api-version` is not keyed (it names the wire the
    /// caller speaks, which corral answers in whatever version it is).
    Azure { endpoint: Endpoint },
    /// AWS Bedrock's InvokeModel (`/model/{id}/invoke`) and
    /// InvokeModelWithResponseStream (`.../invoke-with-response-stream`,
    /// answered in AWS's event-stream framing): Messages, the path delivers.
    Bedrock { stream: bool },
    /// Vertex AI's `rawPredict` and `streamRawPredict` of Anthropic's
    /// models: Messages, the path delivers.
    Vertex { stream: bool },
}

impl PathCall {
    /// The call `path` names, for a deduplicated method of a path-naming
    /// API; `None` for any other path.
    pub fn of_path(path: &str) -> Option<Self> {
        if path.starts_with("/openai/") {
            return azure(path);
        }
        if let Some(call) = bedrock(path).or_else(|| vertex(path)) {
            return Some(call);
        }
        let gemini = GeminiCall::of_path(path)?;
        Some(Self {
            model: Some(gemini.model),
            via: PathApi::Gemini {
                method: gemini.method,
                version: gemini.version,
            },
            path: path.to_owned(),
        })
    }

    pub fn endpoint(&self) -> Endpoint {
        match self.via {
            PathApi::Gemini { method, .. } => method.endpoint(),
            PathApi::Azure { endpoint } => endpoint,
            PathApi::Bedrock { .. } | PathApi::Vertex { .. } => Endpoint::Messages,
        }
    }

    /// Whether the path says the answer streams; `None`: the body says.
    pub fn stream(&self) -> Option<bool> {
        match self.via {
            PathApi::Gemini { method, .. } => Some(method == GeminiMethod::StreamGenerate),
            PathApi::Azure { .. } => None,
            PathApi::Bedrock { stream } | PathApi::Vertex { stream } => Some(stream),
        }
    }

    /// Whether the path is a cloud's for Anthropic's Messages (Bedrock's,
    /// Vertex AI's), whose body names no model and carries the cloud's
    /// `anthropic_version` (and Bedrock's `anthropic_beta`).
    pub fn is_cloud_messages(&self) -> bool {
        matches!(self.via, PathApi::Bedrock { .. } | PathApi::Vertex { .. })
    }

    /// Gemini's method, when it is Gemini's path.
    pub fn gemini_method(&self) -> Option<GeminiMethod> {
        match self.via {
            PathApi::Gemini { method, .. } => Some(method),
            _ => None,
        }
    }

    /// What the path names that is keyed beside the query: the model (the
    /// body may not hold it) and Gemini's version.
    pub fn keyed(&self) -> Vec<(String, String)> {
        let mut keyed = Vec::with_capacity(2);
        if let PathApi::Gemini { .. } = self.via
            && let Some(model) = &self.model
        {
            keyed.push((":model".to_owned(), model.clone()));
        }
        if let PathApi::Gemini { version, .. } = self.via {
            keyed.push((":version".to_owned(), version.to_owned()));
        }
        keyed
    }

    /// The error shape its clients parse.
    pub fn error_shape(&self) -> ErrorShape {
        match self.via {
            // Vertex AI's errors are Google's.
            PathApi::Gemini { .. } | PathApi::Vertex { .. } => ErrorShape::Gemini,
            PathApi::Azure { .. } => ErrorShape::Azure,
            PathApi::Bedrock { .. } => ErrorShape::Bedrock,
        }
    }

    /// The path the call came on.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Where it goes below an upstream's base URL, in its wire's terms:
    /// Gemini's below its version (`/models/{model}:{method}`), an Azure
    /// path's as its OpenAI endpoint (the member's provider names the
    /// deployment its own way).
    pub fn upstream_path(&self) -> Cow<'static, str> {
        match self.via {
            PathApi::Gemini { version, .. } => {
                Cow::Owned(self.path[1 + version.len()..].to_owned())
            }
            PathApi::Azure { endpoint } => Cow::Borrowed(endpoint.path()),
            PathApi::Bedrock { .. } | PathApi::Vertex { .. } => {
                Cow::Borrowed(Endpoint::Messages.path())
            }
        }
    }
}

/// The OpenAI endpoints Azure serves by path, below `/openai/v1`, or below
/// `/openai/deployments/{deployment}` (all but Responses, which Azure's
/// versioned API serves at `/openai/responses`).
const AZURE_ENDPOINTS: [Endpoint; 4] = [
    Endpoint::ChatCompletions,
    Endpoint::Completions,
    Endpoint::Embeddings,
    Endpoint::Responses,
];

fn azure(path: &str) -> Option<PathCall> {
    let rest = path.strip_prefix("/openai")?;
    let by_path = |below: &str| {
        AZURE_ENDPOINTS
            .into_iter()
            .find(|endpoint| endpoint.path() == below)
    };
    let (model, endpoint) = if let Some(below) = rest.strip_prefix("/v1") {
        (None, by_path(below)?)
    } else if rest == "/responses" {
        (None, Endpoint::Responses)
    } else {
        let (deployment, below) = rest.strip_prefix("/deployments/")?.split_once('/')?;
        let below = format!("/{below}");
        let endpoint = by_path(&below).filter(|endpoint| *endpoint != Endpoint::Responses)?;
        let plain = !deployment.is_empty()
            && deployment
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
        if !plain {
            return None;
        }
        (Some(deployment.to_owned()), endpoint)
    };
    Some(PathCall {
        model,
        via: PathApi::Azure { endpoint },
        path: path.to_owned(),
    })
}

/// Bedrock's `/model/{id}/invoke` and `/model/{id}/invoke-with-response-stream`
/// (the path already percent-decoded: `us.anthropic.claude-sonnet-4-5-20250929-v1:0`).
fn bedrock(path: &str) -> Option<PathCall> {
    let (id, method) = path.strip_prefix("/model/")?.rsplit_once('/')?;
    let stream = match method {
        "invoke" => false,
        "invoke-with-response-stream" => true,
        _ => return None,
    };
    plain_id(id).then(|| PathCall {
        model: Some(id.to_owned()),
        via: PathApi::Bedrock { stream },
        path: path.to_owned(),
    })
}

/// Vertex AI's `/v1/projects/{p}/locations/{l}/publishers/anthropic/models/{m}:rawPredict`
/// (or `:streamRawPredict`).
fn vertex(path: &str) -> Option<PathCall> {
    let rest = path.strip_prefix("/v1/projects/")?;
    let mut segments = rest.splitn(6, '/');
    let (_project, locations, _location, publishers, publisher, models) = (
        segments.next()?,
        segments.next()?,
        segments.next()?,
        segments.next()?,
        segments.next()?,
        segments.next()?,
    );
    if locations != "locations" || publishers != "publishers" || publisher != "anthropic" {
        return None;
    }
    let (model, method) = models.strip_prefix("models/")?.rsplit_once(':')?;
    let stream = match method {
        "rawPredict" => false,
        "streamRawPredict" => true,
        _ => return None,
    };
    plain_id(model).then(|| PathCall {
        model: Some(model.to_owned()),
        via: PathApi::Vertex { stream },
        path: path.to_owned(),
    })
}

/// A model id as a cloud spells it: letters, digits and `-._:@`, nothing
/// that could reach another path.
fn plain_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 256
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b':' | b'@'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn azure_paths_name_their_endpoint_and_deployment() {
        let call = PathCall::of_path("/openai/deployments/prod-gpt4o/chat/completions").unwrap();
        assert_eq!(call.endpoint(), Endpoint::ChatCompletions);
        assert_eq!(call.model.as_deref(), Some("prod-gpt4o"));
        assert_eq!(call.stream(), None, "the body says");
        assert_eq!(call.upstream_path(), "/chat/completions");
        assert_eq!(call.error_shape(), ErrorShape::Azure);
        assert!(
            call.keyed().is_empty(),
            "api-version and the path's spelling are not keyed"
        );
        let call = PathCall::of_path("/openai/deployments/emb/embeddings").unwrap();
        assert_eq!(call.endpoint(), Endpoint::Embeddings);
        let call = PathCall::of_path("/openai/v1/chat/completions").unwrap();
        assert_eq!(
            (call.endpoint(), call.model),
            (Endpoint::ChatCompletions, None)
        );
        let call = PathCall::of_path("/openai/responses").unwrap();
        assert_eq!(call.endpoint(), Endpoint::Responses);
        for other in [
            "/openai/deployments//chat/completions",
            "/openai/deployments/a/b/chat/completions",
            "/openai/deployments/d/responses",
            "/openai/deployments/d/images/generations",
            "/openai/v1/messages",
            "/openai/models",
            "/openai",
        ] {
            assert_eq!(PathCall::of_path(other), None, "{other}");
        }
    }

    #[test]
    fn the_clouds_paths_are_messages_with_the_model_id_they_name() {
        let call = PathCall::of_path(
            "/model/us.anthropic.claude-sonnet-4-5-20250929-v1:0/invoke-with-response-stream",
        )
        .unwrap();
        assert_eq!(call.endpoint(), Endpoint::Messages);
        assert_eq!(
            call.model.as_deref(),
            Some("us.anthropic.claude-sonnet-4-5-20250929-v1:0")
        );
        assert_eq!(call.stream(), Some(true));
        assert_eq!(call.error_shape(), ErrorShape::Bedrock);
        assert_eq!(call.upstream_path(), "/messages");
        assert_eq!(
            PathCall::of_path("/model/m/invoke").unwrap().stream(),
            Some(false)
        );
        let call = PathCall::of_path(
            "/v1/projects/p-1/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-5@20250929:streamRawPredict",
        )
        .unwrap();
        assert_eq!(call.model.as_deref(), Some("claude-sonnet-4-5@20250929"));
        assert_eq!(
            (call.endpoint(), call.stream()),
            (Endpoint::Messages, Some(true))
        );
        assert_eq!(call.error_shape(), ErrorShape::Gemini);
        for other in [
            "/model/m/converse",
            "/model//invoke",
            "/model/a/b/invoke",
            "/v1/projects/p/locations/l/publishers/google/models/gemini:rawPredict",
            "/v1/projects/p/locations/l/publishers/anthropic/models/m:predict",
            "/v1/projects/p/locations/l/publishers/anthropic/models/a/b:rawPredict",
        ] {
            assert_eq!(PathCall::of_path(other), None, "{other}");
        }
    }

    #[test]
    fn gemini_paths_keep_their_model_method_and_version() {
        let call =
            PathCall::of_path("/v1beta/models/gemini-2.5-flash:streamGenerateContent").unwrap();
        assert_eq!(call.endpoint(), Endpoint::GenerateContent);
        assert_eq!(call.stream(), Some(true));
        assert_eq!(
            call.upstream_path(),
            "/models/gemini-2.5-flash:streamGenerateContent"
        );
        assert_eq!(
            call.keyed(),
            [
                (":model".to_owned(), "gemini-2.5-flash".to_owned()),
                (":version".to_owned(), "v1beta".to_owned())
            ]
        );
        assert_eq!(call.error_shape(), ErrorShape::Gemini);
    }
}
