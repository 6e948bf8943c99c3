//! Gemini's embedding methods by the item: `embedContent` (one request, one
//! vector) and `batchEmbedContents` (a vector per entry of its `requests`).
//! An item is one embed request (its `content`, `taskType`, `title`,
//! `outputDimensionality`), keyed with the model the path names, so one
//! content asked for by either method is one entry and one flight. Only the
//! items nobody has embedded go upstream, always as one `batchEmbedContents`
//! call; each caller gets its method's answer: `{"embedding": ...}` or
//! `{"embeddings": [...]}` in its own order.

use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::{
    Items,
    distinct::{Distinct, item_key_body},
    wire::ItemLimits,
    wire::SplitAnswer,
};
use crate::{
    error::GatewayError,
    fingerprint::{Normalization, canonical_body, write_canonical},
    usage::Usage,
    wire::GeminiMethod,
};

/// Keeps Gemini's item keys apart from OpenAI's and from whole requests.
const ITEM_KEY_DOMAIN: &[u8] = b"corral-gemini-embedding-item\0";

/// A Gemini embedding request taken apart into its distinct items.
#[derive(Debug)]
pub struct GeminiItems {
    /// `models/{model}`, as each upstream entry names its model.
    model_ref: String,
    /// The caller's method: the shape of its answer.
    batch: bool,
    /// The distinct items, in the order first seen.
    items: Vec<Value>,
    canonical_items: Vec<Vec<u8>>,
    /// For each of the caller's requests, in its order, the item it is.
    slots: Vec<usize>,
    /// The model and the batch body's other fields, canonical.
    keyed_rest: Vec<u8>,
}

impl GeminiItems {
    /// Splits the body of `method` (for `model`, as the path names it) into
    /// items; every client mistake is a 400 naming its field.
    pub fn parse(
        body: &Map<String, Value>,
        method: Option<GeminiMethod>,
        model: &str,
        limits: ItemLimits,
    ) -> Result<Self, GatewayError> {
        let model_ref = format!("models/{model}");
        let batch = method != Some(GeminiMethod::Embed);
        let (mut rest, requests) = if batch {
            let mut rest = body.clone();
            let requests = match rest.remove("requests") {
                Some(Value::Array(requests)) if !requests.is_empty() => requests,
                _ => {
                    return Err(GatewayError::invalid_param(
                        "requests",
                        "`requests` must be a non-empty array of embed requests",
                    ));
                }
            };
            (rest, requests)
        } else {
            (Map::new(), vec![Value::Object(body.clone())])
        };
        if requests.len() > limits.max_inputs {
            return Err(GatewayError::invalid_param(
                "requests",
                format!(
                    "`requests` has {} entries; the limit is {}",
                    requests.len(),
                    limits.max_inputs
                ),
            ));
        }
        let mut distinct = Distinct::with_capacity(requests.len());
        for (index, request) in requests.into_iter().enumerate() {
            let Value::Object(mut request) = request else {
                return Err(GatewayError::invalid_param(
                    "requests",
                    format!("`requests[{index}]` must be an object"),
                ));
            };
            // The path's model, named again: not part of what is asked.
            if request
                .get("model")
                .and_then(Value::as_str)
                .is_some_and(|named| named == model_ref || named == model)
            {
                request.remove("model");
            }
            let item = Value::Object(request);
            let mut canonical = Vec::new();
            write_canonical(&mut canonical, &item);
            if canonical.len() > limits.max_input_bytes {
                return Err(GatewayError::invalid_param(
                    "requests",
                    format!(
                        "`requests[{index}]` is {} bytes; the limit is {}",
                        canonical.len(),
                        limits.max_input_bytes
                    ),
                ));
            }
            distinct.push(canonical, || item);
        }
        rest.insert("model".to_owned(), Value::String(model_ref.clone()));
        let keyed_rest = canonical_body(&rest, Normalization::default());
        Ok(Self {
            model_ref,
            batch,
            items: distinct.items,
            canonical_items: distinct.canonical,
            slots: distinct.slots,
            keyed_rest,
        })
    }
}

impl Items for GeminiItems {
    fn len(&self) -> usize {
        self.items.len()
    }

    fn item_key_body(&self, item: usize) -> Vec<u8> {
        item_key_body(
            ITEM_KEY_DOMAIN,
            &self.keyed_rest,
            &self.canonical_items[item],
        )
    }

    fn upstream_path(&self) -> Option<String> {
        Some(format!(
            "/{}:{}",
            self.model_ref,
            GeminiMethod::BatchEmbed.name()
        ))
    }

    /// Always a `batchEmbedContents` body, each entry naming the model.
    fn upstream_body(&self, items: &[usize]) -> Bytes {
        let requests: Vec<Value> = items
            .iter()
            .map(|&item| {
                let mut request = self.items[item].clone();
                if let Value::Object(fields) = &mut request {
                    fields
                        .entry("model")
                        .or_insert_with(|| Value::String(self.model_ref.clone()));
                }
                request
            })
            .collect();
        Bytes::from(json!({ "requests": requests }).to_string())
    }

    fn known_tokens(&self, _item: usize) -> Option<u64> {
        None
    }

    /// One `ContentEmbedding` with numeric `values` per item asked for, in
    /// order; anything else refuses the whole answer.
    fn split_answer(&self, body: &[u8], expected: usize) -> Result<SplitAnswer, String> {
        let answer: Value =
            serde_json::from_slice(body).map_err(|err| format!("not JSON: {err}"))?;
        let embeddings = answer
            .get("embeddings")
            .and_then(Value::as_array)
            .ok_or("no `embeddings` list")?;
        if embeddings.len() != expected {
            return Err(format!(
                "{} vectors for {expected} requests",
                embeddings.len()
            ));
        }
        let items = embeddings
            .iter()
            .map(|embedding| {
                let numeric = embedding
                    .get("values")
                    .and_then(Value::as_array)
                    .is_some_and(|values| values.iter().all(Value::is_number));
                if numeric {
                    Ok(Bytes::from(embedding.to_string()))
                } else {
                    Err("an embedding without numeric `values`".to_owned())
                }
            })
            .collect::<Result<_, _>>()?;
        let usage = answer
            .get("usageMetadata")
            .and_then(Usage::from_usage_metadata);
        Ok(SplitAnswer { items, usage })
    }

    /// `{"embedding": ...}` for an `embedContent` caller, `{"embeddings":
    /// [...]}` in its order for a batch.
    fn assemble(&self, items: &[&[u8]], _model: &str, _billed: Usage) -> Result<Bytes, String> {
        let stored: Vec<Value> = items
            .iter()
            .map(|body| {
                serde_json::from_slice(body)
                    .map_err(|err| format!("a stored vector is unreadable: {err}"))
            })
            .collect::<Result<_, _>>()?;
        let answer = if self.batch {
            let embeddings: Vec<Value> = self
                .slots
                .iter()
                .map(|&slot| stored[slot].clone())
                .collect();
            json!({ "embeddings": embeddings })
        } else {
            json!({ "embedding": stored[self.slots[0]] })
        };
        Ok(Bytes::from(answer.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: ItemLimits = ItemLimits {
        max_inputs: 4,
        max_input_bytes: 256,
    };

    fn body(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    fn content(text: &str) -> Value {
        json!({"parts": [{"text": text}]})
    }

    #[test]
    fn one_content_is_one_item_by_either_method() {
        let one = GeminiItems::parse(
            &body(json!({"content": content("a"), "taskType": "RETRIEVAL_QUERY"})),
            Some(GeminiMethod::Embed),
            "gemini-embedding-001",
            LIMITS,
        )
        .unwrap();
        let batch = GeminiItems::parse(
            &body(json!({"requests": [
                {"model": "models/gemini-embedding-001", "content": content("b"), "taskType": "RETRIEVAL_QUERY"},
                {"model": "models/gemini-embedding-001", "content": content("a"), "taskType": "RETRIEVAL_QUERY"},
                {"model": "models/gemini-embedding-001", "content": content("b"), "taskType": "RETRIEVAL_QUERY"},
            ]})),
            Some(GeminiMethod::BatchEmbed),
            "gemini-embedding-001",
            LIMITS,
        )
        .unwrap();
        assert_eq!(batch.len(), 2, "a repeated request is one item");
        assert_eq!(batch.slots, [0, 1, 0]);
        assert_eq!(one.item_key_body(0), batch.item_key_body(1));
        let other_model = GeminiItems::parse(
            &body(json!({"content": content("a"), "taskType": "RETRIEVAL_QUERY"})),
            Some(GeminiMethod::Embed),
            "text-embedding-004",
            LIMITS,
        )
        .unwrap();
        assert_ne!(one.item_key_body(0), other_model.item_key_body(0));
        let upstream: Value = serde_json::from_slice(&batch.upstream_body(&[1])).unwrap();
        assert_eq!(
            upstream,
            json!({"requests": [{"model": "models/gemini-embedding-001", "content": content("a"),
                                  "taskType": "RETRIEVAL_QUERY"}]})
        );
        assert_eq!(
            batch.upstream_path().unwrap(),
            "/models/gemini-embedding-001:batchEmbedContents"
        );
    }

    #[test]
    fn answers_split_by_item_and_assemble_in_each_callers_shape() {
        let batch = GeminiItems::parse(
            &body(
                json!({"requests": [{"content": content("x")}, {"content": content("y")},
                                      {"content": content("x")}]}),
            ),
            Some(GeminiMethod::BatchEmbed),
            "m",
            LIMITS,
        )
        .unwrap();
        let split = batch
            .split_answer(
                br#"{"embeddings":[{"values":[0.5,1]},{"values":[2,-0.25]}]}"#,
                2,
            )
            .unwrap();
        let bodies: Vec<&[u8]> = split.items.iter().map(|b| b.as_ref()).collect();
        let answer: Value =
            serde_json::from_slice(&batch.assemble(&bodies, "m", Usage::default()).unwrap())
                .unwrap();
        assert_eq!(
            answer,
            json!({"embeddings": [{"values": [0.5, 1]}, {"values": [2, -0.25]}, {"values": [0.5, 1]}]})
        );
        let one = GeminiItems::parse(
            &body(json!({"content": content("y")})),
            Some(GeminiMethod::Embed),
            "m",
            LIMITS,
        )
        .unwrap();
        let answer: Value =
            serde_json::from_slice(&one.assemble(&bodies[1..], "m", Usage::default()).unwrap())
                .unwrap();
        assert_eq!(answer, json!({"embedding": {"values": [2, -0.25]}}));
        for bad in [
            &br#"{"embeddings":[{"values":[1]}]}"#[..],
            br#"{"embeddings":[{"values":[1]},{"values":["x"]}]}"#,
            br#"{"embedding":{"values":[1]}}"#,
        ] {
            assert!(batch.split_answer(bad, 2).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_batch_without_requests_or_over_the_limit_is_refused() {
        for bad in [json!({}), json!({"requests": []}), json!({"requests": [1]})] {
            assert!(
                GeminiItems::parse(
                    &body(bad.clone()),
                    Some(GeminiMethod::BatchEmbed),
                    "m",
                    LIMITS
                )
                .is_err(),
                "{bad}"
            );
        }
        let many: Vec<Value> = (0..5)
            .map(|i| json!({"content": content(&i.to_string())}))
            .collect();
        assert!(
            GeminiItems::parse(
                &body(json!({"requests": many})),
                Some(GeminiMethod::BatchEmbed),
                "m",
                LIMITS
            )
            .is_err()
        );
    }
}
