//! `passthrough`: which `/v1/*` endpoints beyond the deduplicated ones are
//! proxied. Each rule is parsed once, at load, into a [`PassRule`].

use std::fmt;

use axum::http::Method;
use glob::Pattern;
use serde::{Deserialize, Serialize};

/// Which `/v1/*` endpoints outside the deduplicated ones are proxied
/// (`passthrough/`). Each rule is `METHOD /v1/path-glob` or `/v1/path-glob`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PassthroughConfig {
    /// Passed even when corral sends its own provider key (then only
    /// stateless endpoints pass by default).
    #[schemars(with = "Vec<String>")]
    pub allow: Vec<PassRule>,
    /// Never passed; wins over `allow` and the defaults.
    #[schemars(with = "Vec<String>")]
    pub deny: Vec<PassRule>,
}

/// `METHOD /v1/path-glob` or `/v1/path-glob` (any method); `*` as the method
/// is any too. Written back as it was given.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(try_from = "String", into = "String")]
pub struct PassRule {
    text: String,
    method: Option<Method>,
    path: Pattern,
}

impl PassRule {
    pub fn parse(text: &str) -> Result<Self, String> {
        let trimmed = text.trim();
        let (method, path) = match trimmed.split_once(char::is_whitespace) {
            Some((method, path)) => (Some(method), path.trim()),
            None => (None, trimmed),
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
        Ok(Self {
            text: text.to_owned(),
            method,
            path,
        })
    }

    /// Whether the rule covers `method` on `path` (decoded, `/v1/...`).
    pub fn matches(&self, method: &Method, path: &str) -> bool {
        self.method.as_ref().is_none_or(|m| m == method) && self.path.matches(path)
    }
}

impl TryFrom<String> for PassRule {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        Self::parse(&text)
    }
}

impl From<PassRule> for String {
    fn from(rule: PassRule) -> Self {
        rule.text
    }
}

impl fmt::Display for PassRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl PartialEq<&str> for PassRule {
    fn eq(&self, other: &&str) -> bool {
        self.text == *other
    }
}
