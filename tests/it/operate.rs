//! Operating corral: purges (by fingerprint, model, tenant, everything;
//! across instances through a spawned Redis; during a flight), admin access to
//! the reports and the admin API, and a readiness endpoint that tells the
//! truth (draining, circuits, Redis).

use std::time::{Duration, Instant};

use corral::{
    Config,
    config::Secret,
    tenant::{TenantScope, key_hash},
};
use mock_upstream::{FailureMode, MockProvider};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{
    cluster::redis_config,
    harness::{Fleet, Reply, TestGateway, WAIT, chat, start_switchable},
    redis_server::RedisServer,
};

const PATH: &str = "/v1/chat/completions";
const ADMIN_KEY: &str = "adm-0123456789";
const GATEWAY_KEY: &str = "gw-0123456789";

fn with_admin_key(config: &mut Config) {
    config.auth.admin_key_hashes = vec![key_hash(ADMIN_KEY.as_bytes())];
}

fn chat_for(model: &str, content: &str) -> Value {
    json!({
        "model": model,
        "temperature": 0,
        "messages": [{"role": "user", "content": content}],
    })
}

/// The mock numbers its calls in `id`: two answers with one id are one call.
fn id(reply: &Reply) -> String {
    reply.json()["id"].as_str().unwrap_or_default().to_owned()
}

async fn send(
    gateway: &TestGateway,
    method: reqwest::Method,
    path: &str,
    authorization: Option<&str>,
    body: Option<&Value>,
) -> Reply {
    let mut request = gateway
        .client
        .request(method, format!("{}{path}", gateway.url));
    if let Some(value) = authorization {
        request = request.header("authorization", value);
    }
    if let Some(body) = body {
        request = request.json(body);
    }
    let response = request.send().await.expect("request reaches corral");
    Reply {
        status: response.status(),
        headers: response.headers().clone(),
        body: response.bytes().await.expect("body arrives"),
    }
}

async fn purge(gateway: &TestGateway, body: Value) -> Reply {
    let bearer = format!("Bearer {ADMIN_KEY}");
    let reply = send(
        gateway,
        reqwest::Method::POST,
        "/admin/purge",
        Some(&bearer),
        Some(&body),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    reply
}

/// Sends `body` (with `headers`) to `gateway` until it is a MISS; bounded by
/// `bound`. Every answer before that must be the old one, `old_id`. Returns
/// the MISS and how long it took to arrive.
async fn until_miss(
    gateway: &TestGateway,
    body: &Value,
    headers: &[(&str, &str)],
    old_id: &str,
    bound: Duration,
) -> (Reply, Duration) {
    let started = Instant::now();
    loop {
        let reply = gateway.post_with(PATH, body, headers).await;
        if reply.cache() == "MISS" {
            return (reply, started.elapsed());
        }
        assert_eq!(reply.cache(), "HIT", "{:?}", reply.body);
        assert_eq!(
            id(&reply),
            old_id,
            "only the old entry until the purge arrives"
        );
        assert!(
            started.elapsed() < bound,
            "still a HIT {:?} after the purge",
            started.elapsed()
        );
        // Each round trip is a full request; this only keeps the loop from spinning.
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_by_fingerprint_on_one_instance_is_a_miss_on_another_within_a_second() {
    let redis = RedisServer::spawn().await;
    let fleet = Fleet::start(2, |config| {
        config.redis = Some(redis_config(&redis.url()));
        with_admin_key(config);
    })
    .await;
    let (a, b) = (&fleet.instances[0], &fleet.instances[1]);
    let body = chat("purge me by fingerprint");
    let other = chat("leave me cached");
    let first = a.post(PATH, &body).await;
    assert_eq!(first.cache(), "MISS");
    assert_eq!(a.post(PATH, &other).await.cache(), "MISS");
    // B reads both through Redis and keeps them in its L1.
    assert_eq!(b.post(PATH, &body).await.cache(), "HIT");
    assert_eq!(b.post(PATH, &other).await.cache(), "HIT");
    let fingerprint = first.header("x-corral-fingerprint").unwrap().to_owned();

    let purged = purge(a, json!({"fingerprint": fingerprint})).await;
    assert_eq!(
        purged.json(),
        json!({"purged": {"fingerprint": fingerprint}, "reach": "cluster"})
    );
    let (miss, elapsed) = until_miss(b, &body, &[], &id(&first), WAIT).await;
    println!("instance B served a MISS {elapsed:?} after the purge on A");
    assert!(
        elapsed < Duration::from_secs(1),
        "the purge took {elapsed:?} to reach the other instance"
    );
    assert_ne!(id(&miss), id(&first), "a new upstream call");
    assert_eq!(
        miss.header("x-corral-fingerprint"),
        Some(fingerprint.as_str()),
        "the request keeps its fingerprint; only the key moved"
    );
    // The new answer is shared again, on both instances; the other entry was never touched.
    let again = a.post(PATH, &body).await;
    assert_eq!((again.cache(), id(&again)), ("HIT", id(&miss)));
    assert_eq!(b.post(PATH, &other).await.cache(), "HIT");
    assert_eq!(a.post(PATH, &other).await.cache(), "HIT");
    assert_eq!(fleet.provider.calls(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purges_by_model_and_by_tenant_leave_other_entries_alone_on_every_instance() {
    let redis = RedisServer::spawn().await;
    let fleet = Fleet::start(2, |config| {
        config.redis = Some(redis_config(&redis.url()));
        with_admin_key(config);
        config.auth.labels_by_hash = vec![(key_hash(b"sk-team-a"), "team-a".to_owned())];
    })
    .await;
    let (a, b) = (&fleet.instances[0], &fleet.instances[1]);
    let team_a = [("authorization", "Bearer sk-team-a")];
    let team_b = [("authorization", "Bearer sk-team-b")];
    // (model, tenant) -> its first answer's id.
    let cases = [
        ("gpt-4o-mini", &team_a),
        ("gpt-4o", &team_a),
        ("gpt-4o-mini", &team_b),
        ("gpt-4o", &team_b),
    ];
    let mut ids = Vec::new();
    for (model, tenant) in cases {
        let body = chat_for(model, "one prompt, four entries");
        let reply = a.post_with(PATH, &body, tenant).await;
        assert_eq!(reply.cache(), "MISS");
        assert_eq!(b.post_with(PATH, &body, tenant).await.cache(), "HIT");
        ids.push(id(&reply));
    }

    // By model: both tenants' gpt-4o-mini entries, on the other instance too.
    purge(a, json!({"model": "gpt-4o-mini"})).await;
    for (i, (model, tenant)) in cases.iter().enumerate() {
        let body = chat_for(model, "one prompt, four entries");
        if *model == "gpt-4o-mini" {
            let (miss, _) = until_miss(b, &body, *tenant, &ids[i], WAIT).await;
            ids[i] = id(&miss);
        } else {
            let hit = b.post_with(PATH, &body, *tenant).await;
            assert_eq!((hit.cache(), id(&hit)), ("HIT", ids[i].clone()), "{model}");
        }
    }
    assert_eq!(fleet.provider.calls(), 6);

    // By tenant, as /stats names it: a key's label ...
    purge(a, json!({"tenant": "team-a"})).await;
    for (i, (model, tenant)) in cases.iter().enumerate() {
        let body = chat_for(model, "one prompt, four entries");
        if std::ptr::eq(*tenant, &team_a) {
            let (miss, _) = until_miss(b, &body, *tenant, &ids[i], WAIT).await;
            ids[i] = id(&miss);
        } else {
            let hit = b.post_with(PATH, &body, *tenant).await;
            assert_eq!((hit.cache(), id(&hit)), ("HIT", ids[i].clone()), "{model}");
        }
    }
    // ... or an unlabelled tenant's short scope.
    let scope = TenantScope::of_credential(None, Some(b"sk-team-b".as_slice()));
    let short = &scope.as_str()[..13];
    let stats = a
        .client
        .get(format!("{}/stats", a.url))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(stats.contains(short), "/stats names the tenant {short}");
    purge(a, json!({"tenant": short})).await;
    for (i, (model, tenant)) in cases.iter().enumerate() {
        let body = chat_for(model, "one prompt, four entries");
        if std::ptr::eq(*tenant, &team_b) {
            until_miss(b, &body, *tenant, &ids[i], WAIT).await;
        } else {
            let hit = b.post_with(PATH, &body, *tenant).await;
            assert_eq!((hit.cache(), id(&hit)), ("HIT", ids[i].clone()), "{model}");
        }
    }
    assert_eq!(fleet.provider.calls(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_of_everything_misses_every_entry_and_every_kept_retry_answer() {
    let gateway = TestGateway::start(with_admin_key).await;
    let cached = [chat("first"), chat("second")];
    let mut ids = Vec::new();
    for body in &cached {
        ids.push(id(&gateway.post(PATH, body).await));
        assert_eq!(gateway.post(PATH, body).await.cache(), "HIT");
    }
    // A sampled answer is not cached but kept for the client's retries.
    let sampled = json!({
        "model": "gpt-4o-mini",
        "temperature": 1,
        "messages": [{"role": "user", "content": "sampled"}],
    });
    let retry = [("x-stainless-retry-count", "1")];
    let kept = gateway.post(PATH, &sampled).await;
    let retried = gateway.post_with(PATH, &sampled, &retry).await;
    assert_eq!(
        (retried.cache(), id(&retried)),
        ("HIT", id(&kept)),
        "the retry window serves the retry"
    );

    let purged = purge(&gateway, json!({"all": true})).await;
    assert_eq!(
        purged.json()["reach"],
        "instance",
        "no Redis: this instance"
    );
    for (body, old) in cached.iter().zip(&ids) {
        let reply = gateway.post(PATH, body).await;
        assert_eq!(reply.cache(), "MISS");
        assert_ne!(&id(&reply), old);
    }
    let retried = gateway.post_with(PATH, &sampled, &retry).await;
    assert_eq!(
        retried.cache(),
        "MISS",
        "a purged answer never returns as a retry"
    );
    assert_ne!(id(&retried), id(&kept));
    assert_eq!(gateway.provider.calls(), 6);
}

/// A flight that started before a purge stores its answer under the old key:
/// requests after the purge neither join it nor read what it stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_during_a_held_flight_does_not_resurrect_its_answer() {
    let redis = RedisServer::spawn().await;
    for scope in ["fingerprint", "model"] {
        let fleet = Fleet::start(1, |config| {
            config.redis = Some(redis_config(&redis.url()));
            with_admin_key(config);
        })
        .await;
        let gateway = &fleet.instances[0];
        let body = chat(&format!("in flight while purged by {scope}"));
        // The fingerprint the answer will carry is the same as this request's.
        let probe = gateway
            .post_with(PATH, &body, &[("cache-control", "no-store")])
            .await;
        let fingerprint = probe.header("x-corral-fingerprint").unwrap().to_owned();
        let purge_body = match scope {
            "fingerprint" => json!({"fingerprint": fingerprint}),
            _ => json!({"model": "gpt-4o-mini"}),
        };
        let calls = fleet.provider.calls();

        fleet.provider.hold();
        let before = {
            let handle = gateway.clone_handle();
            let body = body.clone();
            tokio::spawn(async move { handle.post_with(PATH, &body, &[]).await })
        };
        gateway.wait_for_calls(calls + 1).await;
        purge(gateway, purge_body).await;
        // Not coalesced with the flight that started before the purge: its own call.
        let after = {
            let handle = gateway.clone_handle();
            let body = body.clone();
            tokio::spawn(async move { handle.post_with(PATH, &body, &[]).await })
        };
        gateway.wait_for_calls(calls + 2).await;
        fleet.provider.release();
        let before = before.await.unwrap();
        let after = after.await.unwrap();
        assert_eq!((before.cache(), after.cache()), ("MISS", "MISS"), "{scope}");
        assert_ne!(id(&before), id(&after), "{scope}");
        gateway.wait_idle().await;
        let later = gateway.post(PATH, &body).await;
        assert_eq!(later.cache(), "HIT", "{scope}");
        assert_eq!(
            id(&later),
            id(&after),
            "{scope}: the answer of the flight from before the purge is never served"
        );
        assert_eq!(fleet.provider.calls(), calls + 2);
    }
}

/// An embeddings response's fingerprint names its batch; its inputs are
/// cached one by one. Purging by that fingerprint re-keys the batch's inputs
/// for that batch; an input shared with another batch is purged by model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purges_reach_embeddings_inputs_by_their_batch_and_by_model() {
    const EMBED: &str = "/v1/embeddings";
    let gateway = TestGateway::start(with_admin_key).await;
    let pair = json!({"model": "text-embedding-3-small", "input": ["alpha", "beta"]});
    let alpha = json!({"model": "text-embedding-3-small", "input": ["alpha"]});
    let first = gateway.post(EMBED, &pair).await;
    assert_eq!(first.cache(), "MISS");
    assert_eq!(gateway.post(EMBED, &pair).await.cache(), "HIT");
    let fingerprint = first.header("x-corral-fingerprint").unwrap().to_owned();

    purge(&gateway, json!({"fingerprint": fingerprint})).await;
    let again = gateway.post(EMBED, &pair).await;
    assert_eq!(
        again.header("x-corral-items"),
        Some("hit=0, stale=0, coalesced=0, miss=2"),
        "the batch's inputs were re-keyed"
    );
    assert_eq!(
        gateway.post(EMBED, &alpha).await.cache(),
        "HIT",
        "another batch keeps reading its input"
    );

    purge(&gateway, json!({"model": "text-embedding-3-small"})).await;
    let alone = gateway.post(EMBED, &alpha).await;
    assert_eq!(
        alone.cache(),
        "MISS",
        "a purge by model reaches every input"
    );
    assert_eq!(gateway.provider.embedded_inputs(), 5);
}

#[tokio::test]
async fn admin_keys_guard_the_reports_and_the_admin_api_and_a_gateway_key_is_not_one() {
    let gateway = TestGateway::start(|config| {
        with_admin_key(config);
        config.auth.key_hashes = vec![key_hash(GATEWAY_KEY.as_bytes())];
        config.upstreams[0].api_key = Some(Secret::new("sk-provider".to_owned()));
    })
    .await;
    let admin = format!("Bearer {ADMIN_KEY}");
    let gateway_key = format!("Bearer {GATEWAY_KEY}");
    let basic = format!(
        "Basic {}",
        base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            format!("operator:{ADMIN_KEY}")
        )
    );
    let get = reqwest::Method::GET;
    for path in ["/metrics", "/stats", "/", "/dashboard", "/admin"] {
        for refused in [None, Some(gateway_key.as_str()), Some("Bearer adm-wrong")] {
            let reply = send(&gateway, get.clone(), path, refused, None).await;
            assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{path} {refused:?}");
            assert_eq!(reply.json()["error"]["code"], "invalid_admin_key", "{path}");
            assert!(!String::from_utf8_lossy(&reply.body).contains(GATEWAY_KEY));
        }
        let reply = send(&gateway, get.clone(), path, Some(&admin), None).await;
        assert_eq!(reply.status, StatusCode::OK, "{path}");
        let reply = send(&gateway, get.clone(), path, Some(&basic), None).await;
        assert_eq!(reply.status, StatusCode::OK, "{path} with Basic auth");
    }
    // The page asks a browser for the key; the rest asks for a bearer token.
    let page = send(&gateway, get.clone(), "/", None, None).await;
    assert!(
        page.header("www-authenticate")
            .unwrap()
            .starts_with("Basic")
    );
    let metrics = send(&gateway, get.clone(), "/metrics", None, None).await;
    assert_eq!(metrics.header("www-authenticate"), Some("Bearer"));

    let post = reqwest::Method::POST;
    let all = json!({"all": true});
    for refused in [None, Some(gateway_key.as_str())] {
        let reply = send(&gateway, post.clone(), "/admin/purge", refused, Some(&all)).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{refused:?}");
    }
    let unknown = send(&gateway, post.clone(), "/admin/nothing", None, Some(&all)).await;
    assert_eq!(
        unknown.status,
        StatusCode::UNAUTHORIZED,
        "no path is open without a key"
    );
    // An admin key is not a gateway key either.
    assert_eq!(
        chat_with(&gateway, &admin).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        chat_with(&gateway, &gateway_key).await.status,
        StatusCode::OK
    );

    // Bad purges are 400s in the API's error shape; nothing is purged.
    for bad in [
        json!({}),
        json!({"all": false}),
        json!({"model": "a", "tenant": "b"}),
        json!({"fingerprint": "not hex"}),
        json!({"model": ""}),
        json!({"models": "a"}),
        json!(["all"]),
    ] {
        let reply = send(
            &gateway,
            post.clone(),
            "/admin/purge",
            Some(&admin),
            Some(&bad),
        )
        .await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(
            reply.json()["error"]["type"],
            "invalid_request_error",
            "{bad}"
        );
    }
    assert_eq!(chat_with(&gateway, &gateway_key).await.cache(), "HIT");
    let purged = send(&gateway, post, "/admin/purge", Some(&admin), Some(&all)).await;
    assert_eq!(purged.status, StatusCode::OK);
    assert_eq!(chat_with(&gateway, &gateway_key).await.cache(), "MISS");
}

async fn chat_with(gateway: &TestGateway, authorization: &str) -> Reply {
    gateway
        .post_with(
            PATH,
            &chat("who may ask"),
            &[("authorization", authorization)],
        )
        .await
}

#[tokio::test]
async fn without_admin_keys_the_reports_are_open_and_the_admin_api_is_off() {
    let gateway = TestGateway::start(|_| {}).await;
    for path in ["/metrics", "/stats", "/", "/dashboard"] {
        assert_eq!(gateway.get(path).await.status, StatusCode::OK, "{path}");
    }
    for authorization in [None, Some("Bearer anything")] {
        let reply = send(
            &gateway,
            reqwest::Method::POST,
            "/admin/purge",
            authorization,
            Some(&json!({"all": true})),
        )
        .await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND);
        assert_eq!(reply.json()["error"]["code"], "admin_disabled");
    }
    assert_eq!(gateway.get("/admin").await.status, StatusCode::NOT_FOUND);
}

/// A chat request on a task of its own; its status.
fn spawn_chat(
    client: &reqwest::Client,
    url: &str,
    content: &str,
) -> tokio::task::JoinHandle<StatusCode> {
    let request = client.post(format!("{url}{PATH}")).json(&chat(content));
    tokio::spawn(async move { request.send().await.unwrap().status() })
}

async fn ready(client: &reqwest::Client, url: &str) -> (StatusCode, Value) {
    let response = client.get(format!("{url}/readyz")).send().await.unwrap();
    (response.status(), response.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_answers_503_from_the_start_of_shutdown_while_running_requests_complete() {
    let provider = MockProvider::start(Default::default()).await.unwrap();
    let (url, state, stop, _) = start_switchable(&provider, |config| {
        // Long enough that this test's requests all land inside it.
        config.shutdown.unready_delay = WAIT;
    })
    .await;
    let client = reqwest::Client::builder().timeout(WAIT).build().unwrap();
    let (status, body) = ready(&client, &url).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (body["status"].clone(), body["draining"].clone()),
        (json!("ready"), json!(false))
    );

    provider.hold();
    let running = spawn_chat(&client, &url, "running when shutdown begins");
    assert!(provider.wait_for_calls(1, WAIT).await);
    stop.cancel();
    tokio::time::timeout(WAIT, async {
        while !state.draining().is_cancelled() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("shutdown begins");
    let (status, body) = ready(&client, &url).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["status"], "draining");
    assert_eq!(body["draining"], true);
    assert_eq!(body["in_flight"], 1, "{body}");
    // Still served meanwhile: the balancer has not noticed yet.
    let late = client
        .post(format!("{url}{PATH}"))
        .json(&chat("sent before the balancer noticed"))
        .send();
    provider.release();
    assert_eq!(running.await.unwrap(), StatusCode::OK);
    assert_eq!(late.await.unwrap().status(), StatusCode::OK);
    assert_eq!(
        ready(&client, &url).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
}

#[tokio::test]
async fn readyz_reports_each_circuit_and_redis_and_stays_200_when_they_fail() {
    let provider = MockProvider::start(Default::default()).await.unwrap();
    let (url, state, _stop, _) = start_switchable(&provider, |config| {
        config.upstreams[0].breaker_failures = 1;
        config.upstreams[0].breaker_cool_down = WAIT;
        // Nothing listens there: Redis is configured and unavailable.
        config.redis = Some(corral::config::RedisConfig {
            url: Some("redis://127.0.0.1:1".into()),
            ..Default::default()
        });
    })
    .await;
    let client = reqwest::Client::builder().timeout(WAIT).build().unwrap();
    let (status, body) = ready(&client, &url).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["upstreams"],
        json!([{"name": "mock", "circuit": "closed"}])
    );
    assert_eq!(body["redis"]["state"], "unavailable", "{body}");
    assert_eq!(body["status"], "degraded");

    provider.set_failure(Some(FailureMode::always(500)));
    let failed = client
        .post(format!("{url}{PATH}"))
        .json(&chat("opens the circuit"))
        .send()
        .await
        .unwrap();
    assert!(failed.status().is_server_error());
    assert_eq!(
        state.upstream().circuit(0),
        corral::breaker::BreakerState::Open
    );
    let (status, body) = ready(&client, &url).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "an open circuit still serves stored answers"
    );
    assert_eq!(
        body["upstreams"],
        json!([{"name": "mock", "circuit": "open"}])
    );
    assert_eq!(body["status"], "degraded");
    assert_eq!(body["draining"], false);

    let plain = TestGateway::start(|_| {}).await;
    let body = plain.get("/readyz").await.json();
    assert_eq!(body["redis"], json!({"state": "not_configured"}));
    assert_eq!(body["status"], "ready");
    assert_eq!(plain.get("/healthz").await.json(), json!({"status": "ok"}));
}

/// The real binary under a real SIGTERM, with the default `unready_delay`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_under_sigterm_is_unready_at_once_completes_its_request_and_exits_0() {
    let provider = MockProvider::start(Default::default()).await.unwrap();
    let yaml = format!(
        "listen: 127.0.0.1:0\nupstreams:\n  - {{name: mock, base_url: '{}'}}\n",
        provider.base_url()
    );
    let mut corral = crate::shutdown::CorralProcess::start(&yaml, &[]).await;
    let client = reqwest::Client::builder().timeout(WAIT).build().unwrap();
    assert_eq!(ready(&client, &corral.url).await.0, StatusCode::OK);
    provider.hold();
    let running = spawn_chat(&client, &corral.url, "running at SIGTERM");
    assert!(provider.wait_for_calls(1, WAIT).await);
    corral.signal("TERM");
    corral.wait_for_log("/readyz answers 503").await;
    // Within the default 5 s unready delay: still listening, and unready.
    let (status, body) = ready(&client, &corral.url).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(
        (body["draining"].clone(), body["in_flight"].clone()),
        (json!(true), json!(1))
    );
    provider.release();
    assert_eq!(running.await.unwrap(), StatusCode::OK);
    assert_eq!(corral.exit_code().await, Some(0), "{}", corral.logs());
}
