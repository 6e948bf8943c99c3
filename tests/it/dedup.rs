//! Coalescing and caching over real HTTP: herds, tenants, failures, owner
//! disconnects, response headers and the request's cache controls.

use std::{collections::HashSet, time::Duration};

use corral::fingerprint::Endpoint;
use mock_upstream::FailureMode;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{Reply, TestGateway, WAIT, chat, completion, count_status, embedding};

const HERD: usize = 1000;

async fn one_call_for_a_herd(path: &str, body: Value) {
    let gateway = TestGateway::start(|_| {}).await;
    let replies = gateway.herd(path, &body, HERD, &[]).await;
    assert_eq!(
        gateway.provider.calls(),
        1,
        "{path}: one upstream call for {HERD} callers"
    );
    assert!(
        replies.iter().all(|r| r.status == StatusCode::OK),
        "{path}: every caller gets 200"
    );
    // Embeddings answer with the usage this caller was billed (the MISS
    // alone); everything else is the same bytes for every caller.
    let shared = |reply: &Reply| match path {
        "/v1/embeddings" => reply.json()["data"].to_string().into_bytes(),
        _ => reply.body.to_vec(),
    };
    let bodies: HashSet<Vec<u8>> = replies.iter().map(shared).collect();
    assert_eq!(bodies.len(), 1, "{path}: every caller gets the same bytes");
    assert_eq!(count_status(&replies, "MISS"), 1, "{path}");
    assert_eq!(count_status(&replies, "COALESCED"), HERD - 1, "{path}");

    let repeat = gateway.post(path, &body).await;
    assert_eq!(repeat.cache(), "HIT");
    assert_eq!(shared(&repeat), shared(&replies[0]));
    assert_eq!(gateway.provider.calls(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_identical_chat_requests_make_one_upstream_call() {
    one_call_for_a_herd("/v1/chat/completions", chat("What is a cache stampede?")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_identical_embedding_requests_make_one_upstream_call() {
    one_call_for_a_herd("/v1/embeddings", embedding("the quick brown fox")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_identical_completion_requests_make_one_upstream_call() {
    one_call_for_a_herd("/v1/completions", completion("Once upon a time")).await;
}

#[tokio::test]
async fn tenants_never_share_answers() {
    let gateway = TestGateway::start(|_| {}).await;
    let body = chat("same words, different customers");
    let a = gateway
        .post_with(
            "/v1/chat/completions",
            &body,
            &[("authorization", "Bearer sk-tenant-a")],
        )
        .await;
    let b = gateway
        .post_with(
            "/v1/chat/completions",
            &body,
            &[("authorization", "Bearer sk-tenant-b")],
        )
        .await;
    assert_eq!((a.cache(), b.cache()), ("MISS", "MISS"));
    assert_eq!(gateway.provider.calls(), 2);
    assert_ne!(
        a.json()["id"],
        b.json()["id"],
        "each tenant gets its own answer"
    );
    assert_ne!(
        a.header("x-corral-fingerprint"),
        b.header("x-corral-fingerprint")
    );
    // Each call went upstream with its own caller's credential.
    let auths: Vec<Option<String>> = gateway
        .provider
        .requests()
        .iter()
        .map(|r| r.header("authorization").map(str::to_owned))
        .collect();
    assert_eq!(
        auths,
        [
            Some("Bearer sk-tenant-a".to_owned()),
            Some("Bearer sk-tenant-b".to_owned())
        ]
    );

    // Concurrently: two flights, not one.
    let concurrent = chat("same words, at the same time");
    gateway.provider.hold();
    let handle = gateway.clone_handle();
    let (body_a, body_b) = (concurrent.clone(), concurrent.clone());
    let (h1, h2) = (handle.clone(), handle.clone());
    let a = tokio::spawn(async move {
        h1.post_with(
            "/v1/chat/completions",
            &body_a,
            &[("authorization", "Bearer sk-tenant-a")],
        )
        .await
    });
    let b = tokio::spawn(async move {
        h2.post_with(
            "/v1/chat/completions",
            &body_b,
            &[("authorization", "Bearer sk-tenant-b")],
        )
        .await
    });
    gateway.wait_for_calls(4).await;
    gateway.provider.release();
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    assert_eq!(gateway.provider.calls(), 4);
    assert_eq!((a.cache(), b.cache()), ("MISS", "MISS"));
    assert_ne!(a.json()["id"], b.json()["id"]);
}

#[tokio::test]
async fn openai_organization_splits_the_key() {
    let gateway = TestGateway::start(|_| {}).await;
    let body = chat("organization scoped");
    let a = gateway
        .post_with(
            "/v1/chat/completions",
            &body,
            &[("openai-organization", "org-a")],
        )
        .await;
    let b = gateway
        .post_with(
            "/v1/chat/completions",
            &body,
            &[("openai-organization", "org-b")],
        )
        .await;
    let a_again = gateway
        .post_with(
            "/v1/chat/completions",
            &body,
            &[("openai-organization", "org-a")],
        )
        .await;
    assert_eq!(
        (a.cache(), b.cache(), a_again.cache()),
        ("MISS", "MISS", "HIT")
    );
    assert_eq!(gateway.provider.calls(), 2);
    let forwarded: Vec<Option<String>> = gateway
        .provider
        .requests()
        .iter()
        .map(|r| r.header("openai-organization").map(str::to_owned))
        .collect();
    assert_eq!(
        forwarded,
        [Some("org-a".to_owned()), Some("org-b".to_owned())]
    );
}

#[tokio::test]
async fn prompt_corpus_variants_coalesce_and_distinct_prompts_do_not() {
    use crate::prompts_golden::{PromptRequest, load_groups};

    async fn send(gateway: &TestGateway, request: &PromptRequest) -> crate::harness::Reply {
        let mut headers: Vec<(String, String)> = request.headers.clone();
        if let Some(tenant) = &request.tenant {
            headers.push(("authorization".into(), format!("Bearer {tenant}")));
        }
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let path = match request.query.as_deref() {
            Some(query) => format!("/v1{}?{query}", request.endpoint.path()),
            None => format!("/v1{}", request.endpoint.path()),
        };
        gateway.post_raw(&path, request.raw.clone(), &headers).await
    }

    let gateway = TestGateway::start(|_| {}).await;
    let mut expected_calls = 0;
    for group in load_groups("equal") {
        expected_calls += 1;
        let mut fingerprints = HashSet::new();
        for (i, request) in group.requests.iter().enumerate() {
            let reply = send(&gateway, request).await;
            assert_eq!(
                reply.status,
                StatusCode::OK,
                "{} #{i}: {:?}",
                group.name,
                reply.body
            );
            // `Cache-Control: no-cache` shares the key but skips the entry.
            let no_cache = request.headers.iter().any(|(name, value)| {
                name.eq_ignore_ascii_case("cache-control") && value.contains("no-cache")
            });
            // A streaming variant shares the key: it replays the cached answer as SSE.
            let want = if i == 0 || no_cache { "MISS" } else { "HIT" };
            if i > 0 && no_cache {
                expected_calls += 1;
            }
            assert_eq!(reply.cache(), want, "{} #{i}", group.name);
            fingerprints.insert(reply.header("x-corral-fingerprint").unwrap().to_owned());
        }
        assert_eq!(fingerprints.len(), 1, "group {}", group.name);
        assert_eq!(
            gateway.provider.calls(),
            expected_calls,
            "group {}",
            group.name
        );
    }
    for group in load_groups("distinct") {
        let gateway = TestGateway::start(|_| {}).await;
        let mut fingerprints = HashSet::new();
        let mut direct_calls = 0;
        for (i, request) in group.requests.iter().enumerate() {
            let reply = send(&gateway, request).await;
            assert_eq!(
                reply.status,
                StatusCode::OK,
                "{} #{i}: {:?}",
                group.name,
                reply.body
            );
            fingerprints.insert(reply.header("x-corral-fingerprint").unwrap().to_owned());
            if request.endpoint == Endpoint::Embeddings {
                // Embeddings share by the input, not the request: distinct
                // requests may share inputs, and every vector must be the
                // one a direct call returns.
                let direct = gateway
                    .client
                    .post(format!("{}/embeddings", gateway.provider.base_url()))
                    .body(request.raw.clone())
                    .header("content-type", "application/json")
                    .send()
                    .await
                    .unwrap();
                let direct: Value = direct.json().await.unwrap();
                direct_calls += 1;
                assert_eq!(reply.json()["data"], direct["data"], "{} #{i}", group.name);
                continue;
            }
            assert_eq!(reply.cache(), "MISS", "{} #{i} must not share", group.name);
        }
        assert_eq!(fingerprints.len(), group.requests.len(), "{}", group.name);
        if group.endpoint != Endpoint::Embeddings {
            assert_eq!(
                gateway.provider.calls(),
                group.requests.len() as u64 + direct_calls,
                "{}",
                group.name
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_reaches_every_waiter_and_is_not_cached() {
    let gateway = TestGateway::start(|config| {
        config.retry.max_attempts = 2;
        // No quiet time for a remembered failure: the next request calls (once).
        config.cache.error_ttl = Duration::ZERO;
    })
    .await;
    gateway.provider.set_failure(Some(FailureMode::always(500)));
    let body = chat("this will fail");
    let replies = gateway.herd("/v1/chat/completions", &body, 100, &[]).await;
    assert!(
        replies
            .iter()
            .all(|r| r.status == StatusCode::INTERNAL_SERVER_ERROR)
    );
    let bodies: HashSet<&[u8]> = replies.iter().map(|r| r.body.as_ref()).collect();
    assert_eq!(bodies.len(), 1, "every waiter gets the same error");
    assert!(replies[0].json()["error"]["message"].is_string());
    // One retry loop for the flight, not one per waiter.
    assert_eq!(gateway.provider.calls(), 2);

    gateway.provider.set_failure(None);
    let next = gateway.post("/v1/chat/completions", &body).await;
    assert_eq!(next.status, StatusCode::OK);
    assert_eq!(next.cache(), "MISS", "the error was not cached");
    assert_eq!(gateway.provider.calls(), 3);
}

#[tokio::test]
async fn the_owner_disconnecting_does_not_cancel_the_call() {
    let gateway = TestGateway::start(|_| {}).await;
    let body = chat("owner walks away");
    gateway.provider.hold();
    let owner = {
        let handle = gateway.clone_handle();
        let body = body.clone();
        tokio::spawn(async move { handle.post_with("/v1/chat/completions", &body, &[]).await })
    };
    gateway.wait_for_calls(1).await;
    let followers: Vec<_> = (0..10)
        .map(|_| {
            let handle = gateway.clone_handle();
            let body = body.clone();
            tokio::spawn(async move { handle.post_with("/v1/chat/completions", &body, &[]).await })
        })
        .collect();
    gateway.wait_for_waiters(11).await;
    // Dropping the task closes the owner's connection mid-call.
    owner.abort();
    assert!(owner.await.unwrap_err().is_cancelled());
    gateway.wait_for_waiters_at_most(10).await;
    gateway.provider.release();
    for follower in followers {
        let reply = follower.await.unwrap();
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.cache(), "COALESCED");
    }
    let later = gateway.post("/v1/chat/completions", &body).await;
    assert_eq!(
        later.cache(),
        "HIT",
        "the abandoned owner's answer was cached"
    );
    assert_eq!(gateway.provider.calls(), 1);
}

#[tokio::test]
async fn shared_responses_carry_only_allowlisted_headers() {
    let gateway = TestGateway::start(|_| {}).await;
    let body = chat("headers");
    let miss = gateway.post("/v1/chat/completions", &body).await;
    let hit = gateway.post("/v1/chat/completions", &body).await;
    for reply in [&miss, &hit] {
        assert!(reply.header("set-cookie").is_none());
        assert!(reply.header("x-ratelimit-remaining-requests").is_none());
        assert!(reply.header("openai-organization").is_none());
        assert!(
            reply
                .header("x-request-id")
                .is_none_or(|id| !id.starts_with("req_mock"))
        );
        assert_eq!(reply.header("content-type"), Some("application/json"));
        assert_eq!(reply.header("x-corral-fingerprint").map(str::len), Some(64));
    }
    assert_eq!(
        miss.header("cache-status"),
        Some("corral; fwd=miss; stored")
    );
    assert_eq!(hit.header("cache-status"), Some("corral; hit"));
    assert_eq!(hit.header("age"), Some("0"));
}

#[tokio::test]
async fn cache_control_directives() {
    let gateway = TestGateway::start(|_| {}).await;
    let body = chat("cache control");
    let first = gateway.post("/v1/chat/completions", &body).await;
    assert_eq!(first.cache(), "MISS");

    // no-cache: skips the entry, goes upstream, stores the new answer.
    let refreshed = gateway
        .post_with(
            "/v1/chat/completions",
            &body,
            &[("cache-control", "no-cache")],
        )
        .await;
    assert_eq!(refreshed.cache(), "MISS");
    assert_eq!(
        refreshed.header("cache-status"),
        Some("corral; fwd=request; stored")
    );
    assert_ne!(refreshed.json()["id"], first.json()["id"]);
    let hit = gateway.post("/v1/chat/completions", &body).await;
    assert_eq!(hit.json()["id"], refreshed.json()["id"]);

    // no-store: neither read nor written.
    let bypass = gateway
        .post_with(
            "/v1/chat/completions",
            &chat("never stored"),
            &[("cache-control", "no-store")],
        )
        .await;
    assert_eq!(bypass.cache(), "BYPASS");
    let after = gateway
        .post("/v1/chat/completions", &chat("never stored"))
        .await;
    assert_eq!(after.cache(), "MISS");

    // max-age: only entries young enough.
    gateway.clock.advance(Duration::from_secs(10));
    let young_enough = gateway
        .post_with(
            "/v1/chat/completions",
            &body,
            &[("cache-control", "max-age=60")],
        )
        .await;
    assert_eq!(young_enough.cache(), "HIT");
    assert_eq!(young_enough.header("age"), Some("10"));
    let too_old = gateway
        .post_with(
            "/v1/chat/completions",
            &body,
            &[("cache-control", "max-age=5")],
        )
        .await;
    assert_eq!(too_old.cache(), "MISS");
    assert_eq!(gateway.provider.calls(), 5);
}

#[tokio::test]
async fn sampled_requests_coalesce_but_are_not_stored_by_default() {
    let gateway = TestGateway::start(|_| {}).await;
    let sampled = json!({"model": "gpt-4o-mini", "temperature": 0.8,
                         "messages": [{"role": "user", "content": "tell me a story"}]});
    let a = gateway.post("/v1/chat/completions", &sampled).await;
    let b = gateway.post("/v1/chat/completions", &sampled).await;
    assert_eq!(
        (a.cache(), b.cache()),
        ("MISS", "MISS"),
        "regenerate gets a new answer"
    );
    assert_eq!(a.header("cache-status"), Some("corral; fwd=miss"));
    assert_eq!(gateway.provider.calls(), 2);
    let herd = gateway
        .herd("/v1/chat/completions", &sampled, 20, &[])
        .await;
    assert_eq!(
        count_status(&herd, "COALESCED"),
        19,
        "concurrent sampled requests still coalesce"
    );
    assert_eq!(gateway.provider.calls(), 3);

    let caching = TestGateway::start(|config| config.cache.sampled = true).await;
    caching.post("/v1/chat/completions", &sampled).await;
    let again = caching.post("/v1/chat/completions", &sampled).await;
    assert_eq!(again.cache(), "HIT");
    assert_eq!(caching.provider.calls(), 1);
}

#[tokio::test]
async fn waiters_beyond_the_cap_get_503_with_retry_after() {
    let gateway = TestGateway::start(|config| config.coalesce.max_waiters = 3).await;
    let body = chat("crowded");
    gateway.provider.hold();
    let waiting: Vec<_> = (0..3)
        .map(|_| {
            let handle = gateway.clone_handle();
            let body = body.clone();
            tokio::spawn(async move { handle.post_with("/v1/chat/completions", &body, &[]).await })
        })
        .collect();
    gateway.wait_for_waiters(3).await;
    let refused = gateway.post("/v1/chat/completions", &body).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(refused.header("retry-after").is_some());
    assert_eq!(refused.json()["error"]["code"], "too_many_waiters");
    gateway.provider.release();
    for task in waiting {
        assert_eq!(task.await.unwrap().status, StatusCode::OK);
    }
    assert_eq!(gateway.provider.calls(), 1);
}

#[tokio::test]
async fn no_store_streams_pass_through_live() {
    let gateway = TestGateway::start(|_| {}).await;
    let mut body = chat("stream me");
    body["stream"] = json!(true);
    let reply = gateway
        .post_with(
            "/v1/chat/completions",
            &body,
            &[("cache-control", "no-store")],
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.cache(), "BYPASS");
    assert!(
        reply
            .header("content-type")
            .unwrap()
            .starts_with("text/event-stream")
    );
    let text = String::from_utf8(reply.body.to_vec()).unwrap();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let content: String = text
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str::<Value>(data).unwrap())
        .filter_map(|chunk| {
            chunk["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    let plain = gateway
        .post("/v1/chat/completions", &chat("stream me"))
        .await;
    assert_eq!(
        content,
        plain.json()["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
    );
}

#[tokio::test]
async fn other_v1_paths_are_proxied_and_health_endpoints_answer() {
    let gateway = TestGateway::start(|_| {}).await;
    let models = gateway.get("/v1/models").await;
    assert_eq!(models.status, StatusCode::OK);
    assert_eq!(models.json()["object"], "list");
    assert!(
        models.header("x-corral-cache").is_none(),
        "proxied, not deduplicated"
    );
    assert_eq!(gateway.get("/healthz").await.status, StatusCode::OK);
    let ready = gateway.get("/readyz").await;
    assert_eq!(ready.status, StatusCode::OK);
    assert_eq!(ready.json()["status"], "ready");
    let _ = WAIT;
}

#[tokio::test]
async fn a_follower_whose_wait_runs_out_gets_504_or_makes_its_own_call() {
    for own_call in [false, true] {
        let gateway = TestGateway::start(|config| {
            config.coalesce.wait_timeout = Duration::from_millis(300);
            if own_call {
                config.coalesce.on_wait_timeout = corral::config::OnWaitTimeout::OwnCall;
            }
        })
        .await;
        let body = chat("a slow owner");
        gateway.provider.hold();
        let owner = {
            let handle = gateway.clone_handle();
            let body = body.clone();
            tokio::spawn(async move { handle.post_with("/v1/chat/completions", &body, &[]).await })
        };
        gateway.wait_for_calls(1).await;
        let follower = {
            let handle = gateway.clone_handle();
            let body = body.clone();
            tokio::spawn(async move { handle.post_with("/v1/chat/completions", &body, &[]).await })
        };
        if own_call {
            // The follower gave up on the flight and went upstream itself.
            gateway.wait_for_calls(2).await;
            gateway.provider.release();
            let follower = follower.await.unwrap();
            assert_eq!(follower.status, StatusCode::OK);
            assert_eq!(follower.cache(), "MISS");
        } else {
            let follower = follower.await.unwrap();
            assert_eq!(follower.status, StatusCode::GATEWAY_TIMEOUT);
            assert_eq!(follower.json()["error"]["code"], "coalesce_wait_timeout");
            gateway.provider.release();
        }
        // The owner's wait is bounded the same way (it started first, so it
        // ran out first); its flight is the call and is never repeated for it.
        // Under `own_call` that flight is its own call, which it waits out.
        let owner = owner.await.unwrap();
        let expected = if own_call {
            StatusCode::OK
        } else {
            StatusCode::GATEWAY_TIMEOUT
        };
        assert_eq!(owner.status, expected, "own_call {own_call}");
        assert_eq!(
            gateway.provider.calls(),
            if own_call { 2 } else { 1 },
            "own_call {own_call}"
        );
    }
}

/// Best-of-N in parallel: callers that send `X-Corral-Coalesce: off` each get
/// their own sample (their own upstream call), while the same herd without the
/// header shares one. The opted-out calls are still counted and still feed the
/// retry window, so an SDK's retry of one gets what it paid for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_may_opt_out_of_sharing_a_sampled_flight() {
    let gateway = TestGateway::start(|_| {}).await;
    let mut body = chat("best of five");
    body["temperature"] = json!(1.0);
    let opted_out = [("x-corral-coalesce", "off")];
    let own = gateway
        .herd("/v1/chat/completions", &body, 5, &opted_out)
        .await;
    assert_eq!(gateway.provider.calls(), 5, "five samples");
    let ids: HashSet<String> = own
        .iter()
        .map(|reply| reply.json()["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 5, "each caller its own answer");
    assert!(own.iter().all(|reply| reply.cache() == "MISS"));

    let shared = gateway.herd("/v1/chat/completions", &body, 5, &[]).await;
    assert_eq!(gateway.provider.calls(), 6, "without the header: one call");
    assert_eq!(count_status(&shared, "COALESCED"), 4);

    // An SDK retry of an opted-out call gets that call's answer.
    let retry = gateway
        .post_with(
            "/v1/chat/completions",
            &body,
            &[
                ("x-corral-coalesce", "off"),
                ("x-stainless-retry-count", "1"),
            ],
        )
        .await;
    assert_eq!(
        retry.header("cache-status"),
        Some("corral; hit; detail=retry")
    );
    assert_eq!(gateway.provider.calls(), 6);
}
