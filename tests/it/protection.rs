//! Protection over real HTTP: per-tenant rate limits, the upstream circuit
//! breaker with stale-if-error and the retry budget, upstream caps that
//! coalesced callers do not spend, gateway keys and keyed tenant scopes,
//! input limits, header hygiene, and encryption of cache values in Redis.

use std::time::{Duration, Instant};

use corral::{
    breaker::BreakerState,
    config::{RateConfig, Secret, TenantLimitsConfig},
    tenant::key_hash,
};
use mock_upstream::{FailureMode, MockProvider, Scripted};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{
    harness::{Reply, TestGateway, WAIT, chat, collect, embedding},
    redis_server::RedisServer,
    shutdown::CorralProcess,
};

const PATH: &str = "/v1/chat/completions";

fn bearer(key: &str) -> (&'static str, String) {
    ("authorization", format!("Bearer {key}"))
}

fn retry_after(reply: &Reply) -> u64 {
    reply
        .header("retry-after")
        .expect("Retry-After is set")
        .parse()
        .expect("Retry-After is whole seconds")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_at_5_rps_with_burst_5_gets_5_of_50_and_another_tenant_is_unaffected() {
    let gateway = TestGateway::start(|config| {
        config.limits.per_tenant = Some(TenantLimitsConfig {
            rps: Some(5),
            burst: Some(5),
            ..TenantLimitsConfig::default()
        })
    })
    .await;
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let handle = gateway.clone_handle();
            tokio::spawn(async move {
                let auth = bearer("sk-tenant-a");
                handle
                    .post_with(PATH, &chat(&format!("burst {i}")), &[(auth.0, &auth.1)])
                    .await
            })
        })
        .collect();
    let replies = collect(tasks).await;
    let passed = replies
        .iter()
        .filter(|r| r.status == StatusCode::OK)
        .count();
    let limited: Vec<&Reply> = replies
        .iter()
        .filter(|r| r.status == StatusCode::TOO_MANY_REQUESTS)
        .collect();
    assert_eq!((passed, limited.len()), (5, 45));
    for reply in &limited {
        assert!(retry_after(reply) >= 1);
        let error = &reply.json()["error"];
        assert_eq!(error["code"], "rate_limit_exceeded");
        assert_eq!(error["type"], "requests");
    }
    assert_eq!(
        gateway.provider.calls(),
        5,
        "limited requests never went upstream"
    );

    let b = bearer("sk-tenant-b");
    for i in 0..5 {
        let reply = gateway
            .post_with(PATH, &chat(&format!("b {i}")), &[(b.0, &b.1)])
            .await;
        assert_eq!(reply.status, StatusCode::OK, "tenant b has its own budget");
    }

    // Tenant a waits out its Retry-After: the clock moves, nobody sleeps.
    let a = bearer("sk-tenant-a");
    let again = gateway
        .post_with(PATH, &chat("again"), &[(a.0, &a.1)])
        .await;
    assert_eq!(again.status, StatusCode::TOO_MANY_REQUESTS);
    gateway
        .clock
        .advance(Duration::from_secs(retry_after(&again)));
    let later = gateway
        .post_with(PATH, &chat("later"), &[(a.0, &a.1)])
        .await;
    assert_eq!(later.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_circuit_serves_stale_entries_fails_misses_fast_and_a_probe_closes_it() {
    let cool_down = Duration::from_secs(30);
    let gateway = TestGateway::start(|config| {
        config.cache.soft_ttl = Duration::from_secs(1);
        config.cache.hard_ttl = Duration::from_secs(3600);
        config.cache.early_refresh_beta = 0.0;
        config.upstreams[0].breaker_failures = 8;
        config.upstreams[0].breaker_cool_down = cool_down;
        config.retry.max_attempts = 3;
        config.retry.budget_ratio = 0.5;
        config.retry.budget_min_per_sec = 0.0;
    })
    .await;
    let cached = chat("cached before the outage");
    let warm = gateway.post(PATH, &cached).await;
    assert_eq!(warm.cache(), "MISS");

    gateway.provider.set_failure(Some(FailureMode::always(500)));
    gateway.clock.advance(Duration::from_secs(2));
    // Distinct misses until the circuit opens; each makes one first attempt.
    let mut first_attempts = 0u64;
    while gateway.state.upstream().circuit(0) != BreakerState::Open {
        assert!(first_attempts < 50, "the circuit never opened");
        let reply = gateway
            .post(PATH, &chat(&format!("outage miss {first_attempts}")))
            .await;
        assert!(reply.status.is_server_error(), "{:?}", reply.status);
        first_attempts += 1;
    }
    // The warm-up's first attempt is in the budget's window too.
    let firsts = first_attempts + 1;
    let attempts = gateway.provider.calls();
    println!(
        "outage: {first_attempts} requests, {} upstream attempts (max_attempts 3, budget 0.5)",
        attempts - 1
    );
    assert!(
        attempts as f64 <= firsts as f64 * 1.5,
        "retries stay within half the first attempts: {attempts} attempts, {firsts} first"
    );

    // Stale-if-error: the stored entry keeps being served; its refresh fails fast.
    let before = gateway.provider.calls();
    for _ in 0..5 {
        let stale = gateway.post(PATH, &cached).await;
        assert_eq!(stale.status, StatusCode::OK);
        assert_eq!(stale.cache(), "STALE");
        assert_eq!(stale.body, warm.body);
    }
    gateway.wait_idle().await;
    assert_eq!(
        gateway.provider.calls(),
        before,
        "refreshes stop at the open circuit"
    );

    // A miss gets 503 at once, far inside the retry deadline.
    let started = Instant::now();
    let miss = gateway.post(PATH, &chat("a miss during the outage")).await;
    let elapsed = started.elapsed();
    assert_eq!(miss.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(miss.json()["error"]["code"], "upstream_circuit_open");
    let wait = retry_after(&miss);
    assert!((1..=30).contains(&wait), "{wait}");
    assert!(
        elapsed < Duration::from_secs(5),
        "fast fail took {elapsed:?}"
    );
    println!("open-circuit miss answered in {elapsed:?}");
    assert_eq!(gateway.provider.calls(), before);

    // The provider recovers; after the cool-down one probe closes the circuit.
    gateway.provider.set_failure(None);
    gateway.clock.advance(cool_down);
    let probe = gateway.post(PATH, &chat("the probe")).await;
    assert_eq!((probe.status, probe.cache()), (StatusCode::OK, "MISS"));
    assert_eq!(gateway.state.upstream().circuit(0), BreakerState::Closed);
    assert_eq!(gateway.provider.calls(), before + 1);
    let stale = gateway.post(PATH, &cached).await;
    assert_eq!(stale.cache(), "STALE");
    gateway.wait_idle().await;
    let fresh = gateway.post(PATH, &cached).await;
    assert_eq!(fresh.cache(), "HIT", "the refresh went through");
    assert_ne!(fresh.body, warm.body, "and stored a new answer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_followers_and_cache_hits_do_not_spend_the_upstream_rate() {
    let gateway = TestGateway::start(|config| {
        config.upstreams[0].rate = Some(RateConfig { rps: 1, burst: 1 })
    })
    .await;
    let replies = gateway
        .herd(PATH, &chat("one call for all"), 100, &[])
        .await;
    assert!(replies.iter().all(|r| r.status == StatusCode::OK));
    assert_eq!(gateway.provider.calls(), 1);
    assert_eq!(
        gateway.post(PATH, &chat("one call for all")).await.cache(),
        "HIT"
    );

    let second = gateway.post(PATH, &chat("a second prompt")).await;
    assert_eq!(second.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(second.json()["error"]["code"], "rate_limit_exceeded");
    assert_eq!(gateway.provider.calls(), 1, "the cap held it back");
    gateway
        .clock
        .advance(Duration::from_secs(retry_after(&second)));
    let later = gateway.post(PATH, &chat("a second prompt")).await;
    assert_eq!((later.status, later.cache()), (StatusCode::OK, "MISS"));
    assert_eq!(gateway.provider.calls(), 2);
}

#[tokio::test]
async fn gateway_keys_gate_every_v1_path_and_the_provider_key_is_used_upstream() {
    let gateway = TestGateway::start(|config| {
        config.auth.key_hashes = vec![key_hash(b"gw-key-1")];
        config.upstreams[0].api_key = Some(Secret::new("sk-provider-1".to_owned()));
    })
    .await;
    let body = chat("authenticated");
    for headers in [
        vec![],
        vec![("authorization", "Bearer gw-wrong")],
        vec![("authorization", "Bearer ")],
        vec![("authorization", "Bearer sk-provider-1")],
    ] {
        let reply = gateway.post_with(PATH, &body, &headers).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{headers:?}");
        assert_eq!(reply.json()["error"]["code"], "invalid_api_key");
        assert_eq!(reply.header("www-authenticate"), Some("Bearer"));
        assert!(!String::from_utf8_lossy(&reply.body).contains("gw-wrong"));
        assert!(
            reply.header("x-request-id").is_some(),
            "refusals are tracked too"
        );
    }
    assert_eq!(
        gateway.get("/v1/models").await.status,
        StatusCode::UNAUTHORIZED,
        "proxied paths are gated too"
    );
    assert_eq!(gateway.get("/healthz").await.status, StatusCode::OK);
    assert_eq!(gateway.provider.calls(), 0);

    let good = gateway
        .post_with(PATH, &body, &[("authorization", "Bearer gw-key-1")])
        .await;
    assert_eq!(good.status, StatusCode::OK);
    let sent = gateway.provider.requests();
    assert_eq!(
        sent[0].header("authorization"),
        Some("Bearer sk-provider-1"),
        "the provider gets its own key, never the gateway key"
    );
    assert!(!format!("{:?}", good.headers).contains("sk-provider-1"));
    assert!(!String::from_utf8_lossy(&good.body).contains("sk-provider-1"));
}

fn sha256_hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn neither_redis_nor_the_logs_hold_an_api_key_or_its_plain_hash() {
    let redis = RedisServer::spawn().await;
    let provider = MockProvider::start(Default::default()).await.unwrap();
    let gateway_key = "gw-live-4f1c9a7e2b";
    let provider_key = "sk-provider-88e1d0c4";
    let yaml = format!(
        "listen: 127.0.0.1:0\nupstreams:\n  - {{name: mock, base_url: '{}', api_key_env: PROVIDER_KEY}}\nauth:\n  keys_env: GATEWAY_KEYS\n  tenant_secret_env: TENANT_SECRET\nredis:\n  url: '{}'\n  op_timeout: 2s\nshutdown:\n  unready_delay: 0s\n",
        provider.base_url(),
        redis.url()
    );
    let mut corral = CorralProcess::start(
        &yaml,
        &[
            ("GATEWAY_KEYS", &format!("{gateway_key},gw-other")),
            ("TENANT_SECRET", "tenant-secret-0123456789abcdef"),
            ("PROVIDER_KEY", provider_key),
        ],
    )
    .await;
    corral.wait_redis_connected().await;
    let client = reqwest::Client::builder().timeout(WAIT).build().unwrap();
    let send = |body: Value, path: &'static str, key: Option<&str>| {
        let mut request = client.post(format!("{}{path}", corral.url)).json(&body);
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        async move {
            let response = request.send().await.unwrap();
            let status = response.status();
            let text = format!(
                "{:?} {}",
                response.headers().clone(),
                response.text().await.unwrap()
            );
            (status, text)
        }
    };
    let mut seen = Vec::new();
    seen.push(send(chat("keys stay home"), PATH, None).await);
    seen.push(send(chat("keys stay home"), PATH, Some("gw-unknown")).await);
    seen.push(send(chat("keys stay home"), PATH, Some(gateway_key)).await);
    seen.push(send(chat("keys stay home"), PATH, Some(gateway_key)).await);
    seen.push(
        send(
            embedding("keys stay home"),
            "/v1/embeddings",
            Some(gateway_key),
        )
        .await,
    );
    let statuses: Vec<u16> = seen.iter().map(|(s, _)| s.as_u16()).collect();
    assert_eq!(statuses, [401, 401, 200, 200, 200]);
    assert!(seen[3].1.contains("HIT"));
    assert_eq!(provider.calls(), 2);

    let plain_scope = {
        let digest = Sha256::new()
            .chain_update(b"corral-tenant-v1\0")
            .chain_update(gateway_key.as_bytes())
            .finalize();
        format!("t{}", &hex::encode(digest)[..32])
    };
    let needles = [
        gateway_key.to_owned(),
        sha256_hex(gateway_key),
        provider_key.to_owned(),
        sha256_hex(provider_key),
        plain_scope,
    ];
    let dump = redis.dump().await;
    assert!(
        dump.iter().any(|(key, _)| key.contains(":resp:")),
        "entries were stored: {dump:?}"
    );
    // The log is written by a background thread: wait for the flight's line,
    // then stop the process, which flushes whatever is still queued, so every
    // line it wrote is searched below.
    corral.wait_for_log("upstream call").await;
    corral.signal("TERM");
    assert_eq!(corral.exit_code().await, Some(0), "{}", corral.logs());
    let logs = corral.logs();
    for needle in &needles {
        for (key, value) in &dump {
            assert!(!key.contains(needle.as_str()), "{needle} in key {key}");
            assert!(
                !value.windows(needle.len()).any(|w| w == needle.as_bytes()),
                "{needle} in the value of {key}"
            );
        }
        assert!(!logs.contains(needle.as_str()), "{needle} in the logs");
        for (_, response) in &seen {
            assert!(
                !response.contains(needle.as_str()),
                "{needle} in a response"
            );
        }
    }
    assert!(
        provider
            .requests()
            .iter()
            .all(|r| r.header("authorization") == Some(&format!("Bearer {provider_key}"))),
        "the provider only ever saw its own key"
    );
}

/// A complete chat answer that repeats the prompt, as models often do.
fn echoing_answer(text: &str) -> Scripted {
    Scripted::json(
        200,
        json!({
            "id": "chatcmpl-echo", "object": "chat.completion", "created": 1, "model": "gpt-4o-mini",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": format!("You said: {text}")}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
        })
        .to_string(),
    )
}

fn holds(dump: &[(String, Vec<u8>)], needle: &str) -> bool {
    dump.iter().any(|(key, value)| {
        key.contains(needle) || value.windows(needle.len()).any(|w| w == needle.as_bytes())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_encryption_no_prompt_text_reaches_redis_and_every_key_expires() {
    let redis = RedisServer::spawn().await;
    let canary = "CANARY-d41d8cd98f00";

    // Control: in the clear, the canary does reach Redis (the answer repeats it).
    let clear =
        TestGateway::start(|config| config.redis = Some(crate::harness::redis_at(&redis.url())))
            .await;
    clear.wait_connected().await;
    clear.provider.push_script(echoing_answer(canary));
    assert_eq!(clear.post(PATH, &chat(canary)).await.cache(), "MISS");
    assert!(holds(&redis.dump().await, canary), "the probe can see it");
    drop(clear);
    let mut conn = redis.client().await;
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();

    let encrypted = |key: [u8; 32]| {
        let url = redis.url();
        move |config: &mut corral::Config| {
            let mut redis = crate::harness::redis_at(&url);
            redis.encryption_key = Some(Secret::new(key));
            config.redis = Some(redis);
        }
    };
    let a = TestGateway::start(encrypted([0x5a; 32])).await;
    a.wait_connected().await;
    a.provider.push_script(echoing_answer(canary));
    let first = a.post(PATH, &chat(canary)).await;
    assert_eq!(first.cache(), "MISS");
    assert!(String::from_utf8_lossy(&first.body).contains(canary));
    let dump = redis.dump().await;
    assert!(dump.len() >= 2, "entry and flight record: {dump:?}");
    assert!(!holds(&dump, canary), "no key or value holds prompt text");
    for (key, _) in &dump {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(ttl > 0, "{key} has no TTL ({ttl})");
    }

    // Another instance with the same key decrypts the shared entry.
    let b = TestGateway::start_with(a.provider.clone(), encrypted([0x5a; 32])).await;
    b.wait_connected().await;
    let shared = b.post(PATH, &chat(canary)).await;
    assert_eq!(shared.cache(), "HIT");
    assert_eq!(shared.body, first.body);

    // A rotated key turns the old entry into a clean, counted miss.
    let c = TestGateway::start_with(a.provider.clone(), encrypted([0x77; 32])).await;
    c.wait_connected().await;
    let rotated = c.post(PATH, &chat(canary)).await;
    assert_eq!((rotated.status, rotated.cache()), (StatusCode::OK, "MISS"));
    assert!(c.state.cluster().unwrap().rejected_values() >= 1);
    assert_eq!(a.provider.calls(), 2);
}

#[tokio::test]
async fn hostile_bodies_get_clear_400s_and_nothing_goes_upstream() {
    let gateway = TestGateway::start(|config| {
        config.limits.max_json_depth = 16;
        config.limits.max_messages = 4;
        config.limits.max_body_bytes = 64 * 1024;
    })
    .await;
    let deep = format!(
        r#"{{"model":"gpt-4o-mini","messages":[{{"role":"user","content":"x","extra":{}{}}}]}}"#,
        "[".repeat(40),
        "]".repeat(40)
    );
    let many: Vec<Value> = (0..5)
        .map(|i| json!({"role": "user", "content": format!("m{i}")}))
        .collect();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("depth", deep.into_bytes(), "deeper than 16"),
        (
            "duplicate key",
            br#"{"model":"gpt-4o-mini","temperature":0,"temperature":1,"messages":[]}"#.to_vec(),
            "twice",
        ),
        (
            "huge number",
            br#"{"model":"gpt-4o-mini","temperature":1e999999,"messages":[]}"#.to_vec(),
            "",
        ),
        (
            "invalid utf-8",
            b"{\"model\":\"gpt-4o-mini\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}"
                .to_vec(),
            "",
        ),
        (
            "a type corral decides by",
            br#"{"model":"gpt-4o-mini","stream":"yes","messages":[]}"#.to_vec(),
            "`stream` must be a boolean",
        ),
        (
            "too many messages",
            json!({"model": "gpt-4o-mini", "messages": many})
                .to_string()
                .into_bytes(),
            "the limit is 4",
        ),
    ];
    for (name, body, expected) in cases {
        let reply = gateway.post_raw(PATH, body, &[]).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{name}");
        let error = &reply.json()["error"];
        assert_eq!(error["type"], "invalid_request_error", "{name}");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(expected), "{name}: {message}");
    }

    // A chunked body (no Content-Length) over the limit: 413 all the same.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..10).map(|_| Ok(vec![b' '; 8 * 1024])).collect();
    let chunked = reqwest::Body::wrap_stream(futures::stream::iter(chunks));
    let too_large = gateway.post_raw(PATH, chunked, &[]).await;
    assert_eq!(too_large.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(too_large.json()["error"]["code"], "request_too_large");

    assert_eq!(gateway.provider.calls(), 0, "nothing went upstream");
    assert_eq!(
        gateway.post(PATH, &chat("still fine")).await.cache(),
        "MISS"
    );
}

/// Sends raw bytes on a fresh connection and reads until the server closes it.
async fn raw_exchange(url: &str, request: &[u8]) -> Vec<u8> {
    let address = url.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut response = Vec::new();
    let _ = tokio::time::timeout(WAIT, stream.read_to_end(&mut response))
        .await
        .expect("the server answers and closes");
    response
}

#[tokio::test]
async fn header_values_with_control_bytes_are_refused_and_never_echoed() {
    let gateway = TestGateway::start(|_| {}).await;
    let body = chat("headers").to_string();
    for (name, header) in [
        ("NUL", &b"OpenAI-Organization: org\x00evil-nul"[..]),
        ("bare CR", &b"X-Note: a\revil-cr"[..]),
        (
            "obs-text in a keyed header",
            &b"OpenAI-Organization: org-\xffevil-obs"[..],
        ),
    ] {
        let mut request = format!(
            "POST {PATH} HTTP/1.1\r\nHost: corral\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n",
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(header);
        request.extend_from_slice(b"\r\n\r\n");
        request.extend_from_slice(body.as_bytes());
        let response = raw_exchange(&gateway.url, &request).await;
        let text = String::from_utf8_lossy(&response);
        assert!(text.starts_with("HTTP/1.1 400"), "{name}: {text}");
        assert!(
            !text.contains("evil"),
            "{name}: the value is not echoed: {text}"
        );
    }
    assert_eq!(gateway.provider.calls(), 0);
}

#[tokio::test]
async fn hop_by_hop_and_gateway_internal_headers_do_not_cross() {
    let gateway = TestGateway::start(|_| {}).await;
    let reply = gateway
        .post_with(
            PATH,
            &chat("hop by hop"),
            &[
                ("connection", "keep-alive, x-private"),
                ("x-private", "1"),
                ("te", "trailers"),
                ("proxy-authorization", "Basic Zm9vOmJhcg=="),
                ("x-corral-cache", "HIT"),
                ("x-forwarded-for", "203.0.113.9"),
                ("cookie", "session=1"),
                ("upgrade", "websocket"),
            ],
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    let sent = &gateway.provider.requests()[0];
    for name in [
        "x-private",
        "te",
        "proxy-authorization",
        "x-corral-cache",
        "x-forwarded-for",
        "cookie",
        "upgrade",
    ] {
        assert!(sent.header(name).is_none(), "{name} was forwarded");
    }
    assert!(
        sent.header("connection")
            .is_none_or(|v| !v.contains("x-private")),
        "the caller's Connection header is not relayed"
    );
    for name in reply.headers.keys() {
        assert!(
            ![
                "set-cookie",
                "x-ratelimit-remaining-requests",
                "openai-organization"
            ]
            .contains(&name.as_str()),
            "{name} crossed back"
        );
    }
}
