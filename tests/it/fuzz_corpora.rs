//! The fuzz targets of `fuzz/` as ordinary stable tests: every committed seed
//! in `fuzz/corpus/<target>/` is replayed, then property strategies (arbitrary
//! bytes, structured JSON, mutated seeds, SSE made of plausible lines) feed the
//! same functions for a bounded number of cases. `cargo fuzz` needs nightly,
//! which CI lacks; this keeps "no input panics them" checked on every run.

use std::{path::PathBuf, time::Duration};

use bytes::Bytes;
use corral::{
    cache::codec::{decode_entry, decode_record, encode_entry, encode_record},
    crypto::Sealer,
    fingerprint::{CacheKey, Endpoint, Fingerprint, KeyInput, Normalization, canonical_body},
    sse::{StreamLog, relay},
    tenant::TenantScope,
    validate::{InputLimits, check_fields, parse_json},
};
use proptest::prelude::*;
use serde_json::{Map, Value};

/// The bodies of the fuzz targets, kept in step with `fuzz/fuzz_targets/`.
mod target {
    use super::*;

    pub fn canonical(data: &[u8]) {
        let Ok(Value::Object(body)) = serde_json::from_slice(data) else {
            return;
        };
        for case_fold in [false, true] {
            let normalization = Normalization {
                case_fold,
                ..Normalization::default()
            };
            let canonical = canonical_body(&body, normalization);
            let again: Map<String, Value> =
                serde_json::from_slice(&canonical).expect("canonical bodies are JSON objects");
            assert_eq!(canonical_body(&again, normalization), canonical);
        }
    }

    pub fn validate(data: &[u8]) {
        let limits = InputLimits {
            max_json_depth: 16,
            max_messages: 8,
        };
        if let Ok(Value::Object(body)) = parse_json(data, limits) {
            let _ = check_fields(Endpoint::ChatCompletions, &body, limits);
        }
    }

    pub fn fuzz_key() -> CacheKey {
        let scope = TenantScope::global();
        let fingerprint = Fingerprint::of(&KeyInput {
            endpoint: Endpoint::ChatCompletions,
            upstream: "fuzz",
            scope: &scope,
            headers: &[],
            query: &[],
            body: b"{}",
        });
        CacheKey { scope, fingerprint }
    }

    /// Whether anything decoded (the seeds must reach past the checks).
    pub fn cache_value(data: &[u8]) -> bool {
        let key = fuzz_key();
        let mut decoded = false;
        if let Ok(entry) = decode_entry(data, &key) {
            let again = decode_entry(&encode_entry(&key, &entry), &key).expect("round trip");
            assert_eq!(again.response.body, entry.response.body);
            decoded = true;
        }
        if let Ok(record) = decode_record(data, &key) {
            let again = decode_record(&encode_record(&key, &record), &key).expect("round trip");
            assert_eq!(again.token, record.token);
            decoded = true;
        }
        decoded
    }

    pub fn sealed(data: &[u8]) {
        let sealer = Sealer::new(&[7; 32]);
        assert!(sealer.open(b"corral:v1:global:resp:{fuzz}", data).is_err());
    }

    pub fn sse(data: &[u8]) {
        let Some((&cut, body)) = data.split_first() else {
            return;
        };
        let step = usize::from(cut).max(1);
        let chunks: Vec<Result<Bytes, std::io::Error>> = body
            .chunks(step)
            .map(|chunk| Ok(Bytes::copy_from_slice(chunk)))
            .collect();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let summary = runtime.block_on(async {
            let (_log, writer) = StreamLog::with_limits(
                &corral::wire::chat::STREAM,
                corral::sse::LogLimits {
                    max_bytes: 64 * 1024,
                    max_reader_lag: usize::MAX,
                    tally: None,
                },
            );
            relay(
                futures::stream::iter(chunks),
                writer,
                Duration::from_secs(5),
            )
            .await
        });
        for event in &summary.events {
            assert!(
                event.starts_with(b"data: ") && event.ends_with(b"\n\n"),
                "{event:?}"
            );
        }
    }
}

fn corpus(name: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(name);
    let mut seeds: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|err| panic!("{}: {err}", dir.display()))
        .map(|entry| {
            let path = entry.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            (path, bytes)
        })
        .collect();
    seeds.sort();
    assert!(!seeds.is_empty(), "{name} has seeds");
    seeds
}

#[test]
fn the_committed_corpora_replay_without_a_panic() {
    for (_, seed) in corpus("canonical_body") {
        target::canonical(&seed);
    }
    for (_, seed) in corpus("validate_json") {
        target::validate(&seed);
    }
    let decoded = corpus("cache_value")
        .iter()
        .filter(|(_, seed)| target::cache_value(seed))
        .count();
    assert!(decoded >= 2, "the valid seeds decode ({decoded})");
    for (_, seed) in corpus("sealed_value") {
        target::sealed(&seed);
    }
    for (_, seed) in corpus("sse_relay") {
        target::sse(&seed);
    }
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "[ -~\\r\\n\\t\u{e9}\u{1F600}]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::vec(("[a-z_]{1,8}", inner), 0..6)
                .prop_map(|fields| Value::Object(fields.into_iter().collect())),
        ]
    })
}

fn request_body() -> impl Strategy<Value = Vec<u8>> {
    (
        proptest::collection::vec(("[a-z_]{1,10}", json_value()), 0..8),
        proptest::option::of(json_value()),
    )
        .prop_map(|(fields, messages)| {
            let mut body: Map<String, Value> = fields.into_iter().collect();
            body.insert("model".into(), Value::from("gpt-4o-mini"));
            if let Some(messages) = messages {
                body.insert("messages".into(), messages);
            }
            serde_json::to_vec(&Value::Object(body)).unwrap()
        })
}

/// A seed with a few bytes changed, some cut off, or some inserted.
fn mutated(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    (
        proptest::sample::select(seeds),
        proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        proptest::option::of(any::<prop::sample::Index>()),
    )
        .prop_map(|(mut seed, flips, cut)| {
            if !seed.is_empty() {
                for (at, byte) in flips {
                    let at = at.index(seed.len());
                    seed[at] = byte;
                }
                if let Some(cut) = cut {
                    seed.truncate(cut.index(seed.len()));
                }
            }
            seed
        })
}

fn sse_body() -> impl Strategy<Value = Vec<u8>> {
    let line = prop_oneof![
        Just(b"data: [DONE]".to_vec()),
        Just(b": keep-alive".to_vec()),
        Just(b"event: message".to_vec()),
        Just(b"id: 7".to_vec()),
        Just(b"retry: 5".to_vec()),
        Just(b"data:".to_vec()),
        Just(b"".to_vec()),
        json_value().prop_map(|v| format!("data: {v}").into_bytes()),
        proptest::collection::vec(any::<u8>(), 0..16),
    ];
    let ending = prop_oneof![Just(&b"\n"[..]), Just(&b"\r\n"[..]), Just(&b"\r"[..])];
    (
        any::<u8>(),
        proptest::collection::vec((line, ending), 0..24),
    )
        .prop_map(|(cut, lines)| {
            let mut body = vec![cut];
            for (line, ending) in lines {
                body.extend_from_slice(&line);
                body.extend_from_slice(ending);
            }
            body
        })
}

fn seeds(name: &str) -> Vec<Vec<u8>> {
    corpus(name).into_iter().map(|(_, bytes)| bytes).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, max_shrink_time: 10_000, ..ProptestConfig::default() })]

    #[test]
    fn the_normalizer_never_panics_and_is_idempotent(body in request_body()) {
        target::canonical(&body);
        target::validate(&body);
    }

    #[test]
    fn arbitrary_bytes_never_panic_any_target(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        target::canonical(&bytes);
        target::validate(&bytes);
        target::cache_value(&bytes);
        target::sealed(&bytes);
    }

    #[test]
    fn mutated_cache_values_are_rejected_or_round_trip(bytes in mutated(seeds("cache_value"))) {
        target::cache_value(&bytes);
        target::sealed(&bytes);
    }

    #[test]
    fn mutated_request_bodies_never_panic(bytes in mutated(seeds("validate_json"))) {
        target::canonical(&bytes);
        target::validate(&bytes);
    }

    #[test]
    fn sse_bodies_cut_anywhere_end_in_whole_events(body in sse_body()) {
        target::sse(&body);
    }
}
