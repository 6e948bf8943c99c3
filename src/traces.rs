//! Traces: optional OpenTelemetry export over OTLP/HTTP (protobuf), off unless
//! `telemetry.otlp.endpoint` (or `OTEL_EXPORTER_OTLP_ENDPOINT`) is set.
//!
//! The tracer lives in the `AppState`, like the metrics registry, not in a
//! process-global subscriber: parallel gateways in one process (the tests, the
//! bench) export to their own collectors, and a gateway without traces pays
//! one `Option` check per request and nothing else. That is also why the
//! spans are made with the OpenTelemetry API directly rather than bridged from
//! the `tracing` spans (`tracing-opentelemetry` needs the global subscriber).
//!
//! The current request's [`Context`] travels with its future
//! (`FutureExt::with_context`): the pipeline opens the server span (continuing
//! the caller's W3C `traceparent`) and attaches it; a flight started by that
//! request runs under a `corral.flight` span whose parent is the owner's
//! request span; every upstream attempt is a client span under whatever span
//! is current (the flight, or the request for `no-store` and pass-through
//! calls), and its context is what goes upstream as `traceparent`. So a
//! coalesced flight carries its owner's trace. A follower's request span
//! stays in its own trace (its caller's) and links to the flight's span; a
//! remote follower (answered through Redis) shares only the
//! `corral.fingerprint` prefix with the owner's flight span.
//!
//! Spans never hold prompt text, credentials or a full fingerprint: only
//! 12 hex digits of it, the model names, token counts and statuses. (A flight
//! span's fingerprint is its cache key's, which a purge re-keys: after one it
//! differs from the request's `x-corral-fingerprint`, as in the logs.)
//!
//! Export runs on the batch processor's own thread (a blocking HTTP client):
//! spans wait in a bounded queue (`telemetry.otlp.max_queue_spans`) and are
//! dropped, never waited for, when it is full; `shutdown` exports what is
//! queued when the gateway stops.

use std::sync::{
    Arc,
    atomic::{AtomicU8, Ordering},
};

use axum::response::Response;
use http::{HeaderMap, Method, StatusCode};
use opentelemetry::{
    Context, KeyValue,
    propagation::TextMapPropagator,
    trace::{
        Span as _, SpanContext, SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _,
    },
};
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::{
    Resource,
    propagation::TraceContextPropagator,
    trace::{BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider},
};

use crate::{
    config::OtlpConfig,
    fingerprint::{Endpoint, Fingerprint},
    usage::Usage,
};

/// `gen_ai.operation.name` of a deduplicated endpoint.
pub fn operation_name(endpoint: Endpoint) -> &'static str {
    match endpoint {
        // The GenAI conventions name a conversational turn `chat` whatever
        // the provider's API (OpenAI Responses, Anthropic Messages included).
        Endpoint::ChatCompletions | Endpoint::Responses | Endpoint::Messages => "chat",
        Endpoint::Completions => "text_completion",
        Endpoint::Embeddings | Endpoint::EmbedContent => "embeddings",
        Endpoint::GenerateContent => "generate_content",
    }
}

/// Hex digits of a fingerprint a span shows, as on the access-log line.
pub const FINGERPRINT_PREFIX: usize = 12;

/// The gateway's tracer and the provider that exports its spans.
pub struct Traces {
    provider: SdkTracerProvider,
    tracer: Arc<SdkTracer>,
    propagator: TraceContextPropagator,
}

impl std::fmt::Debug for Traces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Traces")
    }
}

/// The export failed or did not finish in time.
#[derive(Debug, thiserror::Error)]
#[error("trace export: {0}")]
pub struct ExportError(String);

impl Traces {
    /// The exporter and its batch processor for `config`, or `None` when no
    /// endpoint is configured (then nothing is built at all).
    pub fn start(config: &OtlpConfig) -> anyhow::Result<Option<Self>> {
        let Some(endpoint) = &config.endpoint else {
            return Ok(None);
        };
        let headers = config
            .headers
            .as_ref()
            .map(|headers| headers.expose().iter().cloned().collect())
            .unwrap_or_default();
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(traces_url(endpoint))
            .with_timeout(config.timeout)
            .with_headers(headers)
            .build()?;
        let batch = BatchConfigBuilder::default()
            .with_max_queue_size(config.max_queue_spans)
            .with_max_export_batch_size(config.max_queue_spans.min(512))
            .with_scheduled_delay(config.export_interval)
            .build();
        let processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(batch)
            .build();
        // A caller's sampling decision wins (its `traceparent` flags); the
        // ratio decides for traces that start here.
        let sampler =
            Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(config.sample_ratio)));
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(sampler)
            // `OTEL_RESOURCE_ATTRIBUTES` (a pod name, an environment) is
            // honoured; the service name is the config's.
            .with_resource(
                Resource::builder()
                    .with_service_name(config.service_name.clone())
                    .build(),
            )
            .build();
        let tracer = Arc::new(provider.tracer("corral"));
        Ok(Some(Self {
            provider,
            tracer,
            propagator: TraceContextPropagator::new(),
        }))
    }

    /// Exports every ended span now (a test's or an operator's flush). Runs
    /// the blocking export off the async workers.
    pub async fn flush(&self) -> Result<(), ExportError> {
        let provider = self.provider.clone();
        tokio::task::spawn_blocking(move || provider.force_flush())
            .await
            .map_err(|err| ExportError(err.to_string()))?
            .map_err(|err| ExportError(err.to_string()))
    }

    /// Exports what is queued and stops the exporter (at gateway shutdown,
    /// after the drain: every request span has ended by then).
    pub async fn shutdown(&self) -> Result<(), ExportError> {
        let provider = self.provider.clone();
        tokio::task::spawn_blocking(move || provider.shutdown())
            .await
            .map_err(|err| ExportError(err.to_string()))?
            .map_err(|err| ExportError(err.to_string()))
    }

    /// The context a request runs in: its server span, continuing the
    /// caller's `traceparent`/`tracestate` when they are valid (else a new
    /// trace), and the scope the layers below record into.
    pub fn request_context(
        &self,
        method: &Method,
        path: &str,
        headers: &HeaderMap,
        operation: Option<&'static str>,
        request_id: &str,
    ) -> Context {
        let parent = self.propagator.extract(&HeaderExtractor(headers));
        let route = route_of(path);
        let name = match route {
            Some(route) => format!("{method} {route}"),
            None => method.to_string(),
        };
        let mut attributes = Vec::with_capacity(6);
        attributes.push(KeyValue::new("http.request.method", method.to_string()));
        attributes.push(KeyValue::new("url.path", bounded(path)));
        attributes.push(KeyValue::new("corral.request_id", request_id.to_owned()));
        if let Some(route) = route {
            attributes.push(KeyValue::new("http.route", route));
        }
        if let Some(operation) = operation {
            attributes.push(KeyValue::new("gen_ai.operation.name", operation));
        }
        let span = self
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Server)
            .with_attributes(attributes)
            .start_with_context(&*self.tracer, &parent);
        parent.with_span(span).with_value(Scope {
            tracer: self.tracer.clone(),
            role: Arc::new(AtomicU8::new(0)),
        })
    }
}

/// The OTLP/HTTP traces URL of a base endpoint, as `OTEL_EXPORTER_OTLP_ENDPOINT`
/// is read: `/v1/traces` appended (a URL already ending in it is kept).
fn traces_url(endpoint: &str) -> String {
    let base = endpoint.trim_end_matches('/');
    if base.ends_with("/v1/traces") {
        base.to_owned()
    } else {
        format!("{base}/v1/traces")
    }
}

/// What a request's context carries besides its span: the tracer (the
/// layers below start child spans with it) and the flight role the coalescer
/// records for the request span.
#[derive(Clone)]
struct Scope {
    tracer: Arc<SdkTracer>,
    role: Arc<AtomicU8>,
}

/// How a request took part in a flight (`corral.flight.role`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FlightRole {
    /// Its flight called upstream.
    Owner = 1,
    /// It waited on a flight another request on this instance started.
    Follower = 2,
    /// Its answer came from another instance's flight (through Redis).
    RemoteFollower = 3,
}

impl FlightRole {
    fn as_str(code: u8) -> Option<&'static str> {
        match code {
            1 => Some("owner"),
            2 => Some("follower"),
            3 => Some("remote_follower"),
            _ => None,
        }
    }
}

/// Records the current request's flight role (the last call wins). Nothing
/// without traces.
pub fn set_flight_role(role: FlightRole) {
    Context::map_current(|cx| {
        if let Some(scope) = cx.get::<Scope>() {
            scope.role.store(role as u8, Ordering::Relaxed);
        }
    });
}

/// Whether the current task runs under a traced request or flight.
pub fn active() -> bool {
    Context::map_current(|cx| cx.get::<Scope>().is_some())
}

/// Runs `f` on the current span when it is one of ours and recording.
fn with_recording_span(f: impl FnOnce(&opentelemetry::trace::SpanRef<'_>)) {
    Context::map_current(|cx| {
        if cx.get::<Scope>().is_some() {
            let span = cx.span();
            if span.is_recording() {
                f(&span);
            }
        }
    });
}

/// The model asked for and the upstream it was routed to, on the request span.
///
/// The provider is the upstream's configured name: corral speaks one wire
/// format to every upstream, and only the operator knows whether it is
/// OpenAI itself or a compatible server (name it `openai`, `azure.ai.openai`,
/// ... to match the semantic conventions' well-known values). `gen_ai.system`
/// is the older name of the same attribute, for backends that read only it.
pub fn record_request(model: &str, upstream: &str) {
    with_recording_span(|span| {
        span.set_attributes([
            KeyValue::new("gen_ai.request.model", bounded(model)),
            KeyValue::new("gen_ai.provider.name", upstream.to_owned()),
            KeyValue::new("gen_ai.system", upstream.to_owned()),
        ]);
    });
}

/// An answer's token usage and the model that produced it (read from the
/// body's `model`), on the request span.
pub fn record_answer(usage: Option<Usage>, body: &[u8]) {
    with_recording_span(|span| {
        if let Some(usage) = usage {
            span.set_attributes([
                KeyValue::new(
                    "gen_ai.usage.input_tokens",
                    saturating_i64(usage.prompt_tokens),
                ),
                KeyValue::new(
                    "gen_ai.usage.output_tokens",
                    saturating_i64(usage.completion_tokens),
                ),
            ]);
        }
        #[derive(serde::Deserialize)]
        struct Model<'a> {
            #[serde(borrow)]
            model: Option<std::borrow::Cow<'a, str>>,
        }
        if let Ok(Model { model: Some(model) }) = serde_json::from_slice::<Model<'_>>(body) {
            span.set_attribute(KeyValue::new("gen_ai.response.model", bounded(&model)));
        }
    });
}

/// The longest text an attribute takes from a request or an answer: a
/// caller's 7 MB `model`, times the export queue's spans, would otherwise
/// hold gigabytes while a collector is slow. Real model names are far shorter.
pub const LONGEST_ATTRIBUTE: usize = crate::telemetry::LONGEST_FIELD;

/// `text`, cut to [`LONGEST_ATTRIBUTE`] bytes on a character boundary.
fn bounded(text: &str) -> String {
    crate::telemetry::clipped(text).to_owned()
}

fn saturating_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Names a flight's span (its trace and span id) for followers to link to.
#[derive(Debug, Clone)]
pub struct FlightTrace(SpanContext);

/// Links the current request span to the flight it waited on (a follower's
/// trace is its own; the link leads to the owner's).
pub fn link_flight(flight: &FlightTrace) {
    with_recording_span(|span| {
        span.add_link(
            flight.0.clone(),
            vec![KeyValue::new("corral.link", "coalesced_into")],
        );
    });
}

/// The context a flight runs in: a `corral.flight` span whose parent is the
/// current (owner's) request span, and its name for followers' links. `None`
/// without traces.
pub fn flight_context(
    fingerprint: &Fingerprint,
    kind: &'static str,
) -> Option<(Context, FlightTrace)> {
    Context::map_current(|cx| {
        let scope = cx.get::<Scope>()?;
        let prefix = fingerprint.short_hex();
        let span = scope
            .tracer
            .span_builder("corral.flight")
            .with_kind(SpanKind::Internal)
            .with_attributes([
                KeyValue::new("corral.fingerprint", prefix.to_string()),
                KeyValue::new("corral.flight.kind", kind),
            ])
            .start_with_context(&*scope.tracer, cx);
        let name = FlightTrace(span.span_context().clone());
        Some((cx.with_span(span), name))
    })
}

/// The context of an embeddings batch flight (one upstream call for the
/// `items` inputs the current request owns). `None` without traces.
pub fn batch_context(items: usize) -> Option<Context> {
    Context::map_current(|cx| {
        let scope = cx.get::<Scope>()?;
        let span = scope
            .tracer
            .span_builder("corral.flight")
            .with_kind(SpanKind::Internal)
            .with_attributes([
                KeyValue::new("corral.flight.kind", "batch"),
                KeyValue::new("corral.flight.items", saturating_i64(items as u64)),
            ])
            .start_with_context(&*scope.tracer, cx);
        Some(cx.with_span(span))
    })
}

/// The context of one upstream attempt: a client span under the current
/// span. `None` without traces.
pub fn attempt_context(
    attempt: usize,
    method: &Method,
    url: &reqwest::Url,
    upstream: &str,
) -> Option<Context> {
    Context::map_current(|cx| {
        let scope = cx.get::<Scope>()?;
        let mut attributes = vec![
            KeyValue::new("http.request.method", method.to_string()),
            KeyValue::new(
                "server.address",
                url.host_str().unwrap_or_default().to_owned(),
            ),
            KeyValue::new("corral.upstream", upstream.to_owned()),
            KeyValue::new("corral.upstream.attempt", saturating_i64(attempt as u64)),
        ];
        if let Some(port) = url.port_or_known_default() {
            attributes.push(KeyValue::new("server.port", i64::from(port)));
        }
        if attempt > 1 {
            attributes.push(KeyValue::new(
                "http.request.resend_count",
                saturating_i64(attempt as u64 - 1),
            ));
        }
        let span = scope
            .tracer
            .span_builder(method.to_string())
            .with_kind(SpanKind::Client)
            .with_attributes(attributes)
            .start_with_context(&*scope.tracer, cx);
        Some(cx.with_span(span))
    })
}

/// Ends an attempt's span; a failed attempt gets `error.type` and an error status.
pub fn end_attempt(cx: &Context, error: Option<&str>) {
    let span = cx.span();
    if let Some(kind) = error {
        span.set_attribute(KeyValue::new("error.type", kind.to_owned()));
        span.set_status(Status::error(kind.to_owned()));
    }
    span.end();
}

/// The upstream's response status, on the current (attempt) span.
pub fn record_upstream_status(status: StatusCode) {
    with_recording_span(|span| {
        span.set_attribute(KeyValue::new(
            "http.response.status_code",
            i64::from(status.as_u16()),
        ));
    });
}

/// Adds the current span's `traceparent` (and `tracestate`) to an upstream
/// request's headers, when the request is traced.
pub fn inject(headers: &mut HeaderMap) {
    Context::map_current(|cx| {
        if cx.get::<Scope>().is_some() {
            TraceContextPropagator::new().inject_context(cx, &mut HeaderInjector(headers));
        }
    });
}

/// Records the response on the current request span and hands the span to
/// the response body, which ends it when the body is done (sent, or dropped
/// with the connection): a streamed answer's span lasts as long as the stream.
pub fn finish_request(
    response: Response,
    cache: Option<&str>,
    fingerprint: Option<&str>,
) -> Response {
    let cx = Context::current();
    let Some(scope) = cx.get::<Scope>() else {
        return response;
    };
    let span = cx.span();
    let status = response.status();
    if span.is_recording() {
        span.set_attribute(KeyValue::new(
            "http.response.status_code",
            i64::from(status.as_u16()),
        ));
        if let Some(cache) = cache {
            span.set_attribute(KeyValue::new("corral.cache.status", cache.to_owned()));
        }
        if let Some(hex) = fingerprint {
            let prefix = &hex[..hex.len().min(FINGERPRINT_PREFIX)];
            span.set_attribute(KeyValue::new("corral.fingerprint", prefix.to_owned()));
        }
        let role = FlightRole::as_str(scope.role.load(Ordering::Relaxed)).or(match cache {
            Some("HIT" | "STALE") => Some("hit"),
            _ => None,
        });
        if let Some(role) = role {
            span.set_attribute(KeyValue::new("corral.flight.role", role));
        }
        if status.is_server_error() {
            span.set_status(Status::error(status.as_str().to_owned()));
            span.set_attribute(KeyValue::new("error.type", status.as_str().to_owned()));
        }
    }
    crate::held_body::hold_until_body_ends(response, EndsSpan(cx))
}

/// Ends its request's span when dropped: with the response body, sent to the
/// end or abandoned with the connection.
struct EndsSpan(Context);

impl Drop for EndsSpan {
    fn drop(&mut self) {
        self.0.span().end();
    }
}

/// The low-cardinality route of an API path (`http.route`): the literal
/// route, or a template where the path carries an id.
fn route_of(path: &str) -> Option<&'static str> {
    const ROUTES: &[&str] = &[
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/models",
    ];
    if let Some(route) = ROUTES.iter().find(|route| **route == path) {
        return Some(route);
    }
    if path.starts_with("/v1/models/") {
        return Some("/v1/models/{model}");
    }
    if path.starts_with("/v1/") {
        return Some("/v1/{*path}");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_traces_url_is_the_base_endpoint_plus_v1_traces() {
        assert_eq!(traces_url("http://c:4318"), "http://c:4318/v1/traces");
        assert_eq!(traces_url("http://c:4318/"), "http://c:4318/v1/traces");
        assert_eq!(
            traces_url("http://c:4318/v1/traces"),
            "http://c:4318/v1/traces"
        );
    }

    #[test]
    fn routes_are_templates_never_raw_ids() {
        assert_eq!(
            route_of("/v1/chat/completions"),
            Some("/v1/chat/completions")
        );
        assert_eq!(route_of("/v1/files/file-abc"), Some("/v1/{*path}"));
        assert_eq!(route_of("/v1/models/gpt-4o"), Some("/v1/models/{model}"));
        assert_eq!(route_of("/healthz"), None, "only API requests are traced");
    }

    #[test]
    fn without_a_traced_context_the_helpers_do_nothing() {
        assert!(!active());
        let fingerprint = Fingerprint::from_hex(&"ab".repeat(32)).unwrap();
        assert!(flight_context(&fingerprint, "request").is_none());
        let url = reqwest::Url::parse("http://127.0.0.1:1/v1").unwrap();
        assert!(attempt_context(1, &Method::POST, &url, "mock").is_none());
        let mut headers = HeaderMap::new();
        inject(&mut headers);
        assert!(headers.is_empty(), "no traceparent without traces");
    }
}
