//! The parse of a request body and the input limits it must pass before
//! anything else reads it: JSON nesting depth and duplicate object keys (checked
//! while parsing, in the same pass), the number of messages, and the types
//! of the fields corral and the provider interpret. Each failure is a clear
//! 400 naming the problem (and the field, where there is one); nothing goes
//! upstream and nothing is cached.
//!
//! Duplicate keys matter beyond tidiness: `serde_json` keeps the last value,
//! a provider may keep the first, and then the fingerprint would describe a
//! request other than the one answered. Invalid UTF-8 and numbers out of range
//! (`1e999999`) are refused by `serde_json`'s parser, which this module drives.

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

/// Parses the body in one pass, refusing on the way what serde_json would let
/// through: nesting deeper than `max_json_depth` and a key twice in one object
/// (serde_json keeps the last). Those are data errors with their own message;
/// malformed JSON (syntax, end of input, trailing bytes) gets the parser's.
pub fn parse_json(raw: &[u8], limits: InputLimits) -> Result<Value, GatewayError> {
    let mut deserializer = serde_json::Deserializer::from_slice(raw);
    let parsed = (Walk {
        depth: 0,
        max_depth: limits.max_json_depth,
    })
    .deserialize(&mut deserializer)
    .and_then(|value| deserializer.end().map(|()| value));
    parsed.map_err(|err| {
        if err.is_data() {
            GatewayError::invalid(err.to_string())
        } else {
            GatewayError::invalid(format!(
                "We could not parse the JSON body of your request: {err}"
            ))
        }
    })
}

/// Builds a `Value` as serde_json's own visitor does, one nesting level at a time.
#[derive(Clone, Copy)]
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
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<Value, E> {
        Ok(Value::Bool(value))
    }
    fn visit_i64<E>(self, value: i64) -> Result<Value, E> {
        Ok(Value::from(value))
    }
    fn visit_u64<E>(self, value: u64) -> Result<Value, E> {
        Ok(Value::from(value))
    }
    fn visit_f64<E: serde::de::Error>(self, value: f64) -> Result<Value, E> {
        serde_json::Number::from_f64(value)
            .map(Value::Number)
            .ok_or_else(|| E::custom("a number in the request body is out of range"))
    }
    fn visit_str<E>(self, value: &str) -> Result<Value, E> {
        Ok(Value::String(value.to_owned()))
    }
    fn visit_string<E>(self, value: String) -> Result<Value, E> {
        Ok(Value::String(value))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let inner = self.deeper()?;
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(item) = seq.next_element_seed(inner)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let inner = self.deeper()?;
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(A::Error::custom(format!(
                    "the request body has the key `{}` twice in one object",
                    shorten(&key)
                )));
            }
            let value = map.next_value_seed(inner)?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
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
#[derive(Debug, Clone, Copy)]
pub enum Kind {
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

/// `body`'s fields of `kinds`, when present and not `null`, must be of their kind.
/// For the fields a wire format adds to the common ones.
pub fn check_kinds(
    body: &Map<String, Value>,
    kinds: &[(&'static str, Kind)],
) -> Result<(), GatewayError> {
    for (field, kind) in kinds {
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
    Ok(())
}

/// A conversation of no more than `limits.max_messages` messages.
pub fn check_message_count(messages: &[Value], limits: InputLimits) -> Result<(), GatewayError> {
    if messages.len() > limits.max_messages {
        return Err(GatewayError::invalid_param(
            "messages",
            format!(
                "`messages` has {} entries; the limit is {}",
                messages.len(),
                limits.max_messages
            ),
        ));
    }
    Ok(())
}

/// Type and size checks on the parsed body.
pub fn check_fields(
    endpoint: Endpoint,
    body: &Map<String, Value>,
    limits: InputLimits,
) -> Result<(), GatewayError> {
    check_kinds(body, FIELD_KINDS)?;
    if let Some(Value::Array(messages)) = body.get("messages") {
        if endpoint == Endpoint::ChatCompletions {
            check_message_count(messages, limits)?;
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

    fn message<T: std::fmt::Debug>(result: Result<T, GatewayError>) -> String {
        result.unwrap_err().to_string()
    }

    #[test]
    fn depth_and_duplicate_keys_are_refused() {
        assert!(parse_json(br#"{"a":[[[1]]]}"#, LIMITS).is_ok());
        let deep = format!("{}{}", "[".repeat(9), "]".repeat(9));
        assert!(message(parse_json(deep.as_bytes(), LIMITS)).contains("deeper than 8"));
        let twice = br#"{"model":"a","messages":[{"role":"user","role":"system"}]}"#;
        assert!(message(parse_json(twice, LIMITS)).contains("`role` twice"));
        // Escaped spellings of one key are one key.
        assert!(message(parse_json(br#"{"a":1,"\u0061":2}"#, LIMITS)).contains("`a` twice"));
        // Malformed JSON gets the parser's message, trailing bytes included.
        for bad in [&b"{not json"[..], b"{} {}", b"[1,]", b""] {
            assert!(
                message(parse_json(bad, LIMITS)).contains("could not parse"),
                "{bad:?}"
            );
        }
    }

    proptest! {
        /// What passes the checks is exactly what serde_json would have built.
        #[test]
        fn the_parse_is_serde_jsons_own(value in crate::fingerprint::tests::any_json()) {
            let raw = serde_json::to_vec(&value).unwrap();
            prop_assert_eq!(parse_json(&raw, InputLimits { max_json_depth: 64, max_messages: 0 }).unwrap(), value);
        }
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
            let _ = parse_json(&bytes, LIMITS);
        }
    }
}
