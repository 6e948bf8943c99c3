//! The first fence: every proxied path stays inside the provider's API.

use std::borrow::Cow;

use crate::error::GatewayError;

/// `path` (a request's raw path) percent-decoded, as the provider reads it
/// and as [`ProxyPath::decoded`] is: what names an endpoint, so that
/// `/v1/chat/%63ompletions` is `/v1/chat/completions` to the pipeline too.
/// Borrowed when it has no escape; as it came when an escape is not UTF-8
/// (which the fence refuses).
pub fn decoded_path(path: &str) -> Cow<'_, str> {
    if !path.contains('%') {
        return Cow::Borrowed(path);
    }
    percent_encoding::percent_decode_str(path)
        .decode_utf8()
        .unwrap_or(Cow::Borrowed(path))
}

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

#[cfg(test)]
mod tests {
    use axum::http::Method;

    use super::*;
    use crate::{
        config::{PassRule, PassthroughConfig},
        passthrough::Policy,
    };

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
            deny: vec![PassRule::parse("GET /v1/files*").unwrap()],
        });
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
    fn a_decoded_path_is_what_names_an_endpoint() {
        assert_eq!(
            decoded_path("/v1/chat/%63%6Fmpletions"),
            "/v1/chat/completions"
        );
        assert!(matches!(
            decoded_path("/v1/chat/completions"),
            Cow::Borrowed(_)
        ));
        assert_eq!(decoded_path("/v1/%ff"), "/v1/%ff", "not UTF-8: as it came");
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
}
