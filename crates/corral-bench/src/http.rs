//! One persistent HTTP/1.1 connection per virtual client, opened before the
//! clock starts, and one timed request at a time on it.
//!
//! The load tool uses hyper's connection API directly rather than a pooled
//! client: every virtual client owns exactly one socket (as `wrk` and `oha`
//! do), so concurrency means connections, a 10,000-caller stampede is 10,000
//! sockets that were all established beforehand (the kernel's SYN queue is not
//! what is measured), and the client's own overhead stays small on a machine
//! where it shares the cores with the server it measures.

use std::{
    hash::{DefaultHasher, Hasher as _},
    net::SocketAddr,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Uri, header};
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// An OpenAI-compatible base URL, resolved once.
#[derive(Debug, Clone)]
pub struct Target {
    /// The base URL as given, e.g. `http://127.0.0.1:8080/v1`.
    pub base_url: String,
    /// `http://host:port`: where `/metrics` and `/__mock/*` live.
    pub origin: String,
    /// The base URL's path without a trailing slash (`/v1`, or empty).
    pub base_path: String,
    pub addr: SocketAddr,
    host: HeaderValue,
}

impl Target {
    /// Resolves `base_url`; only plain `http://` (loopback benchmarks need no TLS).
    pub async fn resolve(base_url: &str) -> anyhow::Result<Self> {
        let uri: Uri = base_url
            .parse()
            .with_context(|| format!("{base_url:?} is not a URL"))?;
        if uri.scheme_str() != Some("http") {
            bail!("{base_url:?}: only http:// base URLs are supported");
        }
        let authority = uri
            .authority()
            .with_context(|| format!("{base_url:?} has no host"))?
            .clone();
        let port = authority.port_u16().unwrap_or(80);
        let addr = tokio::net::lookup_host((authority.host(), port))
            .await
            .with_context(|| format!("resolving {authority}"))?
            .next()
            .with_context(|| format!("{authority} resolves to no address"))?;
        Ok(Self {
            base_url: base_url.to_owned(),
            origin: format!("http://{authority}"),
            base_path: uri.path().trim_end_matches('/').to_owned(),
            addr,
            host: HeaderValue::from_str(authority.as_str()).context("host header")?,
        })
    }
}

/// The `x-corral-cache` value of a response; `None` when absent (a server
/// that is not corral).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CacheLabel {
    Hit,
    Stale,
    Miss,
    Coalesced,
    Bypass,
    None,
}

impl CacheLabel {
    fn of(headers: &HeaderMap) -> Self {
        match headers.get("x-corral-cache").map(HeaderValue::as_bytes) {
            Some(b"HIT") => Self::Hit,
            Some(b"STALE") => Self::Stale,
            Some(b"MISS") => Self::Miss,
            Some(b"COALESCED") => Self::Coalesced,
            Some(b"BYPASS") => Self::Bypass,
            _ => Self::None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hit => "HIT",
            Self::Stale => "STALE",
            Self::Miss => "MISS",
            Self::Coalesced => "COALESCED",
            Self::Bypass => "BYPASS",
            Self::None => "-",
        }
    }
}

/// A response that arrived in full.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    pub status: u16,
    pub cache: CacheLabel,
    /// From sending to the first body bytes (time to first token for a stream).
    pub first_byte: Duration,
    /// From sending to the last body bytes.
    pub total: Duration,
    pub bytes: u64,
    /// A hash of the body, to count how many different answers a run got.
    pub body_hash: u64,
}

/// Why a request produced no usable response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Failure {
    Connect,
    Io,
    Timeout,
    Status(u16),
    /// A stream that ended without `data: [DONE]`.
    StreamIncomplete,
}

impl Failure {
    pub fn label(self) -> String {
        match self {
            Self::Connect => "connect".into(),
            Self::Io => "io".into(),
            Self::Timeout => "timeout".into(),
            Self::Status(status) => format!("http_{status}"),
            Self::StreamIncomplete => "stream_incomplete".into(),
        }
    }
}

/// One client connection; reopened transparently when the server closed it.
pub struct Conn {
    addr: SocketAddr,
    host: HeaderValue,
    authorization: Option<HeaderValue>,
    sender: Option<SendRequest<Full<Bytes>>>,
    /// How many times the connection had to be reopened.
    pub reconnects: u64,
}

impl Conn {
    pub async fn open(target: &Target, bearer: Option<&str>) -> anyhow::Result<Self> {
        let authorization = bearer
            .map(|token| HeaderValue::from_str(&format!("Bearer {token}")))
            .transpose()
            .context("the bearer token is not a valid header value")?;
        let mut conn = Self {
            addr: target.addr,
            host: target.host.clone(),
            authorization,
            sender: None,
            reconnects: 0,
        };
        conn.sender = Some(
            conn.handshake()
                .await
                .with_context(|| format!("connecting to {}", target.addr))?,
        );
        Ok(conn)
    }

    async fn handshake(&self) -> std::io::Result<SendRequest<Full<Bytes>>> {
        let stream = TcpStream::connect(self.addr).await?;
        stream.set_nodelay(true)?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(std::io::Error::other)?;
        tokio::spawn(async move {
            // Ends when the server closes the connection or the sender is dropped.
            let _ = connection.await;
        });
        Ok(sender)
    }

    /// A ready sender, reconnecting once when the old connection is gone.
    async fn ready(&mut self) -> Result<&mut SendRequest<Full<Bytes>>, Failure> {
        if let Some(sender) = self.sender.as_mut() {
            if sender.ready().await.is_ok() {
                return Ok(self.sender.as_mut().expect("checked above"));
            }
        }
        self.sender = None;
        self.reconnects += 1;
        let mut sender = self.handshake().await.map_err(|_| Failure::Connect)?;
        sender.ready().await.map_err(|_| Failure::Connect)?;
        Ok(self.sender.insert(sender))
    }

    /// POSTs `body` to `path` (absolute, base path included) and reads the
    /// whole response, bounded by `timeout`. With `stream`, the body must end
    /// with the SSE terminator.
    pub async fn post(
        &mut self,
        path: &str,
        body: Bytes,
        stream: bool,
        timeout: Duration,
    ) -> Result<Outcome, Failure> {
        let mut builder = Request::post(path)
            .header(header::HOST, self.host.clone())
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(authorization) = &self.authorization {
            builder = builder.header(header::AUTHORIZATION, authorization.clone());
        }
        let request = builder
            .body(Full::new(body))
            .expect("a POST with valid headers builds");
        let sent = Instant::now();
        let exchange = async {
            let sender = self.ready().await?;
            let response = sender
                .send_request(request)
                .await
                .map_err(|_| Failure::Io)?;
            let status = response.status().as_u16();
            let cache = CacheLabel::of(response.headers());
            let mut body = response.into_body();
            let mut first_byte = None;
            let mut bytes = 0u64;
            let mut hasher = DefaultHasher::new();
            // The last bytes seen, to find `[DONE]` across frame boundaries.
            let mut tail: Vec<u8> = Vec::with_capacity(64);
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|_| Failure::Io)?;
                if let Ok(data) = frame.into_data() {
                    if data.is_empty() {
                        continue;
                    }
                    first_byte.get_or_insert_with(|| sent.elapsed());
                    bytes += data.len() as u64;
                    hasher.write(&data);
                    if stream {
                        tail.extend_from_slice(&data[data.len().saturating_sub(32)..]);
                        let excess = tail.len().saturating_sub(32);
                        tail.drain(..excess);
                    }
                }
            }
            let total = sent.elapsed();
            if !(200..300).contains(&status) {
                return Err(Failure::Status(status));
            }
            if stream && !tail.windows(6).any(|w| w == b"[DONE]") {
                return Err(Failure::StreamIncomplete);
            }
            Ok(Outcome {
                status,
                cache,
                first_byte: first_byte.unwrap_or(total),
                total,
                bytes,
                body_hash: hasher.finish(),
            })
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(Ok(outcome)) => Ok(outcome),
            Ok(Err(failure)) => {
                if matches!(failure, Failure::Io) {
                    self.sender = None;
                }
                Err(failure)
            }
            Err(_) => {
                // The connection may still carry the late response: start afresh.
                self.sender = None;
                Err(Failure::Timeout)
            }
        }
    }
}
