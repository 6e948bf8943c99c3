//! Normalizes a request and hashes it into a tenant-scoped [`Fingerprint`].
//!
//! Two requests share a fingerprint exactly when corral may answer one with the
//! other's response. So the key holds everything that can change the model's
//! output (the body's semantic fields, the endpoint, the upstream, the headers
//! and query parameters providers read) and the tenant scope, and nothing else.

use std::fmt;

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::tenant::TenantScope;

/// Bumped whenever the canonical form changes, so old keys can never alias new ones.
/// v2: upstreams are keyed by their identity (API and base URL), not their name.
const KEY_VERSION: &[u8] = b"corral-key-v2";

/// The deduplicated endpoints. Each speaks one wire format, whose adapter
/// (`wire::of`) knows its fields, streams and completeness rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    ChatCompletions,
    Completions,
    Embeddings,
    /// OpenAI Responses (`POST /v1/responses`).
    Responses,
    /// Anthropic Messages (`POST /v1/messages`).
    Messages,
    /// Gemini's `generateContent` and `streamGenerateContent` (one key for
    /// both: the method only delivers), below the model the path names.
    GenerateContent,
    /// Gemini's `embedContent` and `batchEmbedContents`, item by item.
    EmbedContent,
}

impl Endpoint {
    /// Every deduplicated endpoint.
    pub const ALL: [Endpoint; 7] = [
        Self::ChatCompletions,
        Self::Completions,
        Self::Embeddings,
        Self::Responses,
        Self::Messages,
        Self::GenerateContent,
        Self::EmbedContent,
    ];

    /// The endpoints a `/v1{path}` names by its path alone (Gemini's name a
    /// model in theirs: `wire::GeminiCall`).
    pub const BY_PATH: [Endpoint; 5] = [
        Self::ChatCompletions,
        Self::Completions,
        Self::Embeddings,
        Self::Responses,
        Self::Messages,
    ];

    /// Path below the upstream's base URL (which ends in `/v1`).
    pub fn path(self) -> &'static str {
        match self {
            Self::ChatCompletions => "/chat/completions",
            Self::Completions => "/completions",
            Self::Embeddings => "/embeddings",
            Self::Responses => "/responses",
            Self::Messages => "/messages",
            // Per request (`Wire::upstream_path`): `/models/{model}:{method}`.
            Self::GenerateContent | Self::EmbedContent => "/models",
        }
    }

    /// Short label for logs and metrics.
    pub fn label(self) -> &'static str {
        match self {
            Self::ChatCompletions => "chat",
            Self::Completions => "completions",
            Self::Embeddings => "embeddings",
            Self::Responses => "responses",
            Self::Messages => "messages",
            Self::GenerateContent => "gemini",
            Self::EmbedContent => "gemini_embeddings",
        }
    }
}

/// How one wire format's body is keyed: which top-level fields are left out
/// of the key, which members of the items of a top-level array are, and which
/// field holds the conversation whose text is normalized like chat
/// `messages`. Every other field is keyed as it is: a field corral does not
/// know may change the answer, and keying it costs only a cache split.
///
/// Two kinds of field are left out. **Delivery** fields say how the answer is
/// delivered (`stream`), never what it says; they are always left out, since
/// a stream and a non-stream caller share one call. **Label** fields name,
/// track or route a request at the provider (who asked, which prompt cache
/// to route to, which stored-completion tags to attach) without changing what
/// the model generates; they are left out unless the operator keys them
/// (`cache.ignore_label_fields: false`, [`LabelFields::Keyed`]). Each is still
/// sent upstream as the owner of the call sent it, and where the provider
/// echoes one in its answer, each caller gets its own (`wire::Echo`).
#[derive(Debug, Clone, Copy)]
pub struct BodyKeying {
    /// Top-level fields that only deliver the answer: never keyed.
    pub delivery: &'static [&'static str],
    /// Top-level fields that only label the request.
    pub labels: &'static [&'static str],
    /// `(array field, member)`: a member of each object item of a top-level
    /// array that only labels it or asks for a stream-only delivery (tools'
    /// `eager_input_streaming`).
    pub item_labels: &'static [(&'static str, &'static str)],
    /// The field whose items' text content is trimmed and unified.
    pub messages: Option<&'static str>,
    /// The member of a `messages` item that holds its text content (a
    /// string, or parts whose `text` is normalized): `content`, Gemini's `parts`.
    pub content: &'static str,
    /// Of a `messages` item, whether it carries its content inline, so that
    /// its `id` only names it (a Responses `input` item; never an
    /// `item_reference`, whose id is its content). `None`: ids are keyed.
    pub inline_item: Option<ItemTest>,
}

/// A test of one conversation item (a JSON object).
pub type ItemTest = fn(&Map<String, Value>) -> bool;

impl BodyKeying {
    /// OpenAI Chat Completions, Completions and Embeddings.
    pub const OPENAI: BodyKeying = BodyKeying {
        delivery: &["stream", "stream_options"],
        labels: &[
            "user",
            "safety_identifier",
            "prompt_cache_key",
            "metadata",
            "request_id",
        ],
        item_labels: &[],
        messages: Some("messages"),
        content: "content",
        inline_item: None,
    };

    /// Whether a top-level field is left out of the key.
    pub fn leaves_out(&self, field: &str, labels: LabelFields) -> bool {
        self.delivery.contains(&field)
            || (labels == LabelFields::Ignored && self.labels.contains(&field))
    }

    /// Whether `member` of the object items of the top-level array `field` is left out.
    fn leaves_out_item_member(&self, field: &str, member: &str, labels: LabelFields) -> bool {
        labels == LabelFields::Ignored
            && self
                .item_labels
                .iter()
                .any(|(f, m)| *f == field && *m == member)
    }

    fn has_item_labels(&self, field: &str, labels: LabelFields) -> bool {
        labels == LabelFields::Ignored && self.item_labels.iter().any(|(f, _)| *f == field)
    }

    /// Whether the `id` of this conversation item only names it.
    fn leaves_out_item_id(&self, item: &Map<String, Value>, labels: LabelFields) -> bool {
        labels == LabelFields::Ignored && self.inline_item.is_some_and(|inline| inline(item))
    }
}

/// Whether a wire format's label fields are left out of the key (the default)
/// or keyed like any other field (`cache.ignore_label_fields: false`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LabelFields {
    #[default]
    Ignored,
    Keyed,
}

/// How far normalization goes beyond what never changes meaning.
#[derive(Debug, Clone, Copy, Default)]
pub struct Normalization {
    /// Fold message text to lower case (opt-in: it can change the answer).
    pub case_fold: bool,
    /// Whether the label fields are left out of the key.
    pub labels: LabelFields,
}

/// A fingerprint's first 12 hex digits ([`Fingerprint::short_hex`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ShortHex([u8; 12]);

impl ShortHex {
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("hex digits are ASCII")
    }
}

impl std::fmt::Display for ShortHex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Debug for ShortHex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// SHA-256 over a request's key.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Fingerprint([u8; 32]);

/// A fingerprint is a SHA-256 output, so any 8 of its bytes are as evenly
/// spread as all 32: the maps keyed by it (the cache, the flight table, the
/// failure memory; about ten lookups a miss) hash one word, which their
/// seeded hasher still mixes, instead of a 32-byte slice and its length.
/// Equality still compares all 32 bytes.
impl std::hash::Hash for Fingerprint {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let (word, _) = self.0.split_first_chunk::<8>().expect("32 bytes hold 8");
        state.write_u64(u64::from_le_bytes(*word));
    }
}

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
        let mut text = [0u8; 64];
        hex::encode_to_slice(self.0, &mut text).expect("64 hex digits for 32 bytes");
        std::str::from_utf8(&text)
            .expect("hex digits are ASCII")
            .to_owned()
    }

    /// The first 12 hex digits: enough to find a request's siblings in logs,
    /// too few to matter as a key. On the stack: every access line has one.
    pub fn short_hex(&self) -> ShortHex {
        let mut digits = [0u8; 12];
        hex::encode_to_slice(&self.0[..6], &mut digits).expect("12 hex digits for 6 bytes");
        ShortHex(digits)
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

    /// The key a request's answer is stored under once purges have happened
    /// (`purge.rs`): this fingerprint with the purge generations that apply to
    /// it (everything, its model, its tenant, itself; 0 where none), hashed
    /// under a domain of its own, so it never equals a request's fingerprint
    /// and a purge re-keys every entry it covers at once. `KEY_VERSION` is
    /// unchanged: the canonical form did not change, and with no purge the
    /// key is the fingerprint itself, as before.
    pub fn with_generations(&self, generations: [u64; 4]) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(b"corral-generation-v1\0");
        hasher.update(self.0);
        for generation in generations {
            hasher.update(generation.to_be_bytes());
        }
        Self(hasher.finalize().into())
    }
}

impl Fingerprint {
    /// This fingerprint within one tenant's own space: a key a cache shared
    /// by every tenant (`cache.scope: global`) uses for what stays a
    /// tenant's own (the answers its retries receive).
    pub fn within(&self, scope: &TenantScope) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(b"corral-own-tenant-v1\0");
        hasher.update(self.0);
        hasher.update(scope.as_str().as_bytes());
        Self(hasher.finalize().into())
    }

    /// A flight name of this request's own, for a caller that shares its
    /// call with nobody (`X-Corral-Coalesce: off`): the fingerprint with
    /// `nonce`, hashed under a domain of its own, so it is never a request's
    /// fingerprint or another caller's flight.
    pub fn unshared(&self, nonce: [u8; 16]) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(b"corral-unshared-flight-v1\0");
        hasher.update(self.0);
        hasher.update(nonce);
        Self(hasher.finalize().into())
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

/// What a caller's own upstream call would send: its body byte for byte and
/// whether it streams. Callers of one fingerprint may differ in it (label
/// fields, the white space the key trims, the mode), and a provider that
/// refuses one caller's bytes has said nothing about another's: a follower
/// whose `Sent` differs from the owner's makes its own call after such a
/// refusal, and a remembered failure answers only the same bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sent([u8; 32]);

impl Sent {
    pub fn of(stream: bool, body: &[u8]) -> Self {
        let mode: &[u8] = if stream { b"stream\0" } else { b"plain\0" };
        Self(
            Sha256::new()
                .chain_update(b"corral-sent-v1\0")
                .chain_update(mode)
                .chain_update(body)
                .finalize()
                .into(),
        )
    }

    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }

    pub fn from_hex(text: &str) -> Option<Self> {
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(text, &mut bytes).ok()?;
        Some(Self(bytes))
    }
}

impl fmt::Debug for Sent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sent({}…)", &self.hex()[..12])
    }
}

/// A client's `Idempotency-Key`, hashed together with the tenant of the
/// credential that sent it: two tenants' equal keys are two keys, and the raw
/// key (which a client may derive from its own data) is never kept.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey {
    pub tenant: TenantScope,
    digest: [u8; 32],
}

impl IdempotencyKey {
    pub fn of(tenant: TenantScope, key: &[u8]) -> Self {
        let digest = Sha256::new()
            .chain_update(b"corral-idempotency-v1\0")
            .chain_update(tenant.as_str().as_bytes())
            .chain_update([0])
            .chain_update(key)
            .finalize()
            .into();
        Self { tenant, digest }
    }

    pub fn hex(&self) -> String {
        hex::encode(self.digest)
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey({}…)", &self.hex()[..12])
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
    /// The resolved upstream's identity (`UpstreamConfig::identity`: its API
    /// and base URL, not its name): one prompt sent to two providers is two answers.
    pub upstream: &'a str,
    pub scope: &'a TenantScope,
    /// Keyed request headers, lower-case names, sorted by name.
    pub headers: &'a [(String, String)],
    /// Query parameters, sorted.
    pub query: &'a [(String, String)],
    /// Canonical body bytes from [`canonical_body`].
    pub body: &'a [u8],
}

/// The canonical bytes of a request body: ignored fields removed, message text
/// trimmed with line endings unified, keys sorted, numbers in one spelling, no
/// insignificant whitespace.
///
/// Written in one pass over the parsed body, without copying it: this runs on
/// every request, hits included, and the key can be no cheaper than hashing
/// its input once, so everything but that hash is kept to a copy of the bytes.
pub fn canonical_body(body: &Map<String, Value>, normalization: Normalization) -> Vec<u8> {
    canonical_body_with(body, normalization, &BodyKeying::OPENAI)
}

/// As [`canonical_body`], with a wire format's own [`BodyKeying`].
pub fn canonical_body_with(
    body: &Map<String, Value>,
    normalization: Normalization,
    keying: &BodyKeying,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    let labels = normalization.labels;
    write_object(&mut out, body, |out, name, value| {
        if keying.leaves_out(name, labels) {
            false
        } else if keying.messages == Some(name) {
            write_entry(out, name, |out| {
                write_messages(out, value, normalization, keying)
            })
        } else if let Value::Array(items) = value
            && keying.has_item_labels(name, labels)
        {
            write_entry(out, name, |out| {
                write_array(out, items, |out, item| match item {
                    Value::Object(members) => write_object(out, members, |out, member, value| {
                        !keying.leaves_out_item_member(name, member, labels)
                            && write_entry(out, member, |out| write_canonical(out, value))
                    }),
                    other => write_canonical(out, other),
                })
            })
        } else {
            write_entry(out, name, |out| write_canonical(out, value))
        }
    });
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
        Value::String(text) => write_string(out, text, LineEndings::Keep),
        Value::Array(items) => write_array(out, items, write_canonical),
        Value::Object(map) => write_object(out, map, |out, name, item| {
            write_entry(out, name, |out| write_canonical(out, item))
        }),
    }
}

/// `[a,b,…]`, each item written by `write_item`.
fn write_array(
    out: &mut Vec<u8>,
    items: &[Value],
    mut write_item: impl FnMut(&mut Vec<u8>, &Value),
) {
    out.push(b'[');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_item(out, item);
    }
    out.push(b']');
}

/// `{…}` with the entries in key order. `write_field` writes one entry (with
/// [`write_entry`]) and says whether it wrote anything, so a caller can leave
/// fields out. A map that already iterates in key order (serde_json's default
/// `BTreeMap`) is walked as it is; only an insertion-ordered one is sorted.
fn write_object(
    out: &mut Vec<u8>,
    map: &Map<String, Value>,
    mut write_field: impl FnMut(&mut Vec<u8>, &str, &Value) -> bool,
) {
    out.push(b'{');
    let mut wrote_any = false;
    let mut field = |out: &mut Vec<u8>, name: &str, value: &Value| {
        let before = out.len();
        if wrote_any {
            out.push(b',');
        }
        if write_field(out, name, value) {
            wrote_any = true;
        } else {
            out.truncate(before);
        }
    };
    if map.keys().is_sorted() {
        for (name, value) in map {
            field(out, name, value);
        }
    } else {
        let mut entries: Vec<(&String, &Value)> = map.iter().collect();
        entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
        for (name, value) in entries {
            field(out, name, value);
        }
    }
    out.push(b'}');
}

/// `"name":value`; always writes, so it returns `true` for [`write_object`].
fn write_entry(out: &mut Vec<u8>, name: &str, write_value: impl FnOnce(&mut Vec<u8>)) -> bool {
    write_string(out, name, LineEndings::Keep);
    out.push(b':');
    write_value(out);
    true
}

/// One spelling per numeric value: `1`, `1.0` and `1e0` all become `1`.
fn write_number(out: &mut Vec<u8>, number: &serde_json::Number) {
    if let Some(n) = number.as_i64() {
        out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    } else if let Some(n) = number.as_u64() {
        out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    } else if let Some(f) = number.as_f64() {
        // Integral floats print as integers so they equal their integer
        // spelling (every f64 this large is integral); the rest use the
        // shortest round-trip form.
        const I64_END: f64 = 9_223_372_036_854_775_808.0; // 2^63
        const U64_END: f64 = 18_446_744_073_709_551_616.0; // 2^64
        if f.fract() == 0.0 && (-I64_END..I64_END).contains(&f) {
            out.extend_from_slice(itoa::Buffer::new().format(f as i64).as_bytes());
        } else if f.fract() == 0.0 && (0.0..U64_END).contains(&f) {
            out.extend_from_slice(itoa::Buffer::new().format(f as u64).as_bytes());
        } else {
            out.extend_from_slice(ryu::Buffer::new().format(f).as_bytes());
        }
    }
}

/// Whether a string's `\r\n` and lone `\r` are written as `\n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LineEndings {
    Keep,
    Unify,
}

/// A JSON string with exactly serde_json's escaping (one escape per character:
/// `\"`, `\\`, `\b`, `\f`, `\n`, `\r`, `\t`, else `\u00xx`), so keys are
/// stable across versions. Runs that need no escape are copied whole.
fn write_string(out: &mut Vec<u8>, text: &str, line_endings: LineEndings) {
    /// Bytes checked at once for anything to escape; a clean block is one copy.
    const BLOCK: usize = 16;
    let needs_escape = |b: u8| b < 0x20 || b == b'"' || b == b'\\';
    let bytes = text.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let mut copied = 0;
    let mut at = 0;
    while at < bytes.len() {
        if at + BLOCK <= bytes.len()
            && !bytes[at..at + BLOCK]
                .iter()
                .fold(false, |any, &b| any | needs_escape(b))
        {
            at += BLOCK;
            continue;
        }
        let b = bytes[at];
        if !needs_escape(b) {
            at += 1;
            continue;
        }
        out.extend_from_slice(&bytes[copied..at]);
        match b {
            b'\r' if line_endings == LineEndings::Unify => {
                // `\r\n` is one line ending: its `\n` is written next.
                if bytes.get(at + 1) != Some(&b'\n') {
                    out.extend_from_slice(b"\\n");
                }
            }
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            _ => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xf)]);
            }
        }
        at += 1;
        copied = at;
    }
    out.extend_from_slice(&bytes[copied..]);
    out.push(b'"');
}

/// `messages` with each message's text content normalized, and the `id` of
/// an item that carries its content inline left out where the format says so.
fn write_messages(
    out: &mut Vec<u8>,
    messages: &Value,
    normalization: Normalization,
    keying: &BodyKeying,
) {
    let Value::Array(items) = messages else {
        write_canonical(out, messages);
        return;
    };
    write_array(out, items, |out, message| match message {
        Value::Object(fields) => {
            let named_only = keying.leaves_out_item_id(fields, normalization.labels);
            write_object(out, fields, |out, name, value| {
                if named_only && name == "id" {
                    return false;
                }
                write_entry(out, name, |out| match value {
                    _ if name != keying.content => write_canonical(out, value),
                    Value::String(text) => write_text(out, text, Edges::BOTH, normalization),
                    Value::Array(parts) => write_parts(out, parts, normalization),
                    other => write_canonical(out, other),
                })
            })
        }
        other => write_canonical(out, other),
    });
}

/// Which edges of a piece of message text are trimmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Edges {
    start: bool,
    end: bool,
}

impl Edges {
    const BOTH: Self = Self {
        start: true,
        end: true,
    };

    fn trim(self, text: &str) -> &str {
        match (self.start, self.end) {
            (true, true) => text.trim(),
            (true, false) => text.trim_start(),
            (false, true) => text.trim_end(),
            (false, false) => text,
        }
    }
}

/// A message's content parts. The provider reads their text as one piece,
/// so only its outer edges are white space that never changes meaning: the
/// first text part's start and the last one's end. Trimming every part would
/// merge prompts that differ inside (`"def f():\n"` + `"    return 1"` and
/// `"def f():\n"` + `"return 1"`).
fn write_parts(out: &mut Vec<u8>, parts: &[Value], normalization: Normalization) {
    let is_text = |part: &Value| matches!(part.get("text"), Some(Value::String(_)));
    let first = parts.iter().position(is_text);
    let last = parts.iter().rposition(is_text);
    let mut at = 0;
    write_array(out, parts, |out, part| {
        let edges = Edges {
            start: Some(at) == first,
            end: Some(at) == last,
        };
        at += 1;
        write_content_part(out, part, edges, normalization)
    });
}

/// A content part; of any part, the `text` field is message text.
fn write_content_part(out: &mut Vec<u8>, part: &Value, edges: Edges, normalization: Normalization) {
    let Value::Object(fields) = part else {
        write_canonical(out, part);
        return;
    };
    write_object(out, fields, |out, name, value| {
        write_entry(out, name, |out| match value {
            Value::String(text) if name == "text" => write_text(out, text, edges, normalization),
            other => write_canonical(out, other),
        })
    });
}

/// Message text as a JSON string: trimmed at `edges`, line endings unified
/// (`\r\n` and `\r` become `\n`), folded to lower case when asked. Trimming
/// before unifying gives the same text (both line-ending characters are white
/// space), so only case folding needs a copy.
fn write_text(out: &mut Vec<u8>, text: &str, edges: Edges, normalization: Normalization) {
    let trimmed = edges.trim(text);
    if normalization.case_fold {
        write_string(out, &trimmed.to_lowercase(), LineEndings::Unify);
    } else {
        write_string(out, trimmed, LineEndings::Unify);
    }
}

#[cfg(test)]
impl CacheKey {
    /// A chat-completions key of `body` in `scope`, for unit tests of the
    /// layers that store by key.
    pub(crate) fn for_tests(scope: TenantScope, body: &[u8]) -> Self {
        let fingerprint = Fingerprint::of(&KeyInput {
            endpoint: Endpoint::ChatCompletions,
            upstream: "u",
            scope: &scope,
            headers: &[],
            query: &[],
            body,
        });
        Self { scope, fingerprint }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    /// The canonical form as first written: a normalized copy of `messages`,
    /// then serde_json's own string escaping. The one-pass writer must match
    /// it byte for byte, or every stored key would change.
    fn reference_canonical(body: &Map<String, Value>, normalization: Normalization) -> Vec<u8> {
        fn text(text: &str, normalization: Normalization) -> String {
            let unified = text.replace("\r\n", "\n").replace('\r', "\n");
            let trimmed = unified.trim();
            if normalization.case_fold {
                trimmed.to_lowercase()
            } else {
                trimmed.to_owned()
            }
        }
        fn value(out: &mut Vec<u8>, item: &Value) {
            match item {
                Value::String(s) => serde_json::to_writer(&mut *out, s).unwrap(),
                Value::Array(items) => {
                    out.push(b'[');
                    for (i, item) in items.iter().enumerate() {
                        if i > 0 {
                            out.push(b',');
                        }
                        value(out, item);
                    }
                    out.push(b']');
                }
                Value::Object(map) => {
                    let mut entries: Vec<_> = map.iter().collect();
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                    out.push(b'{');
                    for (i, (name, item)) in entries.into_iter().enumerate() {
                        if i > 0 {
                            out.push(b',');
                        }
                        serde_json::to_writer(&mut *out, name).unwrap();
                        out.push(b':');
                        value(out, item);
                    }
                    out.push(b'}');
                }
                other => write_canonical(out, other),
            }
        }
        let mut body = body.clone();
        body.retain(|name, _| !BodyKeying::OPENAI.leaves_out(name, normalization.labels));
        if let Some(Value::Array(messages)) = body.get_mut("messages") {
            for message in messages {
                match message.get_mut("content") {
                    Some(Value::String(s)) => *s = text(s, normalization),
                    Some(Value::Array(parts)) => {
                        // One piece of text: only its outer edges are trimmed,
                        // the first text part's start and the last one's end.
                        let texts: Vec<usize> = (0..parts.len())
                            .filter(|&i| matches!(parts[i].get("text"), Some(Value::String(_))))
                            .collect();
                        for (n, &i) in texts.iter().enumerate() {
                            let Some(Value::String(s)) = parts[i].get_mut("text") else {
                                continue;
                            };
                            let unified = s.replace("\r\n", "\n").replace('\r', "\n");
                            let mut piece = unified.as_str();
                            if n == 0 {
                                piece = piece.trim_start();
                            }
                            if n + 1 == texts.len() {
                                piece = piece.trim_end();
                            }
                            *s = if normalization.case_fold {
                                piece.to_lowercase()
                            } else {
                                piece.to_owned()
                            };
                        }
                    }
                    _ => {}
                }
            }
        }
        let mut out = Vec::new();
        value(&mut out, &Value::Object(body));
        out
    }

    /// Text rich in what the writer treats specially: escapes, control
    /// characters, line endings (`\r\n` pairs included), Unicode white space.
    pub(crate) fn any_text() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::{prelude::*, string::string_regex};
        prop_oneof![
            string_regex("[ a-zA-Z\r\n\t\"\\\\\u{0}-\u{1f}\u{7f}é\u{2028}\u{3000}😀]{0,40}")
                .unwrap(),
            string_regex("(\r\n|\r|\n| |\u{a0}|x|\"|\\\\|é){0,40}").unwrap(),
        ]
    }

    /// Any JSON value, nested, with [`any_text`] strings and the keys message
    /// normalization looks at (`content`, `text`) among the others.
    pub(crate) fn any_json() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            any_text().prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map(
                    prop_oneof![
                        Just("content".to_owned()),
                        Just("text".to_owned()),
                        any_text()
                    ],
                    inner,
                    0..6
                )
                .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        #[test]
        fn the_one_pass_writer_matches_the_reference_byte_for_byte(
            extra in any_json(),
            messages in proptest::collection::vec(any_json(), 0..5),
            texts in proptest::collection::vec(any_text(), 0..4),
            case_fold in proptest::bool::ANY,
        ) {
            // Messages whose content is a string, parts, or anything at all.
            let mut messages = messages;
            for (i, text) in texts.into_iter().enumerate() {
                messages.push(match i % 2 {
                    0 => json!({"role": "user", "content": text}),
                    _ => json!({"role": "user", "content": [{"type": "text", "text": text}, {"text": 1}]}),
                });
            }
            let body = json!({"model": "m", "user": "u", "stream": true, "extra": extra, "messages": messages});
            let body = body.as_object().unwrap();
            let normalization = Normalization {
                case_fold,
                ..Normalization::default()
            };
            proptest::prop_assert_eq!(
                String::from_utf8(canonical_body(body, normalization)).unwrap(),
                String::from_utf8(reference_canonical(body, normalization)).unwrap()
            );
        }

        #[test]
        fn strings_are_escaped_exactly_as_serde_json_does(text in any_text()) {
            let mut ours = Vec::new();
            write_string(&mut ours, &text, LineEndings::Keep);
            proptest::prop_assert_eq!(ours, serde_json::to_vec(&text).unwrap());
        }
    }

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

    /// K2: parts are one piece of text. Its outer white space is trimmed,
    /// the white space between and inside parts (indentation) is meaning.
    #[test]
    fn text_parts_are_trimmed_at_the_outer_edges_only() {
        let parts = |first: &str, second: &str| {
            canonical(json!({"model":"m","messages":[{"role":"user","content":[
                {"type":"text","text":first},{"type":"text","text":second}]}]}))
        };
        assert_ne!(
            parts("def f():\n", "    return 1"),
            parts("def f():\n", "return 1"),
            "indentation inside the prompt is not white space to trim"
        );
        assert_ne!(parts("a ", "b"), parts("a", "b"), "a space between parts");
        assert_eq!(
            parts("  def f():\n", "    return 1\n\n"),
            parts("def f():\n", "    return 1"),
            "the outer edges are trimmed"
        );
        // Gemini's parts: the same rule.
        let gemini = |first: &str, second: &str| {
            let body =
                json!({"contents":[{"role":"user","parts":[{"text":first},{"text":second}]}]});
            String::from_utf8(canonical_body_with(
                body.as_object().unwrap(),
                Normalization::default(),
                &BodyKeying {
                    messages: Some("contents"),
                    content: "parts",
                    ..BodyKeying::OPENAI
                },
            ))
            .unwrap()
        };
        assert_ne!(gemini("x\n", "  y"), gemini("x\n", "y"));
        // A lone part, a string content: trimmed at both ends as before.
        let lone = |text: &str| {
            canonical(json!({"model":"m","messages":[{"role":"user","content":[
                {"type":"text","text":text}]}]}))
        };
        assert_eq!(lone("  hi \n"), lone("hi"));
    }

    #[test]
    fn case_folding_is_opt_in() {
        let body = json!({"model":"m","messages":[{"role":"user","content":"Hello"}]});
        let plain = canonical_body(body.as_object().unwrap(), Normalization::default());
        let folded = canonical_body(
            body.as_object().unwrap(),
            Normalization {
                case_fold: true,
                ..Normalization::default()
            },
        );
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
