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
    let walk = Walk {
        depth: 0,
        max_depth: limits.max_json_depth,
    };
    // From text when the whole body is UTF-8 (one fast pass): parsing bytes,
    // serde_json checks every string again (about 2,700 instructions of a
    // chat request's miss). Bytes that are not UTF-8 are parsed as bytes,
    // so the error names where, as it always did.
    let parsed = match std::str::from_utf8(raw) {
        Ok(text) => walk_all(walk, &mut serde_json::Deserializer::from_str(text)),
        Err(_) => walk_all(walk, &mut serde_json::Deserializer::from_slice(raw)),
    };
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

/// One JSON value and nothing after it.
fn walk_all<'de, R: serde_json::de::Read<'de>>(
    walk: Walk,
    deserializer: &mut serde_json::Deserializer<R>,
) -> serde_json::Result<Value> {
    let value = walk.deserialize(&mut *deserializer)?;
    deserializer.end()?;
    Ok(value)
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

/// The fields whose type corral itself depends on, in every format: `stream`
/// decides how corral calls upstream and answers. The types of the fields
/// only the provider reads (`temperature`, `max_tokens`, roles, content
/// blocks, ...) are the provider's to check: corral is never stricter than
/// the provider it fronts, and relays its 400 as it came.
const FLAGS: &[&str] = &["stream"];

/// `body`'s `flags`, when present and not `null` (the SDKs' "not given"),
/// must be booleans: corral decides by them. For the flags a wire format adds
/// to the common ones.
pub fn check_flags(body: &Map<String, Value>, flags: &[&'static str]) -> Result<(), GatewayError> {
    for field in flags {
        if let Some(value) = body.get(*field)
            && !value.is_null()
            && !value.is_boolean()
        {
            return Err(GatewayError::invalid_param(
                field,
                format!("`{field}` must be a boolean"),
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

/// The checks every format shares: the types corral depends on, and the
/// bound on a conversation's length (what corral normalizes and hashes).
/// Nothing else: a message that is not an object, an unknown role or content
/// block, a field combination the provider refuses, all go to the provider.
pub fn check_fields(
    _endpoint: Endpoint,
    body: &Map<String, Value>,
    limits: InputLimits,
) -> Result<(), GatewayError> {
    check_flags(body, FLAGS)?;
    if let Some(Value::Array(messages)) = body.get("messages") {
        check_message_count(messages, limits)?;
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
    fn only_what_corral_reads_is_checked() {
        let body = |json: &str| -> Map<String, Value> { serde_json::from_str(json).unwrap() };
        let ok = body(
            r#"{"model":"m","temperature":0.2,"max_tokens":5,"stream":null,"messages":[{"role":"user","content":"x"}]}"#,
        );
        assert!(check_fields(Endpoint::ChatCompletions, &ok, LIMITS).is_ok());
        for (json, expected) in [
            (r#"{"stream":"yes"}"#, "`stream` must be a boolean"),
            (r#"{"messages":[{},{},{},{}]}"#, "the limit is 3"),
        ] {
            let error = message(check_fields(Endpoint::ChatCompletions, &body(json), LIMITS));
            assert!(error.contains(expected), "{json}: {error}");
        }
        // The provider's own rules are the provider's: passed on unchecked.
        for json in [
            r#"{"temperature":"hot"}"#,
            r#"{"max_tokens":1.5}"#,
            r#"{"messages":{}}"#,
            r#"{"messages":[1]}"#,
            r#"{"messages":[{"role":5}]}"#,
            r#"{"messages":[{"role":"system"},{"role":"narrator","content":[{"type":"hologram"}]}]}"#,
        ] {
            assert!(
                check_fields(Endpoint::ChatCompletions, &body(json), LIMITS).is_ok(),
                "{json}"
            );
        }
    }

    #[test]
    fn serde_json_refuses_what_this_module_leaves_to_it() {
        assert!(serde_json::from_slice::<Value>(b"{\"a\":1e999999}").is_err());
        assert!(serde_json::from_slice::<Value>(b"{\"a\":\"\xff\"}").is_err());
    }

    /// A body that is UTF-8 is parsed from text, one that is not from bytes:
    /// the same values and the same refusals either way.
    #[test]
    fn text_and_bytes_parse_alike() {
        for json in [
            "{\"a\":\"caf\\u00e9 \\\"q\\\" \\ud83d\\ude00\",\"b\":[1,2.5,-3,null,true],\"c\":{\"d\":\"\u{e9}\"}}".as_bytes(),
            br#"{"a":1}"#.as_slice(),
        ] {
            let text = std::str::from_utf8(json).unwrap();
            assert_eq!(
                parse_json(json, LIMITS).unwrap(),
                serde_json::from_str::<Value>(text).unwrap()
            );
        }
        let err = parse_json(b"{\"a\":\"\xff\"}", LIMITS).unwrap_err();
        assert!(
            err.to_string().contains("We could not parse the JSON body"),
            "{err}"
        );
        for refused in [&b"{\"a\":1,\"a\":2}"[..], b"{\"a\":1} x", b"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]"] {
            let mut bytes = refused.to_vec();
            let text_err = parse_json(&bytes, LIMITS).unwrap_err().to_string();
            // The same body with a byte that is not UTF-8 at its very end
            // (after the JSON it is trailing garbage) takes the bytes' path.
            bytes.push(0xff);
            let bytes_err = parse_json(&bytes, LIMITS).unwrap_err().to_string();
            assert_eq!(text_err, bytes_err, "{refused:?}");
        }
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = parse_json(&bytes, LIMITS);
        }
    }
}
