//! The one way in, as a single `tower::Service`: a request id (the caller's
//! `x-request-id` when it is sane, else a new one, echoed on every response),
//! a `request` span that the request's logs (and the upstream call it starts)
//! nest in, admission for `/v1/*` (the global cap, the gateway key, the
//! tenant's rate, then the body, read once here and bounded in size and
//! time), then the request's service: `dedup::Dedup` for a deduplicated
//! endpoint's `POST`, the pass-through for any other `/v1/*` path, the router
//! for the rest; then the request counters and latency histogram, by what the
//! service decided ([`Decided`]), and one access-log line.
//!
//! One service instead of two `from_fn` layers: each of those boxes a future
//! and clones the inner router per request, and the hit path pays for every
//! such step (see BENCHMARKS.md). Admission sits inside the tracking, so a
//! refused request (401, 429, 413, 408, overload) is counted and carries a
//! request id too.

use std::{
    convert::Infallible,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::{Duration, Instant},
};

use axum::{
    body::Body,
    extract::Request,
    http::{HeaderValue, Method, request::Parts},
    response::Response,
};
use bytes::Bytes;
use futures::future::BoxFuture;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use opentelemetry::context::FutureExt as _;
use tower::{Layer, Service, ServiceExt as _};
use tracing::Instrument;

use super::proxy;
use crate::{
    auth,
    cache_status::CacheStatus,
    dedup::{Answered, Caller, Decided, REQUEST_ID_HEADER_NAME},
    error::{ErrorShape, GatewayError},
    fingerprint::Endpoint,
    held_body::hold_until_body_ends,
    limits::Places,
    passthrough,
    state::AppState,
    telemetry::{self, AccessLine},
    tenant::TenantScope,
    traces,
    wire::PathCall,
};

/// Longest caller-chosen request id kept; longer ones are replaced.
const MAX_REQUEST_ID_LEN: usize = 128;

/// Wraps the router in [`Pipeline`].
#[derive(Clone)]
pub struct PipelineLayer {
    app: Arc<AppState>,
}

impl PipelineLayer {
    pub fn new(app: Arc<AppState>) -> Self {
        Self { app }
    }
}

impl<S> Layer<S> for PipelineLayer {
    type Service = Pipeline<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Pipeline {
            inner,
            app: self.app.clone(),
        }
    }
}

/// See the module documentation.
#[derive(Clone)]
pub struct Pipeline<S> {
    inner: S,
    app: Arc<AppState>,
}

impl<S, B> Service<http::Request<B>> for Pipeline<S>
where
    S: Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: axum::body::HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        // The clone is the one `poll_ready` was not called on; keep the ready one.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let app = self.app.clone();
        let started = Instant::now();
        let id = request_id(&request);
        let method = request.method().clone();
        // The URI is shared bytes: keeping it for the access line copies nothing.
        let uri = request.uri().clone();
        let raw_path = uri.path();
        // Every decision is on the path as the provider reads it, percent-
        // decoded: `/v1/chat/%63ompletions` is the deduplicated endpoint (served,
        // cached and budgeted as such), never a pass-through to it.
        let decoded = passthrough::decoded_path(raw_path);
        let path = &*decoded;
        // Gemini's deduplicated methods name their model in the path, and
        // Azure's their deployment.
        let path_call = (method == Method::POST)
            .then(|| PathCall::of_path(path))
            .flatten();
        let endpoint = match &path_call {
            Some(call) => Some(call.endpoint()),
            None => endpoint_of(path),
        };
        // The APIs: OpenAI's and Anthropic's under `/v1/`, Gemini's under
        // `/v1beta/` (relayed to a Gemini upstream by the pass-through),
        // Azure OpenAI's under `/openai/` (its deduplicated endpoints only).
        let azure = path.starts_with("/openai/");
        // Bedrock's InvokeModel paths (AWS's SDKs, Claude Code's Bedrock mode).
        let bedrock = path.starts_with("/model/");
        let admitted = path.starts_with("/v1/") || path.starts_with("/v1beta/") || azure || bedrock;
        // Whether the request speaks Gemini's native API (a Gemini path,
        // method or key): such a request goes to a Gemini upstream or nowhere.
        let gemini_path = path_call
            .as_ref()
            .and_then(PathCall::gemini_method)
            .is_some();
        let native = gemini_path
            || (admitted
                && !azure
                && !bedrock
                && passthrough::gemini::is_native(path, request.headers(), uri.query()));
        // A refusal is answered in the shape the route's clients parse
        // (Gemini's for Gemini's requests, under `/v1/` too, where its SDKs post).
        let shape = if native {
            ErrorShape::Gemini
        } else {
            ErrorShape::for_path(path)
        };
        // The deduplicated endpoints' `POST`s go to their handler from here,
        // past the router and its boxing, with the body admission read (Gemini's
        // own methods included). Any other that carries a Gemini key goes to
        // the pass-through, which sends it to a Gemini upstream or nowhere: a
        // Gemini key never reaches another provider.
        let direct = endpoint.filter(|_| method == Method::POST && (gemini_path || !native));
        // Every other request runs in its `request` span; a deduplicated one
        // makes its span only when it does more than read the cache
        // (`dedup::Caller::span`). The path only: a query string may carry anything.
        let span = if direct.is_some() {
            tracing::Span::none()
        } else {
            tracing::info_span!(
                "request",
                request_id = %id.to_str().unwrap_or_default(),
                method = %method,
                path = %telemetry::clipped(raw_path),
            )
        };
        // With traces on, an API request's server span (continuing the
        // caller's `traceparent`) is the context it runs in; probes, scrapes
        // and the dashboard are not traced. Off, nothing.
        let traced = app.traces().filter(|_| admitted).map(|traces| {
            traces.request_context(
                request.method(),
                raw_path,
                request.headers(),
                endpoint.map(traces::operation_name),
                id.to_str().unwrap_or_default(),
            )
        });
        let is_traced = traced.is_some();
        let serve = async move {
            let (mut response, decided) = if admitted {
                match admit(&app, request).await {
                    Ok(admitted) if is_upgrade(&admitted.parts.headers) => (
                        GatewayError::UpgradeRefused.to_response_as(shape),
                        Decided::default(),
                    ),
                    Ok(Admitted {
                        mut parts,
                        body,
                        places,
                        tenant,
                    }) => {
                        let (response, decided) = match direct {
                            // A SigV4 signature corral cannot check identifies
                            // nobody: an AWS SDK's request needs a gateway key
                            // or a key of its own beside it.
                            Some(_) if signed_only(&parts.headers, parts.uri.query()) => (
                                GatewayError::Unauthorized.to_response_as(shape),
                                Decided::default(),
                            ),
                            Some(endpoint) => {
                                let caller = Caller {
                                    request_id: id.clone(),
                                    tenant,
                                };
                                let headers = std::mem::take(&mut parts.headers);
                                let query = parts.uri.query().map(str::to_owned);
                                let Answered { response, decided } = app
                                    .dedup()
                                    .serve(endpoint, path_call, caller, headers, query, body)
                                    .await;
                                (response, decided)
                            }
                            // Azure's paths are served for their deduplicated
                            // endpoints only: nothing else of Azure's is relayed.
                            None if azure || bedrock => (
                                GatewayError::UnknownPath {
                                    path: telemetry::clipped(uri.path()).to_string(),
                                }
                                .to_response_as(shape),
                                Decided::default(),
                            ),
                            // Boxed, as the router below: held inline, the
                            // pass-through's future would make every deduplicated
                            // request's kilobytes larger to move into its box.
                            None => (
                                Box::pin(proxy::serve(&app, parts, body, &tenant)).await,
                                Decided::default(),
                            ),
                        };
                        // The places last as long as the body: a stream is
                        // being served long after its head left.
                        let response = if places.is_empty() {
                            response
                        } else {
                            hold_until_body_ends(response, places)
                        };
                        (response, decided)
                    }
                    Err(error) => (error.to_response_as(shape), Decided::default()),
                }
            } else {
                let response = Box::pin(inner.oneshot(request.map(Body::new)))
                    .await
                    .unwrap_or_else(|never| match never {});
                (response, Decided::default())
            };
            record(
                &app,
                &id,
                &method,
                uri.path(),
                endpoint,
                &response,
                decided,
                started.elapsed(),
            );
            if is_traced {
                response = finish_trace(response, endpoint.is_some(), decided);
            }
            response.headers_mut().insert(REQUEST_ID_HEADER_NAME, id);
            Ok(response)
        }
        .instrument(span);
        match traced {
            None => Box::pin(serve),
            Some(context) => Box::pin(serve.with_context(context)),
        }
    }
}

/// Whether the request's only credential is an AWS SigV4 signature.
fn signed_only(headers: &http::HeaderMap, query: Option<&str>) -> bool {
    headers
        .get(http::header::AUTHORIZATION)
        .is_some_and(|value| auth::is_sigv4(value.as_bytes()))
        && matches!(auth::credential(headers, query), Ok(None))
}

/// Whether the request asks to switch protocols (RFC 9110 7.8: its
/// `Connection` lists `upgrade`, and its `Upgrade` names a protocol; a
/// WebSocket dial): refused with 426, never served or forwarded. After
/// admission, so a dial without a gateway key still meets its 401. An
/// `Upgrade: h2c` alone (`curl --http2` over plain HTTP) is not refused: it
/// is ignored, as HTTP/2 lets a server do, and served over HTTP/1.1; nor is a
/// stray `Upgrade` header that neither `Connection` nor a WebSocket key goes
/// with (it is dropped, like every hop-by-hop header).
fn is_upgrade(headers: &http::HeaderMap) -> bool {
    let tokens = |name| {
        headers
            .get_all(name)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .map(str::trim)
            .filter(|token| !token.is_empty())
    };
    let connection =
        tokens(http::header::CONNECTION).any(|option| option.eq_ignore_ascii_case("upgrade"));
    // A WebSocket handshake's own key marks a dial whose `Connection` a proxy
    // on the way dropped (it is hop-by-hop; `Upgrade` and the key pass).
    let handshake = headers.contains_key(http::header::SEC_WEBSOCKET_KEY);
    if !(connection || handshake) {
        return false;
    }
    let mut upgrades = tokens(http::header::UPGRADE).peekable();
    if upgrades.peek().is_none() {
        return connection;
    }
    upgrades.any(|protocol| !protocol.eq_ignore_ascii_case("h2c"))
}

/// How a request to a deduplicated endpoint was served, as its metrics and
/// log line name it: the service's cache status, or `ERROR` for an error
/// (its own, or a refusal at admission).
fn cache_label(decided: Decided) -> &'static str {
    decided.cache.map_or("ERROR", CacheStatus::as_str)
}

/// The response's status, cache status and fingerprint prefix on the request
/// span, which then ends with the response body.
fn finish_trace(response: Response, deduplicated: bool, decided: Decided) -> Response {
    let cache = deduplicated.then(|| cache_label(decided));
    let fingerprint = decided
        .fingerprint
        .map(|fingerprint| fingerprint.short_hex());
    traces::finish_request(
        response,
        cache,
        fingerprint.as_ref().map(|prefix| prefix.as_str()),
    )
}

/// Counts the request by what the service decided and writes its
/// access-log line.
#[allow(clippy::too_many_arguments)]
fn record(
    app: &AppState,
    id: &HeaderValue,
    method: &Method,
    path: &str,
    endpoint: Option<Endpoint>,
    response: &Response,
    decided: Decided,
    elapsed: Duration,
) {
    let cache = cache_label(decided);
    if let Some(endpoint) = endpoint {
        app.metrics().request(endpoint.label(), cache, elapsed);
    }
    if app.config().log.requests && tracing::enabled!(tracing::Level::INFO) {
        let prefix = decided
            .fingerprint
            .map(|fingerprint| fingerprint.short_hex());
        let fingerprint = prefix.as_ref().map_or("-", |prefix| prefix.as_str());
        let line = AccessLine {
            request_id: id.to_str().unwrap_or_default(),
            method: method.as_str(),
            path: telemetry::clipped(path),
            status: response.status().as_u16(),
            cache: if endpoint.is_some() { cache } else { "-" },
            fingerprint,
            latency: elapsed,
        };
        match telemetry::access_log() {
            Some(log) => log.write(&line),
            // No corral subscriber (a library user's own, tests): an event.
            None => tracing::info!(
                request_id = line.request_id,
                method = line.method,
                path = line.path,
                status = line.status,
                cache = line.cache,
                fingerprint = line.fingerprint,
                latency_ms = elapsed.as_secs_f64() * 1000.0,
                "request"
            ),
        }
    }
}

/// The caller's request id when it is visible ASCII of at most 128 characters
/// (it goes into logs and a response header verbatim), else a fresh random one.
fn request_id<B>(request: &http::Request<B>) -> HeaderValue {
    request
        .headers()
        .get(REQUEST_ID_HEADER_NAME)
        .filter(|id| {
            let bytes = id.as_bytes();
            !bytes.is_empty()
                && bytes.len() <= MAX_REQUEST_ID_LEN
                && bytes.iter().all(|b| b.is_ascii_graphic())
        })
        .cloned()
        .unwrap_or_else(fresh_request_id)
}

/// 32 hex digits: this process's random half, then a count. Unique without
/// a random draw per request; an id names a request, it guards nothing.
fn fresh_request_id() -> HeaderValue {
    static PROCESS: OnceLock<u64> = OnceLock::new();
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let process = *PROCESS.get_or_init(rand::random::<u64>);
    let count = COUNT.fetch_add(1, Ordering::Relaxed);
    let id = (u128::from(process) << 64) | u128::from(count);
    let mut text = [0u8; 32];
    hex::encode_to_slice(id.to_be_bytes(), &mut text).expect("32 hex digits for 16 bytes");
    HeaderValue::from_bytes(&text).expect("hex is a valid header value")
}

/// The deduplicated endpoint a `/v1/` path is, by its path alone (Gemini's,
/// whose path names a model, is read by `GeminiCall::of_path`).
fn endpoint_of(path: &str) -> Option<Endpoint> {
    Endpoint::BY_PATH
        .into_iter()
        .find(|endpoint| path.strip_prefix("/v1") == Some(endpoint.path()))
}

/// A request past admission: its head, its whole body, its places among the
/// requests served at once, and its caller's tenant.
struct Admitted {
    parts: Parts,
    body: Bytes,
    places: Places,
    tenant: TenantScope,
}

/// For `/v1/*`: the instance's cap, the gateway key, the tenant's cap and
/// rate, then the body (bounded in size and time), all before any parsing.
async fn admit<B>(app: &AppState, request: http::Request<B>) -> Result<Admitted, GatewayError>
where
    B: axum::body::HttpBody<Data = Bytes>,
    B::Error: Into<axum::BoxError>,
{
    let mut places = app.limits().admit()?;
    // The caller's credential wherever it was sent (a Gemini key or OAuth
    // token may come in the query): one key, one tenant (`auth::credential`).
    let tenant = app
        .auth()
        .authenticate(request.headers(), request.uri().query())?;
    app.limits().admit_tenant(&tenant, &mut places)?;
    let (parts, body) = request.into_parts();
    let limit = app.config().limits.max_body_bytes;
    // A body announced larger than the limit is refused before a byte of it
    // is read (a chunked one is cut at the limit while it is read).
    let announced = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.trim().parse::<u64>().ok());
    if announced.is_some_and(|length| length > limit as u64) {
        return Err(GatewayError::BodyTooLarge { limit });
    }
    let body = read_body(body, limit, app.config().server.body_read_timeout).await?;
    Ok(Admitted {
        parts,
        body,
        places,
        tenant,
    })
}

/// Reads the whole body under a size limit and a deadline, so no handler
/// ever waits on a slow client. The body is read as hyper hands it over (no
/// boxing), and the deadline's timer is made only for a body that has not
/// all arrived with its head: most have, and a timer made and dropped per
/// request is a measurable part of a cached answer's cost.
pub(super) async fn read_body<B>(
    body: B,
    limit: usize,
    deadline: Duration,
) -> Result<Bytes, GatewayError>
where
    B: axum::body::HttpBody<Data = Bytes>,
    B::Error: Into<axum::BoxError>,
{
    let mut collect = std::pin::pin!(whole(Limited::new(body, limit)));
    let collected = match futures::poll!(collect.as_mut()) {
        Poll::Ready(collected) => Ok(collected),
        Poll::Pending => tokio::time::timeout(deadline, collect).await,
    };
    match collected {
        Err(_) => Err(GatewayError::BodyTimeout { timeout: deadline }),
        Ok(Err(err)) if err.downcast_ref::<LengthLimitError>().is_some() => {
            Err(GatewayError::BodyTooLarge { limit })
        }
        Ok(Err(err)) => Err(GatewayError::invalid(format!(
            "could not read the request body: {err}"
        ))),
        Ok(Ok(body)) => Ok(body),
    }
}

/// A body's data, whole. `BodyExt::collect` keeps a list of every frame and
/// copies them out; a request body nearly always comes as one frame, which
/// is then the answer as it is. Trailers are not kept (no API here has any).
async fn whole<B: axum::body::HttpBody<Data = Bytes>>(body: B) -> Result<Bytes, B::Error> {
    let mut body = std::pin::pin!(body);
    let mut first: Option<Bytes> = None;
    let mut joined: Option<bytes::BytesMut> = None;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        match (&mut joined, first.take()) {
            (Some(joined), _) => joined.extend_from_slice(&data),
            (None, None) => first = Some(data),
            (None, Some(earlier)) => {
                let mut both = bytes::BytesMut::with_capacity(earlier.len() + data.len());
                both.extend_from_slice(&earlier);
                both.extend_from_slice(&data);
                joined = Some(both);
            }
        }
    }
    Ok(joined.map_or_else(|| first.unwrap_or_default(), bytes::BytesMut::freeze))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dedup::REQUEST_ID_HEADER;

    fn with_id(id: &[u8]) -> Request {
        Request::builder()
            .header(REQUEST_ID_HEADER, HeaderValue::from_bytes(id).unwrap())
            .body(Body::empty())
            .unwrap()
    }

    #[test]
    fn sane_request_ids_are_kept_and_others_replaced() {
        assert_eq!(request_id(&with_id(b"req-42_A.b")), "req-42_A.b");
        let longest = "x".repeat(MAX_REQUEST_ID_LEN);
        assert_eq!(request_id(&with_id(longest.as_bytes())), longest.as_str());
        for bad in [
            "x".repeat(MAX_REQUEST_ID_LEN + 1).into_bytes(),
            b"has space".to_vec(),
            b"tab\there".to_vec(),
            "caf\u{e9}".as_bytes().to_vec(),
        ] {
            let id = request_id(&with_id(&bad));
            assert_eq!(id.len(), 32, "{bad:?} -> {id:?}");
            assert!(id.to_str().unwrap().bytes().all(|b| b.is_ascii_hexdigit()));
        }
        let absent = Request::builder().body(Body::empty()).unwrap();
        assert_ne!(request_id(&absent), request_id(&absent), "fresh each time");
    }

    #[tokio::test]
    async fn a_body_is_read_whole_from_one_frame_or_many() {
        use http_body_util::{BodyExt as _, StreamBody};
        let frames = |chunks: &[&'static str]| {
            let frames: Vec<Result<hyper::body::Frame<Bytes>, std::convert::Infallible>> = chunks
                .iter()
                .map(|chunk| {
                    Ok(hyper::body::Frame::data(Bytes::from_static(
                        chunk.as_bytes(),
                    )))
                })
                .chain([Ok(hyper::body::Frame::trailers(http::HeaderMap::new()))])
                .collect();
            StreamBody::new(futures::stream::iter(frames)).boxed()
        };
        assert_eq!(whole(frames(&[])).await.unwrap(), "");
        assert_eq!(whole(frames(&["{\"a\":1}"])).await.unwrap(), "{\"a\":1}");
        assert_eq!(
            whole(frames(&["{\"a\"", "", ":1", "}"])).await.unwrap(),
            "{\"a\":1}"
        );
        let limit = 4;
        let too_long = read_body(frames(&["ab", "cd", "e"]), limit, Duration::from_secs(1)).await;
        assert!(
            matches!(too_long, Err(GatewayError::BodyTooLarge { limit: 4 })),
            "{too_long:?}"
        );
    }

    #[test]
    fn only_the_deduplicated_paths_are_endpoints() {
        assert_eq!(
            endpoint_of("/v1/chat/completions"),
            Some(Endpoint::ChatCompletions)
        );
        assert_eq!(endpoint_of("/v1/completions"), Some(Endpoint::Completions));
        assert_eq!(endpoint_of("/v1/embeddings"), Some(Endpoint::Embeddings));
        assert_eq!(endpoint_of("/v1/models"), None);
        assert_eq!(endpoint_of("/chat/completions"), None);
        assert_eq!(endpoint_of("/metrics"), None);
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> http::HeaderMap {
        pairs
            .iter()
            .map(|(name, value)| {
                (
                    http::HeaderName::from_static(name),
                    http::HeaderValue::from_static(value),
                )
            })
            .collect()
    }

    #[test]
    fn a_websocket_dial_is_an_upgrade_and_h2c_alone_is_not() {
        assert!(is_upgrade(&headers(&[
            ("connection", "keep-alive, Upgrade"),
            ("upgrade", "WebSocket"),
        ])));
        assert!(is_upgrade(&headers(&[("connection", "upgrade")])));
        assert!(is_upgrade(&headers(&[
            ("connection", "upgrade"),
            ("upgrade", "h2c, websocket"),
        ])));
        assert!(
            !is_upgrade(&headers(&[("upgrade", "websocket")])),
            "an Upgrade that Connection does not name asks for nothing"
        );
        assert!(
            is_upgrade(&headers(&[
                ("upgrade", "websocket"),
                ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ])),
            "a handshake whose Connection a proxy dropped"
        );
        assert!(!is_upgrade(&headers(&[
            ("connection", "Upgrade, HTTP2-Settings"),
            ("upgrade", "h2c"),
        ])));
        assert!(!is_upgrade(&headers(&[("connection", "keep-alive")])));
        assert!(!is_upgrade(&http::HeaderMap::new()));
    }
}
