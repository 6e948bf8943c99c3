//! Each caller's own label fields in a shared answer.
//!
//! Label fields (`fingerprint::BodyKeying::labels`) are left out of the key,
//! so callers that differ only in them share one upstream call. Where the
//! provider echoes such a field in its answer (a Responses object carries
//! `metadata`, `prompt_cache_key`, `safety_identifier` and `user`), the
//! answer names the owner of the call; each other caller must receive its
//! own values instead, or one end user's identifiers would reach another.
//! [`Echo`] holds one caller's values and rewrites an answer, or a stream's
//! lifecycle events, only where they differ: the owner's bytes, and every
//! caller's whose values match, pass through as they came.

use bytes::Bytes;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::{Map, Value};

use crate::sse::{named_event, named_event_value};

/// An echoed field: its name, and what the provider echoes when the request
/// leaves it out.
pub type EchoedField = (&'static str, fn() -> Value);

/// One caller's values of the label fields its API echoes.
#[derive(Debug, Clone, PartialEq)]
pub struct Echo {
    /// Each echoed field with the caller's value (the provider's "absent"
    /// value where the caller sent none).
    values: Vec<(&'static str, Value)>,
    /// The stream events whose `response` object echoes them.
    events: &'static [&'static str],
}

impl Echo {
    /// The values `body` asks the provider to echo.
    pub fn of(
        body: &Map<String, Value>,
        fields: &[EchoedField],
        events: &'static [&'static str],
    ) -> Self {
        let values = fields
            .iter()
            .map(|(name, absent)| match body.get(*name) {
                Some(value) if !value.is_null() => (*name, value.clone()),
                _ => (*name, absent()),
            })
            .collect();
        Self { values, events }
    }

    /// The answer as this caller receives it, when it differs from `body`:
    /// each echoed field the answer carries set to the caller's value. An
    /// answer that is not a JSON object is left alone.
    pub fn answer(&self, body: &[u8]) -> Option<Bytes> {
        let echoed = self.echoed(body)?;
        if self.matches(&echoed) {
            return None;
        }
        let Ok(Value::Object(mut answer)) = serde_json::from_slice::<Value>(body) else {
            return None;
        };
        self.overwrite(&mut answer);
        serde_json::to_vec(&answer).ok().map(Bytes::from)
    }

    /// A stream event as this caller receives it, when it differs from
    /// `event`: a lifecycle event's `response` with the caller's values.
    /// Every other event is passed by without being parsed.
    pub fn event(&self, event: &Bytes) -> Option<Bytes> {
        let name = event
            .strip_prefix(b"event: ")
            .and_then(|rest| rest.split(|&b| b == b'\n').next())?;
        if !self.events.iter().any(|known| known.as_bytes() == name) {
            return None;
        }
        let mut value = named_event_value(event)?;
        let response = value.get_mut("response")?.as_object_mut()?;
        let differs = self
            .values
            .iter()
            .any(|(field, own)| response.get(*field).is_some_and(|sent| sent != own));
        if !differs {
            return None;
        }
        self.overwrite(response);
        let name = std::str::from_utf8(name).ok()?;
        Some(named_event(name, &value))
    }

    fn matches(&self, echoed: &Map<String, Value>) -> bool {
        echoed
            .iter()
            .all(|(field, sent)| self.value(field).is_none_or(|own| own == sent))
    }

    fn value(&self, field: &str) -> Option<&Value> {
        self.values
            .iter()
            .find(|(name, _)| *name == field)
            .map(|(_, value)| value)
    }

    /// The caller's value in each echoed field `object` carries; a field the
    /// provider did not echo is not added.
    fn overwrite(&self, object: &mut Map<String, Value>) {
        for (field, own) in &self.values {
            if let Some(sent) = object.get_mut(*field) {
                *sent = own.clone();
            }
        }
    }

    /// The echoed fields of a JSON object, read without building the rest of
    /// it (a large answer is only skimmed). `None`: not a JSON object.
    fn echoed(&self, body: &[u8]) -> Option<Map<String, Value>> {
        let mut deserializer = serde_json::Deserializer::from_slice(body);
        EchoedFields(self).deserialize(&mut deserializer).ok()
    }
}

/// Reads a JSON object's top-level members named by an [`Echo`], skipping the rest.
struct EchoedFields<'a>(&'a Echo);

impl<'de> DeserializeSeed<'de> for EchoedFields<'_> {
    type Value = Map<String, Value>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for EchoedFields<'_> {
    type Value = Map<String, Value>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut echoed = Map::new();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if self.0.value(&key).is_some() {
                echoed.insert(key.into_owned(), map.next_value::<Value>()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(echoed)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const FIELDS: &[EchoedField] = &[
        ("metadata", || json!({})),
        ("user", || Value::Null),
        ("safety_identifier", || Value::Null),
    ];
    const EVENTS: &[&str] = &["response.created", "response.completed"];

    fn echo(body: Value) -> Echo {
        Echo::of(body.as_object().unwrap(), FIELDS, EVENTS)
    }

    #[test]
    fn an_answer_carries_the_callers_own_values() {
        let owner = json!({"id": "r", "metadata": {"run": "a"}, "user": "alice", "safety_identifier": "sa", "output": [1]});
        let raw = serde_json::to_vec(&owner).unwrap();
        // The owner's own values: the bytes pass as they came.
        assert_eq!(
            echo(json!({"metadata": {"run": "a"}, "user": "alice", "safety_identifier": "sa"}))
                .answer(&raw),
            None
        );
        let bob = echo(json!({"user": "bob", "metadata": {"run": "b"}}))
            .answer(&raw)
            .unwrap();
        let bob: Value = serde_json::from_slice(&bob).unwrap();
        assert_eq!(
            bob,
            json!({"id": "r", "metadata": {"run": "b"}, "user": "bob", "safety_identifier": null, "output": [1]})
        );
    }

    #[test]
    fn a_field_the_provider_did_not_echo_is_not_added() {
        let raw = br#"{"id":"r","user":"alice"}"#;
        let rewritten = echo(json!({"user": "bob", "metadata": {"k": "v"}}))
            .answer(raw)
            .unwrap();
        assert_eq!(
            serde_json::from_slice::<Value>(&rewritten).unwrap(),
            json!({"id": "r", "user": "bob"})
        );
        assert_eq!(echo(json!({})).answer(b"[1,2]"), None);
        assert_eq!(echo(json!({})).answer(b"not json"), None);
    }

    #[test]
    fn only_lifecycle_events_are_rewritten() {
        let created = named_event(
            "response.created",
            &json!({"type": "response.created", "sequence_number": 0, "response": {"id": "r", "user": "alice", "metadata": {}}}),
        );
        let delta = named_event(
            "response.output_text.delta",
            &json!({"type": "response.output_text.delta", "delta": "user alice"}),
        );
        let bob = echo(json!({"user": "bob"}));
        let rewritten = bob.event(&created).unwrap();
        let value = named_event_value(&rewritten).unwrap();
        assert_eq!(value["response"]["user"], "bob");
        assert_eq!(value["sequence_number"], 0);
        assert!(rewritten.starts_with(b"event: response.created\n"));
        assert_eq!(bob.event(&delta), None);
        assert_eq!(echo(json!({"user": "alice"})).event(&created), None);
    }
}
