//! CI smoke of the load tool (`corral::bench`), so it cannot rot: small
//! counts against an in-process gateway and mock, assertions on counts only
//! (requests, errors, upstream calls, cache statuses), never on timings.

use std::{path::Path, sync::Arc};

use corral::bench::{
    self, Mix, Scenario, Stop,
    workload::{Prompt, load_corpus},
};

use crate::harness::TestGateway;

fn corpus() -> Arc<Vec<Prompt>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("prompts/corpus.jsonl");
    Arc::new(load_corpus(&path).expect("the corpus loads"))
}

fn scenario(gateway: &TestGateway, name: &str, mix: Mix, requests: u64) -> Scenario {
    let mut scenario = Scenario::new(name, vec![format!("{}/v1", gateway.url)], corpus());
    scenario.mock = Some(gateway.provider.base_url());
    scenario.mix = mix;
    scenario.concurrency = 8;
    scenario.stop = Stop::Requests(requests);
    scenario
}

fn cache_count(report: &bench::LoadReport, label: &str) -> u64 {
    report.by_cache.get(label).map_or(0, |b| b.count)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_requests_are_counted_and_cost_one_upstream_call() {
    let gateway = TestGateway::start(|_| {}).await;
    let report = bench::run(&scenario(
        &gateway,
        "smoke: identical",
        Mix::Identical { index: 0 },
        200,
    ))
    .await
    .expect("the load run completes");
    println!("{}", report.table());
    assert_eq!(report.requests, 200);
    assert_eq!(report.ok, 200);
    assert_eq!(report.errors, 0, "{:?}", report.errors_by_kind);
    assert_eq!(report.unsent, 0);
    assert_eq!(report.upstream_calls, Some(1));
    assert_eq!(report.distinct_bodies, 1, "every caller got the same bytes");
    assert_eq!(cache_count(&report, "MISS"), 1);
    assert_eq!(
        cache_count(&report, "MISS")
            + cache_count(&report, "COALESCED")
            + cache_count(&report, "HIT"),
        200
    );
    let metrics = report.metrics.expect("corral serves /metrics");
    assert_eq!(metrics.requests_by_cache.values().sum::<f64>(), 200.0);
    assert_eq!(metrics.upstream_requests, 1.0);
    assert!(report.latency.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_requests_each_cost_a_call_and_zipf_repeats_are_saved() {
    let gateway = TestGateway::start(|_| {}).await;
    let distinct = bench::run(&scenario(&gateway, "smoke: distinct", Mix::Distinct, 100))
        .await
        .expect("the distinct run completes");
    assert_eq!((distinct.ok, distinct.errors), (100, 0));
    assert_eq!(distinct.upstream_calls, Some(100));
    assert_eq!(cache_count(&distinct, "MISS"), 100);

    let mut zipf = scenario(
        &gateway,
        "smoke: zipf at a fixed rate",
        Mix::Zipf { s: 1.1 },
        200,
    );
    zipf.rate = Some(2000.0);
    let zipf = bench::run(&zipf).await.expect("the zipf run completes");
    println!("{}", zipf.table());
    assert_eq!((zipf.ok, zipf.errors), (200, 0));
    let calls = zipf.upstream_calls.expect("the mock counts calls");
    assert!(
        (1..=60).contains(&calls),
        "{calls} calls for at most 60 prompts"
    );
    assert_eq!(
        zipf.metrics.expect("metrics").upstream_requests,
        calls as f64
    );
    assert!(
        zipf.schedule_lag.is_some(),
        "an open-loop run reports its lag"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_are_read_to_the_end() {
    let gateway = TestGateway::start(|_| {}).await;
    let mut streams = scenario(&gateway, "smoke: streams", Mix::Identical { index: 0 }, 20);
    streams.stream = true;
    let report = bench::run(&streams)
        .await
        .expect("the stream run completes");
    println!("{}", report.table());
    assert_eq!(
        (report.ok, report.errors),
        (20, 0),
        "{:?}",
        report.errors_by_kind
    );
    assert!(report.first_byte.is_some());
    assert!(report.upstream_calls.is_some());
}
