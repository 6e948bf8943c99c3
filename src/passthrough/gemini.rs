//! Gemini's native API, recognized so that it never reaches another
//! provider. Google's SDKs (`google-genai`, the ADK, the Gemini CLI) post to
//! `/v1beta/models/{model}:generateContent` (their 3.x versions to `/v1/`)
//! with the key in `x-goog-api-key` or `?key=`. Relayed as an ordinary
//! pass-through, such a request would go to an OpenAI upstream, its Gemini
//! key with it (in the URL, where a proxy or a log keeps it).
//!
//! With an `api: gemini` upstream, [`Passthrough::serve_gemini`] relays it
//! there, routed by the model its path names; the caller's key goes only
//! there and only as `x-goog-api-key` (never in the URL), and not at all when
//! corral has a key of its own for it. Without one, it is answered 404 in
//! Gemini's error shape and sent nowhere. The deduplicated methods
//! (`generateContent`, `streamGenerateContent`, `embedContent`,
//! `batchEmbedContents`) never come here: the pipeline hands them to
//! `dedup` (`wire::GeminiCall`); everything else Gemini is relayed as it came.

use std::sync::Arc;

use axum::{
    http::{HeaderMap, Method},
    response::Response,
};
use bytes::Bytes;

use super::{Passthrough, ProxyPath, paid::Caller, relay::forwarded_headers};
use crate::{
    auth::{self, GEMINI_KEY_HEADER},
    config::Api,
    error::GatewayError,
    upstream::Outbound,
};

impl Passthrough<'_> {
    /// Relays a request [`is_native`] recognized to a Gemini upstream, held
    /// to `tenant`'s budgets when Google bills it (`paid.rs`).
    pub async fn serve_gemini(
        &self,
        method: Method,
        path: &str,
        headers: &HeaderMap,
        query: Option<&str>,
        body: Bytes,
        tenant: &Arc<str>,
    ) -> Result<Response, GatewayError> {
        let refused = || GatewayError::NoGeminiUpstream {
            path: path.to_owned(),
        };
        let first = self.routes.first_of(Api::Gemini).ok_or_else(refused)?;
        // Below the caller's version (`/v1beta` or `/v1`), which the
        // upstream's base URL names instead; fenced like every proxied path.
        let below = path
            .strip_prefix("/v1beta")
            .or_else(|| path.strip_prefix("/v1"))
            .filter(|rest| rest.starts_with('/'))
            .ok_or_else(refused)?;
        let fenced = ProxyPath::parse(&format!("/v1{below}"))?;
        let model = model_of(fenced.decoded().strip_prefix("/v1").unwrap_or_default());
        let upstream =
            match model {
                Some(model) => self.routes.route_for(Api::Gemini, model).ok_or_else(|| {
                    GatewayError::NoRoute {
                        model: model.to_owned(),
                    }
                })?,
                None => first,
            };
        self.policy
            .check(&method, fenced.decoded(), self.shares_a_key(upstream))?;
        let caller = Caller { tenant, model };
        let bill = self
            .admit_paid(&method, fenced.decoded(), upstream, caller)
            .await?;
        let (key, query) = auth::gemini_key(headers, query)?;
        let outbound = Outbound {
            upstream,
            method,
            path: fenced.below_base().to_owned().into(),
            query,
            headers: forwarded_headers(headers),
            authorization: key,
            body,
            affinity: None,
            pin: None,
            model: model.map(Into::into),
        };
        self.relay(&outbound, bill).await
    }
}

/// The model a Gemini path names: `/models/{model}` or `/models/{model}:{method}`.
fn model_of(below: &str) -> Option<&str> {
    let rest = below.strip_prefix("/models/")?;
    let model = rest.split(['/', ':']).next()?;
    (!model.is_empty()).then_some(model)
}

/// Gemini's model methods (`models/{model}:{method}`). OpenAI model ids have
/// colons too (a fine-tuned `ft:gpt-4o-mini:org::id`), so the method, not
/// the colon, says a path is Gemini's.
const MODEL_METHODS: &[&str] = &[
    "generateContent",
    "streamGenerateContent",
    "countTokens",
    "computeTokens",
    "embedContent",
    "batchEmbedContents",
    "batchGenerateContent",
    "asyncBatchEmbedContent",
    "predict",
    "predictLongRunning",
];

/// Whether a request speaks Gemini's native API: a `/v1beta/` path, a
/// Gemini model method under `/v1/models/`, or a Google credential
/// (`x-goog-api-key`, a `key`, `access_token` or `oauth_token` query parameter).
pub fn is_native(path: &str, headers: &HeaderMap, query: Option<&str>) -> bool {
    let versioned = path == "/v1beta" || path.starts_with("/v1beta/");
    let model_method = path
        .strip_prefix("/v1/models/")
        .and_then(|rest| rest.rsplit_once(':'))
        .is_some_and(|(_, method)| MODEL_METHODS.contains(&method));
    let credential =
        headers.contains_key(&GEMINI_KEY_HEADER) || auth::query_credential(query).is_some();
    versioned || model_method || credential
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn a_gemini_path_names_its_model() {
        assert_eq!(
            model_of("/models/gemini-2.5-flash:generateContent"),
            Some("gemini-2.5-flash")
        );
        assert_eq!(
            model_of("/models/gemini-2.5-flash"),
            Some("gemini-2.5-flash")
        );
        assert_eq!(model_of("/models"), None);
        assert_eq!(model_of("/files/abc"), None);
    }

    #[test]
    fn gemini_paths_and_credentials_are_recognized_and_openai_ids_are_not() {
        let none = HeaderMap::new();
        for path in [
            "/v1beta/models/gemini-2.5-flash:generateContent",
            "/v1beta/models",
            "/v1beta",
            "/v1/models/gemini-2.5-flash:streamGenerateContent",
            "/v1/models/text-embedding-004:batchEmbedContents",
        ] {
            assert!(is_native(path, &none, None), "{path}");
        }
        for path in [
            "/v1/models",
            "/v1/models/gpt-4o-mini",
            "/v1/models/ft:gpt-4o-mini:acme::abc123",
            "/v1/chat/completions",
            "/v1betas/x",
        ] {
            assert!(!is_native(path, &none, Some("limit=2")), "{path}");
        }
        let mut keyed = HeaderMap::new();
        keyed.insert(GEMINI_KEY_HEADER, HeaderValue::from_static("AIza-test"));
        assert!(is_native("/v1/models", &keyed, None));
        assert!(is_native(
            "/v1/models",
            &none,
            Some("pageSize=5&key=AIza-test")
        ));
        assert!(is_native("/v1/files", &none, Some("key")));
        assert!(is_native("/v1/files", &none, Some("%6Bey=AIza-test")));
        assert!(!is_native("/v1/files", &none, Some("keys=1&monkey=2")));
    }
}
