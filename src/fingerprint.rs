//! Normalizes a request and hashes it into a tenant-scoped [`Fingerprint`].
//!
//! Two requests share a fingerprint exactly when corral may answer one with the
//! other's response. So the key holds everything that can change the model's
//! output (the body's semantic fields, the endpoint, the upstream, the headers
//! and query parameters providers read) and the tenant scope, and nothing else.

use std::{fmt, sync::Arc};

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::auth::TenantKey;

/// Bumped whenever the canonical form changes, so old keys can never alias new ones.
const KEY_VERSION: &[u8] = b"corral-key-v1";

/// The deduplicated endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    ChatCompletions,
    Completions,
    Embeddings,
}

impl Endpoint {
    /// Path below the upstream's base URL (which ends in `/v1`).
    pub fn path(self) -> &'static str {
        match self {
            Self::ChatCompletions => "/chat/completions",
            Self::Completions => "/completions",
            Self::Embeddings => "/embeddings",
        }
    }

    /// Short label for logs and metrics.
    pub fn label(self) -> &'static str {
        match self {
            Self::ChatCompletions => "chat",
            Self::Completions => "completions",
            Self::Embeddings => "embeddings",
        }
    }
}

/// Whose cache an entry belongs to: a hash of the caller's credential, or the
/// one shared scope. Never the credential itself.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TenantScope(Arc<str>);

impl TenantScope {
    pub const GLOBAL: &'static str = "global";

    /// Scope of a caller identified by `credential` (its bearer token, as raw
    /// bytes so a non-ASCII token is still its own tenant); callers without one
    /// share the anonymous scope.
    ///
    /// With the server's [`TenantKey`] the scope is an HMAC of the credential
    /// (`k…`): unlinkable to the key without the secret. Without one it is the
    /// salted SHA-256 of earlier versions (`t…`, the pinned golden
    /// fingerprints), which anyone holding a guessed key can recompute.
    pub fn of_credential(key: Option<&TenantKey>, credential: Option<&[u8]>) -> Self {
        match (key, credential) {
            (Some(key), Some(token)) => {
                Self(format!("k{}", &hex::encode(key.mac(token))[..32]).into())
            }
            (None, Some(token)) => {
                let digest = Sha256::new()
                    .chain_update(b"corral-tenant-v1\0")
                    .chain_update(token)
                    .finalize();
                Self(format!("t{}", &hex::encode(digest)[..32]).into())
            }
            (_, None) => Self("anonymous".into()),
        }
    }

    pub fn global() -> Self {
        Self(Self::GLOBAL.into())
    }

    /// Rebuilds a scope read back from storage (a Redis entry's header).
    pub fn from_stored(text: &str) -> Self {
        Self(text.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for TenantScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TenantScope({})", self.0)
    }
}

/// How far normalization goes beyond what never changes meaning.
#[derive(Debug, Clone, Copy, Default)]
pub struct Normalization {
    /// Fold message text to lower case (opt-in: it can change the answer).
    pub case_fold: bool,
}

/// SHA-256 over a request's key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    pub fn of(input: &KeyInput<'_>) -> Self {
        // Destructured so a new field cannot be added without deciding how it is keyed.
        let KeyInput {
            endpoint,
            upstream,
            scope,
            headers,
            query,
            body,
        } = input;
        let mut hasher = Sha256::new();
        // Every part is length-prefixed, so the hashed input is prefix-free:
        // no two different keys can produce the same byte sequence.
        let mut part = |bytes: &[u8]| {
            hasher.update((bytes.len() as u64).to_be_bytes());
            hasher.update(bytes);
        };
        part(KEY_VERSION);
        part(endpoint.path().as_bytes());
        part(upstream.as_bytes());
        part(scope.as_str().as_bytes());
        part(&(headers.len() as u64).to_be_bytes());
        for (name, value) in headers.iter() {
            part(name.as_bytes());
            part(value.as_bytes());
        }
        part(&(query.len() as u64).to_be_bytes());
        for (name, value) in query.iter() {
            part(name.as_bytes());
            part(value.as_bytes());
        }
        part(body);
        Self(hasher.finalize().into())
    }

    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses the hex form (as announced over pub/sub).
    pub fn from_hex(text: &str) -> Option<Self> {
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(text, &mut bytes).ok()?;
        Some(Self(bytes))
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({}…)", &self.hex()[..12])
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.hex())
    }
}

/// Where a response is stored: its fingerprint (which already covers the
/// scope) and the scope itself, so stores can lay keys out per tenant.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheKey {
    pub scope: TenantScope,
    pub fingerprint: Fingerprint,
}

/// Everything a fingerprint is computed from.
#[derive(Debug)]
pub struct KeyInput<'a> {
    pub endpoint: Endpoint,
    /// Name of the resolved upstream: one prompt sent to two providers is two answers.
    pub upstream: &'a str,
    pub scope: &'a TenantScope,
    /// Keyed request headers, lower-case names, sorted by name.
    pub headers: &'a [(String, String)],
    /// Query parameters, sorted.
    pub query: &'a [(String, String)],
    /// Canonical body bytes from [`canonical_body`].
    pub body: &'a [u8],
}

/// What a top-level body field does to the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FieldRole {
    /// Can change the answer: part of the key.
    Keyed,
    /// Cannot change the answer's content: left out, so it does not split the cache.
    Ignored,
}

/// The decision table for body fields. Unknown fields are keyed: a field corral
/// does not know may change the answer, and keying it costs only a cache split.
fn field_role(name: &str) -> FieldRole {
    match name {
        // Who asked and how the answer is delivered, not what it says.
        "user" | "stream" | "stream_options" | "request_id" => FieldRole::Ignored,
        // Listed to record the decision; the default below would key them anyway.
        "model"
        | "messages"
        | "prompt"
        | "input"
        | "tools"
        | "tool_choice"
        | "functions"
        | "function_call"
        | "response_format"
        | "temperature"
        | "top_p"
        | "max_tokens"
        | "max_completion_tokens"
        | "stop"
        | "seed"
        | "n"
        | "logprobs"
        | "top_logprobs"
        | "logit_bias"
        | "presence_penalty"
        | "frequency_penalty"
        | "parallel_tool_calls"
        | "reasoning_effort"
        | "modalities"
        | "audio"
        | "prediction"
        | "dimensions"
        | "encoding_format"
        | "suffix"
        | "echo"
        | "best_of"
        | "service_tier"
        | "store"
        | "metadata" => FieldRole::Keyed,
        _ => FieldRole::Keyed,
    }
}

/// The canonical bytes of a request body: ignored fields removed, message text
/// trimmed with line endings unified, keys sorted, numbers in one spelling, no
/// insignificant whitespace.
pub fn canonical_body(body: &Map<String, Value>, normalization: Normalization) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    let mut fields: Vec<(&String, &Value)> = body
        .iter()
        .filter(|(name, _)| field_role(name) == FieldRole::Keyed)
        .collect();
    fields.sort_unstable_by(|a, b| a.0.cmp(b.0));
    out.push(b'{');
    for (i, (name, value)) in fields.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_string(&mut out, name);
        out.push(b':');
        if name == "messages" {
            write_messages(&mut out, value, normalization);
        } else {
            write_canonical(&mut out, value);
        }
    }
    out.push(b'}');
    out
}

/// Canonical JSON of any value. Keys are sorted here explicitly, whatever map
/// order serde_json was built with (`preserve_order` keeps insertion order).
pub fn write_canonical(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(number) => write_number(out, number),
        Value::String(text) => write_string(out, text),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(out, item);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (name, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(out, name);
                out.push(b':');
                write_canonical(out, item);
            }
            out.push(b'}');
        }
    }
}

/// One spelling per numeric value: `1`, `1.0` and `1e0` all become `1`.
fn write_number(out: &mut Vec<u8>, number: &serde_json::Number) {
    if let Some(n) = number.as_i64() {
        out.extend_from_slice(n.to_string().as_bytes());
    } else if let Some(n) = number.as_u64() {
        out.extend_from_slice(n.to_string().as_bytes());
    } else if let Some(f) = number.as_f64() {
        // Integral floats print as integers so they equal their integer
        // spelling (every f64 this large is integral); the rest use the
        // shortest round-trip form.
        const I64_END: f64 = 9_223_372_036_854_775_808.0; // 2^63
        const U64_END: f64 = 18_446_744_073_709_551_616.0; // 2^64
        if f.fract() == 0.0 && (-I64_END..I64_END).contains(&f) {
            out.extend_from_slice((f as i64).to_string().as_bytes());
        } else if f.fract() == 0.0 && (0.0..U64_END).contains(&f) {
            out.extend_from_slice((f as u64).to_string().as_bytes());
        } else {
            out.extend_from_slice(ryu::Buffer::new().format(f).as_bytes());
        }
    }
}

fn write_string(out: &mut Vec<u8>, text: &str) {
    // serde_json's string escaping is canonical (one escape per character).
    serde_json::to_writer(&mut *out, text).expect("writing to a Vec cannot fail");
}

/// `messages` with each message's text content normalized.
fn write_messages(out: &mut Vec<u8>, messages: &Value, normalization: Normalization) {
    let Value::Array(items) = messages else {
        write_canonical(out, messages);
        return;
    };
    let normalized: Vec<Value> = items
        .iter()
        .map(|message| match message {
            Value::Object(fields) => {
                let mut fields = fields.clone();
                if let Some(content) = fields.get_mut("content") {
                    normalize_content(content, normalization);
                }
                Value::Object(fields)
            }
            other => other.clone(),
        })
        .collect();
    write_canonical(out, &Value::Array(normalized));
}

/// Content is a string, or a list of parts of which `{"type":"text","text":…}` carry text.
fn normalize_content(content: &mut Value, normalization: Normalization) {
    match content {
        Value::String(text) => *text = normalize_text(text, normalization),
        Value::Array(parts) => {
            for part in parts {
                if let Some(Value::String(text)) = part.get_mut("text") {
                    *text = normalize_text(text, normalization);
                }
            }
        }
        _ => {}
    }
}

/// Trims surrounding whitespace and unifies line endings (`\r\n`, `\r` -> `\n`).
pub fn normalize_text(text: &str, normalization: Normalization) -> String {
    let unified = text.replace("\r\n", "\n").replace('\r', "\n");
    let trimmed = unified.trim();
    if normalization.case_fold {
        trimmed.to_lowercase()
    } else {
        trimmed.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn canonical(value: Value) -> String {
        String::from_utf8(canonical_body(
            value.as_object().unwrap(),
            Normalization::default(),
        ))
        .unwrap()
    }

    #[test]
    fn numbers_have_one_spelling() {
        let a: Value = serde_json::from_str(r#"{"model":"m","temperature":1}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"model":"m","temperature":1.0}"#).unwrap();
        let c: Value = serde_json::from_str(r#"{"model":"m","temperature":1e0}"#).unwrap();
        assert_eq!(canonical(a.clone()), canonical(b));
        assert_eq!(canonical(a), canonical(c));
        assert_eq!(
            canonical(json!({"model":"m","top_p":0.5})),
            r#"{"model":"m","top_p":0.5}"#
        );
    }

    #[test]
    fn ignored_fields_leave_the_key_and_text_is_normalized() {
        let a = json!({"model":"m","user":"u1","stream":true,
                       "messages":[{"role":"user","content":"  hi\r\nthere \n"}]});
        let b = json!({"messages":[{"content":"hi\nthere","role":"user"}],"model":"m"});
        assert_eq!(canonical(a), canonical(b));
    }

    #[test]
    fn case_folding_is_opt_in() {
        let body = json!({"model":"m","messages":[{"role":"user","content":"Hello"}]});
        let plain = canonical_body(body.as_object().unwrap(), Normalization::default());
        let folded = canonical_body(body.as_object().unwrap(), Normalization { case_fold: true });
        assert!(String::from_utf8_lossy(&plain).contains("Hello"));
        assert!(String::from_utf8_lossy(&folded).contains("hello"));
    }

    #[test]
    fn key_parts_cannot_run_into_each_other() {
        let scope = TenantScope::global();
        let headers_a = [("ab".to_owned(), "c".to_owned())];
        let headers_b = [("a".to_owned(), "bc".to_owned())];
        let input = |headers: &'static [(String, String)]| {
            Fingerprint::of(&KeyInput {
                endpoint: Endpoint::ChatCompletions,
                upstream: "u",
                scope: &scope,
                headers,
                query: &[],
                body: b"{}",
            })
        };
        let a = input(Box::leak(Box::new(headers_a)));
        let b = input(Box::leak(Box::new(headers_b)));
        assert_ne!(a, b);
    }

    #[test]
    fn tenant_scope_hides_the_credential() {
        let scope = TenantScope::of_credential(None, Some(b"sk-secret-key"));
        assert!(!scope.as_str().contains("sk-secret"));
        assert_ne!(scope, TenantScope::of_credential(None, Some(b"sk-other")));
        assert_ne!(scope, TenantScope::of_credential(None, None));
    }
}
