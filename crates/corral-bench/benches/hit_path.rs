//! The hit path in process: the suite's cached request (the first line of
//! `prompts/corpus.jsonl`) through corral's whole router, with the shipped
//! `config.yaml` (request id and span, admission, parse, fingerprint, cache
//! read, response headers, metrics), but without sockets; beside a router that
//! returns the same bytes. `corral-bench suite` measures the hit path over
//! loopback, where the kernel's share and a shared machine's noise dominate;
//! this isolates what corral itself adds per request, so a change to the hot
//! path shows here. `corral-bench suite` reports the ratio of the two.

use std::{path::Path, sync::Arc, time::Instant};

use axum::{Router, body::Body, http::Request, routing::post};
use bytes::Bytes;
use corral::{AppState, Config};
use corral_bench::workload::{Mix, Workload, load_corpus};
use criterion::{Criterion, black_box, criterion_group, criterion_main};
use http_body_util::BodyExt;
use mock_upstream::{MockProvider, MockSettings};
use tower::ServiceExt;

/// One request as the load tool sends it.
fn request(path: &str, body: &Bytes) -> Request<Body> {
    Request::post(format!("/v1{path}"))
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-bench")
        .header("host", "127.0.0.1")
        .body(Body::from(body.clone()))
        .expect("a valid request")
}

/// Sends `iters` requests one after the other and returns the time they took.
/// `router`: corral's API (its pipeline in front of its router) or the bare one.
async fn run<S>(router: &S, path: &str, body: &Bytes, iters: u64) -> std::time::Duration
where
    S: tower::Service<
            Request<Body>,
            Response = axum::response::Response,
            Error = std::convert::Infallible,
        > + Clone,
{
    let started = Instant::now();
    for _ in 0..iters {
        let response = router
            .clone()
            .oneshot(request(path, body))
            .await
            .expect("infallible");
        assert!(response.status().is_success(), "{}", response.status());
        black_box(response.into_body().collect().await.expect("a body"));
    }
    started.elapsed()
}

fn bench(c: &mut Criterion) {
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let corpus = load_corpus(&root.join("prompts/corpus.jsonl")).expect("the corpus loads");
    let workload =
        Workload::new(&corpus, Mix::Identical { index: 0 }, false, "hit-path").expect("workload");
    let prepared = workload.request(0, &mut rand::rng());
    let (path, body) = (prepared.path, prepared.body);

    let (_provider, corral, cached) = runtime.block_on(async {
        let provider = MockProvider::start(MockSettings::default())
            .await
            .expect("the mock starts");
        let yaml = std::fs::read_to_string(root.join("config.yaml")).expect("config.yaml");
        let base_url = provider.base_url();
        let mut config = Config::load(&yaml, [("CORRAL_UPSTREAM_BASE_URL", base_url.as_str())])
            .expect("config.yaml loads");
        // As the suite runs it: the per-request log line is measured on its own there.
        config.log.requests = false;
        // Spans are part of the cost: the binary's subscriber, at its default level.
        std::mem::forget(corral::telemetry::init(config.log.format));
        let state = Arc::new(AppState::build(config).expect("state builds"));
        let corral = corral::api::router(state);
        // The first request fills the cache; every measured one is a HIT.
        run(&corral, path, &body, 2).await;
        let response = corral
            .clone()
            .oneshot(request(path, &body))
            .await
            .expect("infallible");
        assert_eq!(response.headers()["x-corral-cache"], "HIT");
        let cached = response.into_body().collect().await.expect("a body");
        (provider, corral, cached.to_bytes())
    });
    // The physical limit in process: a router that returns the same bytes.
    let same_bytes = Router::new().route(
        &format!("/v1{path}"),
        post(move |body: Bytes| {
            let cached = cached.clone();
            async move {
                black_box(body);
                ([("content-type", "application/json")], cached)
            }
        }),
    );

    let mut group = c.benchmark_group("hit_path");
    group
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(3))
        .sample_size(30);
    group.bench_function("same_bytes_router", |b| {
        b.iter_custom(|iters| runtime.block_on(run(&same_bytes, path, &body, iters)))
    });
    group.bench_function("corral_router", |b| {
        b.iter_custom(|iters| runtime.block_on(run(&corral, path, &body, iters)))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
