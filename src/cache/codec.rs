//! The self-describing byte format of values corral keeps in Redis: cache
//! entries, flight records and the retry window's answers.
//!
//! `magic (4) | header length (u32 BE) | header JSON | body bytes`. The header
//! names the format version, the tenant scope and the full fingerprint, and
//! every read checks them against the key it read: a value that does not match
//! (garbage, an old format, another fingerprint or tenant, or a previous
//! command's reply returned after a client timeout) is rejected, never served.
//! Decoding never panics, whatever the bytes.

use std::{sync::Arc, time::Duration};

use axum::http::{HeaderName, HeaderValue, StatusCode};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::{Entry, StoredResponse, Usage};
use crate::fingerprint::{CacheKey, Sent};

/// Bumped with any change of the header or layout.
const MAGIC: &[u8; 4] = b"CRL\x01";
/// Headers larger than this are not ours.
const MAX_HEADER_BYTES: usize = 64 * 1024;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("not a corral value, or another format version")]
    Magic,
    #[error("truncated value")]
    Truncated,
    #[error("unreadable header: {0}")]
    Header(String),
    #[error("value belongs to another key")]
    ForeignKey,
    #[error("value is a {found:?}, expected a {expected:?}")]
    ValueKind {
        expected: ValueKind,
        found: ValueKind,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ValueKind {
    /// A cached response.
    Entry,
    /// How one flight ended, for its followers (and negative caching).
    Record,
    /// A completed answer kept for the client's retries (`retry_window.rs`).
    Retained,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    kind: ValueKind,
    scope: String,
    fingerprint: String,
    status: u16,
    headers: Vec<(String, String)>,
    usage: Option<Usage>,
    /// Catches a value cut short anywhere in its body.
    body_len: u64,
    stored_at_ms: u64,
    #[serde(default)]
    soft_expires_at_ms: u64,
    #[serde(default)]
    hard_expires_at_ms: u64,
    #[serde(default)]
    compute_us: u64,
    /// Records only: the owner's lock token, and whether the flight failed.
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    failed: bool,
    /// Records only: what the owner's call sent, in hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sends: Option<String>,
    /// Retained answers of streamed flights: the length of each SSE event,
    /// stored after the response body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    event_lens: Option<Vec<u64>>,
}

/// How a flight ended, as followers on other instances read it.
#[derive(Debug, Clone)]
pub struct FlightRecord {
    /// The lock token of the owner that wrote it.
    pub token: String,
    /// True when `response` is the error the flight ended with.
    pub failed: bool,
    pub response: Arc<StoredResponse>,
    pub recorded_at_ms: u64,
    /// What the owner's call sent (`fingerprint::Sent`): a refusal of those
    /// bytes answers no other bytes.
    pub sends: Option<Sent>,
}

pub fn encode_entry(key: &CacheKey, entry: &Entry) -> Vec<u8> {
    let header = Header {
        kind: ValueKind::Entry,
        scope: key.scope.as_str().to_owned(),
        fingerprint: key.fingerprint.hex(),
        status: entry.response.status.as_u16(),
        headers: header_pairs(&entry.response),
        usage: entry.response.usage,
        body_len: entry.response.body.len() as u64,
        stored_at_ms: entry.stored_at_ms,
        soft_expires_at_ms: entry.soft_expires_at_ms,
        hard_expires_at_ms: entry.hard_expires_at_ms,
        compute_us: entry.compute_time.as_micros() as u64,
        token: None,
        failed: false,
        sends: None,
        event_lens: None,
    };
    encode(&header, &entry.response.body)
}

pub fn decode_entry(bytes: &[u8], key: &CacheKey) -> Result<Entry, DecodeError> {
    let (header, response) = decode(bytes, key, ValueKind::Entry)?;
    Ok(Entry {
        response,
        stored_at_ms: header.stored_at_ms,
        soft_expires_at_ms: header.soft_expires_at_ms,
        hard_expires_at_ms: header.hard_expires_at_ms,
        compute_time: Duration::from_micros(header.compute_us),
    })
}

pub fn encode_record(key: &CacheKey, record: &FlightRecord) -> Vec<u8> {
    let header = Header {
        kind: ValueKind::Record,
        scope: key.scope.as_str().to_owned(),
        fingerprint: key.fingerprint.hex(),
        status: record.response.status.as_u16(),
        headers: header_pairs(&record.response),
        usage: record.response.usage,
        body_len: record.response.body.len() as u64,
        stored_at_ms: record.recorded_at_ms,
        soft_expires_at_ms: 0,
        hard_expires_at_ms: 0,
        compute_us: 0,
        token: Some(record.token.clone()),
        failed: record.failed,
        sends: record.sends.map(|sends| sends.hex()),
        event_lens: None,
    };
    encode(&header, &record.response.body)
}

pub fn decode_record(bytes: &[u8], key: &CacheKey) -> Result<FlightRecord, DecodeError> {
    let (header, response) = decode(bytes, key, ValueKind::Record)?;
    Ok(FlightRecord {
        token: header
            .token
            .ok_or_else(|| DecodeError::Header("a record without its owner token".into()))?,
        failed: header.failed,
        response,
        recorded_at_ms: header.stored_at_ms,
        sends: header.sends.as_deref().and_then(Sent::from_hex),
    })
}

/// A completed answer and, for a streamed flight, its events as callers
/// received them; `stored_at_ms` on the gateway's clock.
pub fn encode_retained(
    key: &CacheKey,
    response: &StoredResponse,
    events: &[Bytes],
    stored_at_ms: u64,
) -> Vec<u8> {
    let event_lens: Vec<u64> = events.iter().map(|event| event.len() as u64).collect();
    let header = Header {
        kind: ValueKind::Retained,
        scope: key.scope.as_str().to_owned(),
        fingerprint: key.fingerprint.hex(),
        status: response.status.as_u16(),
        headers: header_pairs(response),
        usage: response.usage,
        body_len: response.body.len() as u64 + event_lens.iter().sum::<u64>(),
        stored_at_ms,
        soft_expires_at_ms: 0,
        hard_expires_at_ms: 0,
        compute_us: 0,
        token: None,
        failed: false,
        sends: None,
        event_lens: (!events.is_empty()).then_some(event_lens),
    };
    let mut body = Vec::with_capacity(header.body_len as usize);
    body.extend_from_slice(&response.body);
    for event in events {
        body.extend_from_slice(event);
    }
    encode(&header, &body)
}

/// The inverse of `encode_retained`: the response, its events, and when it was stored.
pub fn decode_retained(
    bytes: &[u8],
    key: &CacheKey,
) -> Result<(Arc<StoredResponse>, Vec<Bytes>, u64), DecodeError> {
    let (header, response) = decode(bytes, key, ValueKind::Retained)?;
    let Some(lens) = header.event_lens else {
        return Ok((response, Vec::new(), header.stored_at_ms));
    };
    // `decode` checked that the whole tail is there; the events are its end.
    let all = response.body.clone();
    let events_len = lens
        .iter()
        .try_fold(0u64, |sum, len| sum.checked_add(*len))
        .filter(|sum| *sum <= all.len() as u64)
        .ok_or(DecodeError::Truncated)? as usize;
    let body_len = all.len() - events_len;
    let mut events = Vec::with_capacity(lens.len());
    let mut at = body_len;
    for len in lens {
        let end = at + len as usize;
        events.push(all.slice(at..end));
        at = end;
    }
    let response = Arc::new(StoredResponse {
        status: response.status,
        headers: response.headers.clone(),
        body: all.slice(..body_len),
        usage: response.usage,
    });
    Ok((response, events, header.stored_at_ms))
}

fn header_pairs(response: &StoredResponse) -> Vec<(String, String)> {
    response
        .headers
        .iter()
        .filter_map(|(name, value)| {
            Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned()))
        })
        .collect()
}

fn encode(header: &Header, body: &[u8]) -> Vec<u8> {
    let header = serde_json::to_vec(header).expect("a header always serializes");
    let mut out = Vec::with_capacity(8 + header.len() + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(header.len() as u32).to_be_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(body);
    out
}

fn decode(
    bytes: &[u8],
    key: &CacheKey,
    expected: ValueKind,
) -> Result<(Header, Arc<StoredResponse>), DecodeError> {
    let rest = bytes
        .strip_prefix(MAGIC.as_slice())
        .ok_or(DecodeError::Magic)?;
    let (length, rest) = rest
        .split_first_chunk::<4>()
        .ok_or(DecodeError::Truncated)?;
    let length = u32::from_be_bytes(*length) as usize;
    if length > MAX_HEADER_BYTES {
        return Err(DecodeError::Header(format!("header of {length} bytes")));
    }
    if rest.len() < length {
        return Err(DecodeError::Truncated);
    }
    let (header, body) = rest.split_at(length);
    let header: Header =
        serde_json::from_slice(header).map_err(|err| DecodeError::Header(err.to_string()))?;
    if header.scope != key.scope.as_str() || header.fingerprint != key.fingerprint.hex() {
        return Err(DecodeError::ForeignKey);
    }
    if header.body_len != body.len() as u64 {
        return Err(DecodeError::Truncated);
    }
    if header.kind != expected {
        return Err(DecodeError::ValueKind {
            expected,
            found: header.kind,
        });
    }
    let status = StatusCode::from_u16(header.status)
        .map_err(|_| DecodeError::Header(format!("status {}", header.status)))?;
    let mut headers = Vec::with_capacity(header.headers.len());
    for (name, value) in &header.headers {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| DecodeError::Header(format!("header name {name:?}")))?;
        let value = HeaderValue::from_str(value)
            .map_err(|_| DecodeError::Header(format!("header value of {name}")))?;
        headers.push((name, value));
    }
    let response = Arc::new(StoredResponse {
        status,
        headers,
        body: Bytes::copy_from_slice(body),
        usage: header.usage,
    });
    Ok((header, response))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::tenant::TenantScope;

    fn key(scope: &str, body: &[u8]) -> CacheKey {
        CacheKey::for_tests(TenantScope::from_stored(scope), body)
    }

    fn entry() -> Entry {
        Entry {
            response: Arc::new(StoredResponse {
                status: StatusCode::OK,
                headers: vec![(
                    HeaderName::from_static("content-type"),
                    HeaderValue::from_static("application/json"),
                )],
                body: Bytes::from_static(br#"{"choices":[]}"#),
                usage: Some(Usage {
                    prompt_tokens: 3,
                    completion_tokens: 5,
                    ..Usage::default()
                }),
            }),
            stored_at_ms: 10,
            soft_expires_at_ms: 20,
            hard_expires_at_ms: 30,
            compute_time: Duration::from_millis(7),
        }
    }

    #[test]
    fn entries_round_trip() {
        let k = key("t1", b"a");
        let decoded = decode_entry(&encode_entry(&k, &entry()), &k).unwrap();
        assert_eq!(decoded.response.body, entry().response.body);
        assert_eq!(decoded.response.usage, entry().response.usage);
        assert_eq!(decoded.response.headers, entry().response.headers);
        assert_eq!(
            (
                decoded.stored_at_ms,
                decoded.soft_expires_at_ms,
                decoded.hard_expires_at_ms
            ),
            (10, 20, 30)
        );
        assert_eq!(decoded.compute_time, Duration::from_millis(7));
    }

    #[test]
    fn a_value_under_the_wrong_key_is_rejected() {
        let bytes = encode_entry(&key("t1", b"a"), &entry());
        assert_eq!(
            decode_entry(&bytes, &key("t1", b"b")).unwrap_err(),
            DecodeError::ForeignKey
        );
        assert_eq!(
            decode_entry(&bytes, &key("t2", b"a")).unwrap_err(),
            DecodeError::ForeignKey
        );
        assert_eq!(
            decode_entry(b"OK", &key("t1", b"a")).unwrap_err(),
            DecodeError::Magic
        );
        assert!(matches!(
            decode_record(&bytes, &key("t1", b"a")),
            Err(DecodeError::ValueKind { .. })
        ));
    }

    #[test]
    fn records_round_trip() {
        let k = key("t1", b"a");
        let record = FlightRecord {
            token: "tok".into(),
            failed: true,
            response: entry().response,
            recorded_at_ms: 99,
            sends: Some(crate::fingerprint::Sent::of(true, b"{}")),
        };
        let decoded = decode_record(&encode_record(&k, &record), &k).unwrap();
        assert_eq!(decoded.token, "tok");
        assert!(decoded.failed);
        assert_eq!(decoded.recorded_at_ms, 99);
        assert_eq!(decoded.sends, record.sends);
        // A record written before `sends` existed reads as sending nothing known.
        let older = FlightRecord {
            sends: None,
            ..record
        };
        assert_eq!(
            decode_record(&encode_record(&k, &older), &k).unwrap().sends,
            None
        );
    }

    #[test]
    fn retained_answers_round_trip_with_their_events() {
        let k = key("t1", b"a");
        let response = entry().response;
        let events = [
            Bytes::from_static(b"data: {\"a\":1}\n\n"),
            Bytes::from_static(b"data: [DONE]\n\n"),
        ];
        let bytes = encode_retained(&k, &response, &events, 42);
        let (decoded, decoded_events, stored_at) = decode_retained(&bytes, &k).unwrap();
        assert_eq!(decoded.body, response.body);
        assert_eq!(decoded.usage, response.usage);
        assert_eq!(decoded_events, events);
        assert_eq!(stored_at, 42);
        let (_, none, _) = decode_retained(&encode_retained(&k, &response, &[], 1), &k).unwrap();
        assert!(none.is_empty());
        assert!(matches!(
            decode_entry(&bytes, &k),
            Err(DecodeError::ValueKind { .. })
        ));
        assert_eq!(
            decode_retained(&bytes, &key("t2", b"a")).unwrap_err(),
            DecodeError::ForeignKey
        );
    }

    proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let k = key("t1", b"a");
            let _ = decode_entry(&bytes, &k);
            let _ = decode_record(&bytes, &k);
            let _ = decode_retained(&bytes, &k);
            let mut framed = MAGIC.to_vec();
            framed.extend_from_slice(&bytes);
            let _ = decode_entry(&framed, &k);
        }

        #[test]
        fn a_truncated_value_is_always_rejected(cut in 0usize..1000) {
            let k = key("t1", b"a");
            let bytes = encode_entry(&k, &entry());
            let cut = cut % bytes.len();
            prop_assert!(decode_entry(&bytes[..cut], &k).is_err());
        }
    }
}
