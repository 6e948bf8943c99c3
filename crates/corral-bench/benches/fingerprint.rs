//! The fingerprint's cost: normalize (canonical body) + SHA-256 of 1 KB,
//! 32 KB and 1 MB chat requests, beside raw SHA-256 of the same bytes (the
//! limit: a key can be no cheaper than hashing its input once) and beside the
//! whole request-side work (JSON parse + normalize + SHA-256). Throughput is
//! in request bytes; `corral-bench suite` reads criterion's estimates from
//! `target/criterion/fingerprint/` and reports the ratios.

use std::time::Duration;

use corral::{
    fingerprint::{Endpoint, Fingerprint, KeyInput, Normalization, canonical_body},
    tenant::TenantScope,
};
use criterion::{BenchmarkId, Criterion, Throughput, black_box, criterion_group, criterion_main};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

/// A chat request of about `size` bytes: a system prompt and a conversation of
/// ~400-byte turns, the shape long-context traffic has.
fn request_of(size: usize) -> Vec<u8> {
    let turn = "The quarterly report shows revenue up 12% on the year, driven by the \
        cloud segment, while hardware margins narrowed. Summarize the drivers, the risks \
        named by management, and what changed since the last quarter.\r\n Keep numbers exact; \
        quote the guidance verbatim where it is given, and flag any restated figure. ";
    let mut messages = vec![json!({"role": "system", "content": "You are a careful analyst."})];
    let mut body = json!({"model": "gpt-4o-mini", "temperature": 0, "messages": []});
    let mut i = 0;
    loop {
        body["messages"] = Value::Array(messages.clone());
        let bytes = serde_json::to_vec(&body).unwrap();
        if bytes.len() >= size {
            return bytes;
        }
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        messages.push(json!({"role": role, "content": format!("{i}: {turn}")}));
        i += 1;
    }
}

fn fingerprint(map: &Map<String, Value>, scope: &TenantScope) -> Fingerprint {
    let body = canonical_body(map, Normalization::default());
    Fingerprint::of(&KeyInput {
        endpoint: Endpoint::ChatCompletions,
        upstream: "openai",
        scope,
        headers: &[],
        query: &[],
        body: &body,
    })
}

fn bench(c: &mut Criterion) {
    let scope = TenantScope::global();
    let mut group = c.benchmark_group("fingerprint");
    group
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30);
    for (name, size) in [("1KB", 1 << 10), ("32KB", 32 << 10), ("1MB", 1 << 20)] {
        let bytes = request_of(size);
        let map: Map<String, Value> = serde_json::from_slice(&bytes).unwrap();
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        group.bench_with_input(BenchmarkId::new("raw_sha256", name), &bytes, |b, bytes| {
            b.iter(|| Sha256::digest(black_box(bytes)))
        });
        group.bench_with_input(
            BenchmarkId::new("canonical_sha256", name),
            &map,
            |b, map| b.iter(|| fingerprint(black_box(map), &scope)),
        );
        group.bench_with_input(
            BenchmarkId::new("parse_canonical_sha256", name),
            &bytes,
            |b, bytes| {
                b.iter(|| {
                    let map: Map<String, Value> = serde_json::from_slice(black_box(bytes)).unwrap();
                    fingerprint(&map, &scope)
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
