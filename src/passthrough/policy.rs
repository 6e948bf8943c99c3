//! The second fence: only the endpoints the policy allows are proxied.

use axum::http::Method;

use crate::{
    config::{PassRule, PassthroughConfig},
    error::GatewayError,
};

/// What passes by default when corral injects its own provider key: no
/// endpoint here keeps state on the provider's side between calls.
pub const STATELESS: &[&str] = &[
    "GET /v1/models",
    "GET /v1/models/*",
    "POST /v1/moderations",
    "POST /v1/audio/*",
    "POST /v1/images/*",
    "POST /v1/chat/completions",
    "POST /v1/completions",
    "POST /v1/embeddings",
    "POST /v1/messages",
    "POST /v1/messages/count_tokens",
    // Gemini's model methods (generateContent, countTokens, embedContent, ...),
    // as `gemini.rs` checks them: below `/v1/`, whatever the caller's version.
    "POST /v1/models/*",
];

/// Which proxied requests are let through; see the module docs.
#[derive(Debug, Clone)]
pub struct Policy {
    stateless: Vec<PassRule>,
    allow: Vec<PassRule>,
    deny: Vec<PassRule>,
}

impl Policy {
    /// The configured rules (parsed at load) and the built-in stateless ones.
    pub fn new(config: &PassthroughConfig) -> Self {
        Self {
            stateless: STATELESS
                .iter()
                .map(|text| PassRule::parse(text).expect("the built-in rules parse"))
                .collect(),
            allow: config.allow.clone(),
            deny: config.deny.clone(),
        }
    }

    /// Whether `method path` may be proxied to an upstream that does
    /// (`shared_key`) or does not hold corral's own provider key.
    pub fn check(&self, method: &Method, path: &str, shared_key: bool) -> Result<(), GatewayError> {
        let listed = |rules: &[PassRule]| rules.iter().any(|rule| rule.matches(method, path));
        let denied = |setting| GatewayError::PassthroughDenied {
            method: method.clone(),
            path: path.to_owned(),
            setting,
        };
        if listed(&self.deny) {
            return Err(denied("passthrough.deny lists it"));
        }
        if !shared_key || listed(&self.allow) || listed(&self.stateless) {
            return Ok(());
        }
        Err(denied(
            "corral sends its own provider key, which every caller shares, so only stateless endpoints pass unless passthrough.allow lists it",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: &[&str], deny: &[&str]) -> Policy {
        let rules = |list: &[&str]| list.iter().map(|s| PassRule::parse(s).unwrap()).collect();
        Policy::new(&PassthroughConfig {
            allow: rules(allow),
            deny: rules(deny),
        })
    }

    #[test]
    fn a_shared_key_passes_only_stateless_endpoints_unless_allowed() {
        let default = policy(&[], &[]);
        for (method, path) in [
            (Method::GET, "/v1/models"),
            (Method::GET, "/v1/models/gpt-4o"),
            (Method::POST, "/v1/audio/transcriptions"),
            (Method::POST, "/v1/images/generations"),
            (Method::POST, "/v1/moderations"),
        ] {
            assert!(default.check(&method, path, true).is_ok(), "{path}");
        }
        for (method, path) in [
            (Method::POST, "/v1/files"),
            (Method::GET, "/v1/files"),
            (Method::DELETE, "/v1/models/ft-1"),
            (Method::POST, "/v1/batches"),
            (Method::GET, "/v1/chat/completions/chatcmpl-1"),
            (Method::POST, "/v1/responses"),
            (Method::POST, "/v1/threads"),
        ] {
            let err = default.check(&method, path, true).unwrap_err();
            assert!(err.to_string().contains("passthrough.allow"), "{err}");
            assert!(
                default.check(&method, path, false).is_ok(),
                "own keys: {path}"
            );
        }
        let allowed = policy(&["POST /v1/files", "get /v1/files/*"], &[]);
        assert!(allowed.check(&Method::POST, "/v1/files", true).is_ok());
        assert!(allowed.check(&Method::GET, "/v1/files/f-1", true).is_ok());
        assert!(
            allowed
                .check(&Method::DELETE, "/v1/files/f-1", true)
                .is_err()
        );
    }

    #[test]
    fn deny_wins_over_everything() {
        let denied = policy(&["/v1/files*"], &["DELETE /v1/*", "/v1/images/*"]);
        for shared_key in [true, false] {
            let err = denied
                .check(&Method::DELETE, "/v1/files/f-1", shared_key)
                .unwrap_err();
            assert!(err.to_string().contains("passthrough.deny"), "{err}");
            assert!(
                denied
                    .check(&Method::POST, "/v1/images/generations", shared_key)
                    .is_err()
            );
        }
        assert!(denied.check(&Method::GET, "/v1/files", true).is_ok());
    }

    #[test]
    fn bad_rules_say_what_is_wrong() {
        assert!(PassRule::parse("files").unwrap_err().contains("/v1/"));
        assert!(
            PassRule::parse("G@T /v1/files")
                .unwrap_err()
                .contains("HTTP method")
        );
        assert!(
            PassRule::parse("/v1/[files")
                .unwrap_err()
                .contains("/v1/[files")
        );
    }
}
