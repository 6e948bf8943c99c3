//! Gemini's native API, recognized so that it never reaches another
//! provider. Google's SDKs (`google-genai`, the ADK, the Gemini CLI) post to
//! `/v1beta/models/{model}:generateContent` (their 3.x versions to `/v1/`)
//! with the key in `x-goog-api-key` or `?key=`. Relayed as an ordinary
//! pass-through, such a request would go to an OpenAI upstream, its Gemini
//! key with it (in the URL, where a proxy or a log keeps it). corral has no
//! `api: gemini` upstream yet, so it answers 404 in Gemini's error shape, and
//! sends nothing anywhere.

use axum::http::{HeaderMap, HeaderName};

/// The header Google's SDKs carry the key in.
pub const GEMINI_KEY_HEADER: HeaderName = HeaderName::from_static("x-goog-api-key");

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
/// Gemini model method under `/v1/models/`, or a Gemini credential
/// (`x-goog-api-key`, a `key` query parameter).
pub fn is_native(path: &str, headers: &HeaderMap, query: Option<&str>) -> bool {
    let versioned = path == "/v1beta" || path.starts_with("/v1beta/");
    let model_method = path
        .strip_prefix("/v1/models/")
        .and_then(|rest| rest.rsplit_once(':'))
        .is_some_and(|(_, method)| MODEL_METHODS.contains(&method));
    let credential = headers.contains_key(&GEMINI_KEY_HEADER)
        || query.is_some_and(|query| {
            query.split('&').any(|pair| {
                let name = pair.split_once('=').map_or(pair, |(name, _)| name);
                percent_encoding::percent_decode_str(name).decode_utf8_lossy() == "key"
            })
        });
    versioned || model_method || credential
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

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
