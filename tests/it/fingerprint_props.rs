//! Property tests of the fingerprint through `DedupRequest::parse`: what must
//! never change it (key order at every depth, whitespace, string escapes,
//! integer spelling, ignored fields) and what must always change it (every keyed
//! field, the endpoint, the tenant, keyed headers).
//!
//! Bodies are serialized by a small writer of our own rather than serde_json,
//! because serde_json always writes one layout: the point is to send the gateway
//! every spelling a client could produce of the same value.

use std::fmt::Write as _;

use corral::fingerprint::Endpoint;
use proptest::prelude::*;
use serde_json::{Map, Number, Value, json};

use crate::prompts_golden::{PromptRequest, fingerprint_of};

/// Integers are respelled (`n` as `n.0`, `ne0`, ...) below this magnitude, where
/// every spelling names the same f64; the large-integer tests at the end of
/// this file cover the rest of the range.
const RESPELL_LIMIT: i64 = 1 << 53;

const TENANT: Option<&str> = Some("sk-prop-tenant");

/// A small deterministic generator (SplitMix64) for layout choices, seeded by
/// proptest so a failing layout is reproduced from its seed.
struct Dice(u64);

impl Dice {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn one_in(&mut self, n: u64) -> bool {
        self.next() % n == 0
    }
}

/// How integers are spelled in the rendered JSON.
#[derive(Debug, Clone, Copy)]
enum IntSpelling {
    /// `42`
    Plain,
    /// `42.0`, `42.000`
    Fraction,
    /// `42e0`, `42E+0`, `42e-0`, `42.0e0`
    Exponent,
    /// Any of the above, chosen per number.
    Mixed,
}

/// Renders `value` as valid JSON with object keys shuffled at every level,
/// random insignificant whitespace between tokens, random (valid) string
/// escapes, and integers spelled as `ints` says.
fn render(value: &Value, seed: u64, ints: IntSpelling) -> String {
    let mut writer = Writer {
        dice: Dice(seed),
        ints,
        out: String::new(),
    };
    writer.space();
    writer.value(value);
    writer.space();
    writer.out
}

struct Writer {
    dice: Dice,
    ints: IntSpelling,
    out: String,
}

impl Writer {
    /// Zero to three of the four JSON whitespace characters.
    fn space(&mut self) {
        if self.dice.one_in(2) {
            return;
        }
        for _ in 0..=self.dice.below(3) {
            let c = [' ', '\t', '\n', '\r'][self.dice.below(4)];
            self.out.push(c);
        }
    }

    fn value(&mut self, value: &Value) {
        match value {
            Value::Null => self.out.push_str("null"),
            Value::Bool(true) => self.out.push_str("true"),
            Value::Bool(false) => self.out.push_str("false"),
            Value::Number(number) => self.number(number),
            Value::String(text) => self.string(text),
            Value::Array(items) => {
                self.out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        self.out.push(',');
                    }
                    self.space();
                    self.value(item);
                    self.space();
                }
                if items.is_empty() {
                    self.space();
                }
                self.out.push(']');
            }
            Value::Object(map) => {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                // Fisher-Yates.
                for i in (1..entries.len()).rev() {
                    let j = self.dice.below(i + 1);
                    entries.swap(i, j);
                }
                self.out.push('{');
                for (i, (name, item)) in entries.iter().enumerate() {
                    if i > 0 {
                        self.out.push(',');
                    }
                    self.space();
                    self.string(name);
                    self.space();
                    self.out.push(':');
                    self.space();
                    self.value(item);
                    self.space();
                }
                if entries.is_empty() {
                    self.space();
                }
                self.out.push('}');
            }
        }
    }

    fn number(&mut self, number: &Number) {
        // Only integer-backed numbers are respelled; a float keeps serde_json's
        // spelling, so both renderings parse to the very same f64.
        let Some(n) = number.as_i64().filter(|n| n.abs() < RESPELL_LIMIT) else {
            write!(self.out, "{number}").expect("writing to a String cannot fail");
            return;
        };
        let spelling = match self.ints {
            IntSpelling::Mixed => [
                IntSpelling::Plain,
                IntSpelling::Fraction,
                IntSpelling::Exponent,
            ][self.dice.below(3)],
            other => other,
        };
        let suffix = match spelling {
            IntSpelling::Plain | IntSpelling::Mixed => "",
            IntSpelling::Fraction => [".0", ".000"][self.dice.below(2)],
            IntSpelling::Exponent => ["e0", "E+0", "e-0", ".0e0"][self.dice.below(4)],
        };
        write!(self.out, "{n}{suffix}").expect("writing to a String cannot fail");
    }

    fn string(&mut self, text: &str) {
        self.out.push('"');
        for c in text.chars() {
            let short = match c {
                '"' => Some("\\\""),
                '\\' => Some("\\\\"),
                '\n' => Some("\\n"),
                '\r' => Some("\\r"),
                '\t' => Some("\\t"),
                '\u{8}' => Some("\\b"),
                '\u{c}' => Some("\\f"),
                '/' => Some("\\/"),
                _ => None,
            };
            let must_escape = c == '"' || c == '\\' || c < ' ';
            if must_escape || self.dice.one_in(4) {
                match short {
                    Some(escape) if self.dice.one_in(2) => self.out.push_str(escape),
                    _ => self.unicode_escape(c),
                }
            } else {
                self.out.push(c);
            }
        }
        self.out.push('"');
    }

    /// `\uXXXX`, as a surrogate pair beyond the BMP, hex digits in either case.
    fn unicode_escape(&mut self, c: char) {
        let mut units = [0u16; 2];
        for unit in c.encode_utf16(&mut units) {
            if self.dice.one_in(2) {
                write!(self.out, "\\u{unit:04X}")
            } else {
                write!(self.out, "\\u{unit:04x}")
            }
            .expect("writing to a String cannot fail");
        }
    }
}

/// Arbitrary text, weighted towards the characters normalization cares about.
fn text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        6 => any::<char>(),
        3 => prop::char::range('a', 'z'),
        1 => Just(' '),
        1 => Just('\n'),
        1 => Just('\r'),
        1 => Just('\t'),
        1 => Just('"'),
        1 => Just('\\'),
    ];
    prop::collection::vec(piece, 0..24).prop_map(String::from_iter)
}

/// An integer `Writer` may respell.
fn respellable_int() -> impl Strategy<Value = i64> {
    -(RESPELL_LIMIT - 1)..RESPELL_LIMIT
}

/// Any JSON value, nested up to three levels.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        respellable_int().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| Number::from_f64(f).map(Value::Number)),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 32, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(text(), inner, 0..4)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

/// A chat message: string content or text parts, sometimes with extra nested data.
fn message() -> impl Strategy<Value = Value> {
    let content = prop_oneof![
        text().prop_map(Value::String),
        prop::collection::vec(text(), 1..3).prop_map(|texts| {
            texts
                .into_iter()
                .map(|text| json!({"type": "text", "text": text}))
                .collect()
        }),
    ];
    (
        prop::sample::select(vec!["system", "user", "assistant", "tool"]),
        content,
        prop::option::of(json_value()),
    )
        .prop_map(|(role, content, meta)| {
            let mut message = json!({"role": role, "content": content});
            if let Some(meta) = meta {
                message["x_meta"] = meta;
            }
            message
        })
}

fn tool() -> impl Strategy<Value = Value> {
    ("[a-z_]{1,12}", json_value()).prop_map(|(name, parameters)| {
        json!({"type": "function", "function": {"name": name, "parameters": parameters}})
    })
}

prop_compose! {
    /// A chat body with every keyed field sometimes present, plus unknown
    /// `x_*` fields holding arbitrary nested JSON.
    fn chat_body()(
        model in prop_oneof![
            prop::sample::select(vec!["gpt-4o-mini", "gpt-4o"]).prop_map(str::to_owned),
            "[a-z0-9.-]{1,20}",
        ],
        messages in prop::collection::vec(message(), 1..5),
        temperature in prop::option::of(prop_oneof![Just(0.0), 0.0..2.0f64]),
        max_tokens in prop::option::of(1..100_000i64),
        seed in prop::option::of(any::<i64>()),
        tools in prop::option::of(prop::collection::vec(tool(), 1..3)),
        extras in prop::collection::btree_map("x_[a-z_]{1,8}", json_value(), 0..3),
    ) -> Map<String, Value> {
        let mut body = Map::new();
        body.insert("model".to_owned(), model.into());
        body.insert("messages".to_owned(), messages.into());
        if let Some(temperature) = temperature {
            body.insert("temperature".to_owned(), temperature.into());
        }
        if let Some(max_tokens) = max_tokens {
            body.insert("max_tokens".to_owned(), max_tokens.into());
        }
        if let Some(seed) = seed {
            body.insert("seed".to_owned(), seed.into());
        }
        if let Some(tools) = tools {
            body.insert("tools".to_owned(), tools.into());
        }
        body.extend(extras);
        body
    }
}

fn tenant() -> impl Strategy<Value = Option<String>> {
    prop::option::of("sk-[A-Za-z0-9_-]{1,40}")
}

fn request(
    endpoint: Endpoint,
    tenant: Option<&str>,
    headers: &[(&str, &str)],
    raw: String,
) -> PromptRequest {
    PromptRequest {
        endpoint,
        tenant: tenant.map(str::to_owned),
        headers: headers
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect(),
        query: None,
        raw,
    }
}

fn chat_fingerprint(tenant: Option<&str>, headers: &[(&str, &str)], raw: String) -> String {
    fingerprint_of(&request(Endpoint::ChatCompletions, tenant, headers, raw))
}

fn compact(body: &Map<String, Value>) -> String {
    Value::Object(body.clone()).to_string()
}

/// One keyed field to change.
#[derive(Debug, Clone)]
enum Change {
    Model,
    /// One character of one message's text (the first text part for parts).
    Content {
        message: usize,
        at: usize,
    },
    Temperature,
    MaxTokens,
    Seed,
    Tools,
    /// An unknown `x_*` field: changed if present, added if not.
    Extra,
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        Just(Change::Model),
        (any::<usize>(), any::<usize>()).prop_map(|(message, at)| Change::Content { message, at }),
        Just(Change::Temperature),
        Just(Change::MaxTokens),
        Just(Change::Seed),
        Just(Change::Tools),
        Just(Change::Extra),
    ]
}

/// Replaces the character at `at` (modulo the length) with a different
/// non-whitespace one. Normalization only trims and rewrites whitespace, so the
/// normalized text changes too.
fn change_one_char(text: &mut String, at: usize) {
    let mut chars: Vec<char> = text.chars().collect();
    if chars.is_empty() {
        text.push('a');
        return;
    }
    let i = at % chars.len();
    chars[i] = if chars[i] == 'a' { 'b' } else { 'a' };
    *text = chars.into_iter().collect();
}

/// Every message text with CRLF line endings and random whitespace around it:
/// the same text after trimming and unifying line endings.
fn respace_messages(body: &mut Map<String, Value>, seed: u64) {
    let mut dice = Dice(seed);
    let pad = |dice: &mut Dice| -> String {
        (0..dice.below(4))
            .map(|_| [' ', '\t', '\n', '\r'][dice.below(4)])
            .collect()
    };
    // Padding goes only where the text as a whole begins or ends: parts are
    // one piece of text, and white space between them is meaning (K2).
    let mut respace = |text: &mut String, start: bool, end: bool| {
        let unified = text.replace("\r\n", "\n").replace('\r', "\n");
        let left = if start { pad(&mut dice) } else { String::new() };
        let right = if end { pad(&mut dice) } else { String::new() };
        *text = format!("{left}{}{right}", unified.replace('\n', "\r\n"));
    };
    let Some(Value::Array(messages)) = body.get_mut("messages") else {
        unreachable!("chat_body always has messages")
    };
    for message in messages {
        match &mut message["content"] {
            Value::String(text) => respace(text, true, true),
            Value::Array(parts) => {
                let texts: Vec<usize> = (0..parts.len())
                    .filter(|&i| parts[i]["text"].is_string())
                    .collect();
                for (n, &i) in texts.iter().enumerate() {
                    if let Value::String(text) = &mut parts[i]["text"] {
                        respace(text, n == 0, n + 1 == texts.len());
                    }
                }
            }
            _ => {}
        }
    }
}

fn apply(body: &mut Map<String, Value>, change: &Change) {
    match change {
        Change::Model => {
            let Some(Value::String(model)) = body.get_mut("model") else {
                unreachable!("chat_body always has a model")
            };
            model.push('x');
        }
        Change::Content { message, at } => {
            let Some(Value::Array(messages)) = body.get_mut("messages") else {
                unreachable!("chat_body always has messages")
            };
            let count = messages.len();
            let text = match &mut messages[message % count]["content"] {
                Value::String(text) => text,
                Value::Array(parts) => match &mut parts[0]["text"] {
                    Value::String(text) => text,
                    other => unreachable!("text part without text: {other}"),
                },
                other => unreachable!("unexpected content {other}"),
            };
            change_one_char(text, *at);
        }
        Change::Temperature => {
            let next = body
                .get("temperature")
                .and_then(Value::as_f64)
                .map_or(0.5, |t| t + 0.25);
            body.insert("temperature".to_owned(), next.into());
        }
        Change::MaxTokens => {
            let next = body
                .get("max_tokens")
                .and_then(Value::as_i64)
                .map_or(16, |n| n + 1);
            body.insert("max_tokens".to_owned(), next.into());
        }
        Change::Seed => {
            let next = body
                .get("seed")
                .and_then(Value::as_i64)
                .map_or(7, |n| n.wrapping_add(1));
            body.insert("seed".to_owned(), next.into());
        }
        Change::Tools => match body.get_mut("tools") {
            Some(Value::Array(tools)) => {
                let Some(Value::String(name)) = tools[0].pointer_mut("/function/name") else {
                    unreachable!("tool() always names its function")
                };
                name.push_str("_v2");
            }
            _ => {
                body.insert(
                    "tools".to_owned(),
                    json!([{"type": "function", "function": {"name": "lookup"}}]),
                );
            }
        },
        Change::Extra => {
            match body.iter_mut().find(|(name, _)| name.starts_with("x_")) {
                // Wrapping in an array changes the value at any depth of nesting.
                Some((_, value)) => *value = Value::Array(vec![value.take()]),
                None => {
                    body.insert("x_added".to_owned(), Value::Null);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn fingerprint_ignores_key_order_whitespace_and_escapes(
        body in chat_body(),
        layout_a in any::<u64>(),
        layout_b in any::<u64>(),
    ) {
        let expected = chat_fingerprint(TENANT, &[], compact(&body));
        let body = Value::Object(body);
        for layout in [layout_a, layout_b] {
            let raw = render(&body, layout, IntSpelling::Plain);
            prop_assert_eq!(chat_fingerprint(TENANT, &[], raw.clone()), expected.clone(), "raw: {}", raw);
        }
    }

    #[test]
    fn fingerprint_ignores_integer_spelling(
        body in chat_body(),
        n in respellable_int(),
        layout in any::<u64>(),
    ) {
        let mut body = body;
        // At least one integer at the top level and one deep inside an unknown field.
        body.insert("seed".to_owned(), n.into());
        body.insert("x_numbers".to_owned(), json!({"deep": [n, {"n": n}]}));
        let body = Value::Object(body);
        let expected = chat_fingerprint(TENANT, &[], render(&body, layout, IntSpelling::Plain));
        for spelling in [IntSpelling::Fraction, IntSpelling::Exponent, IntSpelling::Mixed] {
            let raw = render(&body, layout, spelling);
            prop_assert_eq!(chat_fingerprint(TENANT, &[], raw.clone()), expected.clone(), "raw: {}", raw);
        }
    }

    #[test]
    fn fingerprint_ignores_surrounding_whitespace_and_line_endings_of_message_text(
        body in chat_body(),
        seed in any::<u64>(),
    ) {
        let mut respaced = body.clone();
        respace_messages(&mut respaced, seed);
        prop_assert_eq!(
            chat_fingerprint(TENANT, &[], compact(&body)),
            chat_fingerprint(TENANT, &[], compact(&respaced)),
            "respaced: {:?}", respaced
        );
    }

    #[test]
    fn fingerprint_changes_with_every_keyed_field(body in chat_body(), change in change()) {
        let mut changed = body.clone();
        apply(&mut changed, &change);
        prop_assert_ne!(
            chat_fingerprint(TENANT, &[], compact(&body)),
            chat_fingerprint(TENANT, &[], compact(&changed)),
            "{:?} left the fingerprint unchanged", change
        );
    }

    #[test]
    fn fingerprint_ignores_user_stream_and_request_id(
        body in chat_body(),
        user in prop::option::of(text()),
        stream in prop::option::of(any::<bool>()),
        include_usage in prop::option::of(any::<bool>()),
        request_id in prop::option::of("[a-z0-9_]{0,16}"),
    ) {
        let mut variant = body.clone();
        if let Some(user) = user {
            variant.insert("user".to_owned(), user.into());
        }
        if let Some(stream) = stream {
            variant.insert("stream".to_owned(), stream.into());
        }
        if let Some(include_usage) = include_usage {
            variant.insert("stream_options".to_owned(), json!({"include_usage": include_usage}));
        }
        if let Some(request_id) = request_id {
            variant.insert("request_id".to_owned(), request_id.into());
        }
        prop_assert_eq!(
            chat_fingerprint(TENANT, &[], compact(&body)),
            chat_fingerprint(TENANT, &[], compact(&variant))
        );
    }

    #[test]
    fn fingerprint_changes_with_the_tenant(body in chat_body(), a in tenant(), b in tenant()) {
        prop_assume!(a != b);
        prop_assert_ne!(
            chat_fingerprint(a.as_deref(), &[], compact(&body)),
            chat_fingerprint(b.as_deref(), &[], compact(&body))
        );
    }

    #[test]
    fn fingerprint_changes_with_openai_organization(
        body in chat_body(),
        tenant in tenant(),
        a in prop::option::of("org-[A-Za-z0-9]{1,24}"),
        b in prop::option::of("org-[A-Za-z0-9]{1,24}"),
    ) {
        prop_assume!(a != b);
        let a: Vec<(&str, &str)> = a.iter().map(|org| ("openai-organization", org.as_str())).collect();
        let b: Vec<(&str, &str)> = b.iter().map(|org| ("openai-organization", org.as_str())).collect();
        prop_assert_ne!(
            chat_fingerprint(tenant.as_deref(), &a, compact(&body)),
            chat_fingerprint(tenant.as_deref(), &b, compact(&body))
        );
    }

    #[test]
    fn fingerprint_changes_with_the_endpoint(body in chat_body()) {
        let raw = compact(&body);
        let chat = fingerprint_of(&request(Endpoint::ChatCompletions, TENANT, &[], raw.clone()));
        let completions = fingerprint_of(&request(Endpoint::Completions, TENANT, &[], raw.clone()));
        let embeddings = fingerprint_of(&request(Endpoint::Embeddings, TENANT, &[], raw));
        prop_assert_ne!(&chat, &completions);
        prop_assert_ne!(&chat, &embeddings);
        prop_assert_ne!(&completions, &embeddings);
    }
}

/// Fingerprint of `{"model":"gpt-4o-mini","seed":<spelling>,"messages":[]}`.
fn seed_fingerprint(spelling: &str) -> String {
    chat_fingerprint(
        TENANT,
        &[],
        format!(r#"{{"model":"gpt-4o-mini","seed":{spelling},"messages":[]}}"#),
    )
}

/// Integer spellings beyond [`RESPELL_LIMIT`]. `write_number` canonicalizes the
/// f64 serde_json parsed, and serde_json's default float parser is only
/// best-effort: `1848205781038441.0` becomes 1848205781038440.8. Integral floats
/// from 2^53 up also keep a float spelling (`9007199254740992.0`), unlike the
/// integer they equal.
#[test]
fn fingerprint_ignores_the_spelling_of_large_integers() {
    for n in [1_848_205_781_038_441_i64, (1 << 53) - 1, 1 << 53, 1 << 60] {
        let expected = seed_fingerprint(&n.to_string());
        for suffix in [".0", "e0"] {
            assert_eq!(
                seed_fingerprint(&format!("{n}{suffix}")),
                expected,
                "{n}{suffix}"
            );
        }
    }
}

/// Two different numbers must never share a key: today `1848205781038441.0`
/// and `1848205781038440.8` both canonicalize to `1848205781038440.8`, so one
/// caller could be served the answer to the other's request.
#[test]
fn fingerprint_separates_numbers_that_differ_in_the_last_digit() {
    assert_ne!(
        seed_fingerprint("1848205781038441.0"),
        seed_fingerprint("1848205781038440.8")
    );
}

/// A bearer token that is not visible ASCII fails `HeaderValue::to_str`, so
/// `DedupRequest::parse` treats its caller as anonymous, while the header itself
/// is still forwarded upstream: two such callers, and every caller without a
/// token, share one cache scope.
#[test]
fn fingerprint_separates_tenants_whose_token_is_not_ascii() {
    use axum::http::{HeaderMap, HeaderValue, header};
    use corral::{config::Config, request::DedupRequest, upstream::Routes};

    let config = Config::for_tests("http://127.0.0.1:1/v1");
    let routes = Routes::new(&config.upstreams);
    let names: Vec<String> = config.upstreams.iter().map(|u| u.name.clone()).collect();
    let fingerprint = |token: Option<&[u8]>| {
        let mut headers = HeaderMap::new();
        if let Some(token) = token {
            let value = HeaderValue::from_bytes(token).expect("obs-text is a valid header value");
            headers.insert(header::AUTHORIZATION, value);
        }
        DedupRequest::parse(
            Endpoint::ChatCompletions,
            &headers,
            None,
            r#"{"model":"gpt-4o-mini","temperature":0,"messages":[]}"#.into(),
            &routes,
            &names,
            &config.cache,
        )
        .expect("a valid request")
        .fingerprint
    };
    let anonymous = fingerprint(None);
    let a = fingerprint(Some(b"Bearer sk-\xffaaa"));
    let b = fingerprint(Some(b"Bearer sk-\xfebbb"));
    assert_ne!(a, b);
    assert_ne!(a, anonymous);
}
