//! The pick's cost (issue 38: under a microsecond): `routing::order` over
//! pools of 2, 4 and 16 members, with every member usable and with a quarter
//! cooling, and `Pool::order` (the same with the cooldowns read); beside
//! `routing::affinity_key` on a typical chat body (a system prompt and a few
//! turns) and on one naming its `prompt_cache_key`. A hit never picks: only a
//! call that goes upstream pays this.

use std::{num::NonZeroU32, sync::Arc, time::Duration};

use corral::{
    clock::SystemClock,
    routing::{AffinityKey, MemberSpec, Pool, affinity_key, order},
};
use criterion::{BenchmarkId, Criterion, black_box, criterion_group, criterion_main};
use http::HeaderMap;
use serde_json::{Map, Value, json};

fn members(n: usize) -> Vec<MemberSpec> {
    (0..n)
        .map(|i| MemberSpec {
            weight: NonZeroU32::new(1 + i as u32 % 3).expect("non-zero"),
            priority: u32::from(i >= n.max(4) * 3 / 4),
            quota: None,
            ..MemberSpec::named(&format!("openai-org-{i}"))
        })
        .collect()
}

fn chat_body() -> Map<String, Value> {
    let body = json!({
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "You are a careful analyst. Quote figures exactly and flag any restatement."},
            {"role": "user", "content": "Summarize the quarterly report: revenue up 12% on the year, cloud growing, hardware margins narrower."},
            {"role": "assistant", "content": "Revenue grew 12%, led by cloud; hardware margins narrowed."},
            {"role": "user", "content": "What risks did management name?"},
        ],
        "temperature": 0,
    });
    match body {
        Value::Object(map) => map,
        _ => unreachable!("an object literal"),
    }
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("pick");
    group
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(30);
    let mut out = Vec::with_capacity(16);
    let mut key = 0u64;
    for n in [2usize, 4, 16] {
        let specs = members(n);
        group.bench_with_input(BenchmarkId::new("order", n), &specs, |b, specs| {
            b.iter(|| {
                key = key.wrapping_add(0x9e37_79b9_7f4a_7c15);
                order(black_box(specs), |_| true, AffinityKey(key), &mut out);
                black_box(out[0])
            })
        });
        group.bench_with_input(
            BenchmarkId::new("order_quarter_cooling", n),
            &specs,
            |b, specs| {
                b.iter(|| {
                    key = key.wrapping_add(0x9e37_79b9_7f4a_7c15);
                    order(black_box(specs), |i| i % 4 != 1, AffinityKey(key), &mut out);
                    black_box(out[0])
                })
            },
        );
        let pool = Pool::new(specs.clone(), Arc::new(SystemClock));
        pool.cool(n - 1, Duration::from_secs(3600));
        group.bench_with_input(BenchmarkId::new("pool_order", n), &pool, |b, pool| {
            b.iter(|| {
                key = key.wrapping_add(0x9e37_79b9_7f4a_7c15);
                pool.order(AffinityKey(key), |_| false, &mut out);
                black_box(out[0])
            })
        });
    }
    let headers = HeaderMap::new();
    let body = chat_body();
    group.bench_function("affinity_key/chat_opening", |b| {
        b.iter(|| affinity_key(black_box(&headers), black_box(&body)))
    });
    let mut named = chat_body();
    named.insert("prompt_cache_key".into(), json!("session-7f3a9c"));
    group.bench_function("affinity_key/prompt_cache_key", |b| {
        b.iter(|| affinity_key(black_box(&headers), black_box(&named)))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
