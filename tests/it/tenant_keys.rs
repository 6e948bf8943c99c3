//! Every key is its own tenant (issue 37, S1–S5 and W1's credential part):
//! one function decides a request's credential, wherever it was sent, and the
//! tenant scope, its label, its budgets and the credential forwarded upstream
//! all follow it. A Gemini request's credential is the Gemini key (or OAuth
//! token) that goes upstream; a key sent in the query is the same tenant, with
//! the same label and budgets, as in a header; a caller sees only its own
//! budgets; a key of one provider is never sent to another; and `/metrics`
//! names budget rules, never tenants.

use corral::{config::Secret, tenant::key_hash};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{
    budgets::{dear_prices, rule, with_messages},
    gemini::with_gemini,
    harness::{Reply, TestGateway, chat},
};

const GENERATE: &str = "/v1beta/models/gemini-2.5-flash:generateContent";
const CHAT: &str = "/v1/chat/completions";

fn contents(text: &str) -> Value {
    json!({"contents": [{"parts": [{"text": text}]}],
           "generationConfig": {"temperature": 0}})
}

/// The generate calls the Gemini upstream received.
fn gemini_calls(gateway: &TestGateway) -> Vec<mock_upstream::RecordedRequest> {
    gateway
        .provider
        .requests()
        .into_iter()
        .filter(|request| request.path.starts_with("/v1beta/"))
        .collect()
}

/// S1: a Gemini request's tenant is the Gemini key that goes upstream, not
/// its `Authorization`: callers sharing one `Authorization` with different
/// Gemini keys share nothing, and a HIT needs the key that paid for it.
#[tokio::test]
async fn one_authorization_with_two_gemini_keys_is_two_tenants() {
    let gateway = TestGateway::start(with_gemini).await;
    let body = contents("whose answer is this?");
    let shared = ("authorization", "Bearer sk-shared-by-everyone");
    let one = gateway
        .post_with(
            GENERATE,
            &body,
            &[shared, ("x-goog-api-key", "AIza-key-one")],
        )
        .await;
    // The second key in the query: the same key wherever it is sent.
    let two = gateway
        .post_with(&format!("{GENERATE}?key=AIza-key-two"), &body, &[shared])
        .await;
    assert_eq!(one.status, StatusCode::OK, "{:?}", one.body);
    assert_eq!(two.status, StatusCode::OK, "{:?}", two.body);
    assert_eq!(
        (one.cache(), two.cache()),
        ("MISS", "MISS"),
        "two Gemini keys are two tenants, whatever `Authorization` says"
    );
    let keys: Vec<_> = gemini_calls(&gateway)
        .iter()
        .map(|call| call.header("x-goog-api-key").unwrap_or("-").to_owned())
        .collect();
    assert_eq!(
        keys,
        ["AIza-key-one", "AIza-key-two"],
        "two calls, each with its key"
    );
    // The first key again, under another `Authorization`: its own answer.
    let again = gateway
        .post_with(
            GENERATE,
            &body,
            &[
                ("authorization", "Bearer sk-someone-else"),
                ("x-goog-api-key", "AIza-key-one"),
            ],
        )
        .await;
    assert_eq!(again.cache(), "HIT", "one key, one tenant");
    assert_eq!(gemini_calls(&gateway).len(), 2);
}

/// W1: an OAuth token in the query (`access_token`, `oauth_token`) is the
/// caller's credential like `?key=`: its own tenant (not the anonymous one),
/// sent upstream as `Authorization: Bearer`, never in the URL.
#[tokio::test]
async fn an_oauth_token_in_the_query_is_its_own_tenant_and_goes_in_a_header() {
    let gateway = TestGateway::start(with_gemini).await;
    let body = contents("who holds this token?");
    let one = gateway
        .post_with(
            &format!("{GENERATE}?access_token=ya29.token-one"),
            &body,
            &[],
        )
        .await;
    let two = gateway
        .post_with(
            &format!("{GENERATE}?oauth_token=ya29.token-two"),
            &body,
            &[],
        )
        .await;
    assert_eq!(one.status, StatusCode::OK, "{:?}", one.body);
    assert_eq!(two.status, StatusCode::OK, "{:?}", two.body);
    assert_eq!(
        (one.cache(), two.cache()),
        ("MISS", "MISS"),
        "two tokens are two tenants, not one anonymous one"
    );
    let calls = gemini_calls(&gateway);
    let sent: Vec<_> = calls
        .iter()
        .map(|call| call.header("authorization").unwrap_or("-").to_owned())
        .collect();
    assert_eq!(sent, ["Bearer ya29.token-one", "Bearer ya29.token-two"]);
    for call in &calls {
        let query = call.query.as_deref().unwrap_or_default();
        assert!(!query.contains("token"), "a token left in the URL: {query}");
        assert!(call.header("x-goog-api-key").is_none());
    }
    let again = gateway
        .post_with(
            &format!("{GENERATE}?access_token=ya29.token-one"),
            &body,
            &[],
        )
        .await;
    assert_eq!(again.cache(), "HIT", "one token, one tenant");
}

/// S3: a labelled key sent as `?key=` is its label's tenant: its label's
/// budget stops it, as it would in `x-goog-api-key`.
#[tokio::test]
async fn a_labelled_key_in_the_query_spends_its_labels_budget() {
    const KEY: &str = "AIza-team-a-key";
    let gateway = TestGateway::start(|config| {
        with_gemini(config);
        dear_prices(config);
        config.auth.labels_by_hash = vec![(key_hash(KEY.as_bytes()), "team-a".to_owned())];
        config.budgets = vec![rule(Some("team-a"), None, 0.000_001, "day")];
    })
    .await;
    let first = gateway
        .post_with(&format!("{GENERATE}?key={KEY}"), &contents("first"), &[])
        .await;
    assert_eq!(first.status, StatusCode::OK, "{:?}", first.body);
    assert_eq!(first.cache(), "MISS");
    let second = gateway
        .post_with(&format!("{GENERATE}?key={KEY}"), &contents("second"), &[])
        .await;
    assert_eq!(
        second.status,
        StatusCode::TOO_MANY_REQUESTS,
        "team-a's budget is spent, whichever place its key came in: {:?}",
        second.body
    );
    assert!(
        String::from_utf8_lossy(&second.body).contains("tenant team-a"),
        "{:?}",
        second.body
    );
    // The same key in its header is the same tenant, out of budget too.
    let header = gateway
        .post_with(GENERATE, &contents("third"), &[("x-goog-api-key", KEY)])
        .await;
    assert_eq!(header.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(gemini_calls(&gateway).len(), 1);
}

/// S2: `x-corral-budget-remaining-usd` says what is left of the caller's own
/// budgets only: never an upstream's (account-wide) cap, which would show
/// every tenant the others' spend.
#[tokio::test]
async fn the_budget_header_shows_only_the_callers_own_budgets() {
    let gateway = TestGateway::start(|config| {
        dear_prices(config);
        config.auth.labels_by_hash = vec![(key_hash(b"sk-team-a"), "team-a".to_owned())];
        config.budgets = vec![
            rule(None, Some("mock"), 1.0, "day"),
            rule(Some("team-a"), None, 100.0, "day"),
        ];
    })
    .await;
    let post = |key: &'static str, text: &'static str| {
        let gateway = &gateway;
        async move {
            let auth = format!("Bearer {key}");
            gateway
                .post_with(CHAT, &chat(text), &[("authorization", auth.as_str())])
                .await
        }
    };
    let own: Reply = post("sk-team-a", "mine").await;
    assert_eq!(own.status, StatusCode::OK);
    let left: f64 = own
        .header("x-corral-budget-remaining-usd")
        .expect("team-a has a budget of its own")
        .parse()
        .unwrap();
    assert!(
        (99.0..100.0).contains(&left),
        "team-a's own $100, not the upstream's $1: {left}"
    );
    let other = post("sk-someone-else", "theirs").await;
    assert_eq!(other.status, StatusCode::OK);
    assert_eq!(
        other.header("x-corral-budget-remaining-usd"),
        None,
        "a tenant without a budget of its own is told nothing of the upstream's"
    );
}

/// S5: a `*` budget is one series per rule on `/metrics`, never one per
/// tenant; the tenants are on `/stats`.
#[tokio::test]
async fn budget_metrics_name_the_rule_never_a_tenant() {
    let gateway = TestGateway::start(|config| {
        dear_prices(config);
        config.budgets = vec![rule(Some("*"), None, 10.0, "day")];
    })
    .await;
    for (key, text) in [("sk-tenant-one", "one"), ("sk-tenant-two", "two")] {
        let auth = format!("Bearer {key}");
        let reply = gateway
            .post_with(CHAT, &chat(text), &[("authorization", auth.as_str())])
            .await;
        assert_eq!(reply.status, StatusCode::OK);
    }
    let stats = gateway.get("/stats").await.json();
    let budgets = stats["budgets"].as_array().expect("budgets on /stats");
    assert_eq!(budgets.len(), 2, "each tenant's use on /stats: {budgets:?}");
    let metrics = String::from_utf8(gateway.get("/metrics").await.body.to_vec()).unwrap();
    for family in ["corral_budget_usd{", "corral_budget_spent_usd{"] {
        let series: Vec<&str> = metrics
            .lines()
            .filter(|line| line.starts_with(family))
            .collect();
        assert_eq!(series.len(), 1, "one series per rule: {series:?}");
        assert!(
            series[0].contains("budget=\"every tenant\""),
            "the rule, not a tenant: {series:?}"
        );
    }
    assert!(
        !metrics.contains("budget=\"tenant "),
        "no tenant is a label: {metrics}"
    );
}

/// S4: a credential whose form names another provider is refused (401, in the
/// API's shape) before it would be forwarded, on the deduplicated paths and
/// the pass-through alike; keys of no known form and upstreams with a key
/// of their own are unaffected.
#[tokio::test]
async fn a_key_of_another_provider_is_refused_before_it_leaves() {
    let gateway = TestGateway::start(with_messages).await;
    let messages = json!({"model": "claude-sonnet-4-5", "max_tokens": 16,
        "messages": [{"role": "user", "content": "hi"}]});
    for (path, body, header, key, shape) in [
        (
            CHAT,
            chat("a"),
            "authorization",
            "Bearer AIzaSyA-not-openai",
            "openai",
        ),
        (
            CHAT,
            chat("b"),
            "authorization",
            "Bearer sk-ant-api03-not-openai",
            "openai",
        ),
        (
            CHAT,
            chat("c"),
            "x-api-key",
            "sk-ant-api03-not-openai",
            "openai",
        ),
        (
            "/v1/embeddings",
            json!({"model": "text-embedding-3-small", "input": "x"}),
            "authorization",
            "Bearer AIzaSyA-not-openai",
            "openai",
        ),
        (
            "/v1/messages",
            messages.clone(),
            "x-api-key",
            "sk-proj-not-anthropic",
            "anthropic",
        ),
        (
            "/v1/messages",
            messages.clone(),
            "authorization",
            "Bearer ya29.not-anthropic",
            "anthropic",
        ),
        // The pass-through.
        (
            "/v1/images/generations",
            json!({"model": "gpt-image-1", "prompt": "x"}),
            "authorization",
            "Bearer sk-ant-api03-not-openai",
            "openai",
        ),
        (
            "/v1/messages/count_tokens",
            messages.clone(),
            "x-api-key",
            "AIzaSyA-not-anthropic",
            "anthropic",
        ),
    ] {
        let reply = gateway.post_with(path, &body, &[(header, key)]).await;
        assert_eq!(
            reply.status,
            StatusCode::UNAUTHORIZED,
            "{path} {key}: {:?}",
            reply.body
        );
        let json = reply.json();
        let error_type = match shape {
            "openai" => {
                assert_eq!(json["error"]["code"], "foreign_credential", "{json}");
                &json["error"]["type"]
            }
            _ => {
                assert_eq!(json["type"], "error", "{json}");
                &json["error"]["type"]
            }
        };
        assert!(error_type.is_string(), "{json}");
        let text = json.to_string();
        assert!(
            !text.contains("not-openai") && !text.contains("not-anthropic"),
            "{text}"
        );
    }
    let model = gateway
        .client
        .get(format!("{}/v1/models/gpt-4o-mini", gateway.url))
        .header("authorization", "Bearer sk-ant-api03-not-openai")
        .send()
        .await
        .expect("corral answers");
    assert_eq!(model.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        gateway.provider.calls(),
        0,
        "nothing left: {:?}",
        gateway.provider.received()
    );
    // A key of no known form passes, as does a provider's own key to it.
    for (path, body, credential) in [
        (
            CHAT,
            chat("d"),
            ("authorization", "Bearer sk-plain-or-deepseek"),
        ),
        (
            CHAT,
            chat("e"),
            ("authorization", "Bearer sk-proj-openais-own"),
        ),
        (
            "/v1/messages",
            messages.clone(),
            ("x-api-key", "sk-ant-api03-anthropics-own"),
        ),
    ] {
        let reply = gateway.post_with(path, &body, &[credential]).await;
        assert_eq!(
            reply.status,
            StatusCode::OK,
            "{credential:?}: {:?}",
            reply.body
        );
    }
}

/// S4: an upstream with a key of its own forwards no caller's credential,
/// so none is refused there (a gateway key that looks like a provider's
/// included): the caller's key never leaves.
#[tokio::test]
async fn an_upstream_with_its_own_key_refuses_no_callers_key() {
    let gateway = TestGateway::start(|config| {
        config.auth.key_hashes = vec![key_hash(b"AIza-looking-gateway-key")];
        config.upstreams[0].api_key = Some(Secret::new("sk-proj-corrals-own".to_owned()));
    })
    .await;
    let reply = gateway
        .post_with(
            CHAT,
            &chat("f"),
            &[("authorization", "Bearer AIza-looking-gateway-key")],
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    let sent = gateway.provider.requests();
    assert_eq!(sent.len(), 1);
    assert_eq!(
        sent[0].header("authorization"),
        Some("Bearer sk-proj-corrals-own")
    );
}
