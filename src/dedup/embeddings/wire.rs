//! The embeddings wire format, by the item: a request's `input` split into
//! items (each keyed by itself and the request's other fields), the upstream
//! body for any subset of them, the provider's answer split back into one
//! stored vector per item, and the caller's answer assembled from stored
//! vectors in its own order and `encoding_format`.
//!
//! A stored vector keeps the provider's own representation: the base64 string
//! of little-endian f32s it sent a base64 caller, or the JSON numbers it sent a
//! float caller. Each caller gets its own encoding of it: a base64 string is
//! decoded to f32s, each printed as the shortest decimal that reads back as
//! that f32 (what providers send a float caller: `-0.0078`, not the f64
//! `-0.007799999788403511` it equals); floats become base64 as little-endian
//! f32s, as the provider itself encodes them.

use base64::{Engine as _, engine::general_purpose::STANDARD as BASE64};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{
    Items,
    distinct::{Distinct, item_key_body},
};
use crate::{
    config::LimitsConfig,
    error::GatewayError,
    fingerprint::{Normalization, canonical_body, write_canonical},
    usage::Usage,
};

/// Keeps item keys apart from every whole-request key: a canonical body
/// starts with `{`, never with this.
const ITEM_KEY_DOMAIN: &[u8] = b"corral-embedding-item\0";

/// How the caller wants its vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodingFormat {
    Float,
    Base64,
}

/// The bounds on a batch (`limits.max_embedding_inputs`, `limits.max_embedding_input_bytes`).
#[derive(Debug, Clone, Copy)]
pub struct ItemLimits {
    pub max_inputs: usize,
    pub max_input_bytes: usize,
}

impl From<&LimitsConfig> for ItemLimits {
    fn from(limits: &LimitsConfig) -> Self {
        Self {
            max_inputs: limits.max_embedding_inputs,
            max_input_bytes: limits.max_embedding_input_bytes,
        }
    }
}

/// An embeddings request taken apart into its distinct items.
#[derive(Debug)]
pub struct ItemizedRequest {
    /// The body without `input`: every upstream body is this plus its items.
    rest: Map<String, Value>,
    pub format: EncodingFormat,
    /// The distinct items, in the order first seen (the relative order upstream).
    items: Vec<Value>,
    /// Each item's canonical bytes (what it is keyed by).
    canonical_items: Vec<Vec<u8>>,
    /// For each of the caller's inputs, in its order, the item it is.
    pub slots: Vec<usize>,
    /// The canonical rest without `encoding_format`: every caller format shares an item.
    keyed_rest: Vec<u8>,
}

impl ItemizedRequest {
    /// Splits `input` into items; every client mistake is a 400 naming `input`.
    pub fn parse(body: &Map<String, Value>, limits: ItemLimits) -> Result<Self, GatewayError> {
        if matches!(body.get("stream"), Some(Value::Bool(true))) {
            return Err(GatewayError::invalid_param(
                "stream",
                "embeddings do not stream; leave `stream` out",
            ));
        }
        let format = match body.get("encoding_format") {
            None | Some(Value::Null) => EncodingFormat::Float,
            Some(Value::String(format)) if format == "float" => EncodingFormat::Float,
            Some(Value::String(format)) if format == "base64" => EncodingFormat::Base64,
            Some(_) => {
                return Err(GatewayError::invalid_param(
                    "encoding_format",
                    "`encoding_format` must be \"float\" or \"base64\"",
                ));
            }
        };
        let inputs: Vec<&Value> = match body.get("input") {
            None | Some(Value::Null) => {
                return Err(GatewayError::invalid_param(
                    "input",
                    "you must provide an input",
                ));
            }
            Some(text @ Value::String(_)) => vec![text],
            // One input given as token ids.
            Some(tokens @ Value::Array(list))
                if !list.is_empty() && list.iter().all(Value::is_number) =>
            {
                vec![tokens]
            }
            Some(Value::Array(list)) => list.iter().collect(),
            Some(_) => {
                return Err(GatewayError::invalid_param(
                    "input",
                    "`input` must be a string, an array of strings or an array of token arrays",
                ));
            }
        };
        if inputs.is_empty() {
            return Err(GatewayError::invalid_param(
                "input",
                "`input` must not be empty",
            ));
        }
        if inputs.len() > limits.max_inputs {
            return Err(GatewayError::invalid_param(
                "input",
                format!(
                    "`input` has {} items; the limit is {}",
                    inputs.len(),
                    limits.max_inputs
                ),
            ));
        }
        let mut distinct = Distinct::with_capacity(inputs.len());
        for (index, input) in inputs.into_iter().enumerate() {
            let valid = match input {
                Value::String(_) => true,
                Value::Array(tokens) => tokens.iter().all(|token| token.as_u64().is_some()),
                _ => false,
            };
            if !valid {
                return Err(GatewayError::invalid_param(
                    "input",
                    format!("`input[{index}]` must be a string or an array of token ids"),
                ));
            }
            let mut canonical = Vec::new();
            write_canonical(&mut canonical, input);
            if canonical.len() > limits.max_input_bytes {
                return Err(GatewayError::invalid_param(
                    "input",
                    format!(
                        "`input[{index}]` is {} bytes; the limit is {}",
                        canonical.len(),
                        limits.max_input_bytes
                    ),
                ));
            }
            distinct.push(canonical, || input.clone());
        }
        let mut rest = body.clone();
        rest.remove("input");
        let mut keyed = rest.clone();
        keyed.remove("encoding_format");
        let keyed_rest = canonical_body(&keyed, Normalization::default());
        Ok(Self {
            rest,
            format,
            items: distinct.items,
            canonical_items: distinct.canonical,
            slots: distinct.slots,
            keyed_rest,
        })
    }
}

/// OpenAI's embeddings items: `input` entries.
impl Items for ItemizedRequest {
    fn len(&self) -> usize {
        self.items.len()
    }

    /// What item `item`'s fingerprint is computed from: the request's other
    /// fields (`encoding_format` excepted) and the item itself.
    fn item_key_body(&self, item: usize) -> Vec<u8> {
        item_key_body(
            ITEM_KEY_DOMAIN,
            &self.keyed_rest,
            &self.canonical_items[item],
        )
    }

    /// The upstream body asking for `items`, in that order.
    fn upstream_body(&self, items: &[usize]) -> Bytes {
        let mut body = self.rest.clone();
        let input: Vec<Value> = items.iter().map(|&i| self.items[i].clone()).collect();
        body.insert("input".to_owned(), Value::Array(input));
        Bytes::from(serde_json::to_vec(&body).expect("a JSON map serializes"))
    }

    /// The tokens item `item` costs, where the request itself says (token ids).
    fn known_tokens(&self, item: usize) -> Option<u64> {
        match &self.items[item] {
            Value::Array(tokens) => Some(tokens.len() as u64),
            _ => None,
        }
    }

    fn split_answer(&self, body: &[u8], expected: usize) -> Result<SplitAnswer, String> {
        split_answer(body, expected)
    }

    fn assemble(&self, items: &[&[u8]], model: &str, billed: Usage) -> Result<Bytes, String> {
        assemble(self.format, &self.slots, items, model, billed)
    }
}

/// One item's stored vector: the model that embedded it and the provider's representation.
#[derive(Debug, Serialize, Deserialize)]
struct StoredItem {
    model: String,
    /// A base64 string of little-endian f32s, or an array of numbers.
    embedding: Value,
}

/// A provider's answer, split by item.
#[derive(Debug)]
pub struct SplitAnswer {
    /// One stored-item body per input asked for, in the order asked.
    pub items: Vec<Bytes>,
    pub usage: Option<Usage>,
}

/// Splits a provider's answer to `expected` inputs. Anything but one valid
/// vector per input (fewer, more, an index twice, an undecodable vector) is
/// an error: nothing of a partial answer is kept.
pub fn split_answer(body: &[u8], expected: usize) -> Result<SplitAnswer, String> {
    #[derive(Deserialize)]
    struct Answer {
        data: Vec<Datum>,
        #[serde(default)]
        model: String,
    }
    #[derive(Deserialize)]
    struct Datum {
        index: usize,
        embedding: Value,
    }
    let answer: Answer =
        serde_json::from_slice(body).map_err(|err| format!("not an embeddings list: {err}"))?;
    if answer.data.len() != expected {
        return Err(format!(
            "{} vectors for {expected} inputs",
            answer.data.len()
        ));
    }
    let mut items: Vec<Option<Bytes>> = vec![None; expected];
    for datum in answer.data {
        let slot = items
            .get_mut(datum.index)
            .ok_or_else(|| format!("index {} out of range", datum.index))?;
        if slot.is_some() {
            return Err(format!("index {} twice", datum.index));
        }
        check_vector(&datum.embedding)?;
        let stored = StoredItem {
            model: answer.model.clone(),
            embedding: datum.embedding,
        };
        *slot = Some(Bytes::from(
            serde_json::to_vec(&stored).expect("a stored item serializes"),
        ));
    }
    Ok(SplitAnswer {
        items: items
            .into_iter()
            .map(|item| item.expect("every index seen once"))
            .collect(),
        usage: Usage::from_body(body),
    })
}

fn check_vector(embedding: &Value) -> Result<(), String> {
    match embedding {
        Value::String(text) => {
            let bytes = BASE64
                .decode(text)
                .map_err(|err| format!("a base64 vector does not decode: {err}"))?;
            if bytes.len() % 4 != 0 {
                return Err("a base64 vector is not whole f32 values".to_owned());
            }
            Ok(())
        }
        Value::Array(numbers) if numbers.iter().all(Value::is_number) => Ok(()),
        _ => Err("a vector is neither base64 nor numbers".to_owned()),
    }
}

/// The caller's answer: one entry per input slot (`slots[j]` names the stored
/// item of input `j`), each encoded as the caller asked.
pub fn assemble(
    format: EncodingFormat,
    slots: &[usize],
    items: &[&[u8]],
    fallback_model: &str,
    billed: Usage,
) -> Result<Bytes, String> {
    let stored: Vec<StoredItem> = items
        .iter()
        .map(|body| {
            serde_json::from_slice(body)
                .map_err(|err| format!("a stored vector is unreadable: {err}"))
        })
        .collect::<Result<_, _>>()?;
    let encoded: Vec<Value> = stored
        .iter()
        .map(|item| encode(&item.embedding, format))
        .collect::<Result<_, _>>()?;
    let data: Vec<Value> = slots
        .iter()
        .enumerate()
        .map(|(index, &item)| {
            let mut datum = Map::new();
            datum.insert("object".into(), Value::from("embedding"));
            datum.insert("index".into(), Value::from(index));
            datum.insert("embedding".into(), encoded[item].clone());
            Value::Object(datum)
        })
        .collect();
    let model = stored
        .first()
        .map(|item| item.model.as_str())
        .filter(|model| !model.is_empty())
        .unwrap_or(fallback_model);
    let answer = serde_json::json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": billed.prompt_tokens, "total_tokens": billed.prompt_tokens},
    });
    Ok(Bytes::from(
        serde_json::to_vec(&answer).expect("a JSON value serializes"),
    ))
}

/// One stored vector in the caller's format.
fn encode(embedding: &Value, format: EncodingFormat) -> Result<Value, String> {
    match (embedding, format) {
        (Value::String(_), EncodingFormat::Base64) | (Value::Array(_), EncodingFormat::Float) => {
            Ok(embedding.clone())
        }
        (Value::String(text), EncodingFormat::Float) => {
            let bytes = BASE64
                .decode(text)
                .map_err(|err| format!("a stored vector does not decode: {err}"))?;
            let floats = bytes
                .chunks_exact(4)
                .map(|chunk| {
                    let value = f32::from_le_bytes(chunk.try_into().expect("four bytes"));
                    if !value.is_finite() {
                        return Err("a stored vector holds a non-finite value".to_owned());
                    }
                    // The shortest decimal that reads back as this f32, as an f64
                    // (which serde_json prints in that same shortest form).
                    let shortest: f64 = ryu::Buffer::new()
                        .format_finite(value)
                        .parse()
                        .expect("ryu prints a decimal");
                    serde_json::Number::from_f64(shortest)
                        .map(Value::Number)
                        .ok_or_else(|| "a stored vector holds a non-finite value".to_owned())
                })
                .collect::<Result<Vec<Value>, String>>()?;
            Ok(Value::Array(floats))
        }
        (Value::Array(numbers), EncodingFormat::Base64) => {
            let mut bytes = Vec::with_capacity(numbers.len() * 4);
            for number in numbers {
                let value = number
                    .as_f64()
                    .ok_or_else(|| "a stored vector holds a non-number".to_owned())?;
                bytes.extend_from_slice(&(value as f32).to_le_bytes());
            }
            Ok(Value::String(BASE64.encode(bytes)))
        }
        _ => Err("a stored vector is neither base64 nor numbers".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: ItemLimits = ItemLimits {
        max_inputs: 4,
        max_input_bytes: 64,
    };

    fn parse(json: &str) -> Result<ItemizedRequest, GatewayError> {
        let body: Map<String, Value> = serde_json::from_str(json).unwrap();
        ItemizedRequest::parse(&body, LIMITS)
    }

    #[test]
    fn inputs_become_distinct_items_in_first_seen_order() {
        let request = parse(r#"{"model":"m","input":["a","b","a",[1,2]]}"#).unwrap();
        assert_eq!(request.len(), 3);
        assert_eq!(request.slots, [0, 1, 0, 2]);
        assert_eq!(request.known_tokens(2), Some(2));
        assert_eq!(request.known_tokens(0), None);
        let body: Value = serde_json::from_slice(&request.upstream_body(&[2, 0])).unwrap();
        assert_eq!(body["input"], serde_json::json!([[1, 2], "a"]));
        assert_eq!(body["model"], "m");
        // A single token array is one input, not a list of numbers.
        assert_eq!(parse(r#"{"model":"m","input":[5,6,7]}"#).unwrap().len(), 1);
    }

    #[test]
    fn a_string_is_the_single_item_of_a_list_and_formats_share_a_key() {
        let single = parse(r#"{"model":"m","input":"a"}"#).unwrap();
        let listed =
            parse(r#"{"model":"m","input":["b","a"],"encoding_format":"base64"}"#).unwrap();
        assert_eq!(single.item_key_body(0), listed.item_key_body(1));
        assert_ne!(listed.item_key_body(0), listed.item_key_body(1));
        let other = parse(r#"{"model":"m","input":"a","dimensions":8}"#).unwrap();
        assert_ne!(single.item_key_body(0), other.item_key_body(0));
        assert!(!single.item_key_body(0).starts_with(b"{"));
    }

    #[test]
    fn bad_inputs_are_refused_with_the_field_named() {
        for (json, expected) in [
            (r#"{"model":"m"}"#, "provide an input"),
            (r#"{"model":"m","input":[]}"#, "must not be empty"),
            (
                r#"{"model":"m","input":["a","b","c","d","e"]}"#,
                "the limit is 4",
            ),
            (r#"{"model":"m","input":["a",{}]}"#, "`input[1]`"),
            (r#"{"model":"m","input":[[1,-2]]}"#, "`input[0]`"),
            (r#"{"model":"m","input":[["x"]]}"#, "`input[0]`"),
            (r#"{"model":"m","input":5}"#, "must be a string"),
            (
                r#"{"model":"m","input":"a","encoding_format":"hex"}"#,
                "encoding_format",
            ),
            (
                r#"{"model":"m","input":"a","stream":true}"#,
                "do not stream",
            ),
        ] {
            let error = parse(json).unwrap_err().to_string();
            assert!(error.contains(expected), "{json}: {error}");
        }
        let long = format!(r#"{{"model":"m","input":["{}"]}}"#, "x".repeat(100));
        assert!(
            parse(&long)
                .unwrap_err()
                .to_string()
                .contains("the limit is 64")
        );
    }

    fn base64_of(values: &[f32]) -> String {
        BASE64.encode(
            values
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>(),
        )
    }

    #[test]
    fn answers_split_by_index_and_partial_answers_are_errors() {
        let body = serde_json::json!({
            "data": [
                {"index": 1, "embedding": base64_of(&[0.5, -0.25])},
                {"index": 0, "embedding": [0.125, 1.0]},
            ],
            "model": "m-1",
            "usage": {"prompt_tokens": 7, "total_tokens": 7},
        })
        .to_string();
        let split = split_answer(body.as_bytes(), 2).unwrap();
        assert_eq!(split.usage.unwrap().prompt_tokens, 7);
        let first: Value = serde_json::from_slice(&split.items[0]).unwrap();
        assert_eq!(first["embedding"], serde_json::json!([0.125, 1.0]));
        assert_eq!(first["model"], "m-1");
        assert!(
            split_answer(body.as_bytes(), 3)
                .unwrap_err()
                .contains("2 vectors for 3")
        );
        let twice = body.replace("\"index\":0", "\"index\":1");
        assert!(
            split_answer(twice.as_bytes(), 2)
                .unwrap_err()
                .contains("twice")
        );
        let broken = body.replace(&base64_of(&[0.5, -0.25]), "AAA");
        assert!(split_answer(broken.as_bytes(), 2).is_err());
    }

    #[test]
    fn each_caller_gets_its_format_of_the_same_floats() {
        // Values whose f64 form is long: a float caller gets the f32's shortest decimal.
        let values = [0.1_f32, -1.0 / 3.0, 1e-7, -0.0078, 3.4028235e38];
        let stored = serde_json::to_vec(&StoredItem {
            model: "m".into(),
            embedding: Value::String(base64_of(&values)),
        })
        .unwrap();
        let usage = Usage::default();
        let floats = assemble(EncodingFormat::Float, &[0, 0], &[&stored], "x", usage).unwrap();
        let floats: Value = serde_json::from_slice(&floats).unwrap();
        assert_eq!(floats["data"][1]["index"], 1);
        let parsed: Vec<f64> = floats["data"][0]["embedding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        let read_back: Vec<f32> = parsed.iter().map(|v| *v as f32).collect();
        assert_eq!(
            read_back, values,
            "a float caller reads the very f32 values"
        );
        let text =
            String::from_utf8_lossy(&serde_json::to_vec(&floats["data"][0]).unwrap()).into_owned();
        assert!(
            text.contains("[0.1,-0.33333334,1e-7,-0.0078,3.4028235e+38]"),
            "the shortest decimals, as providers send them: {text}"
        );
        // And back: floats stored, a base64 caller gets the same bits.
        let from_floats = serde_json::to_vec(&StoredItem {
            model: "m".into(),
            embedding: floats["data"][0]["embedding"].clone(),
        })
        .unwrap();
        let encoded = assemble(EncodingFormat::Base64, &[0], &[&from_floats], "x", usage).unwrap();
        let encoded: Value = serde_json::from_slice(&encoded).unwrap();
        assert_eq!(encoded["data"][0]["embedding"], base64_of(&values));
        assert_eq!(encoded["model"], "m");
    }
}
