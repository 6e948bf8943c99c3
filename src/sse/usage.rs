//! The usage chunk: always requested upstream, shown only to the callers who asked for it.
//!
//! With `stream_options.include_usage: true`, OpenAI adds a `"usage": null` member to every
//! chunk and sends one more chunk before `[DONE]` whose `choices` is empty and whose `usage`
//! holds the token counts. Without it, chunks carry no `usage` member at all and that last
//! chunk does not exist. Corral always asks (cost accounting needs the counts, and one upstream
//! stream serves callers of both kinds), so the log holds the stream as a caller who asked
//! would receive it, byte for byte in corral's framing. A caller who did not ask is given what
//! the provider would have sent it: every chunk without its top-level `usage` member and
//! without the usage-only chunk. Removing `"usage": null` rather than passing it through is
//! deliberate: strict clients and SDK models that were generated without the field must see
//! exactly the stream they would have seen without corral.

use bytes::Bytes;
use serde::{
    Deserialize, Deserializer,
    de::{MapAccess, Visitor},
};
use serde_json::{Map, Value, value::RawValue};

use super::{data_event, event_json, event_object};

/// Whether a caller asked for the usage chunk itself (`stream_options.include_usage: true`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallerUsage {
    /// The caller asked: it receives the stream exactly as the provider sent it.
    Asked,
    /// The caller did not ask: no `usage` members and no usage-only chunk.
    NotAsked,
}

impl CallerUsage {
    /// What the caller's own request body asked for; anything but a literal `true` is "not asked",
    /// as it is for OpenAI.
    pub fn of(body: &Map<String, Value>) -> Self {
        let asked = body
            .get("stream_options")
            .and_then(|options| options.get("include_usage"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if asked { Self::Asked } else { Self::NotAsked }
    }
}

/// The body of a streamed flight's upstream request, and what its owner asked for.
#[derive(Debug, Clone)]
pub struct UpstreamStreamRequest {
    /// The caller's body with `stream: true` and `stream_options.include_usage: true`.
    pub body: Bytes,
    /// Whether the caller had asked for usage itself (for the reader it is given).
    pub caller_usage: CallerUsage,
}

/// The body to send upstream for a streamed flight of a format whose stream always carries
/// usage (Responses, Anthropic Messages): the caller's body with only `stream: true` forced.
pub fn force_stream(body: &Map<String, Value>) -> UpstreamStreamRequest {
    let mut upstream = body.clone();
    upstream.insert("stream".to_owned(), Value::Bool(true));
    UpstreamStreamRequest {
        body: Bytes::from(Value::Object(upstream).to_string()),
        caller_usage: CallerUsage::Asked,
    }
}

/// How one logged event looks to a caller who did not ask for usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UsageFree {
    /// The event carries no `usage` member: the same bytes.
    Same,
    /// The usage-only chunk: not sent at all.
    Skip,
    /// The event re-framed without its `usage` member.
    Rewritten(Bytes),
}

impl UsageFree {
    /// Decides, once per logged event, what a caller who did not ask for usage receives.
    ///
    /// Every event of a stream passes here, so the common cases skip the
    /// event's tree: an event that cannot hold a top-level `usage` member is
    /// the same bytes, and one that does is cut by its top-level members as
    /// written ([`Members`]). Anything else (an escaped or repeated key, a
    /// member written over several lines) takes the tree, with the same
    /// outcome.
    pub fn of(event: &[u8]) -> Self {
        // A `usage` key is written `"usage"` unless escaped (`\u0075...`).
        let finder = |needle: &[u8]| memchr::memmem::find(event, needle).is_some();
        if !finder(b"\"usage\"") && !finder(b"\\u") {
            return Self::Same;
        }
        Self::by_members(event).unwrap_or_else(|| Self::by_tree(event))
    }

    /// [`Self::of`] from the event's top-level members as written; `None`
    /// where only the tree can tell.
    pub(super) fn by_members(event: &[u8]) -> Option<Self> {
        let json = event_json(event)?;
        if json.contains(&b'\n') || json.contains(&b'\r') {
            return None;
        }
        let Members(members) = serde_json::from_slice(json).ok()?;
        // A repeated key: the tree keeps the last one. (A chunk has a handful
        // of members: comparing each pair costs less than sorting a copy.)
        let repeated = members
            .iter()
            .enumerate()
            .any(|(at, (key, _))| members[..at].iter().any(|(earlier, _)| earlier == key));
        if repeated {
            return None;
        }
        let member = |name: &str| {
            members
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| value.get())
        };
        let Some(usage) = member("usage") else {
            return Some(Self::Same);
        };
        // The text is valid JSON (its reading checked it): an empty array is
        // `[`, white space, `]`.
        let no_choices = member("choices").is_none_or(|choices| {
            choices
                .strip_prefix('[')
                .is_some_and(|rest| rest.trim_start().starts_with(']'))
        });
        if usage != "null" && no_choices {
            return Some(Self::Skip);
        }
        let mut rewritten = Vec::with_capacity(event.len());
        rewritten.extend_from_slice(b"data: {");
        let mut first = true;
        for (key, value) in members.iter().filter(|(key, _)| *key != "usage") {
            if !first {
                rewritten.push(b',');
            }
            first = false;
            // A key borrowed from the text has no escape, so it is written as it was.
            rewritten.push(b'"');
            rewritten.extend_from_slice(key.as_bytes());
            rewritten.extend_from_slice(b"\":");
            rewritten.extend_from_slice(value.get().as_bytes());
        }
        rewritten.extend_from_slice(b"}\n\n");
        Some(Self::Rewritten(Bytes::from(rewritten)))
    }

    /// [`Self::of`] from the event's whole tree.
    pub(super) fn by_tree(event: &[u8]) -> Self {
        let Some(mut chunk) = event_object(event) else {
            return Self::Same;
        };
        let Some(usage) = chunk.remove("usage") else {
            return Self::Same;
        };
        let no_choices = match chunk.get("choices") {
            None => true,
            Some(Value::Array(choices)) => choices.is_empty(),
            Some(_) => false,
        };
        if !usage.is_null() && no_choices {
            // The chunk exists only because usage was requested.
            return Self::Skip;
        }
        // `"usage": null` on an ordinary chunk, or counts on a content chunk (some
        // OpenAI-compatible servers report usage there): the chunk stays, the member goes.
        Self::Rewritten(data_event(&Value::Object(chunk)))
    }
}

/// An object's top-level members in the order written, each value as its
/// text. A key written with an escape is not borrowed and fails the read,
/// which sends the event to the tree.
struct Members<'a>(Vec<(&'a str, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> Visitor<'de> for Visit {
            type Value = Members<'de>;

            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut members = Vec::with_capacity(map.size_hint().unwrap_or(8));
                while let Some(key) = map.next_key::<&'de str>()? {
                    members.push((key, map.next_value::<&'de RawValue>()?));
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(Visit)
    }
}

/// `event` as a caller who did not ask for usage receives it; `None` when it receives nothing.
///
/// For replaying a cached stream event by event; a [`StreamReader`](super::StreamReader)
/// made with [`CallerUsage::NotAsked`] applies the same rule, computed once per event.
pub fn without_usage(event: &Bytes) -> Option<Bytes> {
    match UsageFree::of(event) {
        UsageFree::Same => Some(event.clone()),
        UsageFree::Skip => None,
        UsageFree::Rewritten(event) => Some(event),
    }
}
