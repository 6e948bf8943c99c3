//! Slow clients are cut by the header and body read timeouts while everyone
//! else is served: one trickling client in-process, then 500 against the real
//! binary, whose file descriptors are counted in /proc.
//!
//! The trickle itself is paced by real time (that is the attack); what the
//! tests wait on is the server closing the connection.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use crate::{
    harness::{TestGateway, WAIT},
    shutdown::CorralProcess,
};

const HEAD: &[u8] =
    b"GET /healthz HTTP/1.1\r\nHost: corral\r\nUser-Agent: slowloris\r\nAccept: */*\r\n\r\n";

/// Writes `HEAD` one byte per `every` until the server closes the connection;
/// returns how long after connecting that happened and the bytes sent.
async fn trickle(address: String, every: Duration) -> (Duration, usize) {
    let mut stream = TcpStream::connect(&address).await.expect("connects");
    let started = Instant::now();
    let mut ticks = tokio::time::interval(every);
    let mut sent = 0;
    let mut buf = [0u8; 256];
    let closed = tokio::time::timeout(WAIT, async {
        loop {
            tokio::select! {
                read = stream.read(&mut buf) => match read {
                    // Closed (or reset): hyper gave up on the head.
                    Ok(0) | Err(_) => return,
                    Ok(_) => panic!("the server answered a request that never completed"),
                },
                _ = ticks.tick() => {
                    if sent < HEAD.len() && stream.write_all(&HEAD[sent..=sent]).await.is_err() {
                        return;
                    }
                    sent += 1;
                }
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "a trickling connection was never closed");
    (started.elapsed(), sent)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_sending_its_headers_a_byte_a_second_is_cut_and_others_are_served() {
    let timeout = Duration::from_secs(2);
    let gateway = TestGateway::start(|config| config.server.header_read_timeout = timeout).await;
    let slow = tokio::spawn(trickle(
        gateway.url.trim_start_matches("http://").to_owned(),
        Duration::from_secs(1),
    ));
    // Others are unaffected meanwhile.
    let mut served = 0;
    while !slow.is_finished() {
        let started = Instant::now();
        assert_eq!(gateway.get("/healthz").await.status, StatusCode::OK);
        // Generous: this tells "served beside the trickler" from "queued
        // behind it until the cut", not how fast a loaded machine is.
        assert!(started.elapsed() < Duration::from_secs(10));
        served += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (cut_after, sent) = slow.await.unwrap();
    println!(
        "slow client cut after {cut_after:?} ({sent} bytes); {served} requests served meanwhile"
    );
    assert!(
        cut_after >= timeout - Duration::from_millis(100),
        "{cut_after:?}"
    );
    assert!(
        cut_after < timeout + Duration::from_secs(10),
        "{cut_after:?}"
    );
    assert!(sent < HEAD.len(), "cut before the head was complete");
    assert!(served > 0);
}

#[tokio::test]
async fn a_connection_that_never_sends_a_byte_is_closed_too() {
    let gateway = TestGateway::start(|config| {
        config.server.header_read_timeout = Duration::from_millis(500);
    })
    .await;
    let mut stream = TcpStream::connect(gateway.url.trim_start_matches("http://"))
        .await
        .unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(WAIT, stream.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "closed, not answered"
    );
    // Far above the 500 ms timeout (a loaded machine), far below "never".
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn a_slow_body_is_cut_with_408() {
    let gateway = TestGateway::start(|config| {
        config.server.body_read_timeout = Duration::from_secs(1);
    })
    .await;
    let mut stream = TcpStream::connect(gateway.url.trim_start_matches("http://"))
        .await
        .unwrap();
    stream
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: corral\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n{\"model\"")
        .await
        .unwrap();
    let started = Instant::now();
    let mut ticks = tokio::time::interval(Duration::from_millis(300));
    let mut response = Vec::new();
    let mut buf = [0u8; 4096];
    let answered = tokio::time::timeout(WAIT, async {
        loop {
            tokio::select! {
                read = stream.read(&mut buf) => match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => response.extend_from_slice(&buf[..n]),
                },
                _ = ticks.tick() => { let _ = stream.write_all(b" ").await; }
            }
        }
    })
    .await;
    assert!(answered.is_ok(), "the slow body was never cut");
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("request_timeout"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(gateway.provider.calls(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_trickling_connections_are_closed_at_the_header_timeout_and_fds_return() {
    let timeout = Duration::from_secs(3);
    let provider = mock_upstream::MockProvider::start(Default::default())
        .await
        .unwrap();
    let yaml = format!(
        "listen: 127.0.0.1:0\nupstreams:\n  - {{name: mock, base_url: '{}'}}\nserver:\n  header_read_timeout: 3s\n",
        provider.base_url()
    );
    let corral = CorralProcess::start(&yaml, &[]).await;
    // Each normal request on its own connection, closed after: nothing pooled.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(WAIT)
        .build()
        .unwrap();
    // Warm up the path normal traffic takes (its pooled upstream connection
    // belongs to the baseline), then let the count come to rest.
    let warm = client
        .post(format!("{}/v1/chat/completions", corral.url))
        .json(&crate::harness::chat("warm up"))
        .send()
        .await
        .unwrap();
    assert_eq!(warm.status(), StatusCode::OK);
    let baseline = at_rest(&corral).await;

    let address = corral.url.trim_start_matches("http://").to_owned();
    let started = Instant::now();
    let attackers: Vec<_> = (0..500)
        .map(|_| tokio::spawn(trickle(address.clone(), Duration::from_secs(2))))
        .collect();
    let mut peak = settle(&corral, |fds| fds >= baseline + 400).await;

    // Normal traffic flows while all 500 hold their sockets.
    let mut served = 0;
    let mut slowest = Duration::ZERO;
    while attackers.iter().any(|a| !a.is_finished()) {
        let sent = Instant::now();
        let response = client
            .post(format!("{}/v1/chat/completions", corral.url))
            .json(&crate::harness::chat(&format!(
                "during the attack {served}"
            )))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        slowest = slowest.max(sent.elapsed());
        served += 1;
        peak = peak.max(corral.open_fds());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut cut = Vec::new();
    for attacker in attackers {
        cut.push(attacker.await.unwrap().0);
    }
    let last = cut.iter().max().unwrap();
    let first = cut.iter().min().unwrap();
    println!(
        "500 trickling connections: fds {baseline} -> {peak}; cut between {first:?} and {last:?} \
         (header timeout {timeout:?}); {served} normal requests served meanwhile, slowest {slowest:?}; \
         all done after {:?}",
        started.elapsed()
    );
    assert!(*first >= timeout - Duration::from_millis(200), "{first:?}");
    assert!(*last < timeout + Duration::from_secs(10), "{last:?}");
    assert!(served > 0);
    assert!(
        peak >= baseline + 450,
        "most of the 500 were held at once ({peak})"
    );
    // Not starved: served in seconds, not after the attackers are cut.
    assert!(slowest < Duration::from_secs(10), "{slowest:?}");
    let after = settle(&corral, |fds| fds <= baseline).await;
    assert!(after <= baseline, "fds {after} back to {baseline}");
}

/// The fd count once two readings 100 ms apart agree (bounded).
async fn at_rest(corral: &CorralProcess) -> usize {
    let mut last = corral.open_fds();
    let deadline = Instant::now() + WAIT;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = corral.open_fds();
        if now == last {
            return now;
        }
        assert!(Instant::now() < deadline, "fd count never settled");
        last = now;
    }
}

/// Reads the process's fd count until `done` holds for it (bounded); the
/// count changes as the kernel and the server get to it, with no event to await.
async fn settle(corral: &CorralProcess, done: impl Fn(usize) -> bool) -> usize {
    let deadline = Instant::now() + WAIT;
    loop {
        let fds = corral.open_fds();
        if done(fds) {
            return fds;
        }
        assert!(Instant::now() < deadline, "fd count stuck at {fds}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
