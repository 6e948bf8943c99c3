//! `bench-baseline`: the physical limit of one HTTP hop on this machine, for
//! the hit-path benchmark. A bare hyper HTTP/1.1 server that reads each
//! request body and answers every request with the same bytes (the body corral
//! serves for the benchmark's cached request), with keep-alive; no routing, no
//! parsing, no logging. This file is the whole server.
//!
//! With `--header`, it also sends the headers corral's answer carries, so its
//! response is corral's byte for byte but for the date: the hop's cost with
//! corral's wire format, against which corral's own work is measured apart.

use std::{net::SocketAddr, path::PathBuf};

use anyhow::Context as _;
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt as _, Full};
use hyper::{Request, Response, body::Incoming, header, service::service_fn};
use hyper_util::rt::TokioIo;
use std::io::Write as _;
use tokio::net::TcpListener;

#[derive(Debug, Parser)]
#[command(name = "bench-baseline", version)]
struct Args {
    /// Address to listen on; port 0 picks a free port (printed on the ready line).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// The bytes to answer with (as `application/json`).
    #[arg(long)]
    body_file: PathBuf,
    /// A header to send on every response, as `name: value` (repeatable).
    #[arg(long = "header", value_parser = parse_header)]
    headers: Vec<(header::HeaderName, header::HeaderValue)>,
}

fn parse_header(text: &str) -> Result<(header::HeaderName, header::HeaderValue), String> {
    let (name, value) = text
        .split_once(':')
        .ok_or_else(|| format!("{text:?} is not `name: value`"))?;
    let name = header::HeaderName::from_bytes(name.trim().as_bytes()).map_err(|e| e.to_string())?;
    let value = header::HeaderValue::from_str(value.trim()).map_err(|e| e.to_string())?;
    Ok((name, value))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let body = Bytes::from(
        std::fs::read(&args.body_file)
            .with_context(|| format!("reading {}", args.body_file.display()))?,
    );
    // One map, shared: a clone per response is what corral pays for its prebuilt headers too.
    let headers: header::HeaderMap = args.headers.into_iter().collect();
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
        let body = body.clone();
        let headers = headers.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<Incoming>| {
                let body = body.clone();
                let headers = headers.clone();
                async move {
                    // Read the request as corral must, so both sides do that work.
                    request.into_body().collect().await?;
                    let mut response = Response::new(Full::new(body));
                    response.headers_mut().insert(
                        header::CONTENT_TYPE,
                        header::HeaderValue::from_static("application/json"),
                    );
                    if !headers.is_empty() {
                        response.headers_mut().extend(headers);
                    }
                    Ok::<_, hyper::Error>(response)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
