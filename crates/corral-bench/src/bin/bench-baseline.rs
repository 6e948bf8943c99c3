//! `bench-baseline`: the physical limit of one HTTP hop on this machine, for
//! the hit-path benchmark. A bare hyper HTTP/1.1 server that reads each
//! request body and answers every request with the same bytes (the body corral
//! serves for the benchmark's cached request), with keep-alive; no routing, no
//! parsing, no logging. This file is the whole server.

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
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let body = Bytes::from(
        std::fs::read(&args.body_file)
            .with_context(|| format!("reading {}", args.body_file.display()))?,
    );
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
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<Incoming>| {
                let body = body.clone();
                async move {
                    // Read the request as corral must, so both sides do that work.
                    request.into_body().collect().await?;
                    let mut response = Response::new(Full::new(body));
                    response.headers_mut().insert(
                        header::CONTENT_TYPE,
                        header::HeaderValue::from_static("application/json"),
                    );
                    Ok::<_, hyper::Error>(response)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
