//! Every byte has a deadline and a budget: stalled readers are cut by the
//! write timeout and what they held is freed, silent upstream bodies end
//! within the stall timeout, a dripping stream ends at its total deadline
//! with nothing cached and no lock left, and the cache stays within its bytes.

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{Router, body::Body, extract::State, response::IntoResponse, routing};
use bytes::Bytes;
use corral::config::RedisConfig;
use mock_upstream::{MockProvider, MockSettings};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpSocket, TcpStream},
    sync::watch,
    time::Instant,
};

use crate::{
    harness::{TestGateway, WAIT, chat, redis_at, streamed},
    redis_server::RedisServer,
};

const PATH: &str = "/v1/chat/completions";

fn streaming(content: &str) -> Value {
    streamed(chat(content))
}

/// A provider (OpenAI's wire format) for what the shipped mock does not do:
/// one large stream, sent only once released, and a `GET /v1/files` whose
/// body goes silent after its first chunk.
struct BigUpstream {
    base_url: String,
    release: watch::Sender<bool>,
    calls: Arc<AtomicUsize>,
}

#[derive(Clone)]
struct BigShared {
    release: watch::Receiver<bool>,
    calls: Arc<AtomicUsize>,
    chunks: usize,
    chunk_bytes: usize,
}

impl BigUpstream {
    async fn start(chunks: usize, chunk_bytes: usize) -> Self {
        let (release, released) = watch::channel(false);
        let calls = Arc::new(AtomicUsize::new(0));
        let shared = BigShared {
            release: released,
            calls: calls.clone(),
            chunks,
            chunk_bytes,
        };
        let app = Router::new()
            .route("/v1/chat/completions", routing::post(big_stream))
            .route("/v1/files", routing::get(silent_body))
            .with_state(shared);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            base_url: format!("http://{addr}/v1"),
            release,
            calls,
        }
    }
}

fn chunk_event(delta: Value, finish: Value) -> Bytes {
    let chunk = json!({
        "id": "chatcmpl-big", "object": "chat.completion.chunk", "created": 1,
        "model": "gpt-4o-mini",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    });
    Bytes::from(format!("data: {chunk}\n\n"))
}

async fn big_stream(State(shared): State<BigShared>) -> impl IntoResponse {
    shared.calls.fetch_add(1, Ordering::SeqCst);
    let mut released = shared.release.clone();
    let _ = released.wait_for(|go| *go).await;
    let mut events = vec![chunk_event(json!({"role": "assistant"}), Value::Null)];
    let content = "x".repeat(shared.chunk_bytes);
    for _ in 0..shared.chunks {
        events.push(chunk_event(json!({"content": content}), Value::Null));
    }
    events.push(chunk_event(json!({}), json!("stop")));
    let usage = json!({
        "id": "chatcmpl-big", "object": "chat.completion.chunk", "created": 1,
        "model": "gpt-4o-mini", "choices": [],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1000, "total_tokens": 1005},
    });
    events.push(Bytes::from(format!("data: {usage}\n\n")));
    events.push(Bytes::from_static(b"data: [DONE]\n\n"));
    let body = futures::stream::iter(events.into_iter().map(Ok::<_, Infallible>));
    (
        [("content-type", "text/event-stream")],
        Body::from_stream(body),
    )
}

/// The head and a first chunk, then nothing, for ever.
async fn silent_body() -> impl IntoResponse {
    let first = futures::stream::once(async {
        Ok::<_, Infallible>(Bytes::from_static(b"{\"object\":\"list\",\"data\":["))
    });
    let body = futures::StreamExt::chain(first, futures::stream::pending());
    (
        [("content-type", "application/json")],
        Body::from_stream(body),
    )
}

/// Sends a streaming request over a socket with a tiny receive buffer and
/// never reads from it: a client that stopped reading.
async fn stalled_reader(addr: SocketAddr, body: &Value) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(addr).await.unwrap();
    let body = body.to_string();
    let request = format!(
        "POST {PATH} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    stream
}

/// A `/stats` field, as a number.
async fn stat(gateway: &TestGateway, field: &str) -> i64 {
    gateway.get("/stats").await.json()[field]
        .as_i64()
        .unwrap_or_else(|| panic!("/stats has no {field}"))
}

/// Waits (bounded) until a `/stats` field satisfies `ok`; returns its last value.
async fn wait_for_stat(gateway: &TestGateway, field: &str, ok: impl Fn(i64) -> bool) -> i64 {
    let deadline = Instant::now() + WAIT;
    loop {
        let value = stat(gateway, field).await;
        if ok(value) || Instant::now() >= deadline {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_stalled_readers_are_cut_by_the_write_timeout_and_their_memory_returns() {
    // 12 MiB of events: far more than the kernel buffers a stalled socket.
    let (chunks, chunk_bytes) = (384, 32 * 1024);
    let upstream = BigUpstream::start(chunks, chunk_bytes).await;
    let provider = MockProvider::start(MockSettings::default()).await.unwrap();
    let base_url = upstream.base_url.clone();
    let gateway = TestGateway::start_with(provider, move |config| {
        config.upstreams[0].base_url = base_url;
        config.server.write_timeout = Duration::from_secs(2);
        config.limits.max_response_bytes = 64 * 1024 * 1024;
        // Fast readers here read as fast as loopback allows; the lag cap has its own test.
        config.coalesce.max_reader_lag_bytes = 64 * 1024 * 1024;
    })
    .await;
    let addr: SocketAddr = gateway.url.trim_start_matches("http://").parse().unwrap();
    let body = streaming("one large stream, twenty clients that never read it");

    let mut stalled = Vec::new();
    for _ in 0..20 {
        stalled.push(stalled_reader(addr, &body).await);
    }
    let fast: Vec<_> = (0..3)
        .map(|_| {
            let (client, url, body) = (gateway.client.clone(), gateway.url.clone(), body.clone());
            tokio::spawn(async move {
                let response = client
                    .post(format!("{url}{PATH}"))
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status(), StatusCode::OK);
                let bytes = response
                    .bytes()
                    .await
                    .expect("a fast reader gets all of it");
                (bytes, Instant::now())
            })
        })
        .collect();
    gateway.wait_for_waiters(23).await;
    let released = Instant::now();
    upstream.release.send_replace(true);

    let mut streams = Vec::new();
    for task in fast {
        let (bytes, finished) = task.await.unwrap();
        println!(
            "fast reader: {} bytes in {:?}",
            bytes.len(),
            finished - released
        );
        assert!(bytes.len() > chunks * chunk_bytes);
        assert!(bytes.ends_with(b"data: [DONE]\n\n"), "complete");
        streams.push(bytes);
    }
    assert!(streams.windows(2).all(|w| w[0] == w[1]), "the same bytes");
    assert_eq!(
        upstream.calls.load(Ordering::SeqCst),
        1,
        "one upstream call"
    );

    // The flight is over and the fast readers are done: only the stalled
    // readers can still hold the 12 MiB log. corral's own count returns to zero
    // once the write timeout has cut every one of them.
    let held = wait_for_stat(&gateway, "stream_log_bytes", |bytes| bytes == 0).await;
    assert_eq!(held, 0, "stream logs still held");
    println!(
        "stream logs freed {:?} after the release",
        released.elapsed()
    );
    // Their connections are closed: reading now drains what the kernel had
    // buffered and ends (EOF or reset), far short of the stream and its [DONE].
    for mut socket in stalled {
        let mut received = Vec::new();
        let read = tokio::time::timeout(WAIT, socket.read_to_end(&mut received))
            .await
            .expect("the server closed the stalled connection");
        if let Err(err) = read {
            assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
        }
        assert!(
            received.len() < chunks * chunk_bytes,
            "{} bytes",
            received.len()
        );
        assert!(!received.windows(6).any(|w| w == b"[DONE]"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_no_store_stream_and_a_silent_passthrough_body_end_within_the_stall_timeout() {
    let stall = Duration::from_secs(1);
    // The mock sends its first event, then waits a minute before the next.
    let provider = dripping_provider(Duration::from_secs(60)).await;
    let gateway = TestGateway::start_with(provider, |config| {
        config.coalesce.stream_stall_timeout = stall;
    })
    .await;
    let started = Instant::now();
    let reply = gateway
        .post_with(
            PATH,
            &streaming("a no-store stream whose provider goes silent"),
            &[("cache-control", "no-store")],
        )
        .await;
    let elapsed = started.elapsed();
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.cache(), "BYPASS");
    let text = String::from_utf8_lossy(&reply.body);
    let last = text
        .trim_end()
        .rsplit("\n\n")
        .next()
        .unwrap()
        .strip_prefix("data: ")
        .unwrap();
    let error: Value = serde_json::from_str(last).expect("the last event is JSON");
    assert_eq!(error["error"]["code"], "upstream_stream_broken", "{text}");
    assert!(text.starts_with("data: {"), "the first event was relayed");
    println!("silent no-store stream ended after {elapsed:?}");
    assert!(
        elapsed < Duration::from_secs(20),
        "ended near the 1 s stall timeout, not the provider's 60 s: {elapsed:?}"
    );

    // A pass-through body (here `GET /v1/files`) that goes silent mid-body.
    let upstream = BigUpstream::start(1, 1).await;
    let base_url = upstream.base_url.clone();
    let provider = MockProvider::start(MockSettings::default()).await.unwrap();
    let proxy = TestGateway::start_with(provider, move |config| {
        config.upstreams[0].base_url = base_url;
        config.coalesce.stream_stall_timeout = stall;
    })
    .await;
    let started = Instant::now();
    let response = proxy
        .client
        .get(format!("{}/v1/files", proxy.url))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.bytes().await;
    let elapsed = started.elapsed();
    assert!(
        body.is_err(),
        "the client sees the body cut short: {body:?}"
    );
    println!("silent pass-through body ended after {elapsed:?}");
    assert!(elapsed < Duration::from_secs(20), "{elapsed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dripping_stream_ends_at_its_total_deadline_for_every_reader_with_no_lock_and_no_cache() {
    let redis = RedisServer::spawn().await;
    let provider = dripping_provider(Duration::from_secs(2)).await;
    let total = Duration::from_secs(5);
    let gateway = TestGateway::start_with(provider, |config| {
        config.upstreams[0].request_timeout = total;
        config.coalesce.stream_stall_timeout = Duration::from_secs(60);
        config.redis = Some(redis_at(&redis.url()));
    })
    .await;
    gateway.wait_connected().await;
    // A long answer: at one event every 2 s, far longer than 5 s.
    let body = streaming(
        "a provider that drips one event every two seconds for a long, long answer indeed",
    );
    let started = Instant::now();
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (handle, body) = (gateway.clone_handle(), body.clone());
            tokio::spawn(async move {
                let reply = handle.post_with(PATH, &body, &[]).await;
                (reply, Instant::now())
            })
        })
        .collect();
    for reader in readers {
        let (reply, ended) = reader.await.unwrap();
        let elapsed = ended - started;
        println!("reader ended after {elapsed:?}");
        assert!(elapsed >= total - Duration::from_millis(100), "{elapsed:?}");
        assert!(elapsed < total + Duration::from_secs(10), "{elapsed:?}");
        let text = String::from_utf8_lossy(&reply.body);
        assert!(!text.contains("[DONE]"), "{text}");
        let last = text.trim_end().rsplit("\n\n").next().unwrap();
        let error: Value = serde_json::from_str(last.strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(error["error"]["code"], "upstream_stream_broken");
        assert!(
            error["error"]["message"]
                .as_str()
                .unwrap()
                .contains("did not complete within"),
            "{error}"
        );
    }
    assert_eq!(gateway.provider.calls(), 1);
    gateway.wait_idle().await;
    let keys: Vec<String> = redis.dump().await.into_iter().map(|(k, _)| k).collect();
    assert!(
        !keys
            .iter()
            .any(|k| k.contains(":lock:") || k.contains(":resp:")),
        "no lock left and nothing cached: {keys:?}"
    );
    assert_eq!(
        stat(&gateway, "cache_entries").await,
        0,
        "nothing cached in process"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_distinct_key_flood_keeps_the_cache_within_its_bytes() {
    let max_bytes: u64 = 256 * 1024;
    let gateway = TestGateway::start(|config| {
        config.cache.max_bytes = max_bytes;
        config.cache.max_entry_bytes = 64 * 1024;
    })
    .await;
    let mut stored = 0;
    for i in 0..600 {
        // Large-ish answers: the mock quotes the prompt and n choices.
        let mut body = chat(&format!("flood key {i}: {}", "padding ".repeat(200)));
        body["n"] = json!(8);
        let reply = gateway.post(PATH, &body).await;
        assert_eq!(reply.status, StatusCode::OK);
        stored += reply.body.len();
        if i % 100 == 99 {
            let bytes = stat(&gateway, "cache_bytes").await;
            assert!(bytes as u64 <= max_bytes, "{bytes} > {max_bytes}");
        }
    }
    let bytes = stat(&gateway, "cache_bytes").await as u64;
    let entries = stat(&gateway, "cache_entries").await;
    println!("flood: {stored} bytes of answers, cache holds {bytes} bytes in {entries} entries");
    assert!(
        stored as u64 > 4 * max_bytes,
        "the flood outweighs the cache"
    );
    assert!(bytes <= max_bytes && bytes > max_bytes / 4, "{bytes}");
    let metrics = gateway.get("/metrics").await;
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(
        text.lines()
            .any(|line| line == format!("corral_cache_bytes {bytes}")),
        "{text}"
    );
}

/// Reads a streamed response to its end; the chunks must end cleanly (no
/// transport error), bounded by `WAIT`.
async fn read_to_clean_end(mut response: reqwest::Response, mut bytes: Vec<u8>) -> Vec<u8> {
    while let Some(chunk) = tokio::time::timeout(WAIT, response.chunk())
        .await
        .expect("the stream ends")
        .expect("the stream ends cleanly, not with a transport error")
    {
        bytes.extend_from_slice(&chunk);
    }
    bytes
}

/// Reads until at least one whole event arrived.
async fn first_event(response: &mut reqwest::Response) -> Vec<u8> {
    let mut bytes = Vec::new();
    while !bytes.windows(2).any(|w| w == b"\n\n") {
        let chunk = tokio::time::timeout(WAIT, response.chunk())
            .await
            .expect("a first event")
            .unwrap()
            .expect("the stream is open");
        bytes.extend_from_slice(&chunk);
    }
    bytes
}

fn last_event_json(bytes: &[u8]) -> Value {
    let text = String::from_utf8_lossy(bytes);
    let last = text.trim_end().rsplit("\n\n").next().unwrap().to_owned();
    serde_json::from_str(last.strip_prefix("data: ").unwrap())
        .unwrap_or_else(|_| panic!("the last event is JSON: {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_open_streams_gives_every_reader_an_error_event_leaves_no_lock_and_exits_0() {
    let redis = RedisServer::spawn().await;
    // A long stream: one event a second.
    let provider = dripping_provider(Duration::from_secs(1)).await;
    let yaml = format!(
        "listen: 127.0.0.1:0\nupstreams:\n  - {{name: mock, base_url: '{}'}}\nredis:\n  url: '{}'\n  op_timeout: 2s\nshutdown:\n  drain_timeout: 1s\n",
        provider.base_url(),
        redis.url()
    );
    let mut corral = crate::shutdown::CorralProcess::start(&yaml, &[]).await;
    let client = reqwest::Client::builder().timeout(WAIT).build().unwrap();
    corral.wait_redis_connected().await;

    let body = streaming("a long stream that is open when the gateway is told to stop");
    let mut open = Vec::new();
    for headers in [vec![], vec![], vec![], vec![("cache-control", "no-store")]] {
        let mut request = client.post(format!("{}{PATH}", corral.url)).json(&body);
        for (name, value) in headers {
            request = request.header(name, value);
        }
        let mut response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let so_far = first_event(&mut response).await;
        open.push((response, so_far));
    }
    assert_eq!(
        provider.calls(),
        2,
        "one coalesced stream, one no-store stream"
    );
    let dump = redis.dump().await;
    assert!(
        dump.iter().any(|(key, _)| key.contains(":lock:")),
        "the owner holds the lock"
    );

    corral.signal("TERM");
    for (response, so_far) in open {
        let bytes = read_to_clean_end(response, so_far).await;
        assert!(
            !bytes.windows(6).any(|w| w == b"[DONE]"),
            "cut, not completed"
        );
        let error = last_event_json(&bytes);
        assert_eq!(error["error"]["code"], "upstream_stream_broken", "{error}");
        assert!(
            error["error"]["message"]
                .as_str()
                .unwrap()
                .contains("shutting down"),
            "{error}"
        );
    }
    assert_eq!(corral.exit_code().await, Some(0), "{}", corral.logs());
    let dump = redis.dump().await;
    assert!(
        !dump
            .iter()
            .any(|(key, _)| key.contains(":lock:") || key.contains(":resp:")),
        "no lock left, nothing cached: {dump:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_streaming_follower_gets_the_whole_answer_within_one_poll_interval_of_the_owner() {
    let redis = RedisServer::spawn().await;
    let provider = dripping_provider(Duration::from_millis(100)).await;
    let poll_interval = Duration::from_secs(5);
    let fleet = crate::harness::Fleet::start_with(provider, 2, |config| {
        config.coalesce.stream_stall_timeout = Duration::from_secs(120);
        config.redis = Some(RedisConfig {
            poll_interval,
            ..redis_at(&redis.url())
        });
    })
    .await;
    let body = streaming("the owner finishes; the remote follower must not wait for a stall");
    let mut owner = fleet.instances[0].open(PATH, &body).await;
    let so_far = first_event(&mut owner).await;
    let follower = {
        let (client, url, body) = (
            fleet.instances[1].client.clone(),
            fleet.instances[1].url.clone(),
            body.clone(),
        );
        tokio::spawn(async move {
            let response = client
                .post(format!("{url}{PATH}"))
                .json(&body)
                .send()
                .await
                .unwrap();
            let cache = response.headers()["x-corral-cache"]
                .to_str()
                .unwrap()
                .to_owned();
            let bytes = read_to_clean_end(response, Vec::new()).await;
            (cache, bytes, Instant::now())
        })
    };
    let owner_bytes = read_to_clean_end(owner, so_far).await;
    let owner_done = Instant::now();
    let (cache, follower_bytes, follower_done) = follower.await.unwrap();
    let behind = follower_done.saturating_duration_since(owner_done);
    println!("the remote follower finished {behind:?} after the owner");
    assert_eq!(cache, "COALESCED");
    assert_eq!(
        follower_bytes, owner_bytes,
        "the whole answer, the owner's events"
    );
    assert!(owner_bytes.ends_with(b"data: [DONE]\n\n"));
    assert!(behind < poll_interval, "{behind:?}");
    assert_eq!(fleet.provider.calls(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_streaming_follower_whose_owner_dies_mid_stream_ends_long_before_the_stall_timeout()
 {
    let redis = RedisServer::spawn().await;
    // A long stream: one event every 300 ms.
    let provider = dripping_provider(Duration::from_millis(300)).await;
    let stall = Duration::from_secs(120);
    let yaml = format!(
        "listen: 127.0.0.1:0\nupstreams:\n  - {{name: mock, base_url: '{}'}}\nredis:\n  url: '{}'\n  op_timeout: 2s\n  lock_ttl: 1s\n",
        provider.base_url(),
        redis.url()
    );
    let mut owner = crate::shutdown::CorralProcess::start(&yaml, &[]).await;
    let follower_gateway = TestGateway::start_with(provider.clone(), |config| {
        config.coalesce.stream_stall_timeout = stall;
        config.redis = Some(RedisConfig {
            lock_ttl: Duration::from_secs(1),
            ..redis_at(&redis.url())
        });
    })
    .await;
    follower_gateway.wait_connected().await;
    let client = reqwest::Client::builder().timeout(WAIT).build().unwrap();
    let body = streaming("the owner of this stream is killed while it streams it");
    // The owner process must hold the lock before the follower asks: wait for
    // its first event.
    let mut owned = client
        .post(format!("{}{PATH}", owner.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    first_event(&mut owned).await;
    let mut followed = client
        .post(format!("{}{PATH}", follower_gateway.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(followed.headers()["x-corral-cache"], "COALESCED");
    let so_far = first_event(&mut followed).await;
    owner.child.kill().await.expect("SIGKILL the owner");
    let killed_at = Instant::now();
    let bytes = read_to_clean_end(followed, so_far).await;
    let elapsed = killed_at.elapsed();
    println!("the remote follower's stream ended {elapsed:?} after the owner died");
    assert!(!bytes.windows(6).any(|w| w == b"[DONE]"));
    assert_eq!(
        last_event_json(&bytes)["error"]["code"],
        "upstream_stream_broken"
    );
    // Lock TTL + one poll + the relay's 1 s grace, not the 120 s stall timeout.
    assert!(elapsed < Duration::from_secs(30), "{elapsed:?}");
}

/// A provider that sends a stream's events `delay` apart.
async fn dripping_provider(delay: Duration) -> MockProvider {
    MockProvider::start(MockSettings {
        stream_chunk_delay: delay,
        ..MockSettings::default()
    })
    .await
    .unwrap()
}
