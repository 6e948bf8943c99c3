//! Traces: a real OTLP/HTTP receiver on loopback (protobuf bodies decoded with
//! `opentelemetry-proto`) gets one trace per request, with the GenAI and
//! corral attributes, the flight and each upstream attempt as child spans; a
//! caller's `traceparent` is continued and reaches the mock provider. The
//! spans are flushed by the gateway's shutdown, never waited for by a sleep.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{Router, body::Bytes, extract::State, http::HeaderMap, routing::post};
use mock_upstream::Scripted;
use opentelemetry_proto::tonic::{
    collector::trace::v1::ExportTraceServiceRequest,
    common::v1::{AnyValue, KeyValue, any_value},
    trace::v1::{Span, span::SpanKind},
};
use prost::Message as _;
use serde_json::json;
use tokio::{net::TcpListener, sync::watch};

use crate::{
    cluster::redis_config,
    harness::{Fleet, TestGateway, WAIT},
    redis_server::RedisServer,
};

const CHAT: &str = "/v1/chat/completions";
/// The W3C example trace: the caller's trace id and its own span id.
const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
const PROMPT: &str = "a prompt that must never reach a span";

/// One exported span, flattened: ids in hex, attributes as text.
#[derive(Debug, Clone)]
struct Exported {
    trace_id: String,
    span_id: String,
    parent: String,
    name: String,
    kind: SpanKind,
    /// (trace id, span id) of each linked span.
    links: Vec<(String, String)>,
    attributes: BTreeMap<String, String>,
    service: Option<String>,
}

impl Exported {
    fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

/// A loopback OTLP/HTTP trace receiver (`POST /v1/traces`, protobuf).
struct Collector {
    url: String,
    spans: Arc<Mutex<Vec<Exported>>>,
    received: watch::Receiver<usize>,
    _server: tokio::task::JoinHandle<()>,
}

#[derive(Clone)]
struct Sink {
    spans: Arc<Mutex<Vec<Exported>>>,
    received: Arc<watch::Sender<usize>>,
}

fn text(value: &Option<AnyValue>) -> String {
    match value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn attributes(list: &[KeyValue]) -> BTreeMap<String, String> {
    list.iter()
        .map(|kv| (kv.key.clone(), text(&kv.value)))
        .collect()
}

async fn receive(State(sink): State<Sink>, headers: HeaderMap, body: Bytes) -> &'static str {
    assert_eq!(
        headers.get("content-type").and_then(|v| v.to_str().ok()),
        Some("application/x-protobuf"),
        "OTLP/HTTP protobuf"
    );
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP trace export");
    let mut spans = sink.spans.lock().unwrap();
    for resource in &request.resource_spans {
        let service = resource
            .resource
            .as_ref()
            .and_then(|r| attributes(&r.attributes).get("service.name").cloned());
        for scope in &resource.scope_spans {
            for span in &scope.spans {
                spans.push(flatten(span, service.clone()));
            }
        }
    }
    let count = spans.len();
    drop(spans);
    sink.received.send_replace(count);
    // An empty ExportTraceServiceResponse encodes as zero bytes.
    ""
}

fn flatten(span: &Span, service: Option<String>) -> Exported {
    Exported {
        trace_id: hex::encode(&span.trace_id),
        span_id: hex::encode(&span.span_id),
        parent: hex::encode(&span.parent_span_id),
        name: span.name.clone(),
        kind: SpanKind::try_from(span.kind).unwrap_or(SpanKind::Unspecified),
        links: span
            .links
            .iter()
            .map(|link| (hex::encode(&link.trace_id), hex::encode(&link.span_id)))
            .collect(),
        attributes: attributes(&span.attributes),
        service,
    }
}

impl Collector {
    async fn start() -> Self {
        let (sender, received) = watch::channel(0);
        let sink = Sink {
            spans: Arc::default(),
            received: Arc::new(sender),
        };
        let spans = sink.spans.clone();
        let app = Router::new()
            .route("/v1/traces", post(receive))
            .with_state(sink);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            url,
            spans,
            received,
            _server: server,
        }
    }

    /// Every span received, once at least `n` have arrived (bounded wait).
    async fn spans(&self, n: usize) -> Vec<Exported> {
        let mut received = self.received.clone();
        tokio::time::timeout(WAIT, received.wait_for(|count| *count >= n))
            .await
            .unwrap_or_else(|_| {
                panic!("{n} spans never arrived: {:#?}", self.spans.lock().unwrap())
            })
            .unwrap();
        self.spans.lock().unwrap().clone()
    }
}

async fn traced_gateway(collector: &Collector) -> TestGateway {
    let endpoint = collector.url.clone();
    TestGateway::start(move |config| {
        config.telemetry.otlp.endpoint = Some(endpoint);
    })
    .await
}

fn chat(content: &str) -> serde_json::Value {
    json!({
        "model": "gpt-4o-mini",
        "temperature": 0,
        "messages": [{"role": "user", "content": content}],
    })
}

fn of_kind(spans: &[Exported], kind: SpanKind) -> Vec<&Exported> {
    spans.iter().filter(|s| s.kind == kind).collect()
}

/// `00-{trace}-{span}-{flags}` split into its trace id and parent span id.
fn traceparent_ids(value: &str) -> (String, String) {
    let parts: Vec<&str> = value.split('-').collect();
    assert_eq!(parts.len(), 4, "a W3C traceparent: {value}");
    assert_eq!(parts[0], "00");
    (parts[1].to_owned(), parts[2].to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_request_is_one_trace_that_continues_the_callers_and_reaches_the_provider() {
    let collector = Collector::start().await;
    let gateway = traced_gateway(&collector).await;
    let caller = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");

    let miss = gateway
        .post_with(
            CHAT,
            &chat(PROMPT),
            &[("traceparent", &caller), ("tracestate", "vendor=abc")],
        )
        .await;
    assert_eq!(miss.status, 200, "{:?}", miss.body);
    assert_eq!(miss.cache(), "MISS");
    assert_eq!(
        miss.header("content-length"),
        Some(miss.body.len().to_string().as_str()),
        "the traced body keeps its length"
    );
    let hit = gateway.post(CHAT, &chat(PROMPT)).await;
    assert_eq!(hit.cache(), "HIT");
    // Probes are not traced.
    assert_eq!(gateway.get("/healthz").await.status, 200);
    let fingerprint = miss.header("x-corral-fingerprint").unwrap().to_owned();
    let answer = miss.json();

    // The provider received the caller's trace, under corral's attempt span.
    let recorded = gateway.provider.requests();
    assert_eq!(recorded.len(), 1, "one upstream call");
    let sent = recorded[0]
        .header("traceparent")
        .expect("traceparent forwarded upstream");
    let (sent_trace, sent_parent) = traceparent_ids(sent);
    assert_eq!(
        sent_trace, CALLER_TRACE,
        "the caller's trace id goes upstream"
    );
    assert_ne!(
        sent_parent, CALLER_SPAN,
        "upstream's parent is corral's span"
    );
    assert_eq!(recorded[0].header("tracestate"), Some("vendor=abc"));

    // Shutdown drains, then exports what is queued.
    gateway.stop().await;
    let spans = collector.spans(4).await;

    let servers = of_kind(&spans, SpanKind::Server);
    assert_eq!(servers.len(), 2, "one server span per request: {spans:#?}");
    assert_ne!(
        servers[0].trace_id, servers[1].trace_id,
        "one trace per request"
    );

    let server = servers
        .iter()
        .find(|s| s.trace_id == CALLER_TRACE)
        .expect("the miss continues the caller's trace");
    assert_eq!(server.parent, CALLER_SPAN, "child of the caller's span");
    assert_eq!(server.name, "POST /v1/chat/completions");
    assert_eq!(server.service.as_deref(), Some("corral"));
    for (key, value) in [
        ("http.request.method", "POST"),
        ("http.route", CHAT),
        ("http.response.status_code", "200"),
        ("corral.cache.status", "MISS"),
        ("corral.fingerprint", &fingerprint[..12]),
        ("corral.flight.role", "owner"),
        ("gen_ai.operation.name", "chat"),
        ("gen_ai.provider.name", "mock"),
        ("gen_ai.system", "mock"),
        ("gen_ai.request.model", "gpt-4o-mini"),
        ("gen_ai.response.model", answer["model"].as_str().unwrap()),
        (
            "gen_ai.usage.input_tokens",
            &answer["usage"]["prompt_tokens"].to_string(),
        ),
        (
            "gen_ai.usage.output_tokens",
            &answer["usage"]["completion_tokens"].to_string(),
        ),
    ] {
        assert_eq!(server.attr(key), Some(value), "{key} on {server:#?}");
    }

    // The flight is the owner's child; the attempt is the flight's, and its
    // span id is the parent the provider was told about.
    let flight = spans
        .iter()
        .find(|s| s.name == "corral.flight" && s.trace_id == CALLER_TRACE)
        .expect("the flight's span");
    assert_eq!(flight.kind, SpanKind::Internal);
    assert_eq!(flight.parent, server.span_id);
    assert_eq!(flight.attr("corral.fingerprint"), Some(&fingerprint[..12]));
    let attempts = of_kind(&spans, SpanKind::Client);
    assert_eq!(attempts.len(), 1, "one upstream attempt: {spans:#?}");
    let attempt = attempts[0];
    assert_eq!(attempt.trace_id, CALLER_TRACE);
    assert_eq!(attempt.parent, flight.span_id);
    assert_eq!(attempt.span_id, sent_parent);
    assert_eq!(attempt.attr("http.request.method"), Some("POST"));
    assert_eq!(attempt.attr("server.address"), Some("127.0.0.1"));
    assert_eq!(attempt.attr("http.response.status_code"), Some("200"));
    assert_eq!(attempt.attr("corral.upstream.attempt"), Some("1"));
    assert_eq!(attempt.attr("error.type"), None);

    // The hit: its own new trace, no flight, no upstream call.
    let hit_span = servers.iter().find(|s| s.trace_id != CALLER_TRACE).unwrap();
    assert!(hit_span.parent.is_empty(), "a new trace starts at corral");
    assert_eq!(hit_span.attr("corral.cache.status"), Some("HIT"));
    assert_eq!(hit_span.attr("corral.flight.role"), Some("hit"));
    assert_eq!(
        hit_span.attr("corral.fingerprint"),
        Some(&fingerprint[..12])
    );
    assert!(
        spans
            .iter()
            .all(|s| s.trace_id != hit_span.trace_id || s.span_id == hit_span.span_id),
        "a hit is one span"
    );

    // Never the prompt or the full fingerprint, anywhere.
    for span in &spans {
        for (key, value) in &span.attributes {
            assert!(!value.contains(PROMPT), "{key} holds the prompt");
            assert!(
                !value.contains(&fingerprint),
                "{key} holds the full fingerprint"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_followers_streams_and_batches_have_their_spans() {
    let collector = Collector::start().await;
    let gateway = traced_gateway(&collector).await;

    // A retried call: the first attempt gets a 500, the second answers.
    gateway.provider.push_script(Scripted::json(
        500,
        r#"{"error":{"message":"boom","type":"server_error"}}"#,
    ));
    let retried = gateway.post(CHAT, &chat("retried")).await;
    assert_eq!(retried.status, 200);
    let sent: Vec<String> = gateway
        .provider
        .requests()
        .iter()
        .map(|r| traceparent_ids(r.header("traceparent").unwrap()).1)
        .collect();
    assert_eq!(sent.len(), 2);
    assert_ne!(sent[0], sent[1], "each attempt is its own span");

    // Two identical concurrent requests: one owner, one follower.
    let replies = gateway.herd(CHAT, &chat("herded"), 2, &[]).await;
    let mut statuses: Vec<&str> = replies.iter().map(|r| r.cache()).collect();
    statuses.sort_unstable();
    assert_eq!(statuses, ["COALESCED", "MISS"]);
    let herd_fingerprint = replies[0].header("x-corral-fingerprint").unwrap()[..12].to_owned();

    // A streamed answer: traced like a buffered one.
    let mut streamed = chat("streamed");
    streamed["stream"] = json!(true);
    let stream = gateway.post(CHAT, &streamed).await;
    assert_eq!(stream.status, 200);
    assert!(String::from_utf8_lossy(&stream.body).contains("[DONE]"));

    // Embeddings: the batch flight and its call, under the request.
    let embedded = gateway
        .post(
            "/v1/embeddings",
            &json!({"model": "text-embedding-3-small", "input": ["one", "two"]}),
        )
        .await;
    assert_eq!(embedded.status, 200);
    assert_eq!(embedded.cache(), "MISS");

    gateway.stop().await;
    let spans = collector.spans(4 + 4 + 3 + 3).await;

    let attempts = of_kind(&spans, SpanKind::Client);
    let retry_attempts: Vec<_> = attempts
        .iter()
        .filter(|a| sent.contains(&a.span_id))
        .collect();
    assert_eq!(retry_attempts.len(), 2, "{spans:#?}");
    let first = retry_attempts
        .iter()
        .find(|a| a.attr("corral.upstream.attempt") == Some("1"))
        .unwrap();
    let second = retry_attempts
        .iter()
        .find(|a| a.attr("corral.upstream.attempt") == Some("2"))
        .unwrap();
    assert_eq!(first.attr("http.response.status_code"), Some("500"));
    assert_eq!(first.attr("error.type"), Some("500"));
    assert_eq!(second.attr("http.response.status_code"), Some("200"));
    assert_eq!(second.attr("http.request.resend_count"), Some("1"));
    assert_eq!(first.parent, second.parent, "both under the one flight");
    assert_eq!(first.trace_id, second.trace_id);

    let herd: Vec<_> = of_kind(&spans, SpanKind::Server)
        .into_iter()
        .filter(|s| s.attr("corral.fingerprint") == Some(herd_fingerprint.as_str()))
        .collect();
    assert_eq!(herd.len(), 2, "{spans:#?}");
    let owner = herd
        .iter()
        .find(|s| s.attr("corral.flight.role") == Some("owner"))
        .expect("the owner's span");
    let follower = herd
        .iter()
        .find(|s| s.attr("corral.flight.role") == Some("follower"))
        .expect("the follower's span");
    assert_eq!(follower.attr("corral.cache.status"), Some("COALESCED"));
    assert_ne!(
        owner.trace_id, follower.trace_id,
        "each caller has its trace"
    );
    let flight = spans
        .iter()
        .find(|s| s.name == "corral.flight" && s.parent == owner.span_id)
        .expect("the flight runs in the owner's trace");
    assert_eq!(
        flight.attr("corral.fingerprint"),
        follower.attr("corral.fingerprint"),
        "the follower names the flight it waited on"
    );
    assert_eq!(
        follower.links,
        [(flight.trace_id.clone(), flight.span_id.clone())],
        "and links to it, in the owner's trace"
    );
    assert!(owner.links.is_empty());
    assert!(
        !spans
            .iter()
            .any(|s| s.trace_id == follower.trace_id && s.kind == SpanKind::Client),
        "a follower makes no upstream call"
    );

    let stream_span = of_kind(&spans, SpanKind::Server)
        .into_iter()
        .find(|s| {
            s.attr("corral.fingerprint") == stream.header("x-corral-fingerprint").map(|f| &f[..12])
        })
        .expect("the streamed request's span");
    assert_eq!(stream_span.attr("corral.cache.status"), Some("MISS"));
    assert_eq!(stream_span.attr("corral.flight.role"), Some("owner"));
    assert_eq!(
        stream_span.attr("gen_ai.request.model"),
        Some("gpt-4o-mini")
    );
    let stream_attempt = spans
        .iter()
        .find(|s| s.trace_id == stream_span.trace_id && s.kind == SpanKind::Client)
        .expect("the streamed call's attempt");
    let stream_flight = spans
        .iter()
        .find(|s| s.span_id == stream_attempt.parent)
        .expect("the attempt's parent");
    assert_eq!(stream_flight.name, "corral.flight");
    assert_eq!(stream_flight.parent, stream_span.span_id);

    let embeddings = of_kind(&spans, SpanKind::Server)
        .into_iter()
        .find(|s| s.attr("gen_ai.operation.name") == Some("embeddings"))
        .expect("the embeddings request's span");
    assert_eq!(embeddings.attr("http.route"), Some("/v1/embeddings"));
    assert_eq!(
        embeddings.attr("gen_ai.usage.input_tokens"),
        Some(
            embedded.json()["usage"]["prompt_tokens"]
                .to_string()
                .as_str()
        )
    );
    let batch = spans
        .iter()
        .find(|s| s.name == "corral.flight" && s.parent == embeddings.span_id)
        .expect("the batch flight");
    assert_eq!(batch.attr("corral.flight.items"), Some("2"));
    assert!(
        spans
            .iter()
            .any(|s| s.kind == SpanKind::Client && s.parent == batch.span_id),
        "the batch's upstream call"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_down_costs_requests_nothing() {
    // A port nothing listens on: every export is refused.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let gateway = TestGateway::start(move |config| {
        config.telemetry.otlp.endpoint = Some(endpoint);
    })
    .await;
    for i in 0..3 {
        let reply = gateway.post(CHAT, &chat(&format!("down {i}"))).await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.cache(), "MISS");
    }
    let traces = gateway.state.traces().expect("traces are on");
    assert!(traces.flush().await.is_err(), "the export is refused");
    // Shutdown still completes (`stop` bounds it by WAIT).
    gateway.stop().await;
}

#[tokio::test]
async fn without_an_endpoint_nothing_is_built_and_nothing_is_forwarded() {
    let gateway = TestGateway::start(|_| {}).await;
    assert!(
        gateway.state.traces().is_none(),
        "traces are off by default"
    );
    let caller = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let reply = gateway
        .post_with(CHAT, &chat("untraced"), &[("traceparent", &caller)])
        .await;
    assert_eq!(reply.status, 200);
    let recorded = gateway.provider.requests();
    assert_eq!(recorded.len(), 1);
    assert_eq!(
        recorded[0].header("traceparent"),
        None,
        "off: the header allowlist is unchanged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_answered_by_another_instances_flight_is_a_remote_follower() {
    let collector = Collector::start().await;
    let redis = RedisServer::spawn().await;
    let endpoint = collector.url.clone();
    let fleet = Fleet::start(2, |config| {
        let mut redis_config = redis_config(&redis.url());
        // Lock attempts are the only scripts Redis runs in this test: no
        // lease extension and no ledger flush while it lasts.
        redis_config.lock_ttl = Duration::from_secs(300);
        config.redis = Some(redis_config);
        config.ledger.flush_interval = Duration::from_secs(3600);
        config.telemetry.otlp.endpoint = Some(endpoint.clone());
    })
    .await;
    let (owner, remote) = (&fleet.instances[0], &fleet.instances[1]);

    fleet.provider.hold();
    let body = chat("across instances");
    let first = {
        let handle = owner.clone_handle();
        let body = body.clone();
        tokio::spawn(async move { handle.post_with(CHAT, &body, &[]).await })
    };
    owner.wait_for_calls(1).await;
    let locks_before = script_calls(&redis).await;
    let second = {
        let handle = remote.clone_handle();
        let body = body.clone();
        tokio::spawn(async move { handle.post_with(CHAT, &body, &[]).await })
    };
    // Released only once the second instance has tried the lock (and lost
    // it to the first), so it follows that flight rather than finding its
    // stored answer.
    tokio::time::timeout(WAIT, async {
        while script_calls(&redis).await <= locks_before {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the second instance contends for the lock");
    fleet.provider.release();
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert_eq!(first.cache(), "MISS");
    assert_eq!(second.cache(), "COALESCED");
    assert_eq!(
        fleet.provider.calls(),
        1,
        "one upstream call for both instances"
    );

    for instance in fleet.instances {
        instance.stop().await;
    }
    // The owner's server, flight and attempt spans; the remote follower's
    // server span and its flight's (which followed through Redis).
    let spans = collector.spans(5).await;
    let servers = of_kind(&spans, SpanKind::Server);
    let role = |reply: &crate::harness::Reply| {
        let prefix = &reply.header("x-corral-fingerprint").unwrap()[..12];
        let cache = reply.cache();
        servers
            .iter()
            .find(|s| {
                s.attr("corral.fingerprint") == Some(prefix)
                    && s.attr("corral.cache.status") == Some(cache)
            })
            .and_then(|s| s.attr("corral.flight.role"))
            .map(str::to_owned)
    };
    assert_eq!(role(&first).as_deref(), Some("owner"), "{spans:#?}");
    assert_eq!(
        role(&second).as_deref(),
        Some("remote_follower"),
        "{spans:#?}"
    );
    assert_eq!(
        of_kind(&spans, SpanKind::Client).len(),
        1,
        "only the owner's instance called upstream"
    );
}

/// Scripts Redis has run (`EVALSHA` and `EVAL` in `INFO commandstats`): a
/// lock attempt is one.
async fn script_calls(redis: &RedisServer) -> u64 {
    redis.command_calls("evalsha").await + redis.command_calls("eval").await
}

/// A caller's `model` is its own text, and may be megabytes: what a span
/// keeps of it is bounded (the export queue holds thousands of spans while a
/// collector is slow), and the price lookup names it `other` without matching
/// it against every price.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_model_name_is_bounded_in_spans_and_metrics() {
    let collector = Collector::start().await;
    let gateway = traced_gateway(&collector).await;
    let model = "m".repeat(7 << 20);
    let body = json!({"model": model, "temperature": 0,
        "messages": [{"role": "user", "content": "hi"}]});
    let reply = gateway.post(CHAT, &body).await;
    assert_eq!(reply.status, 200);
    let metrics = gateway.get("/metrics").await;
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(!text.contains("mmmmmmmm"), "no label holds the model");
    gateway.stop().await;
    let spans = collector.spans(2).await;
    let server = of_kind(&spans, SpanKind::Server)[0];
    let requested = server.attr("gen_ai.request.model").expect("the model");
    assert!(
        !requested.is_empty() && requested.len() <= corral::traces::LONGEST_ATTRIBUTE,
        "{} bytes",
        requested.len()
    );
    for span in &spans {
        for (key, value) in &span.attributes {
            assert!(
                value.len() <= corral::traces::LONGEST_ATTRIBUTE.max(64),
                "{}: `{key}` holds {} bytes",
                span.name,
                value.len()
            );
        }
    }
}
