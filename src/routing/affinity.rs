//! The request's affinity key: what keeps one conversation on one member, so
//! the provider's prompt cache for it stays warm.
//!
//! In the order issue 38 gives: the caller's own session naming (OpenAI's
//! body `prompt_cache_key`; the headers `x-session-affinity`,
//! `x-claude-code-session-id`, `session-id`, `session_id`; Anthropic's
//! `metadata.user_id`), else the conversation's opening: the first system
//! (or developer) text and the first user text, which every later turn of
//! the same conversation repeats. Hashed as borrowed bytes, nothing copied;
//! each text's first 4 KiB at most, so a long prompt costs no more than a
//! short one. A request with none of these (an embedding of an array, an
//! empty body) gets a key of its own and is spread by weight.

use std::hash::Hasher;

use http::HeaderMap;
use serde_json::{Map, Value};

use super::pick::{AffinityKey, hasher};

/// The most of any one text (a session id, a message) that is hashed.
const HASHED_PREFIX: usize = 4096;

/// The headers that name a session, in the order they are read.
const SESSION_HEADERS: [&str; 4] = [
    "x-session-affinity",
    "x-claude-code-session-id",
    "session-id",
    "session_id",
];

/// The request's affinity key; see the module's documentation for the order.
pub fn affinity_key(headers: &HeaderMap, body: &Map<String, Value>) -> AffinityKey {
    if let Some(key) = non_empty(body.get("prompt_cache_key").and_then(Value::as_str)) {
        return named(key.as_bytes());
    }
    for name in SESSION_HEADERS {
        if let Some(value) = headers
            .get(name)
            .filter(|v| !v.as_bytes().trim_ascii().is_empty())
        {
            return named(value.as_bytes().trim_ascii());
        }
    }
    let user_id = body
        .get("metadata")
        .and_then(|m| m.get("user_id"))
        .and_then(Value::as_str);
    if let Some(user) = non_empty(user_id) {
        return named(user.as_bytes());
    }
    opening(body).unwrap_or_else(AffinityKey::random)
}

fn non_empty(text: Option<&str>) -> Option<&str> {
    text.filter(|t| !t.trim().is_empty())
}

/// A session's own name: the same name is the same key, whichever field sent it.
fn named(bytes: &[u8]) -> AffinityKey {
    let mut hasher = hasher();
    hasher.write_u8(b'n');
    hasher.write(&bytes[..bytes.len().min(HASHED_PREFIX)]);
    AffinityKey(hasher.finish())
}

/// The key of the conversation's opening, or none if the body has neither a
/// system nor a user text.
fn opening(body: &Map<String, Value>) -> Option<AffinityKey> {
    let system = system_text(body);
    let user = user_text(body);
    if system.is_none() && user.is_none() {
        return None;
    }
    let mut hasher = hasher();
    hasher.write_u8(b'c');
    for (tag, content) in [(b's', system), (b'u', user)] {
        hasher.write_u8(tag);
        if let Some(content) = content {
            hash_content(content, &mut hasher);
        }
    }
    Some(AffinityKey(hasher.finish()))
}

/// The first system text: Anthropic's top-level `system`, Responses'
/// `instructions`, Gemini's `systemInstruction`, else the first `system` or
/// `developer` message of `messages` (chat) or `input` (Responses).
fn system_text(body: &Map<String, Value>) -> Option<&Value> {
    [
        "system",
        "instructions",
        "systemInstruction",
        "system_instruction",
    ]
    .iter()
    .find_map(|field| body.get(*field).filter(|v| !v.is_null()))
    .or_else(|| first_message(body, |role| matches!(role, Some("system" | "developer"))))
}

/// The first user text: the first `user` message of `messages`, `input` or
/// Gemini's `contents` (whose role may be left out), else a Responses or
/// embeddings `input` string, else a completions `prompt`.
fn user_text(body: &Map<String, Value>) -> Option<&Value> {
    first_message(body, |role| matches!(role, Some("user")))
        .or_else(|| {
            body.get("contents")?
                .as_array()?
                .iter()
                .find(|m| m.get("role").is_none_or(|r| r.as_str() == Some("user")))
                .and_then(content_of)
        })
        .or_else(|| body.get("input").filter(|v| v.is_string()))
        .or_else(|| body.get("prompt").filter(|v| v.is_string()))
}

fn first_message(body: &Map<String, Value>, role: impl Fn(Option<&str>) -> bool) -> Option<&Value> {
    ["messages", "input"].iter().find_map(|field| {
        body.get(*field)?
            .as_array()?
            .iter()
            .find(|m| role(m.get("role").and_then(Value::as_str)))
            .and_then(content_of)
    })
}

/// A message's content: `content` (chat, Responses, Anthropic) or `parts` (Gemini).
fn content_of(message: &Value) -> Option<&Value> {
    message.get("content").or_else(|| message.get("parts"))
}

/// Hashes a content's text: a string, a list of strings or of parts with a
/// `text`, or an object with `parts` (Gemini's `systemInstruction`); the
/// first [`HASHED_PREFIX`] bytes in all. Anything else (images, files) is
/// not text and is left out.
fn hash_content(content: &Value, hasher: &mut impl Hasher) {
    let mut budget = HASHED_PREFIX;
    let mut write = |text: &str| {
        let bytes = &text.as_bytes()[..text.len().min(budget)];
        budget -= bytes.len();
        hasher.write(bytes);
        hasher.write_u8(0xff);
    };
    let parts = match content {
        Value::String(text) => return write(text),
        Value::Array(parts) => parts,
        Value::Object(object) => match object.get("parts").and_then(Value::as_array) {
            Some(parts) => parts,
            None => return,
        },
        _ => return,
    };
    for part in parts {
        let text = match part {
            Value::String(text) => Some(text.as_str()),
            part => part.get("text").and_then(Value::as_str),
        };
        if let Some(text) = text {
            write(text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key_of(headers: &[(&'static str, &str)], body: Value) -> AffinityKey {
        let headers: HeaderMap = headers
            .iter()
            .map(|(name, value)| (http::HeaderName::from_static(name), value.parse().unwrap()))
            .collect();
        affinity_key(&headers, body.as_object().unwrap())
    }

    fn chat(system: &str, user: &str) -> Value {
        json!({"model": "m", "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": user},
        ]})
    }

    #[test]
    fn the_callers_own_session_name_comes_first_in_the_issues_order() {
        let mut body = chat("sys", "hi");
        body["prompt_cache_key"] = json!("s-1");
        body["metadata"] = json!({"user_id": "u-1"});
        let by_cache_key = key_of(&[("x-session-affinity", "h-1")], body.clone());
        assert_eq!(
            by_cache_key,
            key_of(&[], json!({"prompt_cache_key": "s-1"}))
        );
        body.as_object_mut().unwrap().remove("prompt_cache_key");
        let by_header = key_of(
            &[("session_id", "h-2"), ("x-session-affinity", "h-1")],
            body.clone(),
        );
        assert_eq!(
            by_header,
            key_of(&[("x-session-affinity", "h-1")], json!({}))
        );
        for name in ["x-claude-code-session-id", "session-id", "session_id"] {
            assert_eq!(
                key_of(&[(name, "h-3")], body.clone()),
                key_of(&[("x-session-affinity", "h-3")], json!({}))
            );
        }
        let by_user = key_of(&[], body.clone());
        assert_eq!(
            by_user,
            key_of(&[], json!({"metadata": {"user_id": "u-1"}}))
        );
        body.as_object_mut().unwrap().remove("metadata");
        assert_eq!(key_of(&[], body), key_of(&[], chat("sys", "hi")));
    }

    #[test]
    fn a_conversations_later_turns_keep_its_key() {
        let first = chat("You are terse.", "Name a prime.");
        let mut later = first.clone();
        let messages = later["messages"].as_array_mut().unwrap();
        messages.push(json!({"role": "assistant", "content": "7"}));
        messages.push(json!({"role": "user", "content": "Another."}));
        later["temperature"] = json!(0.2);
        assert_eq!(key_of(&[], first.clone()), key_of(&[], later));
        assert_ne!(
            key_of(&[], first.clone()),
            key_of(&[], chat("You are terse.", "Name a square."))
        );
        assert_ne!(
            key_of(&[], first),
            key_of(&[], chat("You are verbose.", "Name a prime."))
        );
    }

    #[test]
    fn every_apis_system_and_user_text_is_read() {
        let chat_parts = json!({"messages": [
            {"role": "developer", "content": [{"type": "text", "text": "S"}]},
            {"role": "user", "content": [{"type": "text", "text": "U"}, {"type": "image_url", "image_url": {"url": "x"}}]},
        ]});
        let responses = json!({"instructions": "S", "input": "U"});
        let responses_items = json!({"input": [
            {"role": "system", "content": "S"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "U"}]},
        ]});
        let anthropic = json!({"system": [{"type": "text", "text": "S"}], "messages": [{"role": "user", "content": "U"}]});
        let gemini = json!({"systemInstruction": {"parts": [{"text": "S"}]}, "contents": [{"parts": [{"text": "U"}]}]});
        let expected = key_of(&[], chat("S", "U"));
        for body in [chat_parts, responses, responses_items, anthropic, gemini] {
            assert_eq!(key_of(&[], body.clone()), expected, "{body}");
        }
        assert_ne!(
            key_of(&[], json!({"prompt": "U"})),
            expected,
            "no system text is another opening"
        );
        assert_eq!(
            key_of(&[], json!({"prompt": "U"})),
            key_of(&[], json!({"messages": [{"role": "user", "content": "U"}]}))
        );
    }

    #[test]
    fn only_the_first_four_kib_of_a_text_are_hashed() {
        let long = "a".repeat(HASHED_PREFIX);
        assert_eq!(
            key_of(&[], chat("S", &format!("{long}one ending"))),
            key_of(&[], chat("S", &format!("{long}another")))
        );
        assert_ne!(
            key_of(&[], chat("S", "short one")),
            key_of(&[], chat("S", "short two"))
        );
    }

    #[test]
    fn a_body_with_nothing_to_key_on_is_spread() {
        let keys: std::collections::HashSet<_> = (0..8)
            .map(|_| key_of(&[], json!({"input": ["a", "b"]})))
            .collect();
        assert!(keys.len() > 1, "a key of its own per call");
        let blank = key_of(
            &[("session-id", " ")],
            json!({"prompt_cache_key": "", "messages": []}),
        );
        assert_ne!(blank, key_of(&[], json!({})), "blank names are not names");
    }
}
