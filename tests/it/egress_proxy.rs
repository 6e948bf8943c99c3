//! An egress proxy the environment names (`HTTP_PROXY`): corral's provider
//! calls go through it (`upstream/transport.rs` hands them to reqwest, which
//! honours it); every other test runs without one, over hyper's client.

use std::sync::{Arc, Mutex};

use axum::{body::Bytes, extract::Request, http::StatusCode, response::IntoResponse};
use mock_upstream::{MockProvider, MockSettings};
use serde_json::json;

use crate::logs::Corral;

const CONFIG: &str =
    "listen: 127.0.0.1:0\nupstreams:\n  - name: mock\n    base_url: http://127.0.0.1:1/v1\n";

/// A forward proxy on loopback: each request it is asked to carry (in
/// absolute form, as a proxy receives them), recorded and relayed.
struct ForwardProxy {
    url: String,
    carried: Arc<Mutex<Vec<String>>>,
}

impl ForwardProxy {
    async fn start() -> Self {
        let carried = Arc::new(Mutex::new(Vec::new()));
        let record = carried.clone();
        let relay = reqwest::Client::builder().no_proxy().build().unwrap();
        let app = axum::Router::new().fallback(move |request: Request| {
            let record = record.clone();
            let relay = relay.clone();
            async move {
                let (parts, body) = request.into_parts();
                record.lock().unwrap().push(parts.uri.to_string());
                let body: Bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap();
                let mut forwarded = relay
                    .request(parts.method, parts.uri.to_string())
                    .body(body);
                for (name, value) in &parts.headers {
                    if name != "host" && name != "proxy-connection" {
                        forwarded = forwarded.header(name, value);
                    }
                }
                let Ok(answer) = forwarded.send().await else {
                    return StatusCode::BAD_GATEWAY.into_response();
                };
                let status = answer.status();
                let bytes = answer.bytes().await.unwrap_or_default();
                (status, [("content-type", "application/json")], bytes).into_response()
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { url, carried }
    }

    fn carried(&self) -> Vec<String> {
        self.carried.lock().unwrap().clone()
    }
}

fn chat(content: &str) -> String {
    json!({
        "model": "gpt-4o-mini",
        "temperature": 0,
        "messages": [{"role": "user", "content": content}],
    })
    .to_string()
}

#[tokio::test]
async fn an_egress_proxy_in_the_environment_carries_every_provider_call() {
    let provider = MockProvider::start(MockSettings::default()).await.unwrap();
    let proxy = ForwardProxy::start().await;
    let corral = Corral::start_with(CONFIG, &provider, &[("HTTP_PROXY", proxy.url.as_str())]).await;

    let miss = corral
        .post("/v1/chat/completions", chat("via the proxy"), &[])
        .await;
    assert_eq!(miss.status(), StatusCode::OK);
    assert_eq!(miss.headers()["x-corral-cache"], "MISS");
    let carried = proxy.carried();
    assert_eq!(
        carried,
        [format!("{}/chat/completions", provider.base_url())],
        "the call went through the proxy, in absolute form"
    );
    assert_eq!(provider.calls(), 1);
    let hit = corral
        .post("/v1/chat/completions", chat("via the proxy"), &[])
        .await;
    assert_eq!(hit.headers()["x-corral-cache"], "HIT");
    assert_eq!(proxy.carried().len(), 1, "a hit goes nowhere");
}
