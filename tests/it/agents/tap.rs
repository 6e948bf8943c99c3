//! A recording tap between a client and corral: every request goes on as it came, every answer
//! comes back as it went (streams streamed), and the tap keeps what each request was and what
//! status corral gave it. That is the one place that sees all a client sent, whatever the path
//! and whether or not it went upstream: how a test checks that each got a 2xx, and what it
//! diffs when two runs of one task did not coalesce.

use std::sync::{Arc, Mutex, PoisonError};

use axum::{
    Router,
    body::Body,
    extract::{Request, State},
    http::{HeaderName, StatusCode, header},
    response::{IntoResponse, Response},
};
use bytes::Bytes;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio_util::sync::{CancellationToken, DropGuard};

/// Largest request body the tap reads (a long agent conversation, with room to spare).
const MAX_BODY: usize = 64 * 1024 * 1024;

/// One request a client sent, and corral's status.
#[derive(Debug, Clone)]
pub struct Exchange {
    pub method: String,
    /// Path and query, e.g. `/v1/messages?beta=true`.
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
    pub status: u16,
    /// corral's `x-corral-cache` (MISS, COALESCED, HIT, ...), or `-`.
    pub cache: String,
    /// The answer's body when it was not a success (errors are small and say why).
    pub error: Option<String>,
}

impl Exchange {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// `METHOD target -> status cache`, and the error body if any.
    pub fn summary(&self) -> String {
        let error = self.error.as_deref().unwrap_or_default();
        let Self {
            method,
            target,
            status,
            cache,
            ..
        } = self;
        format!("{method} {target} -> {status} {cache} {error}")
            .trim_end()
            .to_owned()
    }
}

pub struct Tap {
    /// The address clients are given instead of corral's.
    pub url: String,
    shared: Arc<Shared>,
    _stop: DropGuard,
}

struct Shared {
    upstream: String,
    client: reqwest::Client,
    exchanges: Mutex<Vec<Exchange>>,
}

impl Tap {
    /// A tap on 127.0.0.1:0 in front of `upstream` (corral's URL), serving until dropped.
    pub async fn start(upstream: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind port 0");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let shared = Arc::new(Shared {
            upstream: upstream.trim_end_matches('/').to_owned(),
            // No proxy from the environment between two loopback sockets; no overall timeout,
            // since the client's own bound covers a long stream.
            client: reqwest::Client::builder()
                .no_proxy()
                .build()
                .expect("a client"),
            exchanges: Mutex::new(Vec::new()),
        });
        let stop = CancellationToken::new();
        let router = Router::new().fallback(forward).with_state(shared.clone());
        let signal = stop.clone().cancelled_owned();
        tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(signal)
                .await
        });
        Self {
            url,
            shared,
            _stop: stop.drop_guard(),
        }
    }

    /// Every request so far, in the order corral answered them.
    pub fn exchanges(&self) -> Vec<Exchange> {
        self.shared
            .exchanges
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The requests so far whose path is `path` (query aside).
    pub fn to(&self, path: &str) -> Vec<Exchange> {
        self.exchanges()
            .into_iter()
            .filter(|exchange| exchange.target.split('?').next() == Some(path))
            .collect()
    }
}

/// Headers that belong to one hop, not to the request or answer.
fn hop_by_hop(name: &HeaderName) -> bool {
    name == header::HOST
        || name == header::CONNECTION
        || name == header::CONTENT_LENGTH
        || name == header::TRANSFER_ENCODING
}

async fn forward(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(body) => body,
        Err(err) => return (StatusCode::BAD_REQUEST, err.to_string()).into_response(),
    };
    let target = parts
        .uri
        .path_and_query()
        .map_or("/", |target| target.as_str())
        .to_owned();
    let mut outbound = shared
        .client
        .request(parts.method.clone(), format!("{}{target}", shared.upstream))
        .body(body.clone());
    for (name, value) in &parts.headers {
        if !hop_by_hop(name) {
            outbound = outbound.header(name, value);
        }
    }
    let mut exchange = Exchange {
        method: parts.method.to_string(),
        target,
        headers: parts
            .headers
            .iter()
            .map(|(name, value)| {
                let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
                (name.as_str().to_owned(), value)
            })
            .collect(),
        body,
        status: 0,
        cache: "-".to_owned(),
        error: None,
    };
    let answer = match outbound.send().await {
        Ok(answer) => answer,
        Err(err) => {
            exchange.status = StatusCode::BAD_GATEWAY.as_u16();
            exchange.error = Some(format!("the tap could not reach corral: {err}"));
            shared.record(exchange);
            return (StatusCode::BAD_GATEWAY, err.to_string()).into_response();
        }
    };
    let status = answer.status();
    let mut response = Response::builder().status(status);
    for (name, value) in answer.headers() {
        if !hop_by_hop(name) {
            response = response.header(name, value);
        }
    }
    exchange.status = status.as_u16();
    if let Some(cache) = answer.headers().get("x-corral-cache") {
        exchange.cache = String::from_utf8_lossy(cache.as_bytes()).into_owned();
    }
    let body = if status.is_success() {
        Body::from_stream(answer.bytes_stream())
    } else {
        let bytes = answer.bytes().await.unwrap_or_default();
        exchange.error = Some(String::from_utf8_lossy(&bytes).into_owned());
        Body::from(bytes)
    };
    shared.record(exchange);
    response.body(body).expect("a valid response")
}

impl Shared {
    fn record(&self, exchange: Exchange) {
        self.exchanges
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(exchange);
    }
}
