//! Input limits a request body must pass before anything else reads it: JSON
//! nesting depth, duplicate object keys, the number of messages, and the types
//! of the fields corral and the provider interpret. Each failure is a clear
//! 400 naming the problem (and the field, where there is one); nothing goes
//! upstream and nothing is cached.
//!
//! Duplicate keys matter beyond tidiness: `serde_json` keeps the last value,
//! a provider may keep the first, and then the fingerprint would describe a
//! request other than the one answered. Invalid UTF-8 and numbers out of range
//! (`1e999999`) are refused by `serde_json` itself, before this module runs.

use std::collections::HashSet;

use serde::de::{DeserializeSeed, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::{config::LimitsConfig, error::GatewayError, fingerprint::Endpoint};

/// The limits a body is checked against (from `limits`).
#[derive(Debug, Clone, Copy)]
pub struct InputLimits {
    pub max_json_depth: usize,
    pub max_messages: usize,
}

impl From<&LimitsConfig> for InputLimits {
    fn from(limits: &LimitsConfig) -> Self {
        Self {
            max_json_depth: limits.max_json_depth,
            max_messages: limits.max_messages,
        }
    }
}

/// Walks the raw JSON once, without building it: depth and duplicate keys.
/// Syntax errors are left to the real parse, which reports them better.
pub fn check_structure(raw: &[u8], limits: InputLimits) -> Result<(), GatewayError> {
    let mut deserializer = serde_json::Deserializer::from_slice(raw);
    match (Walk {
        depth: 0,
        max_depth: limits.max_json_depth,
    })
    .deserialize(&mut deserializer)
    {
        Ok(()) => Ok(()),
        Err(err) if err.is_data() => Err(GatewayError::invalid(err.to_string())),
        // Syntax, EOF or I/O: the parse that follows says what is wrong.
        Err(_) => Ok(()),
    }
}

struct Walk {
    depth: usize,
    max_depth: usize,
}

impl Walk {
    fn deeper<E: serde::de::Error>(&self) -> Result<Walk, E> {
        if self.depth >= self.max_depth {
            return Err(E::custom(format!(
                "the request body nests deeper than {} levels",
                self.max_depth
            )));
        }
        Ok(Walk {
            depth: self.depth + 1,
            max_depth: self.max_depth,
        })
    }
}

impl<'de> DeserializeSeed<'de> for Walk {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: serde::de::Error>(self, value: f64) -> Result<(), E> {
        if value.is_finite() {
            Ok(())
        } else {
            Err(E::custom("a number in the request body is out of range"))
        }
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_borrowed_str<E>(self, _: &'de str) -> Result<(), E> {
        Ok(())
    }
    fn visit_string<E>(self, _: String) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_none<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let inner = self.deeper()?;
        while seq
            .next_element_seed(Walk {
                depth: inner.depth,
                max_depth: inner.max_depth,
            })?
            .is_some()
        {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let inner = self.deeper()?;
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if !seen.insert(key.clone().into_owned()) {
                return Err(A::Error::custom(format!(
                    "the request body has the key `{}` twice in one object",
                    shorten(&key)
                )));
            }
            map.next_value_seed(Walk {
                depth: inner.depth,
                max_depth: inner.max_depth,
            })?;
        }
        Ok(())
    }
}

/// Keys are echoed in errors; a hostile one is cut short.
fn shorten(text: &str) -> String {
    let mut short: String = text.chars().take(64).collect();
    if short.len() < text.len() {
        short.push('…');
    }
    short
}

/// What a top-level field must be, when present.
#[derive(Clone, Copy)]
enum Kind {
    Bool,
    Number,
    Integer,
    Text,
    TextOrArray,
    Array,
    Object,
}

impl Kind {
    fn accepts(self, value: &Value) -> bool {
        match self {
            Self::Bool => value.is_boolean(),
            Self::Number => value.is_number(),
            // `1.0` and `1e0` spell an integer too (the fingerprint treats them as one).
            Self::Integer => value
                .as_f64()
                .is_some_and(|n| n.is_finite() && n.fract() == 0.0),
            Self::Text => value.is_string(),
            Self::TextOrArray => value.is_string() || value.is_array(),
            Self::Array => value.is_array(),
            Self::Object => value.is_object(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Bool => "a boolean",
            Self::Number => "a number",
            Self::Integer => "an integer",
            Self::Text => "a string",
            Self::TextOrArray => "a string or an array",
            Self::Array => "an array",
            Self::Object => "an object",
        }
    }
}

/// Fields whose type the OpenAI API fixes. `null` is accepted for each (the
/// SDKs send it for "not given").
const FIELD_KINDS: &[(&str, Kind)] = &[
    ("stream", Kind::Bool),
    ("temperature", Kind::Number),
    ("top_p", Kind::Number),
    ("presence_penalty", Kind::Number),
    ("frequency_penalty", Kind::Number),
    ("max_tokens", Kind::Integer),
    ("max_completion_tokens", Kind::Integer),
    ("n", Kind::Integer),
    // A number, not only an integer: a provider may round it, and corral keys
    // every spelling exactly, so a fractional seed is merely its own entry.
    ("seed", Kind::Number),
    ("messages", Kind::Array),
    ("prompt", Kind::TextOrArray),
    ("input", Kind::TextOrArray),
    ("stop", Kind::TextOrArray),
    ("user", Kind::Text),
    ("tools", Kind::Array),
    ("response_format", Kind::Object),
    ("stream_options", Kind::Object),
];

/// Type and size checks on the parsed body.
pub fn check_fields(
    endpoint: Endpoint,
    body: &Map<String, Value>,
    limits: InputLimits,
) -> Result<(), GatewayError> {
    for (field, kind) in FIELD_KINDS {
        if let Some(value) = body.get(*field)
            && !value.is_null()
            && !kind.accepts(value)
        {
            return Err(GatewayError::invalid_param(
                field,
                format!("`{field}` must be {}", kind.name()),
            ));
        }
    }
    if let Some(Value::Array(messages)) = body.get("messages") {
        if endpoint == Endpoint::ChatCompletions && messages.len() > limits.max_messages {
            return Err(GatewayError::invalid_param(
                "messages",
                format!(
                    "`messages` has {} entries; the limit is {}",
                    messages.len(),
                    limits.max_messages
                ),
            ));
        }
        for (index, message) in messages.iter().enumerate() {
            let Some(message) = message.as_object() else {
                return Err(GatewayError::invalid_param(
                    "messages",
                    format!("`messages[{index}]` must be an object"),
                ));
            };
            if message.get("role").is_some_and(|role| !role.is_string()) {
                return Err(GatewayError::invalid_param(
                    "messages",
                    format!("`messages[{index}].role` must be a string"),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const LIMITS: InputLimits = InputLimits {
        max_json_depth: 8,
        max_messages: 3,
    };

    fn message(result: Result<(), GatewayError>) -> String {
        result.unwrap_err().to_string()
    }

    #[test]
    fn depth_and_duplicate_keys_are_refused() {
        assert!(check_structure(br#"{"a":[[[1]]]}"#, LIMITS).is_ok());
        let deep = format!("{}{}", "[".repeat(9), "]".repeat(9));
        assert!(message(check_structure(deep.as_bytes(), LIMITS)).contains("deeper than 8"));
        let twice = br#"{"model":"a","messages":[{"role":"user","role":"system"}]}"#;
        assert!(message(check_structure(twice, LIMITS)).contains("`role` twice"));
        // Escaped spellings of one key are one key.
        assert!(check_structure(br#"{"a":1,"\u0061":2}"#, LIMITS).is_err());
        // Syntax errors are the parser's to report.
        assert!(check_structure(b"{not json", LIMITS).is_ok());
    }

    #[test]
    fn field_types_and_message_counts_are_checked() {
        let body = |json: &str| -> Map<String, Value> { serde_json::from_str(json).unwrap() };
        let ok = body(
            r#"{"model":"m","temperature":0.2,"max_tokens":5,"stream":null,"messages":[{"role":"user","content":"x"}]}"#,
        );
        assert!(check_fields(Endpoint::ChatCompletions, &ok, LIMITS).is_ok());
        for (json, expected) in [
            (r#"{"temperature":"hot"}"#, "`temperature` must be a number"),
            (r#"{"max_tokens":1.5}"#, "`max_tokens` must be an integer"),
            (r#"{"stream":"yes"}"#, "`stream` must be a boolean"),
            (r#"{"messages":{}}"#, "`messages` must be an array"),
            (r#"{"messages":[1]}"#, "`messages[0]` must be an object"),
            (r#"{"messages":[{"role":5}]}"#, "`messages[0].role`"),
            (r#"{"messages":[{},{},{},{}]}"#, "the limit is 3"),
        ] {
            let error = message(check_fields(Endpoint::ChatCompletions, &body(json), LIMITS));
            assert!(error.contains(expected), "{json}: {error}");
        }
    }

    #[test]
    fn serde_json_refuses_what_this_module_leaves_to_it() {
        assert!(serde_json::from_slice::<Value>(b"{\"a\":1e999999}").is_err());
        assert!(serde_json::from_slice::<Value>(b"{\"a\":\"\xff\"}").is_err());
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = check_structure(&bytes, LIMITS);
        }
    }
}
