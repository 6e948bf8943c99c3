//! The pass-through's two fences: every proxied path stays inside the
//! provider's API ([`ProxyPath`]), and only the endpoints the policy allows
//! are proxied at all ([`Policy`]).
//!
//! **Confinement.** A path reaches the provider joined to `base_url`, with the
//! provider key when corral holds one. A dot-segment, or anything that a URL
//! parser or the provider could turn into one (`%2e`, `%2f`, `%5c`, `\`, a
//! double-encoded `%25..`), an empty segment (`//host` would be read as an
//! authority) or a malformed escape could walk out of `base_url`'s path, so
//! each is refused (400) before anything is sent. The joined URL is checked
//! again by the client (`upstream/client.rs`), and redirects are never followed.
//!
//! **Policy.** When corral sends its own provider key, every tenant shares
//! the provider account: a file one tenant uploads, a batch, an assistant or a
//! stored response would be listed and read by every other. Then only
//! stateless endpoints pass by default ([`STATELESS`]); `passthrough.allow`
//! adds more, `passthrough.deny` removes any, and deny wins. When callers
//! bring their own provider keys, the provider separates them and everything
//! is allowed unless denied.

use axum::http::Method;
use glob::Pattern;

use serde::{Deserialize, Serialize};

use crate::error::GatewayError;

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
];

/// A request path below `/v1`, checked to stay there; kept as it arrived
/// (percent-encoding included), so the provider sees the caller's bytes, and
/// decoded, so rules and routes see what the provider will make of it
/// (`/v1/%66iles` is `/v1/files` to a deny rule as to the provider).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyPath {
    raw: String,
    decoded: String,
}

impl ProxyPath {
    /// `path` is the request's raw path (not percent-decoded), `/v1/...`.
    pub fn parse(path: &str) -> Result<Self, GatewayError> {
        let refuse = |reason: &'static str| GatewayError::PathRefused { reason };
        let rest = path
            .strip_prefix("/v1")
            .filter(|rest| rest.starts_with('/'))
            .ok_or(refuse("it must start with /v1/"))?;
        for segment in rest[1..].split('/') {
            check_segment(segment).map_err(refuse)?;
        }
        // No escape left can make a segment (encoded dots, slashes,
        // backslashes and percent signs are refused above).
        let decoded = percent_encoding::percent_decode_str(path)
            .decode_utf8()
            .map_err(|_| refuse("it has a percent-escape that is not UTF-8"))?
            .into_owned();
        Ok(Self {
            raw: rest.to_owned(),
            decoded,
        })
    }

    /// Below the upstream's base URL as it came, e.g. `/files/file-abc`.
    pub fn below_base(&self) -> &str {
        &self.raw
    }

    /// The whole path, `/v1/...`, percent-decoded: what rules and routes match.
    pub fn decoded(&self) -> &str {
        &self.decoded
    }
}

fn check_segment(segment: &str) -> Result<(), &'static str> {
    match segment {
        "" => return Err("it has an empty segment"),
        "." | ".." => return Err("it has a dot-segment"),
        _ => {}
    }
    let bytes = segment.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => return Err("it has a backslash"),
            b'%' => {
                let decoded = bytes
                    .get(i + 1..i + 3)
                    .and_then(|hex| std::str::from_utf8(hex).ok())
                    .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                    .ok_or("it has a malformed percent-escape")?;
                if matches!(decoded, b'.' | b'/' | b'\\' | b'%') {
                    return Err("it has an encoded dot, slash, backslash or percent sign");
                }
                i += 3;
            }
            byte if byte.is_ascii_control() => return Err("it has a control character"),
            _ => i += 1,
        }
    }
    Ok(())
}

/// Which `/v1/*` endpoints outside the deduplicated ones are proxied
/// (this module). Each rule is `METHOD /v1/path-glob` or `/v1/path-glob`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PassthroughConfig {
    /// Passed even when corral sends its own provider key (then only
    /// stateless endpoints pass by default).
    pub allow: Vec<String>,
    /// Never passed; wins over `allow` and the defaults.
    pub deny: Vec<String>,
}

/// `METHOD /path-glob` or `/path-glob` (any method); `*` as the method is any too.
#[derive(Debug, Clone)]
struct Rule {
    method: Option<Method>,
    path: Pattern,
}

impl Rule {
    fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let (method, path) = match text.split_once(char::is_whitespace) {
            Some((method, path)) => (Some(method), path.trim()),
            None => (None, text),
        };
        let method = match method {
            None | Some("*") => None,
            Some(name) => Some(
                Method::from_bytes(name.to_ascii_uppercase().as_bytes())
                    .map_err(|_| format!("`{name}` is not an HTTP method"))?,
            ),
        };
        if !path.starts_with("/v1/") {
            return Err(format!(
                "`{path}` must be a path glob starting with /v1/, e.g. \"POST /v1/files\""
            ));
        }
        let path = Pattern::new(path).map_err(|err| format!("`{path}`: {err}"))?;
        Ok(Self { method, path })
    }

    fn matches(&self, method: &Method, path: &str) -> bool {
        self.method.as_ref().is_none_or(|m| m == method) && self.path.matches(path)
    }
}

/// Which proxied requests are let through; see the module docs.
#[derive(Debug, Clone)]
pub struct Policy {
    stateless: Vec<Rule>,
    allow: Vec<Rule>,
    deny: Vec<Rule>,
}

impl Policy {
    /// Checks every rule; the error names the offending entry's key.
    pub fn new(config: &PassthroughConfig) -> Result<Self, (String, String)> {
        let rules = |list: &[String], key: &str| {
            list.iter()
                .enumerate()
                .map(|(i, text)| Rule::parse(text).map_err(|err| (format!("{key}[{i}]"), err)))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(Self {
            stateless: STATELESS
                .iter()
                .map(|text| Rule::parse(text).expect("the built-in rules parse"))
                .collect(),
            allow: rules(&config.allow, "passthrough.allow")?,
            deny: rules(&config.deny, "passthrough.deny")?,
        })
    }

    /// Whether `method path` may be proxied to an upstream that does
    /// (`shared_key`) or does not hold corral's own provider key.
    pub fn check(&self, method: &Method, path: &str, shared_key: bool) -> Result<(), GatewayError> {
        let listed = |rules: &[Rule]| rules.iter().any(|rule| rule.matches(method, path));
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

    #[test]
    fn plain_paths_pass_as_they_came() {
        for path in [
            "/v1/models",
            "/v1/models/gpt-4o",
            "/v1/files/file-abc/content",
            "/v1/models/ft%3Agpt-4o%3Aorg",
            "/v1/a.b/c..d/...",
        ] {
            let parsed = ProxyPath::parse(path).unwrap_or_else(|err| panic!("{path}: {err}"));
            assert_eq!(parsed.below_base(), &path[3..]);
        }
    }

    #[test]
    fn rules_match_the_decoded_path_the_provider_sees() {
        let policy = Policy::new(&PassthroughConfig {
            allow: Vec::new(),
            deny: vec!["GET /v1/files*".into()],
        })
        .unwrap();
        for path in ["/v1/files", "/v1/%66iles", "/v1/%66%69%6c%65%73/f-1"] {
            let parsed = ProxyPath::parse(path).unwrap();
            assert!(parsed.decoded().starts_with("/v1/files"), "{path}");
            assert_eq!(parsed.below_base(), &path[3..], "sent as it came");
            assert!(
                policy.check(&Method::GET, parsed.decoded(), false).is_err(),
                "{path}"
            );
        }
        assert!(ProxyPath::parse("/v1/%ff").is_err(), "not UTF-8");
    }

    #[test]
    fn every_way_out_is_refused() {
        for path in [
            "/v1/../admin",
            "/v1/./models",
            "/v1/models/..",
            "/v1/%2e%2e/admin",
            "/v1/%2E%2e/admin",
            "/v1/.%2e/admin",
            "/v1/..%2fadmin",
            "/v1/..%2Fadmin",
            "/v1/%252e%252e/admin",
            "/v1/..\\admin",
            "/v1/..%5cadmin",
            "/v1//evil.example/x",
            "/v1/models/",
            "/v1/%zz",
            "/v1/%2",
            "/v1x/models",
            "/v2/models",
        ] {
            assert!(
                matches!(
                    ProxyPath::parse(path),
                    Err(GatewayError::PathRefused { .. })
                ),
                "{path}"
            );
        }
    }

    fn policy(allow: &[&str], deny: &[&str]) -> Policy {
        Policy::new(&PassthroughConfig {
            allow: allow.iter().map(|s| (*s).to_owned()).collect(),
            deny: deny.iter().map(|s| (*s).to_owned()).collect(),
        })
        .unwrap()
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
    fn bad_rules_name_their_entry() {
        let bad = |allow: &[&str]| {
            Policy::new(&PassthroughConfig {
                allow: allow.iter().map(|s| (*s).to_owned()).collect(),
                deny: Vec::new(),
            })
            .unwrap_err()
        };
        assert_eq!(bad(&["/v1/ok", "files"]).0, "passthrough.allow[1]");
        assert!(bad(&["G@T /v1/files"]).1.contains("HTTP method"));
        assert!(bad(&["/v1/[files"]).1.contains("/v1/[files"));
    }
}
