//! `bench-baseline`: the physical limit of one HTTP hop on this machine, for
//! the hit- and miss-path benchmarks. A bare hyper HTTP/1.1 server with
//! keep-alive; no routing, no parsing, no logging. This file is the whole
//! server. It has two modes:
//!
//! - `--body-file`: answers every request with the same bytes (the body corral
//!   serves for the benchmark's cached request): the hit path's floor. With
//!   `--header`, it also sends the headers corral's answer carries, so its
//!   response is corral's byte for byte but for the date: the hop's cost with
//!   corral's wire format, against which corral's own work is measured apart.
//! - `--proxy-to`: a reverse proxy, the miss path's floor. Each request
//!   (method, path, headers, body bytes) goes to the upstream through one
//!   pooled keep-alive client and the answer streams back as it arrives, as
//!   nginx's `proxy_pass` does with its default request buffering: whatever a
//!   miss through corral costs beyond this is corral's own work.

use std::{net::SocketAddr, path::PathBuf};

use anyhow::Context as _;
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt as _, Full, combinators::BoxBody};
use hyper::{Request, Response, Uri, body::Incoming, header, service::service_fn};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::{TokioExecutor, TokioIo},
};
use std::io::Write as _;
use tokio::net::TcpListener;

#[derive(Debug, Parser)]
#[command(name = "bench-baseline", version)]
struct Args {
    /// Address to listen on; port 0 picks a free port (printed on the ready line).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// The bytes to answer with (as `application/json`).
    #[arg(
        long,
        required_unless_present = "proxy_to",
        conflicts_with = "proxy_to"
    )]
    body_file: Option<PathBuf>,
    /// A header to send on every response, as `name: value` (repeatable).
    #[arg(long = "header", value_parser = parse_header, conflicts_with = "proxy_to")]
    headers: Vec<(header::HeaderName, header::HeaderValue)>,
    /// Forward every request to this origin (`http://host:port`) instead.
    #[arg(long)]
    proxy_to: Option<Uri>,
}

fn parse_header(text: &str) -> Result<(header::HeaderName, header::HeaderValue), String> {
    let (name, value) = text
        .split_once(':')
        .ok_or_else(|| format!("{text:?} is not `name: value`"))?;
    let name = header::HeaderName::from_bytes(name.trim().as_bytes()).map_err(|e| e.to_string())?;
    let value = header::HeaderValue::from_str(value.trim()).map_err(|e| e.to_string())?;
    Ok((name, value))
}

type AnswerBody = BoxBody<Bytes, hyper::Error>;

/// What the server does with each request.
#[derive(Clone)]
enum Mode {
    Fixed {
        body: Bytes,
        headers: header::HeaderMap,
    },
    Proxy {
        client: Box<Client<HttpConnector, Full<Bytes>>>,
        origin: Uri,
    },
}

#[derive(Debug, thiserror::Error)]
enum ProxyError {
    #[error("reading the request: {0}")]
    Request(#[from] hyper::Error),
    #[error("calling the upstream: {0}")]
    Upstream(#[from] hyper_util::client::legacy::Error),
    #[error("building the upstream URI: {0}")]
    Uri(#[from] http::Error),
}

impl Mode {
    async fn answer(self, request: Request<Incoming>) -> Result<Response<AnswerBody>, ProxyError> {
        match self {
            Self::Fixed { body, headers } => {
                // Read the request as corral must, so both sides do that work.
                request.into_body().collect().await?;
                let mut response = Response::new(Full::new(body).map_err(|n| match n {}).boxed());
                response.headers_mut().insert(
                    header::CONTENT_TYPE,
                    header::HeaderValue::from_static("application/json"),
                );
                if !headers.is_empty() {
                    response.headers_mut().extend(headers);
                }
                Ok(response)
            }
            Self::Proxy { client, origin } => {
                let (mut parts, body) = request.into_parts();
                // The whole body before the call, as corral (which keys on it)
                // and nginx's default request buffering both do.
                let body = body.collect().await?.to_bytes();
                let mut uri = origin.into_parts();
                uri.path_and_query = parts.uri.path_and_query().cloned();
                parts.uri = Uri::from_parts(uri).map_err(http::Error::from)?;
                let answer = client
                    .request(Request::from_parts(parts, Full::new(body)))
                    .await?;
                Ok(answer.map(|body| body.boxed()))
            }
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mode = match (args.proxy_to, args.body_file) {
        (Some(origin), _) => Mode::Proxy {
            client: Box::new(Client::builder(TokioExecutor::new()).build({
                let mut connector = HttpConnector::new();
                connector.set_nodelay(true);
                connector
            })),
            origin,
        },
        (None, Some(path)) => Mode::Fixed {
            body: Bytes::from(
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?,
            ),
            // One map, shared: a clone per response is what corral pays for its prebuilt headers too.
            headers: args.headers.into_iter().collect(),
        },
        (None, None) => unreachable!("clap requires --body-file without --proxy-to"),
    };
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let mut stdout = std::io::stdout().lock();
    writeln!(
        stdout,
        "bench-baseline listening on http://{}",
        listener.local_addr()?
    )?;
    stdout.flush()?;
    drop(stdout);
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            // Out of file descriptors and the like: keep serving the others.
            Err(_) => continue,
        };
        let _ = stream.set_nodelay(true);
        let mode = mode.clone();
        tokio::spawn(async move {
            let service =
                service_fn(move |request: Request<Incoming>| mode.clone().answer(request));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
