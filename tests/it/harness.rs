//! Starts corral in-process on 127.0.0.1:0 in front of the shipped mock
//! provider, and sends it real HTTP. Waits are on events (a bound listener, the
//! flights' waiter count, the mock's call counter), never on sleeps.

#![allow(dead_code)]

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use corral::{AppState, Config, clock::ManualClock, config::RedisConfig};
use mock_upstream::{MockProvider, MockSettings};
use reqwest::{StatusCode, header::HeaderMap};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::{CancellationToken, DropGuard};

/// Bound on every wait in a test: generous, so a loaded machine does not fail
/// a correct run, and finite, so a broken one fails instead of hanging.
pub const WAIT: Duration = Duration::from_secs(30);

pub struct TestGateway {
    pub url: String,
    pub state: Arc<AppState>,
    pub provider: MockProvider,
    pub clock: Arc<ManualClock>,
    pub client: reqwest::Client,
    /// The `serve` task: resolves once the instance has drained and shut down.
    serving: tokio::task::JoinHandle<std::io::Result<()>>,
    _stop: DropGuard,
}

#[derive(Debug, Clone)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|err| panic!("body is not JSON ({err}): {:?}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn cache(&self) -> &str {
        self.header("x-corral-cache").unwrap_or("-")
    }
}

impl TestGateway {
    pub async fn start(adjust: impl FnOnce(&mut Config)) -> Self {
        let provider = MockProvider::start(MockSettings::default())
            .await
            .expect("mock provider starts");
        Self::start_with(provider, adjust).await
    }

    pub async fn start_with(provider: MockProvider, adjust: impl FnOnce(&mut Config)) -> Self {
        let clock = Arc::new(ManualClock::new(1_700_000_000_000));
        Self::start_shared(provider, clock, adjust).await
    }

    /// One of several instances sharing a provider and a clock (a fleet).
    pub async fn start_shared(
        provider: MockProvider,
        clock: Arc<ManualClock>,
        adjust: impl FnOnce(&mut Config),
    ) -> Self {
        let mut config = Config::for_tests(&provider.base_url());
        adjust(&mut config);
        config.validate().expect("test config is valid");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind port 0");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state =
            Arc::new(AppState::build_with_clock(config, clock.clone()).expect("state builds"));
        let stop = CancellationToken::new();
        let serving = tokio::spawn(corral::serve(
            listener,
            state.clone(),
            stop.clone().cancelled_owned(),
        ));
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(2048)
            .timeout(WAIT)
            .build()
            .unwrap();
        Self {
            url,
            state,
            provider,
            clock,
            client,
            serving,
            _stop: stop.drop_guard(),
        }
    }

    /// Shuts the instance down as SIGTERM would (drain, last ledger flush) and
    /// waits until it has.
    pub async fn stop(self) {
        let Self { serving, _stop, .. } = self;
        drop(_stop);
        tokio::time::timeout(WAIT, serving)
            .await
            .expect("the instance shuts down")
            .expect("serve did not panic")
            .expect("serve ends cleanly");
    }

    pub async fn post(&self, path: &str, body: &Value) -> Reply {
        self.post_with(path, body, &[]).await
    }

    pub async fn post_with(&self, path: &str, body: &Value, headers: &[(&str, &str)]) -> Reply {
        self.clone_handle().post_with(path, body, headers).await
    }

    pub async fn post_raw(
        &self,
        path: &str,
        body: impl Into<reqwest::Body>,
        headers: &[(&str, &str)],
    ) -> Reply {
        self.clone_handle().post_raw(path, body, headers).await
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.get_with(path, &[]).await
    }

    /// As [`get`](Self::get), with request headers (a caller's key).
    pub async fn get_with(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        let mut request = self.client.get(format!("{}{path}", self.url));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.expect("request reaches corral");
        Reply {
            status: response.status(),
            headers: response.headers().clone(),
            body: response.bytes().await.expect("body arrives"),
        }
    }

    /// Resolves once the instance is connected and subscribed to Redis.
    pub async fn wait_connected(&self) {
        if let Some(cluster) = self.state.cluster() {
            tokio::time::timeout(WAIT, cluster.connected())
                .await
                .expect("the instance connects to Redis");
        }
    }

    /// Resolves once at least `n` callers wait on flights.
    pub async fn wait_for_waiters(&self, n: usize) {
        let mut waiters = self.state.dedup().coalescer().flights().waiters();
        tokio::time::timeout(WAIT, waiters.wait_for(|count| *count >= n))
            .await
            .unwrap_or_else(|_| panic!("{n} waiters never gathered"))
            .expect("flights outlive the test");
    }

    /// Resolves once at most `n` callers wait on flights (others have left).
    pub async fn wait_for_waiters_at_most(&self, n: usize) {
        let mut waiters = self.state.dedup().coalescer().flights().waiters();
        tokio::time::timeout(WAIT, waiters.wait_for(|count| *count <= n))
            .await
            .unwrap_or_else(|_| panic!("waiters never dropped to {n}"))
            .expect("flights outlive the test");
    }

    /// Resolves once the mock has received `n` billable calls.
    pub async fn wait_for_calls(&self, n: u64) {
        assert!(
            self.provider.wait_for_calls(n, WAIT).await,
            "the provider never saw {n} calls (saw {})",
            self.provider.calls()
        );
    }

    /// Resolves once no flight (including background refreshes) is running.
    pub async fn wait_idle(&self) {
        tokio::time::timeout(WAIT, self.state.dedup().coalescer().flights().idle())
            .await
            .expect("flights end");
    }

    /// `n` identical concurrent requests, released together once all of them
    /// wait on the one flight, so exactly one is the owner.
    pub async fn herd(
        &self,
        path: &str,
        body: &Value,
        n: usize,
        headers: &[(&str, &str)],
    ) -> Vec<Reply> {
        self.provider.hold();
        let tasks: Vec<_> = (0..n)
            .map(|_| {
                let client = self.clone_handle();
                let body = body.clone();
                let path = path.to_owned();
                let headers: Vec<(String, String)> = headers
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect();
                tokio::spawn(async move {
                    let headers: Vec<(&str, &str)> = headers
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_str()))
                        .collect();
                    client.post_with(&path, &body, &headers).await
                })
            })
            .collect();
        self.wait_for_waiters(n).await;
        self.provider.release();
        let mut replies = Vec::with_capacity(n);
        for task in tasks {
            replies.push(task.await.expect("request task"));
        }
        replies
    }

    /// Holds the provider, starts `callers`, and releases it once `n` callers wait on the
    /// held flight: they all arrive while one call is under way. Returns what `callers` return.
    pub async fn held_for_waiters<T: Send + 'static>(
        &self,
        n: usize,
        callers: impl FnOnce() -> tokio::task::JoinHandle<T>,
    ) -> T {
        self.provider.hold();
        let task = callers();
        self.wait_for_waiters(n).await;
        self.provider.release();
        task.await.expect("callers' task")
    }

    /// After one upstream stream was cut (the provider truncating streams): once the flight is
    /// over and the provider streams whole again, `body` is a MISS, the second upstream call,
    /// since nothing of the cut stream was cached. Returns that reply.
    pub async fn post_after_a_cut(
        &self,
        path: &str,
        body: &Value,
        headers: &[(&str, &str)],
    ) -> Reply {
        assert_eq!(self.provider.calls(), 1);
        self.wait_idle().await;
        self.provider.set_truncate_streams(false);
        let next = self.post_with(path, body, headers).await;
        assert_eq!(next.cache(), "MISS", "nothing was cached");
        assert_eq!(self.provider.calls(), 2);
        next
    }

    /// A herd of both kinds on a held provider: a caller of `stream_body` waits first, so the
    /// flight (and its upstream call) streams; then callers alternate between `plain_body` and
    /// `stream_body` up to `n` in all, and the provider is released once all `n` wait.
    /// Checks that one upstream call, a streamed one, served both kinds, and that every
    /// stream caller got the same bytes. Returns the stream callers' replies and the plain
    /// callers'.
    pub async fn mixed_herd(
        &self,
        path: &str,
        stream_body: &Value,
        plain_body: &Value,
        n: usize,
        headers: &[(&str, &str)],
    ) -> (Vec<Reply>, Vec<Reply>) {
        let headers: Vec<(String, String)> = headers
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect();
        let spawn = |i: usize| {
            let (handle, path, headers) = (self.clone_handle(), path.to_owned(), headers.clone());
            let is_stream = i % 2 == 0;
            let body = if is_stream { stream_body } else { plain_body }.clone();
            tokio::spawn(async move {
                let headers: Vec<(&str, &str)> = headers
                    .iter()
                    .map(|(name, value)| (name.as_str(), value.as_str()))
                    .collect();
                (is_stream, handle.post_with(&path, &body, &headers).await)
            })
        };
        self.provider.hold();
        let mut tasks = vec![spawn(0)];
        self.wait_for_waiters(1).await;
        tasks.extend((1..n).map(spawn));
        self.wait_for_waiters(n).await;
        self.provider.release();
        let (mut streamed, mut plain) = (Vec::new(), Vec::new());
        for task in tasks {
            match task.await.expect("request task") {
                (true, reply) => streamed.push(reply),
                (false, reply) => plain.push(reply),
            }
        }
        assert_eq!(self.provider.calls(), 1, "one upstream call for both kinds");
        let bodies: std::collections::HashSet<&Bytes> =
            streamed.iter().map(|reply| &reply.body).collect();
        assert_eq!(bodies.len(), 1, "every streaming caller got the same bytes");
        let sent = self.provider.requests()[0].json().unwrap();
        assert_eq!(sent["stream"], true, "the shared call streams");
        (streamed, plain)
    }

    /// `post` on a task of its own, for callers that must wait together.
    pub fn spawn_post(&self, path: &str, body: &Value) -> tokio::task::JoinHandle<Reply> {
        let (handle, body, path) = (self.clone_handle(), body.clone(), path.to_owned());
        tokio::spawn(async move { handle.post_with(&path, &body, &[]).await })
    }

    /// A POST whose (streamed) body the test reads as it arrives.
    pub async fn open(&self, path: &str, body: &Value) -> reqwest::Response {
        self.client
            .post(format!("{}{path}", self.url))
            .json(body)
            .send()
            .await
            .expect("request reaches corral")
    }

    /// A handle whose client waits `timeout` for a whole answer, not
    /// [`WAIT`]: for calls that really take minutes.
    pub fn patient_handle(&self, timeout: Duration) -> Handle {
        Handle {
            url: self.url.clone(),
            client: reqwest::Client::builder()
                .timeout(timeout)
                .build()
                .expect("a client builds"),
        }
    }

    /// A cheap handle for concurrent tasks: shares the client and address.
    pub fn clone_handle(&self) -> Handle {
        Handle {
            url: self.url.clone(),
            client: self.client.clone(),
        }
    }
}

/// Several corral instances in front of one provider, sharing Redis and a clock.
pub struct Fleet {
    pub provider: MockProvider,
    pub clock: Arc<ManualClock>,
    pub instances: Vec<TestGateway>,
}

impl Fleet {
    pub async fn start(n: usize, adjust: impl Fn(&mut Config)) -> Self {
        let provider = MockProvider::start(MockSettings::default())
            .await
            .expect("mock provider starts");
        Self::start_with(provider, n, adjust).await
    }

    pub async fn start_with(
        provider: MockProvider,
        n: usize,
        adjust: impl Fn(&mut Config),
    ) -> Self {
        let clock = Arc::new(ManualClock::new(1_700_000_000_000));
        let mut instances = Vec::new();
        for _ in 0..n {
            let instance =
                TestGateway::start_shared(provider.clone(), clock.clone(), &adjust).await;
            instance.wait_connected().await;
            instances.push(instance);
        }
        Self {
            provider,
            clock,
            instances,
        }
    }

    /// As [`Fleet::herd`], released only once the upstream call has begun and
    /// the flight of every other instance is parked on it (past its own cache
    /// read). Without that, a flight that a loaded machine starts late can
    /// read the owner's stored answer in its double-check and serve it as a
    /// HIT, which the herd's counts do not expect.
    pub async fn herd_on_one_call(&self, path: &str, body: &Value, n: usize) -> Vec<Reply> {
        let tasks = self
            .held_for_one_call(n, || self.spread(path, &[(body.clone(), n)]))
            .await;
        collect(tasks).await
    }

    /// Starts `callers` with the provider held, and lets go once `n`
    /// callers wait, the upstream call has begun and every other instance's
    /// flight is parked on it (as [`herd_on_one_call`](Self::herd_on_one_call)).
    pub async fn held_for_one_call<T>(&self, n: usize, callers: impl FnOnce() -> T) -> T {
        let calls = self.provider.calls();
        self.provider.hold();
        let tasks = callers();
        self.wait_for_waiters(n).await;
        assert!(
            self.provider.wait_for_calls(calls + 1, WAIT).await,
            "the upstream call never began"
        );
        let mut parked: Vec<_> = self
            .instances
            .iter()
            .map(|i| {
                i.state
                    .cluster()
                    .expect("a fleet with Redis")
                    .followers_parked()
            })
            .collect();
        let others = self.instances.len() - 1;
        let gathered = tokio::time::timeout(WAIT, async {
            while parked.iter().map(|p| *p.borrow()).sum::<usize>() < others {
                let changes = parked.iter_mut().map(|p| Box::pin(p.changed()));
                let _ = futures::future::select_all(changes).await;
            }
        })
        .await;
        assert!(
            gathered.is_ok(),
            "the other instances' flights never parked"
        );
        self.provider.release();
        tasks
    }

    /// Callers waiting on flights, over every instance.
    pub fn waiters(&self) -> usize {
        self.instances
            .iter()
            .map(|i| *i.state.dedup().coalescer().flights().waiters().borrow())
            .sum()
    }

    /// Resolves once at least `n` callers wait, over every instance.
    pub async fn wait_for_waiters(&self, n: usize) {
        let mut watches: Vec<_> = self
            .instances
            .iter()
            .map(|i| i.state.dedup().coalescer().flights().waiters())
            .collect();
        let gathered = tokio::time::timeout(WAIT, async {
            while self.waiters() < n {
                let changes = watches.iter_mut().map(|w| Box::pin(w.changed()));
                let _ = futures::future::select_all(changes).await;
            }
        })
        .await;
        assert!(
            gathered.is_ok(),
            "{n} waiters never gathered (saw {})",
            self.waiters()
        );
    }

    /// `n` identical concurrent requests spread round-robin over the
    /// instances, released together once all of them wait.
    pub async fn herd(&self, path: &str, body: &Value, n: usize) -> Vec<Reply> {
        self.provider.hold();
        let tasks = self.spread(path, &[(body.clone(), n)]);
        self.wait_for_waiters(n).await;
        self.provider.release();
        collect(tasks).await
    }

    /// Starts `count` requests of each body, spread round-robin over the instances.
    pub fn spread(
        &self,
        path: &str,
        bodies: &[(Value, usize)],
    ) -> Vec<tokio::task::JoinHandle<Reply>> {
        let mut tasks = Vec::new();
        let mut next = 0;
        for (body, count) in bodies {
            for _ in 0..*count {
                let handle = self.instances[next % self.instances.len()].clone_handle();
                next += 1;
                let body = body.clone();
                let path = path.to_owned();
                tasks.push(tokio::spawn(async move {
                    handle.post_with(&path, &body, &[]).await
                }));
            }
        }
        tasks
    }
}

pub async fn collect(tasks: Vec<tokio::task::JoinHandle<Reply>>) -> Vec<Reply> {
    let mut replies = Vec::with_capacity(tasks.len());
    for task in tasks {
        replies.push(task.await.expect("request task"));
    }
    replies
}

/// What a spawned request task needs of the gateway.
#[derive(Clone)]
pub struct Handle {
    url: String,
    client: reqwest::Client,
}

impl Handle {
    pub async fn post_with(&self, path: &str, body: &Value, headers: &[(&str, &str)]) -> Reply {
        self.post_raw(path, body.to_string(), headers).await
    }

    pub async fn post_raw(
        &self,
        path: &str,
        body: impl Into<reqwest::Body>,
        headers: &[(&str, &str)],
    ) -> Reply {
        let mut request = self
            .client
            .post(format!("{}{path}", self.url))
            .header("content-type", "application/json")
            .body(body);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.expect("request reaches corral");
        Reply {
            status: response.status(),
            headers: response.headers().clone(),
            body: response.bytes().await.expect("body arrives"),
        }
    }
}

/// Entries fresh for `soft` and stale until `hard`, to the millisecond (no
/// jitter), so a test moving the clock knows which side of each it is on.
pub fn exact_ttls(config: &mut Config, soft: Duration, hard: Duration) {
    config.cache.soft_ttl = soft;
    config.cache.hard_ttl = hard;
    config.cache.ttl_jitter = 0.0;
}

pub fn chat(content: &str) -> Value {
    json!({
        "model": "gpt-4o-mini",
        "temperature": 0,
        "messages": [{"role": "user", "content": content}],
    })
}

/// `body` asking for a stream.
pub fn streamed(mut body: Value) -> Value {
    body["stream"] = json!(true);
    body
}

pub fn embedding(input: &str) -> Value {
    json!({"model": "text-embedding-3-small", "input": input})
}

pub fn completion(prompt: &str) -> Value {
    json!({"model": "gpt-3.5-turbo-instruct", "temperature": 0, "prompt": prompt})
}

/// corral in-process with a shutdown switch the test holds: its URL, state, the switch, and
/// the server task (which ends once the switch is flipped and the drain is over).
pub async fn start_switchable(
    provider: &MockProvider,
    adjust: impl FnOnce(&mut Config),
) -> (
    String,
    Arc<AppState>,
    CancellationToken,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let mut config = Config::for_tests(&provider.base_url());
    adjust(&mut config);
    config.validate().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let state = Arc::new(AppState::build(config).unwrap());
    let stop = CancellationToken::new();
    let server = tokio::spawn(corral::serve(
        listener,
        state.clone(),
        stop.clone().cancelled_owned(),
    ));
    (url, state, stop, server)
}

/// Redis at `url` for a test: a 2 s bound on each operation (far above a healthy round trip on a
/// loaded machine, still finite).
pub fn redis_at(url: &str) -> RedisConfig {
    RedisConfig {
        url: Some(url.to_owned()),
        op_timeout: Duration::from_secs(2),
        ..RedisConfig::default()
    }
}

/// Two instances sharing `redis`, in front of a provider that sends a stream's events 50 ms
/// apart, so that a caller on the second instance joins a stream under way.
pub async fn slow_stream_fleet(redis: RedisConfig) -> Fleet {
    let provider = MockProvider::start(MockSettings {
        stream_chunk_delay: Duration::from_millis(50),
        ..MockSettings::default()
    })
    .await
    .unwrap();
    Fleet::start_with(provider, 2, move |config| {
        config.redis = Some(redis.clone())
    })
    .await
}

/// How many whole SSE events `bytes` hold.
pub fn events_in(bytes: &[u8]) -> usize {
    bytes.windows(2).filter(|w| w == b"\n\n").count()
}

/// Reads `response` into `bytes` until they hold at least `n` whole events.
pub async fn read_events(response: &mut reqwest::Response, bytes: &mut Vec<u8>, n: usize) {
    while events_in(bytes) < n {
        let chunk = tokio::time::timeout(WAIT, response.chunk())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        bytes.extend_from_slice(&chunk);
    }
}

/// Reads the rest of `response` into `bytes`.
pub async fn read_to_end(response: &mut reqwest::Response, bytes: &mut Vec<u8>) {
    while let Some(chunk) = tokio::time::timeout(WAIT, response.chunk())
        .await
        .unwrap()
        .unwrap()
    {
        bytes.extend_from_slice(&chunk);
    }
}

/// A stream owned on the fleet's first instance and joined live on its second: the owner
/// reads `before` events, the follower's request is sent, the owner reads to the end.
/// Returns the owner's bytes and the follower's reply.
pub async fn stream_on_two_instances(
    fleet: &Fleet,
    path: &str,
    body: &Value,
    before: usize,
) -> (Vec<u8>, Reply) {
    let mut owner = fleet.instances[0].open(path, body).await;
    let mut owner_bytes = Vec::new();
    read_events(&mut owner, &mut owner_bytes, before).await;
    // Joins on the other instance while the owner's stream is still running.
    let follower = fleet.instances[1].post(path, body).await;
    read_to_end(&mut owner, &mut owner_bytes).await;
    (owner_bytes, follower)
}

/// [`stream_on_two_instances`], checked: the follower joined the owner's flight (COALESCED, one
/// upstream call) and got the owner's bytes exactly. A replay of the finished answer would be
/// framed (and, for Responses, numbered) anew: equal bytes mean the owner's own events came
/// through Redis. Returns the follower's reply.
pub async fn relayed_live(fleet: &Fleet, path: &str, body: &Value, before: usize) -> Reply {
    let (owner_bytes, follower) = stream_on_two_instances(fleet, path, body, before).await;
    assert_eq!(follower.cache(), "COALESCED");
    assert_eq!(follower.body, Bytes::from(owner_bytes));
    assert_eq!(fleet.provider.calls(), 1);
    follower
}

/// A 200 answered as server-sent events.
pub fn assert_event_stream(reply: &Reply) {
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    assert!(
        reply
            .header("content-type")
            .unwrap()
            .starts_with("text/event-stream")
    );
}

/// `(name, data)` of each event of a named-event SSE body (Responses, Anthropic Messages),
/// checking the framing: whole `event: <name>\ndata: <json>` frames, a name equal to its
/// data's `type`.
pub fn named_events(body: &[u8]) -> Vec<(String, Value)> {
    let text = std::str::from_utf8(body).expect("SSE is UTF-8");
    assert!(text.ends_with("\n\n"), "{text}");
    text.split_terminator("\n\n")
        .map(|frame| {
            let (name, data) = frame
                .strip_prefix("event: ")
                .and_then(|rest| rest.split_once("\ndata: "))
                .unwrap_or_else(|| panic!("not a named event: {frame:?}"));
            let data: Value = serde_json::from_str(data).expect("event data is JSON");
            assert_eq!(data["type"], name, "{frame}");
            (name.to_owned(), data)
        })
        .collect()
}

/// Counts replies by `x-corral-cache`.
pub fn count_status(replies: &[Reply], status: &str) -> usize {
    replies.iter().filter(|r| r.cache() == status).count()
}

/// A POST whose head announces `length` bytes of body, sent without the body
/// on a connection of its own: the answer's status and body. For refusals a
/// gateway gives on the head alone (a client still writing a body it refused
/// would see its connection closed before it read the answer).
pub async fn head_only(
    url: &str,
    path: &str,
    headers: &[(&str, &str)],
    length: usize,
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = url.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nHost: corral\r\nContent-Type: application/json\r\n\
         Content-Length: {length}\r\nConnection: close\r\n"
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(WAIT, stream.read_to_end(&mut answer))
        .await
        .expect("answered without the body")
        .expect("the answer is read");
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    (status, body)
}

/// Sends each event logged on this thread whose fields mention one of
/// `needles`, as text, to a channel.
struct LogEvents {
    needles: Vec<&'static str>,
    sender: tokio::sync::mpsc::UnboundedSender<String>,
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for LogEvents {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Fields(String);
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0.push_str(&format!("{}={value:?} ", field.name()));
            }
        }
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        if self.needles.iter().any(|needle| fields.0.contains(needle)) {
            let _ = self.sender.send(fields.0);
        }
    }
}

/// The events logged on this thread that mention one of `needles`, for as
/// long as the guard lives. For a `current_thread` test: the gateway then
/// runs on the test's thread, and logs there.
pub fn capture_logs(
    needles: &[&'static str],
) -> (
    tracing::subscriber::DefaultGuard,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    use tracing_subscriber::layer::SubscriberExt as _;
    let (sender, events) = tokio::sync::mpsc::unbounded_channel();
    let layer = LogEvents {
        needles: needles.to_vec(),
        sender,
    };
    let guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
    (guard, events)
}
