//! How one member's requests travel: hyper's pooled keep-alive client
//! (rustls, HTTP/1.1 and HTTP/2 by ALPN), or reqwest where the environment
//! names an egress proxy (`HTTPS_PROXY` and the rest, which reqwest honours
//! and hyper's client does not).
//!
//! The direct client is the miss path's: reqwest turns every request's URL
//! into a `Uri` and back into a URL for its redirect policy (which corral
//! turns off), clones its client per request and wraps each call in a retry
//! layer corral does not use: about a tenth of a miss's instructions
//! (BENCHMARKS.md, "Miss path"). Both hand back a `reqwest::Response`, so
//! everything past the send (bodies, streams, adapters) is one code path.

use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, header};
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::{TokioExecutor, TokioTimer},
};

/// How long an idle pooled connection is kept.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Idle connections kept per host.
const POOL_MAX_IDLE_PER_HOST: usize = 256;

/// The variables that name an egress proxy (reqwest reads each in both cases).
const PROXY_VARIABLES: [&str; 3] = ["HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"];

type Direct = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// One member's way to its provider. See the module documentation.
#[derive(Clone, Debug)]
pub(crate) enum Transport {
    Direct(Box<Direct>),
    Proxied(reqwest::Client),
}

/// A request that did not get a response head.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SendError {
    #[error(transparent)]
    Direct(#[from] hyper_util::client::legacy::Error),
    #[error(transparent)]
    Proxied(reqwest::Error),
    #[error("the request URL is not a URI: {0}")]
    Uri(#[from] axum::http::uri::InvalidUri),
}

impl SendError {
    /// Whether no connection was made: nothing reached the provider.
    pub(crate) fn is_connect(&self) -> bool {
        match self {
            Self::Direct(err) => err.is_connect(),
            Self::Proxied(err) => err.is_connect(),
            Self::Uri(_) => false,
        }
    }

    /// The error without the request's URL (a query may carry a credential);
    /// hyper's errors never name it.
    pub(crate) fn without_url(self) -> Self {
        match self {
            Self::Proxied(err) => Self::Proxied(err.without_url()),
            other => other,
        }
    }

    /// A timeout other than the connect timeout (reqwest's own).
    pub(crate) fn is_timeout(&self) -> bool {
        matches!(self, Self::Proxied(err) if err.is_timeout())
    }
}

impl Transport {
    /// The transport for a member with `connect_timeout`: proxied when the
    /// environment names a proxy (`reqwest` is the client given), else
    /// direct.
    pub(crate) fn new(
        connect_timeout: Duration,
        proxied: &reqwest::Client,
    ) -> anyhow::Result<Self> {
        if environment_names_a_proxy() {
            return Ok(Self::Proxied(proxied.clone()));
        }
        Self::direct(connect_timeout)
    }

    /// hyper's pooled client, whatever the environment says.
    pub(crate) fn direct(connect_timeout: Duration) -> anyhow::Result<Self> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(connect_timeout));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls_config()?)
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .pool_max_idle_per_host(POOL_MAX_IDLE_PER_HOST)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .build(https);
        Ok(Self::Direct(Box::new(client)))
    }

    /// Sends one request; `whole` bounds a proxied call's body too (the
    /// direct one's body is bounded by its reader). The headers go as they
    /// are, plus `accept: */*` when they name no `accept` (what reqwest
    /// sends).
    pub(crate) async fn send(
        &self,
        method: Method,
        url: reqwest::Url,
        headers: impl Iterator<Item = (HeaderName, HeaderValue)>,
        body: Option<Bytes>,
        whole: Option<Duration>,
    ) -> Result<reqwest::Response, SendError> {
        match self {
            Self::Direct(client) => {
                let mut request = axum::http::Request::new(Full::new(body.unwrap_or_default()));
                *request.method_mut() = method;
                *request.uri_mut() = url.as_str().parse()?;
                let map = request.headers_mut();
                extend(map, headers);
                let mut response = client.request(request).await?;
                response.extensions_mut().extend(placeholder_url());
                Ok(reqwest::Response::from(response.map(reqwest::Body::wrap)))
            }
            Self::Proxied(client) => {
                let mut map = HeaderMap::new();
                extend(&mut map, headers);
                let mut request = client.request(method, url).headers(map);
                if let Some(body) = body {
                    request = request.body(body);
                }
                if let Some(whole) = whole {
                    request = request.timeout(whole);
                }
                request.send().await.map_err(SendError::Proxied)
            }
        }
    }
}

#[cfg(test)]
impl Transport {
    /// A bare `GET` of `url`, as the tests send one.
    pub(crate) async fn get(&self, url: &str) -> Result<reqwest::Response, SendError> {
        let url = reqwest::Url::parse(url).expect("a test's URL parses");
        self.send(Method::GET, url, std::iter::empty(), None, None)
            .await
    }
}

fn extend(map: &mut HeaderMap, headers: impl Iterator<Item = (HeaderName, HeaderValue)>) {
    for (name, value) in headers {
        map.append(name, value);
    }
    if !map.contains_key(header::ACCEPT) {
        map.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
    }
}

/// The URL a direct call's `reqwest::Response` carries: the one reqwest puts
/// there itself (`http://no.url.provided.local`), parsed once. Left out,
/// reqwest parses it anew for every response (about 3,400 instructions, 2%
/// of a miss); the real URL stays out of it, as it would carry a query's key
/// into anything that names the response's URL. Made once, as the
/// extensions reqwest reads it from, and cloned for each response.
pub(super) fn placeholder_url() -> http::Extensions {
    static PLACEHOLDER: std::sync::LazyLock<http::Extensions> = std::sync::LazyLock::new(|| {
        use reqwest::ResponseBuilderExt;
        let url = reqwest::Url::parse("http://no.url.provided.local").expect("a valid URL");
        let mut carrier = http::Response::builder()
            .url(url)
            .body(())
            .expect("a response of defaults and one extension builds");
        std::mem::take(carrier.extensions_mut())
    });
    PLACEHOLDER.clone()
}

/// rustls with the webpki roots and ring, as reqwest's `rustls-tls` has it.
fn tls_config() -> anyhow::Result<rustls::ClientConfig> {
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(config)
}

fn environment_names_a_proxy() -> bool {
    PROXY_VARIABLES.iter().any(|name| {
        [name.to_string(), name.to_lowercase()]
            .iter()
            .any(|name| std::env::var_os(name).is_some_and(|value| !value.is_empty()))
    })
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A direct call's response carries reqwest's placeholder URL, as a
    /// response reqwest made from parts would: never the call's own, whose
    /// query may hold a key.
    #[tokio::test]
    async fn a_direct_response_names_the_placeholder_not_the_call() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                socket.read_exact(&mut byte).await.unwrap();
                head.push(byte[0]);
            }
            socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                .await
                .unwrap();
            head
        });
        let transport = Transport::direct(Duration::from_secs(5)).unwrap();
        {
            let response = transport
                .get(&format!(
                    "http://127.0.0.1:{port}/v1/models?key=AIza-SECRET"
                ))
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
            assert_eq!(response.url().as_str(), "http://no.url.provided.local/");
            assert_eq!(response.bytes().await.unwrap(), "ok");
        }
        let head = String::from_utf8(server.await.unwrap()).unwrap();
        assert!(
            head.starts_with("GET /v1/models?key=AIza-SECRET HTTP/1.1"),
            "{head}"
        );
    }
}
