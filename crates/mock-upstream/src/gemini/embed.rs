//! `embedContent` (`{"embedding":{"values":[...]}}`) and `batchEmbedContents`
//! (`{"embeddings":[{"values":[...]}, ...]}`, in the order of the requests), the shapes of
//! Google's `EmbedContentResponse` and `BatchEmbedContentsResponse`.
//!
//! A vector is a function of the model, the `taskType` and the text, made as the OpenAI
//! surface makes its vectors: Google's vectors differ by task type, so a gateway that caches
//! them must key on it, and a test can see whether it does. Each text embedded by a successful
//! call is counted like an OpenAI embeddings input
//! ([`MockProvider::embedded_counts`](crate::MockProvider::embedded_counts)).

use serde_json::{Value, json};

use super::super::openai::{Answer, InvalidRequest, dimensions, embedding_vector, shortest};
use super::{field, model_method};

/// Largest `outputDimensionality` accepted, `gemini-embedding-001`'s full size.
const MAX_DIMENSIONS: u64 = 3072;

/// `embedContent`: one request, one vector.
pub(super) fn embed_content(model: &str, request: &Value) -> Result<Answer, InvalidRequest> {
    let values = embedding(model, request, "")?;
    Ok(Answer::Json(json!({"embedding": {"values": values}})))
}

/// `batchEmbedContents`: one vector per entry of `requests`.
pub(super) fn batch_embed_contents(model: &str, request: &Value) -> Result<Answer, InvalidRequest> {
    let requests = requests(request)?;
    let embeddings = requests
        .iter()
        .enumerate()
        .map(|(i, request)| {
            embedding(model, request, &format!("requests[{i}]."))
                .map(|values| json!({"values": values}))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Answer::Json(json!({"embeddings": embeddings})))
}

/// The texts a successful embedding call at `path` embedded, in order; none for other methods.
pub(crate) fn embedded_texts(path: &str, body: &[u8]) -> Vec<String> {
    let Ok(request) = serde_json::from_slice::<Value>(body) else {
        return Vec::new();
    };
    match model_method(path).map(|(_, method)| method) {
        Some("embedContent") => content_text(&request).into_iter().collect(),
        Some("batchEmbedContents") => requests(&request)
            .map(|requests| requests.iter().filter_map(content_text).collect())
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// The non-empty `requests` list of a batch.
fn requests(request: &Value) -> Result<&Vec<Value>, InvalidRequest> {
    field(request, "requests", "requests")
        .and_then(Value::as_array)
        .filter(|requests| !requests.is_empty())
        .ok_or_else(|| {
            InvalidRequest::new(
                "* BatchEmbedContentsRequest.requests: at least one request is required",
            )
        })
}

/// The vector of one `EmbedContentRequest`, as JSON numbers; `at` locates it in error messages.
fn embedding(model: &str, request: &Value, at: &str) -> Result<Vec<f64>, InvalidRequest> {
    let text = content_text(request)
        .ok_or_else(|| InvalidRequest::new(format!("* {at}content: content is not specified")))?;
    let dimensions = dimensions(
        field(request, "outputDimensionality", "output_dimensionality"),
        MAX_DIMENSIONS,
        || {
            format!(
                "* {at}output_dimensionality: must be an integer between 1 and {MAX_DIMENSIONS}"
            )
        },
    )?;
    let task = field(request, "taskType", "task_type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let vector = embedding_vector(&format!("{model}/{task}"), &text, dimensions);
    // Printed as Google prints a float: the shortest decimal that reads back as the f32.
    Ok(vector.into_iter().map(shortest).collect())
}

/// The text of a request's `content`: its text parts, concatenated; `None` without content.
fn content_text(request: &Value) -> Option<String> {
    let parts = field(request, "content", "content")?
        .get("parts")?
        .as_array()?;
    Some(
        parts
            .iter()
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect(),
    )
}
